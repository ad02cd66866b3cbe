"""The system's edges (issue 26): a run refused before its folder exists, a run folder never overwritten by
the API, each note said once, ... Real child processes, real files; no mocks of the thing under test."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

import edgetrain
from clitools import assert_user_error, run_edgetrain
from edgetrain.errors import UsageError

BUILTIN = Path(edgetrain.__file__).parent / "_builtin"
PREFIX, ONNX = str(BUILTIN / "digits5"), str(BUILTIN / "digits5.onnx")


def _no_mxnet(tmp_path: Path) -> dict:
    """An environment where ``import mxnet`` fails as it does before `doctor --fix` (Python 3.13, no wheel):
    a real package named mxnet first on the path, raising what a missing one raises."""
    fake = tmp_path / "no-mxnet"
    (fake / "mxnet").mkdir(parents=True)
    (fake / "mxnet" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'mxnet'\", name='mxnet')\n")
    return {"PYTHONPATH": os.pathsep.join([str(fake), *filter(None, [os.environ.get("PYTHONPATH")])])}


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --- 9. `edgetrain run` with no mxnet: refused before anything is made ------------------------------------

RUN_FORMS = {
    "default-folder": [],
    "new-folder": ["-o", "new-run"],
    "existing-empty-folder": ["-o", "empty-run"],
    "bundled-recipe-with-split": ["pi5", "-o", "pi5-run"],
}


@pytest.mark.parametrize("form", sorted(RUN_FORMS))
def test_run_without_mxnet_is_refused_before_its_run_folder_exists(tmp_path, form):
    work = tmp_path / "work"
    (work / "empty-run").mkdir(parents=True)
    before = _tree(work)
    res = run_edgetrain("run", *RUN_FORMS[form], cwd=work, env=_no_mxnet(tmp_path), timeout=300)
    assert_user_error(res, 2, "mxnet", "doctor --fix")
    assert _tree(work) == before  # nothing made, the empty folder still empty


def test_api_run_without_mxnet_leaves_nothing(tmp_path):
    import subprocess

    code = ("import edgetrain, sys\n"
            "try:\n    edgetrain.run(rundir=sys.argv[1], progress=None)\n"
            "except edgetrain.errors.UsageError as e:\n    print('REFUSED', e.exit_code, e)\n")
    env = {**os.environ, **_no_mxnet(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "r")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.stdout.startswith("REFUSED 2 mxnet"), proc.stdout + proc.stderr
    assert not (tmp_path / "r").exists()


# --- 10. the API's run(rundir=...) never overwrites a folder that is not its resumable run -----------------

def _other_run(folder: Path) -> None:
    folder.mkdir()
    (folder / "recipe.yaml").write_text("name: other\nmodel: x\ndata: builtin:digits\nsteps: [export]\n")


NOT_MINE = {
    "a-file-inside": lambda p: (p.mkdir(), (p / "keep.txt").write_text("mine")),
    "a-sub-folder-inside": lambda p: (p.mkdir(), (p / "sub").mkdir(), (p / "sub" / "keep.txt").write_text("x")),
    "another-recipes-run": _other_run,
    "a-regular-file": lambda p: p.write_text("mine"),
}


@pytest.mark.parametrize("resume", [False, True], ids=["new", "resume"])
@pytest.mark.parametrize("kind", sorted(NOT_MINE))
def test_api_run_refuses_a_rundir_that_is_not_its_own(tmp_path, kind, resume):
    target = tmp_path / "rundir"
    NOT_MINE[kind](target)
    before = {p: p.read_bytes() for p in [target, *target.rglob("*")] if p.is_file()}
    with pytest.raises(UsageError) as info:
        edgetrain.run(rundir=target, resume=resume, progress=None)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    assert {p: p.read_bytes() for p in [target, *target.rglob("*")] if p.is_file()} == before


# --- 11. fine-tune says each note once ------------------------------------------------------------------

NOTE_CASES = {
    "factory-random-weights": ["edgetrain.nets:digits_cnn"],
    "prefix": [PREFIX],
    "onnx": [ONNX],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(NOTE_CASES))
def test_finetune_says_each_note_once(tmp_path, case):
    res = run_edgetrain("finetune", *NOTE_CASES[case], "--data", "builtin:digits", "--epochs", "1",
                        "-o", tmp_path / "out", timeout=600)
    assert res.code in (0, 3), res.err
    notes = [re.sub(r"^note\s+", "", ln) for ln in (res.out + res.err).splitlines() if ln.startswith("note ")]
    assert notes, res.out + res.err
    repeated = {n for n in notes if notes.count(n) > 1}
    assert not repeated, repeated


# --- 1. stdout (or stderr) whose reader has gone -------------------------------------------------------

# Every command, each as cheap as it can be, writing to stdout (its human output, its rows, or --json -).
# "{out}" is a fresh output folder; the slow ones load mxnet or measure.
STDOUT_CASES = {
    "help": (["--help"], False),
    "version": (["--version"], False),
    "predict-rows": (["predict", ONNX, "{images}"], False),
    "predict-json": (["predict", ONNX, "{images}", "--json", "-"], False),
    "predict-csv-and-file": (["predict", ONNX, "{images}", "--format", "csv", "--json", "{out}/p.json"], False),
    "inspect": (["inspect", PREFIX], False),
    "inspect-json": (["inspect", PREFIX, "--json", "-"], False),
    "devices-list": (["devices", "list"], False),
    "devices-show-json": (["devices", "show", "rpi5-8gb", "--json", "-"], False),
    "recipes-list": (["recipes", "list"], False),
    "recipes-show": (["recipes", "show", "quickstart"], False),
    "user-error": (["predict", "{out}/missing.onnx", "{images}"], False),
    "inspect-prefix-data": (["inspect", PREFIX, "--data", "{images}"], True),
    "export": (["export", PREFIX, "-o", "{out}/m.onnx"], True),
    "export-json": (["export", PREFIX, "-o", "{out}/m.onnx", "--json", "-"], True),
    "quantize": (["quantize", ONNX, "--calib", "builtin:digits", "-o", "{out}/q.onnx"], True),
    "profile-json": (["profile", ONNX, "--runs", "3", "--json", "-"], True),
    "finetune": (["finetune", PREFIX, "--data", "builtin:digits", "--epochs", "1", "-o", "{out}/ft"], True),
    "doctor": (["doctor"], True),
}


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """An image folder of 600 digits: predict's rows are more than a pipe's buffer holds."""
    import numpy as np
    from PIL import Image

    root = tmp_path_factory.mktemp("images")
    rng = np.random.default_rng(0)
    for c in range(2):
        (root / str(c)).mkdir()
        for i in range(300):
            Image.fromarray((rng.random((8, 8)) * 255).astype("uint8")).save(root / str(c) / f"{i:03d}.png")
    return root


def _closed_pipe_run(argv, env, stream: str, timeout=600):
    """Run edgetrain with ``stream`` (stdout or stderr) a pipe whose reader has already gone."""
    import subprocess

    from hostile import faults

    env, mark = faults.marked_env(env)
    r, w = os.pipe()
    os.close(r)
    other = subprocess.PIPE
    try:
        proc = subprocess.run([sys.executable, "-m", "edgetrain", *argv], env=env, timeout=timeout,
                              stdout=w if stream == "stdout" else other, stderr=w if stream == "stderr" else other)
    finally:
        os.close(w)
    assert faults.processes_with(mark) == [], "a process outlived the command"
    return proc


def _assert_closed_pipe_promise(proc, out: Path, stream: str):
    said = (proc.stderr if stream == "stdout" else proc.stdout) or b""
    assert proc.returncode in (0, 1, 2, 3), proc.returncode
    assert b"Traceback" not in said and b"BrokenPipe" not in said and b"Exception ignored" not in said, said
    if stream == "stdout" and proc.returncode not in (0, 2):
        assert proc.returncode == 1  # the reader left: 1, and nothing said (it could only be said to stderr)
    leftovers = [p.name for p in out.rglob("*") if "edgetrain-tmp" in p.name or p.name.endswith(".tmp")]
    assert leftovers == []


def _case(case, images, out):
    argv, slow = STDOUT_CASES[case]
    return [a.format(images=images, out=out) for a in argv], slow


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize("case", [c for c, (_, slow) in STDOUT_CASES.items() if not slow])
def test_a_gone_reader_ends_every_command_quietly(tmp_path, images, case, stream):
    out = tmp_path / "out"
    out.mkdir()
    argv, _ = _case(case, images, out)
    proc = _closed_pipe_run(argv, {}, stream)
    _assert_closed_pipe_promise(proc, out, stream)
    if stream == "stdout" and case not in ("user-error",):
        assert proc.returncode == 1  # everything here writes to stdout, which had no reader


@pytest.mark.slow
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
@pytest.mark.parametrize("case", [c for c, (_, slow) in STDOUT_CASES.items() if slow])
def test_a_gone_reader_ends_every_long_command_quietly(tmp_path, images, case, stream):
    out = tmp_path / "out"
    out.mkdir()
    argv, _ = _case(case, images, out)
    proc = _closed_pipe_run(argv, {}, stream)
    _assert_closed_pipe_promise(proc, out, stream)


def test_head_one_of_predicts_rows_is_quiet(images):
    """`edgetrain predict MODEL DATA | head -1`: the reader takes one line and leaves mid-stream."""
    import subprocess

    proc = subprocess.run(f"{sys.executable} -m edgetrain predict {ONNX} {images} | head -1; "
                          "echo \"rc=${PIPESTATUS[0]}\" >&2", shell=True, executable="/bin/bash",
                          capture_output=True, text=True, timeout=300)
    assert proc.stdout.count("\n") == 1
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] in ("rc=0", "rc=1")


# --- 2. a stream or an output that cannot take what is written: /dev/full, ulimit -f, a full TMPDIR ------

def _run(argv, env=None, preexec=None, stdout=None, timeout=600):
    import subprocess

    from clitools import CliResult
    from hostile import faults

    env, mark = faults.marked_env(env)
    proc = subprocess.run([sys.executable, "-m", "edgetrain", *map(str, argv)], env=env, timeout=timeout,
                          stdout=stdout if stdout is not None else subprocess.PIPE, stderr=subprocess.PIPE,
                          preexec_fn=preexec)
    assert faults.processes_with(mark) == [], "a process outlived the command"
    decode = lambda b: (b or b"").decode("utf-8", "replace")  # noqa: E731
    return CliResult(proc.returncode, decode(proc.stdout), decode(proc.stderr))


def _leftovers(folder: Path) -> list[str]:
    return [p.name for p in folder.rglob("*") if "edgetrain-tmp" in p.name or p.name.endswith(".tmp")]


@pytest.mark.parametrize("case", [c for c, (_, slow) in STDOUT_CASES.items() if not slow])
def test_stdout_on_dev_full_is_one_line(tmp_path, images, case):
    out = tmp_path / "out"
    out.mkdir()
    argv, _ = _case(case, images, out)
    with open("/dev/full", "wb") as full:
        res = _run(argv, stdout=full)
    if case == "user-error":
        assert_user_error(res, 2, "missing.onnx")
    else:
        assert_user_error(res, 2, "cannot write to stdout", "/dev/full")
    assert _leftovers(out) == []


@pytest.mark.slow
@pytest.mark.parametrize("case", [c for c, (_, slow) in STDOUT_CASES.items() if slow])
def test_stdout_on_dev_full_is_one_line_for_long_commands(tmp_path, images, case):
    out = tmp_path / "out"
    out.mkdir()
    argv, _ = _case(case, images, out)
    with open("/dev/full", "wb") as full:
        res = _run(argv, stdout=full)
    assert_user_error(res, 2, "cannot write to stdout", "/dev/full")
    assert _leftovers(out) == []


# Every output option of every command, given /dev/full (a device: written through, and it is full).
FULL_OUTPUTS = {
    "predict-o": ["predict", ONNX, "{images}", "-o", "/dev/full"],
    "predict-json": ["predict", ONNX, "{images}", "--json", "/dev/full"],
    "inspect-json": ["inspect", PREFIX, "--json", "/dev/full"],
    "devices-show-json": ["devices", "show", "rpi5-8gb", "--json", "/dev/full"],
    "export-o": ["export", PREFIX, "-o", "/dev/full"],
    "quantize-o": ["quantize", ONNX, "--calib", "builtin:digits", "-o", "/dev/full"],
    "profile-json": ["profile", ONNX, "--runs", "3", "--json", "/dev/full"],
}
LONG = ("export-o", "quantize-o", "profile-json")


@pytest.mark.parametrize("case", [pytest.param(c, marks=[pytest.mark.slow] if c in LONG else [])
                                  for c in sorted(FULL_OUTPUTS)])
def test_an_output_on_dev_full_is_one_line(tmp_path, images, case):
    res = _run([a.format(images=images) for a in FULL_OUTPUTS[case]], timeout=600)
    assert_user_error(res, 2, "/dev/full")


# Every writer of a model, a table or a JSON under a file size limit (ulimit -f): Python ignores SIGXFSZ,
# so each write past the limit fails with EFBIG, in edgetrain and in its children alike.
FSIZE_CASES = {
    "predict-o": ["predict", ONNX, "{images}", "-o", "{out}/rows.tsv"],
    "predict-json": ["predict", ONNX, "{images}", "--json", "{out}/r.json"],
    "export": ["export", PREFIX, "-o", "{out}/m.onnx"],
    "quantize": ["quantize", ONNX, "--calib", "builtin:digits", "-o", "{out}/q.onnx"],
    "quantize-gluon": ["quantize", PREFIX, "--calib", "builtin:digits", "-o", "{out}/q.onnx"],
    "finetune": ["finetune", PREFIX, "--data", "builtin:digits", "--epochs", "1", "-o", "{out}/ft"],
}


def _fsize_limit(nbytes: int):
    import resource

    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))
    return preexec


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(FSIZE_CASES))
def test_a_file_size_limit_is_one_line_and_nothing_half_written(tmp_path, images, case):
    out = tmp_path / "out"
    out.mkdir()
    res = _run([a.format(images=images, out=out) for a in FSIZE_CASES[case]], preexec=_fsize_limit(8192))
    assert_user_error(res, 2, "ulimit -f")
    assert _leftovers(out) == []
    for f in out.rglob("*"):  # whatever is there is whole: under the limit, and nothing of ours is cut at it
        assert not f.is_file() or f.stat().st_size < 8192, f


# Every other writer: the rest of the commands' -o/--json/--report outputs and run folders, each under a limit below
# what it writes (8192 bytes, or less for a small output: no command writes anything that small before it).
# "{recipe-export}"/"{recipe-report}": recipes whose run folder fails at its step's model / at its own report;
# "{result}", "{export}", "{start}": a finished `profile --meter-export` result and a meter's export covering it;
# "{meter}": a meter logging while `energy calibrate` samples a board whose power steps (metertools.board_and_meter).
FSIZE_MORE = {
    "profile-json": (["profile", ONNX, "--runs", "3", "--json", "{out}/p.json"], 8192),
    "profile-report": (["profile", ONNX, "--runs", "3", "--report", "{out}/p.html"], 8192),
    "profile-report-md": (["profile", ONNX, "--runs", "3", "--report", "{out}/p.md"], 8192),
    # the measuring child's result (20000 runs' latencies, ~1 MB) over the limit, its op profile (~190 kB) under it
    "profile-child-result": (["profile", ONNX, "--runs", "20000", "--warmup", "1", "--threads", "1", "--json",
                              "{out}/p.json"], 512 << 10),
    "run-step": (["run", "{recipe-export}", "-o", "{out}/run"], 8192),
    "run-report": (["run", "{recipe-report}", "-o", "{out}/run"], 1024),
    "run-json": (["run", "{recipe-report}", "-o", "{out}/run", "--json", "{out}/run.json"], 1024),
    "energy-attribute-o": (["energy", "attribute", "{result}", "{export}", "--power-log-start", "{start}",
                            "-o", "{out}/m.json"], 8192),
    "energy-calibrate-o": (["energy", "calibrate", "{meter}", "-o", "{out}/cal.json", "--seconds", "4",
                            "--phase", "0.5"], 256),
    "fleet-serve": (["fleet", "serve", PREFIX, "--val", "builtin:digits", "-o", "{out}/fleet", "--rounds", "1",
                     "--min-clients", "1", "--join-timeout", "5"], 8192),
    "recipes-list-json": (["recipes", "list", "--json", "{out}/r.json"], 256),
    "recipes-validate-json": (["recipes", "validate", "{recipe-report}", "--json", "{out}/v.json"], 256),
    "devices-show-json": (["devices", "show", "rpi5-8gb", "--json", "{out}/d.json"], 256),
    "inspect-json": (["inspect", PREFIX, "--json", "{out}/i.json"], 256),
    "doctor-json": (["doctor", "--json", "{out}/doctor.json"], 256),
}


@pytest.fixture(scope="module")
def meter_export(tmp_path_factory) -> dict:
    """A finished `profile --meter-export` result and an Otii export (3.25 W) covering its windows."""
    import metertools
    from test_profile_models import conv_gemm_onnx

    folder = tmp_path_factory.mktemp("meter-export")
    result = metertools.meter_export_result(folder, conv_gemm_onnx(folder / "convgemm.onnx"))
    start, seconds = metertools.recording(result)
    export = metertools.otii_export(folder / "Main power - Arc.csv", seconds, lambda s: 3.25)
    return {"result": str(result), "export": str(export), "start": metertools.stamp(start)}


def _recipes(folder: Path) -> dict:
    """A recipe whose export step writes a model over the limit, and one with only the run's own report."""
    folder.mkdir()
    head = f"device: rpi4b-4gb\nmodel: {PREFIX}\ndata: builtin:digits\n"
    (folder / "export.yaml").write_text(f"name: export\n{head}steps:\n  - export:\n  - report:\n")
    (folder / "report.yaml").write_text(f"name: report\n{head}steps:\n  - report:\n")
    return {"recipe-export": str(folder / "export.yaml"), "recipe-report": str(folder / "report.yaml")}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(FSIZE_MORE))
