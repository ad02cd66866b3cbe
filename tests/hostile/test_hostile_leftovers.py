"""Leftovers: stopping edgetrain (Ctrl-C, SIGTERM, SIGKILL) leaves no child process running, and a
killed run's temp files are removed at the next start. Real signals, real processes, checked in /proc."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hostile import faults

DRIVER = textwrap.dedent("""
    import sys
    from edgetrain import child
    # a child that would outlive us by minutes; with a grandchild of its own when asked
    code = "import subprocess, sys, time\\n"
    if sys.argv[1] == "grandchild":
        code += "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\\n"
    code += "print('ready', flush=True); time.sleep(300)\\n"
    child.run([sys.executable, "-c", code], what="sleeper", timeout=600)
""")


@pytest.mark.parametrize("family", ["child", "grandchild"])
@pytest.mark.parametrize("sig", sorted(faults.SIGNALS))
def test_launcher_leaves_no_process_after_a_signal(tmp_path, sig, family):
    if sig == "SIGKILL" and family == "grandchild":
        pytest.skip("SIGKILL of the parent reaches its direct child (PDEATHSIG); a grandchild of a killed "
                    "child is the child's to handle (profile children start none)")
    env, mark = faults.marked_env()
    want = 3 if family == "grandchild" else 2
    driver = subprocess.Popen([sys.executable, "-c", DRIVER, family], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert faults.wait_for(lambda: len(faults.processes_with(mark)) >= want, 60), "children did not start"
        os.kill(driver.pid, faults.SIGNALS[sig])
        driver.wait(30)
        left = faults.wait_for(lambda: not faults.processes_with(mark), 15)
        assert left, [faults.cmdline(p) for p in faults.processes_with(mark)]
        if sig == "SIGTERM":  # unwound as an exit (128+15), not a traceback
            assert driver.returncode == 143 and "Traceback" not in driver.stderr.read()
    finally:
        faults.kill_marked(mark)


@pytest.fixture(scope="module")
def onnx_model(tmp_path_factory):
    from edgetrain.convert import build_onnx
    from edgetrain.models import load_gluon

    root = tmp_path_factory.mktemp("leftover-model")
    model = load_gluon("edgetrain.nets:digits_cnn")
    (root / "net.onnx").write_bytes(build_onnx(model, opset=13, dynamic_batch=True).SerializeToString())
    rng = np.random.RandomState(0)
    np.savez(root / "d.npz", data=rng.randint(0, 255, (64, 16, 16)).astype(np.uint8), label=np.arange(64) % 10)
    return root


@pytest.mark.slow
@pytest.mark.parametrize("sig", sorted(faults.SIGNALS))
def test_profile_stopped_leaves_no_measurement_child(onnx_model, tmp_path, sig):
    env, mark = faults.marked_env({"TMPDIR": str(tmp_path)})
    proc = faults.start_cli("profile", onnx_model / "net.onnx", "--runs", "1000000", "--warmup", "0",
                            env=env, cwd=tmp_path)
    try:
        _stop_while_child_runs(proc, mark, sig, "edgetrain.measure.child")
        if sig != "SIGKILL":
            assert "Traceback" not in proc.stderr.read()
            assert not faults.temp_leftovers(tmp_path)
    finally:
        faults.kill_marked(mark)


def _stop_while_child_runs(proc, mark: str, sig: str, child: str) -> None:
    """Once a child whose command line names ``child`` runs, send ``sig`` to the command: it ends, not with
    exit 0, and no process of its tree (``mark``) is left."""
    def running():
        return [p for p in faults.processes_with(mark) if child in faults.cmdline(p)]
    assert faults.wait_for(running, 120), proc.stderr.read() if proc.poll() is not None else "no child"
    os.kill(proc.pid, faults.SIGNALS[sig])
    proc.wait(60)
    assert faults.wait_for(lambda: not faults.processes_with(mark), 15), \
        [faults.cmdline(p) for p in faults.processes_with(mark)]
    assert proc.returncode != 0


WRITERS = {
    "atomic_write": "from edgetrain.fileio import atomic_path\n"
                    "with atomic_path(Path(out) / 'result.json') as tmp:\n"
                    "    tmp.write_text('{}'); kill()\n",
    "temp_dir_tmpdir": "from edgetrain.fileio import temp_dir\n"
                       "with temp_dir('quantize') as d:\n    (d / 'fp32.onnx').write_bytes(b'x' * 1000); kill()\n",
    "temp_dir_beside": "from edgetrain.fileio import temp_dir\n"
                       "with temp_dir('save', dir=out) as d:\n    (d / 'model-0000.params').write_bytes(b'x'); kill()\n",
    "profile_child_spec": "from edgetrain.fileio import temp_dir\n"
                          "with temp_dir('profile') as d:\n    (d / 'spec.json').write_text('{}'); kill()\n",
}


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_kill_9_mid_write_then_next_start_cleans(tmp_path, writer):
    """SIGKILL cannot run a finally: the temp file stays, and the next writer in that place removes it
    (it carries a dead PID). A live writer's temp files are never touched."""
    out, tmpdir = tmp_path / "out", tmp_path / "tmp"
    out.mkdir(), tmpdir.mkdir()
    code = ("import os, signal, sys\nfrom pathlib import Path\nout = sys.argv[1]\n"
            "def kill():\n    os.kill(os.getpid(), signal.SIGKILL)\n" + WRITERS[writer])
    res = subprocess.run([sys.executable, "-c", code, str(out)], env={**os.environ, "TMPDIR": str(tmpdir)})
    assert res.returncode == -signal.SIGKILL
    left = faults.temp_leftovers(out) + faults.temp_leftovers(tmpdir)
    assert left, "the kill left nothing: the test proves nothing"
    # a live process's temp file, beside the dead one's
    live = out / f".x.json.edgetrain-tmp-{os.getppid()}.abcdefgh.tmp"
    live.write_text("in use")
    code2 = ("from pathlib import Path\nimport sys\nfrom edgetrain.fileio import atomic_write_text, temp_dir\n"
             "atomic_write_text(Path(sys.argv[1]) / 'next.json', '{}')\n"
             "with temp_dir('quantize'):\n    pass\n")
    subprocess.run([sys.executable, "-c", code2, str(out)], env={**os.environ, "TMPDIR": str(tmpdir)}, check=True)
    assert faults.temp_leftovers(out) == [live.name]
    assert faults.temp_leftovers(tmpdir) == []