def test_every_other_writer_under_a_file_size_limit_is_one_line(tmp_path, request, case):
    """The same promise for every other output: one line naming ulimit -f, exit 2, nothing half-written, no temp
    left. A recipe's failing step says it in the run's one line for it ("step 'export' bad input (exit 2): ...")."""
    import metertools

    argv, limit = FSIZE_MORE[case]
    if case.startswith("fleet"):
        pytest.importorskip("flwr")  # the fleet extra: its tests run in the Flower environment
    out = tmp_path / "out"
    out.mkdir()
    given = {"out": str(out), **_recipes(tmp_path / "recipes")}
    env, board = {"XDG_CONFIG_HOME": str(tmp_path / "config"), "EDGETRAIN_CACHE_DIR": ""}, None
    if "{result}" in argv:
        given.update(request.getfixturevalue("meter_export"))
    if "{meter}" in argv:
        root = metertools.hwmon_tree(tmp_path / "sys", metertools.LEVELS_UW[0])
        given["meter"] = str(metertools.um34c_log(tmp_path / "meter.csv"))  # logged by the board: it fits
        env.update(metertools.sensor_env(root))
        board = metertools.board_and_meter(root, Path(given["meter"]), 1.1, 0.5, 10)
    inputs = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_relative_to(out)]
    before = {p: p.read_bytes() for p in inputs + [Path(given[k]) for k in ("result", "export") if k in given]}
    try:
        res = _run([re.sub(r"\{([a-z-]+)\}", lambda m: given[m.group(1)], a) for a in argv], env=env,
                   preexec=_fsize_limit(limit))
    finally:
        if board is not None:
            board.kill()
            board.wait()
    if case == "run-step":
        assert res.code == 2 and "Traceback" not in res.out + res.err, res.out + res.err
        said = [ln for ln in res.out.splitlines() if ln.startswith("step '")]
        assert len(said) == 1 and "bad input (exit 2)" in said[0] and "ulimit -f" in said[0], res.out
    else:
        assert_user_error(res, 2, "ulimit -f")
    assert _leftovers(tmp_path) == []
    for f in out.rglob("*"):  # whatever is there is whole: under the limit, and nothing of ours is cut at it
        assert not f.is_file() or f.stat().st_size < limit, f
    if board is None:  # the inputs are as they were (the board's sensor file is its own to rewrite)
        assert {p: p.read_bytes() for p in before} == before
    assert not (tmp_path / "config").exists()  # calibrate's -o only, never the default file


SCRATCH_CASES = {
    "quantize": ["quantize", ONNX, "--calib", "builtin:digits", "-o", "{out}/q.onnx"],
    "quantize-gluon": ["quantize", PREFIX, "--calib", "builtin:digits", "-o", "{out}/q.onnx"],
    "export": ["export", PREFIX, "-o", "{out}/m.onnx"],
    "profile": ["profile", ONNX, "--runs", "3"],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(SCRATCH_CASES))
def test_a_full_tmpdir_is_one_line_naming_it(tmp_path, images, case):
    """TMPDIR on a 64 KiB file system: room for tempfile's probe, not for a model. Either the run fits, or
    one line naming TMPDIR, exit 1; nothing is left in TMPDIR or beside the output."""
    from hostile import faults

    out = tmp_path / "out"
    out.mkdir()
    with faults.tiny_disk("64k") as disk:
        res = _run([a.format(images=images, out=out) for a in SCRATCH_CASES[case]], env={"TMPDIR": str(disk)})
        if res.code != 0:
            assert_user_error(res, 1, "no space left for temporary files", "TMPDIR")
            assert list(out.iterdir()) == []
        assert list(disk.iterdir()) == []
    assert _leftovers(out) == []


# --- 3. a locale that cannot encode a file name --------------------------------------------------------