@pytest.mark.slow
def test_quantize_killed_at_each_phase_leaves_nothing_after_the_next_run(onnx_model, tmp_path):
    """SIGKILL a real quantize once its temp folder exists, and again once its fp32 copy is written;
    the next quantize removes what they left and leaves nothing itself."""
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    env, mark = faults.marked_env({"TMPDIR": str(tmpdir)})
    args = ("quantize", onnx_model / "net.onnx", "--calib", onnx_model / "d.npz", "-o", tmp_path / "q.onnx")
    for phase in ("folder", "file"):
        proc = faults.start_cli(*args, env=env, cwd=tmp_path)
        try:
            def reached(phase=phase):  # bound now: called only in this iteration, by wait_for
                dirs = list(tmpdir.glob("edgetrain-tmp-quantize-*"))
                return dirs if phase == "folder" else [f for d in dirs for f in d.iterdir()]
            assert faults.wait_for(reached, 120, step=0.01), proc.stderr.read() if proc.poll() is not None else ""
            proc.kill()
            proc.wait(30)
        finally:
            faults.kill_marked(mark)
    assert faults.temp_leftovers(tmpdir), "nothing was left to clean: the test proves nothing"
    done = subprocess.run([sys.executable, "-m", "edgetrain", *map(str, args)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert faults.temp_leftovers(tmpdir) == []
    assert faults.temp_leftovers(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("layers", ["head", "last:2"])
@pytest.mark.parametrize("sig", sorted(faults.SIGNALS))
def test_finetune_stopped_while_exporting_leaves_no_child(tmp_path, sig, layers):
    """A NumPy-trained finetune's first run exports in an mxnet child: stopping the run then stops the
    child too, and (short of SIGKILL) leaves no OUTDIR and no traceback."""
    env, mark = faults.marked_env({"TMPDIR": str(tmp_path), "EDGETRAIN_CACHE_DIR": ""})
    out = tmp_path / "run"
    proc = faults.start_cli("finetune", "edgetrain.nets:pretrained_digits", "--data", "builtin:digits", "-o", out,
                            "--train-layers", layers, "--threads", "1", env=env, cwd=tmp_path)
    try:
        _stop_while_child_runs(proc, mark, sig, "edgetrain.training.prep")
        if sig != "SIGKILL":
            assert "Traceback" not in proc.stderr.read()
            assert not out.exists() and not faults.temp_leftovers(tmp_path)
    finally:
        faults.kill_marked(mark)