LOCALES = {
    "ascii": {"LC_ALL": "C", "PYTHONUTF8": "0"},
    "ascii-strict-io": {"LC_ALL": "C", "PYTHONUTF8": "0", "PYTHONIOENCODING": "ascii:strict"},
    "utf8-strict-io": {"LC_ALL": "C.UTF-8", "PYTHONIOENCODING": "utf-8:strict"},
}
NAMES = {"latin1-bytes": b"caf\xe9", "utf8-bytes": b"caf\xc3\xa9", "invalid-utf8": b"bad\xff\xfe"}


@pytest.fixture(scope="module")
def named_data(tmp_path_factory):
    """Image folders whose class folder and image file names hold each kind of non-ASCII name."""
    import numpy as np
    from PIL import Image

    made = {}
    for kind, name in NAMES.items():
        root = os.fsencode(tmp_path_factory.mktemp(f"names-{kind}"))
        for cls in (name, b"plain"):
            os.makedirs(os.path.join(root, cls))
            for i in range(4):
                pix = (np.random.default_rng(i).random((8, 8)) * 255).astype("uint8")
                Image.fromarray(pix).save(os.path.join(root, cls, name + b"%d.png" % i))
        made[kind] = root
    return made


def _env_argv(argv):
    return [a if isinstance(a, bytes) else str(a) for a in argv]


def _run_bytes(argv, env, timeout=600):
    import subprocess

    full = {k: v for k, v in os.environ.items() if k not in ("EDGETRAIN_DEBUG", "PYTHONIOENCODING", "LANG")}
    full.update(env)
    return subprocess.run([sys.executable, "-m", "edgetrain", *_env_argv(argv)], env=full, capture_output=True,
                          timeout=timeout)


LOCALE_CASES = {
    "predict-rows": lambda d, o: ["predict", ONNX, d],
    "predict-o": lambda d, o: ["predict", ONNX, d, "-o", os.path.join(o, b"rows.tsv")],
    "predict-json": lambda d, o: ["predict", ONNX, d, "--json", os.path.join(o, b"r.json")],
    "predict-missing": lambda d, o: ["predict", ONNX, os.path.join(d, b"missing")],
    "inspect-data": lambda d, o: ["inspect", PREFIX, "--data", d],
}
LONG_LOCALE_CASES = {
    "finetune": lambda d, o: ["finetune", PREFIX, "--data", d, "--epochs", "1", "--allow-chance",
                              "-o", os.path.join(o, b"ft")],
    "quantize": lambda d, o: ["quantize", ONNX, "--calib", d, "--allow-chance", "-o", os.path.join(o, b"q.onnx")],
    "export": lambda d, o: ["export", PREFIX, "--data", d, "--allow-chance", "-o", os.path.join(o, b"m.onnx")],
}


def _check_locale_run(proc, case, data, name):
    said = proc.stdout + proc.stderr
    assert b"Traceback" not in said and b"UnicodeEncodeError" not in said, said.decode("utf-8", "replace")
    if case == "predict-missing":
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith(b"Error:")]
        assert proc.returncode == 2 and len(errors) == 1, said
    else:
        assert proc.returncode in (0, 3), said.decode("utf-8", "replace")


@pytest.mark.parametrize("kind", sorted(NAMES))
@pytest.mark.parametrize("locale_", [pytest.param(n, marks=[] if n == "ascii" else [pytest.mark.slow])
                                     for n in sorted(LOCALES)])
@pytest.mark.parametrize("case", sorted(LOCALE_CASES))
def test_a_name_the_locale_cannot_encode_prints(tmp_path, named_data, case, locale_, kind):
    out = os.fsencode(tmp_path)
    data = named_data[kind]
    proc = _run_bytes(LOCALE_CASES[case](data, out), LOCALES[locale_])
    _check_locale_run(proc, case, data, NAMES[kind])
    if case == "predict-rows":  # the name goes out as the bytes it is, as `ls` prints it
        assert NAMES[kind] + b"0.png" in proc.stdout
    if case == "predict-o":
        assert NAMES[kind] + b"0.png" in (tmp_path / "rows.tsv").read_bytes()
    if case == "predict-json":  # valid JSON, its names escaped
        import json

        assert json.loads((tmp_path / "r.json").read_text("utf-8"))


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(NAMES))
@pytest.mark.parametrize("case", sorted(LONG_LOCALE_CASES))
def test_a_name_the_locale_cannot_encode_prints_in_long_commands(tmp_path, named_data, case, kind):
    proc = _run_bytes(LONG_LOCALE_CASES[case](named_data[kind], os.fsencode(tmp_path)), LOCALES["ascii"])
    _check_locale_run(proc, case, named_data[kind], NAMES[kind])


# --- 4. standard input that never ends (predict -, the one command that reads it) ----------------------

def _stream(kind: str, image: Path):
    """A real producer process for each kind of hostile stdin, and the fragment its refusal names."""
    import subprocess

    if kind == "dev-zero":  # bytes with no newline, forever
        return open("/dev/zero", "rb"), None, "longer than 4096 bytes"
    argv = {"yes-a-path": ["yes", str(image)], "yes-empty-lines": ["yes", ""],
            "random-bytes": ["head", "-c", "200000", "/dev/urandom"],
            "nul-in-a-line": ["printf", "a\\0b\\n"],
            "name-over-name-max": ["printf", "%s\\n", "n" * 300],
            "path-over-path-max": ["printf", "%s\\n", "/".join(["d" * 200] * 30)]}[kind]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    fragment = {"yes-a-path": "more than 1,000,000 lines", "yes-empty-lines": "more than 1,000,000 lines",
                "random-bytes": "", "nul-in-a-line": "", "name-over-name-max": "too long",
                "path-over-path-max": "longer than 4096 bytes"}[kind]
    return proc.stdout, proc, fragment


STDIN_KINDS = ["dev-zero", "random-bytes", "nul-in-a-line", "name-over-name-max", "path-over-path-max"]
ENDLESS_KINDS = ["yes-a-path", "yes-empty-lines"]


@pytest.mark.parametrize("kind", STDIN_KINDS + [pytest.param(k, marks=pytest.mark.slow) for k in ENDLESS_KINDS])
def test_an_endless_or_hostile_stdin_is_one_line_within_bounded_memory(tmp_path, images, kind):
    import subprocess

    from clitools import CliResult
    from hostile import faults

    source, producer, fragment = _stream(kind, images / "0" / "000.png")
    env, mark = faults.marked_env()
    try:
        proc = subprocess.run([sys.executable, "-m", "edgetrain", "predict", ONNX, "-"], stdin=source, env=env,
                              capture_output=True, text=True, timeout=600, preexec_fn=faults.limit_memory(3 << 30))
    finally:
        source.close()
        if producer is not None:
            producer.kill()
            producer.wait()
    assert_user_error(CliResult(proc.returncode, proc.stdout, proc.stderr), 2, fragment)
    assert "MemoryError" not in proc.stderr
    assert faults.processes_with(mark) == []


def test_the_api_reads_a_text_stdin_with_the_same_bounds(images):
    """The API's ``stdin`` may be any text stream: the same line bound holds (no bytes to read)."""
    import io

    from edgetrain.ops.predict import predict as op
    from edgetrain.options import PredictOptions

    with pytest.raises(UsageError, match="longer than 4096 bytes"):
        op(ONNX, "-", PredictOptions(threads=1), stdin=io.StringIO("x" * 10_000))
    res = op(ONNX, "-", PredictOptions(threads=1), stdin=io.StringIO(f"{images / '0' / '000.png'}\n\n"))
    assert res.samples == 1 and res.predictions[0]["input"].endswith("000.png")


# --- 5. a path over PATH_MAX, a name over NAME_MAX -------------------------------------------------------

LONG_PATHS = {"name-over-name-max": "n" * 300, "path-over-path-max": "/".join(["d" * 200] * 25)}

# every command, each of its path arguments in turn given the long path ("{p}")
PATH_ARGS = {
    "predict-model": ["predict", "{p}.onnx", "{images}"],
    "predict-data": ["predict", ONNX, "{p}"],
    "predict-o": ["predict", ONNX, "{images}", "-o", "{p}"],
    "predict-json": ["predict", ONNX, "{images}", "--json", "{p}"],
    "inspect-model": ["inspect", "{p}"],
    "inspect-json": ["inspect", PREFIX, "--json", "{p}"],
    "export-model": ["export", "{p}", "-o", "{out}/m.onnx"],
    "export-o": ["export", PREFIX, "-o", "{p}.onnx"],
    "quantize-calib": ["quantize", ONNX, "--calib", "{p}", "-o", "{out}/q.onnx"],
    "quantize-o": ["quantize", ONNX, "--calib", "builtin:digits", "-o", "{p}.onnx"],
    "finetune-data": ["finetune", PREFIX, "--data", "{p}", "-o", "{out}/ft"],
    "finetune-o": ["finetune", PREFIX, "--data", "builtin:digits", "-o", "{p}"],
    "profile-model": ["profile", "{p}.onnx"],
    "profile-report": ["profile", ONNX, "--report", "{p}.html"],
    "run-recipe": ["run", "{p}.yaml"],
    "run-o": ["run", "-o", "{p}"],
    "devices-show": ["devices", "show", "{p}.yaml"],
    "recipes-validate": ["recipes", "validate", "{p}.yaml"],
    "fleet-serve-o": ["fleet", "serve", PREFIX, "--val", "builtin:digits", "-o", "{p}"],
}


@pytest.mark.parametrize("kind", sorted(LONG_PATHS))
@pytest.mark.parametrize("case", sorted(PATH_ARGS))
def test_a_path_too_long_for_the_system_is_one_line_exit_2(tmp_path, images, case, kind):
    if case.startswith("fleet"):
        pytest.importorskip("flwr")  # the fleet extra: its tests run in the Flower environment
    out = tmp_path / "out"
    out.mkdir()
    long_path = str(tmp_path / LONG_PATHS[kind])
    argv = [a.format(p=long_path, images=images, out=out) for a in PATH_ARGS[case]]
    res = _run(argv, timeout=300)
    assert_user_error(res, 2, "too long")
    assert list(out.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("kind", sorted(LONG_PATHS))
@pytest.mark.parametrize("case", [(fn, p) for fn, (_, params) in __import__("hostile.test_hostile_api", fromlist=["x"])
                                  .SIGNATURES.items() for p in params], ids="-".join)
def test_an_api_path_too_long_is_one_usage_error_before_any_work(tmp_path, monkeypatch, case, kind):
    from hostile.test_hostile_api import SIGNATURES

    fn, param = case
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as info:
        SIGNATURES[fn][0]({param: str(tmp_path / LONG_PATHS[kind])})
    assert "too long" in info.value.line() or "bytes long" in info.value.line(), info.value.line()
    assert info.value.exit_code == 2 and os.listdir(tmp_path) == []


# --- 6. no /proc -----------------------------------------------------------------------------------------

NO_PROC_CASES = {
    "predict": (["predict", ONNX, "{images}"], False),
    "inspect": (["inspect", PREFIX], False),
    "devices-host": (["devices", "host"], False),
    "devices-host-json": (["devices", "host", "--json", "-"], False),
    "profile": (["profile", ONNX, "--runs", "3"], True),
    "profile-device": (["profile", ONNX, "--runs", "3", "--device", "rpi4b-4gb", "--json", "-"], True),
    "finetune": (["finetune", PREFIX, "--data", "builtin:digits", "--epochs", "1", "-o", "{out}/ft"], True),
    "finetune-budget": (["finetune", PREFIX, "--data", "builtin:digits", "--epochs", "1", "--device", "rpi4b-4gb",
                         "-o", "{out}/ft"], True),
    "export": (["export", PREFIX, "-o", "{out}/m.onnx"], True),
    "quantize": (["quantize", ONNX, "--calib", "builtin:digits", "-o", "{out}/q.onnx"], True),
    "doctor": (["doctor"], True),
}


def _without_proc(argv: list[str], timeout=600):
    """Run edgetrain where /proc is an empty folder: a private mount namespace (unshare; as another user, in
    a user namespace) with a tmpfs over /proc. The real thing, not a simulation; skipped where unshare
    cannot make one."""
    import shlex
    import shutil
    import subprocess

    if shutil.which("unshare") is None:
        pytest.skip("no unshare here")
    ns = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-r", "-m"]
    probe = subprocess.run([*ns, "sh", "-c", "mount -t tmpfs none /proc && test ! -e /proc/self"],
                           capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot hide /proc here: {probe.stderr.decode().strip()}")
    command = " ".join(shlex.quote(a) for a in [sys.executable, "-m", "edgetrain", *argv])
    env = {k: v for k, v in os.environ.items() if k != "EDGETRAIN_DEBUG"}
    return subprocess.run([*ns, "sh", "-c", f"mount -t tmpfs none /proc && exec {command}"], env=env,
                          capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("case", [pytest.param(c, marks=[pytest.mark.slow] if slow else [])
                                  for c, (_, slow) in NO_PROC_CASES.items()])
def test_no_proc_gives_unknown_figures_never_a_crash(tmp_path, images, case):
    out = tmp_path / "out"
    out.mkdir()
    argv = [a.format(images=images, out=out) for a in NO_PROC_CASES[case][0]]
    proc = _without_proc(argv)
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout, proc.stderr[-3000:]
    assert proc.returncode in (0, 3), proc.stderr[-3000:]
    assert not [ln for ln in proc.stderr.splitlines() if ln.startswith("Error:")], proc.stderr[-3000:]
    if argv[-2:] == ["--json", "-"]:
        import json

        assert json.loads(proc.stdout)


# --- 7. the pretrained download has an overall deadline ----------------------------------------------------

ZOO = "mobilenetv2_0.25"  # in mxnet's published table; the weights themselves never arrive here


class _SlowMirror:
    """A real HTTP mirror on loopback, in a thread, that never finishes: it trickles one byte every 0.2 s of
    a 10 MB body, or stalls after its headers, or stalls before answering at all."""

    def __init__(self, kind: str):
        import http.server
        import socketserver
        import threading
        import time

        stop = self.stop = threading.Event()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 - http.server's name
                if kind == "stall-before-headers":
                    stop.wait(120)
                    return
                self.send_response(200)
                self.send_header("Content-Length", str(10 << 20))
                self.end_headers()
                self.wfile.flush()
                try:
                    while not stop.is_set():
                        if kind == "trickle":
                            self.wfile.write(b"P")
                            self.wfile.flush()
                        stop.wait(0.2)
                except OSError:  # the client gave up: what the deadline is for
                    pass

            def log_message(self, *args):
                pass

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"
        self._time = time

    def close(self):
        self.stop.set()
        self.server.shutdown()
        self.server.server_close()


MIRRORS = ["trickle", "stall-after-headers", "stall-before-headers"]


@pytest.fixture
def slow_mirror(request):
    mirror = _SlowMirror(request.param)
    yield mirror
    mirror.close()


@pytest.mark.parametrize("slow_mirror", MIRRORS, indirect=True)
def test_a_mirror_that_never_finishes_meets_the_deadline_and_leaves_nothing(tmp_path, monkeypatch, slow_mirror):
    import time

    from edgetrain.models import load_gluon

    monkeypatch.setenv("MXNET_HOME", str(tmp_path / "mxhome"))
    monkeypatch.setenv("MXNET_GLUON_REPO", slow_mirror.url)
    monkeypatch.setenv("EDGETRAIN_DOWNLOAD_DEADLINE", "2")
    t0 = time.monotonic()
    with pytest.raises(UsageError) as info:
        load_gluon(f"zoo:{ZOO}@pretrained", input_shape=(3, 32, 32))
    waited = time.monotonic() - t0
    line = info.value.line()
    assert "cannot be downloaded" in line and ("deadline" in line or "timed out" in line), line
    assert info.value.exit_code == 2 and waited < 60  # ended, rather than waiting on the mirror for good
    cache = tmp_path / "mxhome" / "models"
    assert not cache.exists() or list(cache.iterdir()) == []  # no partial file, no temp folder


@pytest.mark.parametrize("slow_mirror", ["trickle"], indirect=True)
def test_the_cli_download_deadline_is_one_line(tmp_path, slow_mirror):
    res = _run(["inspect", f"zoo:{ZOO}@pretrained", "--input-shape", "1,3,32,32"],
               env={"MXNET_HOME": str(tmp_path / "mxhome"), "MXNET_GLUON_REPO": slow_mirror.url,
                    "EDGETRAIN_DOWNLOAD_DEADLINE": "2"}, timeout=120)
    assert_user_error(res, 2, "deadline", "EDGETRAIN_DOWNLOAD_DEADLINE")
    cache = tmp_path / "mxhome" / "models"
    assert not cache.exists() or list(cache.iterdir()) == []


@pytest.mark.parametrize("value", ["0", "-5", "soon", "inf", "nan"])
def test_a_download_deadline_that_is_not_seconds_is_one_line(tmp_path, monkeypatch, value):
    from edgetrain.models import load_gluon

    monkeypatch.setenv("MXNET_HOME", str(tmp_path / "mxhome"))
    monkeypatch.setenv("EDGETRAIN_DOWNLOAD_DEADLINE", value)
    with pytest.raises(UsageError, match="EDGETRAIN_DOWNLOAD_DEADLINE"):
        load_gluon(f"zoo:{ZOO}@pretrained", input_shape=(3, 32, 32))


# --- 8. a child killed by a signal under a memory limit ----------------------------------------------------

def _address_space(nbytes: int):
    import resource

    def preexec():
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))
    return preexec


@pytest.mark.slow
@pytest.mark.parametrize("limit_mb", [450, 600])
def test_a_child_dying_under_ulimit_v_is_one_line_naming_the_signal_and_the_limit(tmp_path, limit_mb):
    """finetune prepares a Gluon model in a child (mxnet loads there): under a small address-space limit the
    child dies of a signal (SIGSEGV, SIGABRT) or fails (MemoryError) -- or fits. Either way one line, exit 1,
    and a death by signal names the signal and the limit; never silence, never a traceback."""
    res = _run(["finetune", PREFIX, "--data", "builtin:digits", "--epochs", "1", "-o", tmp_path / "ft"],
               env={"EDGETRAIN_CACHE_DIR": ""}, preexec=_address_space(limit_mb << 20), timeout=600)
    if res.code in (0, 3):
        return  # it fitted
    assert_user_error(res, 1)
    line = next(ln for ln in res.err.splitlines() if ln.startswith("Error:"))
    if "crashed with SIG" in line:
        assert "ulimit -v" in line and f"{limit_mb:,.0f} MB" in line, line
    assert _leftovers(tmp_path) == []


@pytest.mark.slow
@pytest.mark.parametrize("command", ["export", "quantize"])
@pytest.mark.parametrize("limit_mb", [450, 800])
def test_mxnet_in_the_command_s_own_process_dying_under_ulimit_v_is_one_line(tmp_path, command, limit_mb):
    """export and quantize of a Gluon PREFIX run mxnet in the command's own process: under an address-space
    limit it dies of SIGSEGV (450 MB) or SIGABRT (800 MB) in an allocation -- which ended in silence (rc 139,
    134). The command then runs in a child its parent watches: one line naming the signal and the limit, exit
    1, and no output file half-written -- or it fits and succeeds."""
    out = tmp_path / "m.onnx"
    argv = ["export", PREFIX, "-o", out] if command == "export" else ["quantize", PREFIX, "--calib", "builtin:digits",
                                                                       "-o", out]
    res = _run(argv, env={"EDGETRAIN_CACHE_DIR": ""}, preexec=_address_space(limit_mb << 20), timeout=600)
    if res.code in (0, 3):
        return  # it fitted
    assert_user_error(res, 1)
    line = next(ln for ln in res.err.splitlines() if ln.startswith("Error:"))
    if "crashed with SIG" in line:
        assert "ulimit -v" in line and f"{limit_mb:,.0f} MB" in line, line
    assert not out.exists() and _leftovers(tmp_path) == []


def test_death_names_the_signal_and_the_likely_cause():
    import signal as sig

    from edgetrain import child

    assert child.death(2) == "failed with exit code 2"
    for name in ("SIGSEGV", "SIGBUS", "SIGABRT", "SIGKILL", "SIGILL"):
        text = child.death(-int(getattr(sig, name)))
        assert text.startswith(f"crashed with {name}")
        if name == "SIGKILL":
            assert "out of memory" in text
