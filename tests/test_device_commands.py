"""Every device command runs, and none imports mxnet (issue 36, item 2): finetune from the shipped ONNX base in
every --train-layers mode, quantize, predict, profile with and without --device, `energy attribute`, `energy
calibrate`, `fleet join`, tune, and `edgetrain run`'s device loop (item 1), each a real `edgetrain` process.

"Imports none" is recorded, not assumed: every process (and every child it starts) finds, ahead of any real
mxnet, an ``mxnet`` package that appends the importing stack to a log and raises ImportError. A command that
tries mxnet and falls back fails here too (its log is not empty), not only one that needs it. CI's `device`
stage runs this file where mxnet was never installed, its `oldest` stage on the oldest onnxruntime, onnx, numpy
and Pillow pyproject.toml allows, and its `python3.10` stage on JetPack 6's Python."""
from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import edgetrain
import metertools
from clitools import run_edgetrain

SHIPPED = Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx"
LAYERS = ("head", "last:2", "bias", "lite", "all")

BLOCKER = '''import os, traceback
with open(os.environ["MXNET_BLOCKER_LOG"], "a", encoding="utf-8") as log:
    log.write("mxnet imported by pid %d:\\n%s\\n" % (os.getpid(), "".join(traceback.format_stack())))
raise ImportError("No module named mxnet (this is the device: tests/test_device_commands.py)")
'''


@pytest.fixture(scope="module")
def blocker(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("no-mxnet")
    (folder / "mxnet").mkdir()
    (folder / "mxnet" / "__init__.py").write_text(BLOCKER)
    return folder


@pytest.fixture
def device(blocker, tmp_path):
    """run(*argv, env=...) as the device would; the test fails if anything tried to import mxnet."""
    log = tmp_path / "mxnet-imports.log"
    path = os.pathsep.join(p for p in (str(blocker), os.environ.get("PYTHONPATH")) if p)

    def run(*argv, env: dict | None = None, timeout: float = 600):
        res = run_edgetrain(*argv, env={**run.env, **(env or {})}, timeout=timeout)
        assert not log.exists(), f"`edgetrain {argv[0]}` imported mxnet:\n{log.read_text()[-4000:]}"
        return res

    run.log = log
    run.env = {"PYTHONPATH": path, "MXNET_BLOCKER_LOG": str(log), "EDGETRAIN_CACHE_DIR": ""}
    return run


def test_the_blocker_records_an_import_even_one_that_is_caught(device, blocker, tmp_path):
    """The check can fail: a process that imports mxnet and catches the error is caught."""
    import subprocess

    env = {**os.environ, "PYTHONPATH": str(blocker), "MXNET_BLOCKER_LOG": str(device.log)}
    subprocess.run([sys.executable, "-c", "try:\n import mxnet\nexcept ImportError:\n pass"], env=env, check=True)
    assert "mxnet imported by pid" in device.log.read_text()


@pytest.fixture(scope="module")
def digits(tmp_path_factory) -> Path:
    """600 training and 200 held-out digits as .npz (what a device holds), the base as the host exported it."""
    from edgetrain.data import load_data
    from edgetrain.preprocess import Preprocess

    folder = tmp_path_factory.mktemp("digits")
    shutil.copyfile(SHIPPED, folder / "digits5.onnx")
    x, y = load_data("builtin:digits", Preprocess(input_shape=(1, 8, 8), mean=(0.0,), std=(1.0,))).arrays(800)
    np.savez(folder / "train.npz", data=x[:600, 0], label=y[:600])
    np.savez(folder / "val.npz", data=x[600:, 0], label=y[600:])
    return folder


@pytest.mark.parametrize("layers", LAYERS)
def test_finetune_from_onnx_in_every_mode_imports_no_mxnet(layers, digits, device, tmp_path):
    res = device("finetune", digits / "digits5.onnx", "--data", digits / "train.npz", "--val", digits / "val.npz",
                 "-o", tmp_path / "run", "--train-layers", layers, "--epochs", "2", "--threads", "1", "--json", "-")
    assert res.code == 0, res.err
    assert (tmp_path / "run" / "model.onnx").is_file() and res.json()["final_accuracy"] > 0.3


@pytest.fixture(scope="module")
def tuned(digits, tmp_path_factory) -> Path:
    """A fine-tuned model.onnx (bias mode), for the commands after fine-tuning."""
    out = tmp_path_factory.mktemp("tuned") / "run"
    res = run_edgetrain("finetune", digits / "digits5.onnx", "--data", digits / "train.npz", "-o", out,
                        "--train-layers", "head", "--epochs", "2", "--threads", "1", env={"EDGETRAIN_CACHE_DIR": ""})
    assert res.code == 0, res.err
    return out / "model.onnx"


def test_quantize_and_predict_import_no_mxnet(tuned, digits, device, tmp_path):
    q = device("quantize", tuned, "--calib", digits / "train.npz", "--val", digits / "val.npz", "-o",
               tmp_path / "int8.onnx", "--max-drop", "100", "--threads", "1", "--json", "-")
    assert q.code == 0, q.err
    p = device("predict", tmp_path / "int8.onnx", digits / "val.npz", "--threads", "1", "--json", "-")
    assert p.code == 0, p.err
    assert p.json()["accuracy"]["samples"] == 200


def test_tune_imports_no_mxnet(digits, device, tmp_path):
    """tune trains its grid's points from the ONNX base in its own children (each a real process), the best
    model.onnx written: all of it without mxnet."""
    out = tmp_path / "tune"
    res = device("tune", digits / "digits5.onnx", "--data", digits / "train.npz", "--val", digits / "val.npz",
                 "--grid", "lr=0.01,0.1", "--grid", "train_layers=head", "--epochs", "2", "--threads", "1",
                 "-o", out, "--json", "-")
    assert res.code == 0, res.err
    d = res.json()
    assert (out / "model.onnx").is_file() and (out / "trials.csv").is_file()
    assert [t["status"] for t in d["trials"]].count("chosen") == 1, d["trials"]
    assert not [t for t in d["trials"] if t["status"] == "failed"], d["trials"]


def _the_device_loop_ran(res, rundir: Path) -> dict:
    assert res.code == 0, res.err
    d = json.loads((rundir / "result.json").read_text())
    assert [(s["name"], s["status"]) for s in d["steps"]] == [
        ("finetune", "done"), ("quantize", "done"), ("profile", "done"), ("report", "done")], d["steps"]
    assert (rundir / "finetune" / "model.onnx").is_file() and (rundir / "model_int8.onnx").is_file()
    assert (rundir / "report.html").is_file()
    s = d["summary"]
    assert s["accuracy_int8_pct"] > 50 and s["energy_per_inference_mj"] > 0 and s["battery_life_days"] > 0, s
    return d


def test_run_on_a_device_runs_the_quickstarts_device_loop_from_the_shipped_onnx_base(device, tmp_path):
    """`edgetrain run quickstart-device`: fine-tune the shipped ONNX base, quantize, profile with the energy report,
    every step a child, none importing mxnet (issue 36, item 1)."""
    rundir = tmp_path / "run"
    _the_device_loop_ran(device("run", "quickstart-device", "-o", rundir), rundir)


def test_run_with_no_recipe_is_the_device_loop_where_mxnet_is_not_installed(tmp_path):
    """The default recipe follows the install: the quickstart on the host, its device loop on a device."""
    import importlib.util

    if importlib.util.find_spec("mxnet") is not None:
        pytest.skip("a device's check: mxnet is installed here (the host runs the Gluon quickstart)")
    rundir = tmp_path / "run"
    d = _the_device_loop_ran(run_edgetrain("run", "-o", rundir, env={"EDGETRAIN_CACHE_DIR": ""}), rundir)
    assert d["recipe"] == "quickstart-device"


def test_a_recipe_from_an_onnx_file_refuses_an_export_step_before_any_work(device, tmp_path):
    from clitools import assert_user_error

    recipe = tmp_path / "r.yaml"
    recipe.write_text("name: r\ndevice: rpi4b-4gb\nmodel: builtin:digits5.onnx\ndata: builtin:digits\n"
                      "steps:\n  - finetune:\n  - export:\n")
    res = device("run", recipe, "-o", tmp_path / "run")
    assert_user_error(res, 2, "the export step needs a Gluon model", "steps[1]")
    assert not (tmp_path / "run").exists()
    recipe.write_text("name: r\ndevice: rpi4b-4gb\nmodel: builtin:digits9.onnx\ndata: builtin:digits\n"
                      "steps:\n  - finetune:\n")
    assert_user_error(device("run", recipe, "-o", tmp_path / "run"), 2, "no ONNX model 'builtin:digits9.onnx'",
                      "builtin:digits5.onnx")


@pytest.mark.parametrize("target", [None, "rpi4b-4gb", "rpi-zero2w"])
def test_profile_with_and_without_a_device_imports_no_mxnet(tuned, device, target):
    """With --device the host's latency is set against the profile's speed reference (MobileNetV2-1.0, written
    as ONNX without mxnet: edgetrain/measure/reference_net.py); it used to stop on "mxnet 1.9.1 is not
    installed" after 8-29 s."""
    more = ["--device", target] if target else []
    res = device("profile", tuned, "--runs", "5", "--warmup", "1", "--threads", "1", *more, "--json", "-")
    assert res.code == 0, res.err
    d = res.json()
    assert d["best"]["p50_ms"] > 0
    if target:
        latency = d["verdict"]["latency"]
        assert latency["provenance"] == "estimated" and latency["p50_ms"] > 0, latency
        assert latency["reference"]["host_runtime"].startswith("onnxruntime"), latency["reference"]


def test_energy_attribute_imports_no_mxnet(tuned, device, tmp_path):
    """A `profile --meter-export` result (on a profile of this machine) and a meter's export covering it."""
    result = tmp_path / "profile.json"
    res = device("profile", tuned, "--device", metertools.this_host(tmp_path), "--meter-export", "--json", result,
                 "--warmup", "1", "--runs", "20", "--threads", "1", env=metertools.sensor_env(tmp_path / "empty-sys"))
    assert res.code == 0, res.err
    start, seconds = metertools.recording(result)
    log = metertools.otii_export(tmp_path / "Main power - Arc.csv", seconds, lambda s: 3.25, hz=200)
    att = device("energy", "attribute", result, log, "--power-log-start", metertools.stamp(start), "-o",
                 tmp_path / "measured.json")
    assert att.code == 0, att.err
    assert json.loads((tmp_path / "measured.json").read_text())["passed"]


def test_energy_calibrate_imports_no_mxnet(device, tmp_path):
    """The board: a sensor tree whose power steps; the meter: a UM34C log of the board's input (tests/metertools)."""
    root = metertools.hwmon_tree(tmp_path / "sys", metertools.LEVELS_UW[0])
    log = metertools.um34c_log(tmp_path / "um34c.csv")
    board = metertools.board_and_meter(root, log, 1.1, 0.5, seconds=7.0)
    try:
        time.sleep(0.5)
        res = device("energy", "calibrate", log, "-o", tmp_path / "cal.json", "--seconds", "5", "--phase", "0.5",
                     "--json", "-", env=metertools.sensor_env(root, XDG_CONFIG_HOME=str(tmp_path / "config")))
    finally:
        board.wait(timeout=30)
    assert res.code == 0, res.err
    assert res.json()["gain"] == pytest.approx(1.1, rel=0.05)


def test_fleet_join_imports_no_mxnet(digits, device, tmp_path):
    """A coordinator of the ONNX base on loopback and one device joining it, both without mxnet."""
    pytest.importorskip("flwr", reason="`fleet join` needs the fleet extra (CI's device stage installs it)")
    from fleettools import Fleet, make_shares

    shares = make_shares(_Folders(tmp_path))
    f = Fleet(tmp_path, tmp_path / "cache")
    f.shares, f.model, f.join_args = shares, str(SHIPPED), ("--model", str(SHIPPED))
    blocked = {k: v for k, v in device.env.items() if k != "EDGETRAIN_CACHE_DIR"}
    try:
        f.serve(tmp_path / "fleet", "--rounds", "1", "--min-clients", "1", "--train-layers", "head", "--export", "none",
                env=blocked)
        f.join("device0", shares["devices"][0], env=blocked)
        code, _, err = f.wait("device0")
        assert code == 0, err
        code, _, err = f.wait("serve", timeout=120)
        assert code == 0, err
    finally:
        assert not f.close()
    assert not device.log.exists(), device.log.read_text()[-4000:]


class _Folders:
    """tmp_path_factory's mktemp, for make_shares inside one test."""

    def __init__(self, root: Path):
        self.root = root

    def mktemp(self, name: str) -> Path:
        path = self.root / name
        path.mkdir()
        return path


def test_the_speed_reference_written_without_mxnet_is_the_zoo_export_op_for_op(tmp_path):
    """What `profile --device` times as the profile's reference (reference_net) is the graph `edgetrain export
    zoo:mobilenetv2_1.0` writes: the same ops, attributes, weight names and shapes, in the same order."""
    import importlib.util

    if importlib.util.find_spec("mxnet") is None:
        pytest.skip("the host's check: needs mxnet to export")
    import onnx
    from onnx import helper

    from edgetrain.measure import reference_onnx

    res = run_edgetrain("export", "zoo:mobilenetv2_1.0", "--input-shape", "3,224,224", "-o", tmp_path / "zoo.onnx")
    assert res.code == 0, res.err
    exported = onnx.load(str(tmp_path / "zoo.onnx"))
    built = onnx.load_from_string(reference_onnx("mobilenetv2_1.0", dynamic_batch=True))

    def signature(m):
        shapes = {i.name: tuple(i.dims) for i in m.graph.initializer}
        return [(n.op_type, [(i, shapes.get(i)) for i in n.input], list(n.output),
                 sorted((a.name, str(helper.get_attribute_value(a))) for a in n.attribute)) for n in m.graph.node]

    assert signature(built) == signature(exported)
    assert [i.name for i in built.graph.input] == [i.name for i in exported.graph.input]
    assert [o.name for o in built.graph.output] == [o.name for o in exported.graph.output]
    assert built.opset_import[0].version == exported.opset_import[0].version == 13


# --- the smallest board: the Pi Zero 2 W's profile (devices/rpi-zero2w.yaml, memory budget 320 MB of 512) -------

@pytest.fixture(scope="module")
def mobilenet(tmp_path_factory) -> dict:
    """MobileNetV2-1.0 (the zoo's graph, written without mxnet) at 96x96 and at 512x512, and 32 digits."""
    from edgetrain.data import load_data
    from edgetrain.measure import reference_onnx
    from edgetrain.preprocess import Preprocess

    folder = tmp_path_factory.mktemp("mobilenet")
    out = {}
    for side in (96, 512):
        out[side] = folder / f"mobilenetv2-{side}.onnx"
        out[side].write_bytes(reference_onnx("mobilenetv2_1.0", side=side, classes=5, dynamic_batch=True))
    x, y = load_data("builtin:digits", Preprocess(input_shape=(1, 8, 8), mean=(0.0,), std=(1.0,))).arrays(32)
    np.savez(folder / "digits32.npz", data=x[:, 0], label=y)
    out["data"] = folder / "digits32.npz"
    return out


def test_the_zero_2_w_refuses_a_finetune_that_would_not_fit_in_one_line_before_the_work(mobilenet, device, tmp_path):
    """Every weight of MobileNetV2 at 512x512 needs about 500 MB even one sample at a time, and its BatchNorm trains on
    2 or more: the Zero 2 W's profile refuses it before any training (exit 2, one line naming the floor and why,
    nothing written)."""
    from clitools import assert_user_error

    res = device("finetune", mobilenet[512], "--data", mobilenet["data"], "-o", tmp_path / "run", "--train-layers",
                 "all", "--device", "rpi-zero2w", "--epochs", "1")
    assert_user_error(res, 2, "memory budget 320 MB is too small", "micro-batch 2 (BatchNorm trains on each")
    assert not (tmp_path / "run").exists()


def test_the_zero_2_w_plans_lite_at_96_within_its_budget(mobilenet, device, tmp_path):
    res = device("finetune", mobilenet[96], "--data", mobilenet["data"], "-o", tmp_path / "run", "--train-layers",
                 "lite", "--device", "rpi-zero2w", "--epochs", "1", "--json", "-")
    assert res.code == 0, res.err
    d = res.json()
    assert d["budget_mb"] == 320 and d["plan"]["estimate_mb"] <= 320, d["plan"]
    assert d["peak_rss_mb"] <= 352, d["peak_rss_mb"]   # what the Zero 2 W leaves a run: 512 - its 160 MB OS reserve


def test_the_zero_2_w_refuses_a_quantize_that_would_not_fit_in_one_line_before_the_work(mobilenet, device, tmp_path):
    """MobileNetV2 at 512x512: every tensor of one sample is about 420 MB (275 MB once BatchNorm is folded), and
    calibration and the per-node SQNR pass hold one sample's of the fp32 and the int8 model: the Zero 2 W's 320 MB
    budget refuses it from the graph alone."""
    from clitools import assert_user_error

    res = device("quantize", mobilenet[512], "--calib", mobilenet["data"], "-o", tmp_path / "int8.onnx",
                 "--device", "rpi-zero2w")
    assert_user_error(res, 2, "quantizing needs about", "more than rpi-zero2w's memory budget of 320 MB",
                      "quantize on the host")
    assert not list(tmp_path.iterdir())


def test_the_zero_2_w_quantizes_mobilenet_at_96_within_its_budget_and_its_board(mobilenet, device, tmp_path):
    """The plan says it fits, and it does: the process's peak RSS (imports included, read by the kernel as the
    child's high-water mark) stays within what the Zero 2 W leaves a run (512 MB less its 160 MB OS reserve)."""
    import subprocess

    out = tmp_path / "int8.onnx"
    argv = [sys.executable, "-m", "edgetrain", "quantize", str(mobilenet[96]), "--calib", str(mobilenet["data"]),
            "-o", str(out), "--device", "rpi-zero2w", "--json", str(tmp_path / "q.json")]
    peak = ("import resource, subprocess, sys\n"
            "code = subprocess.run(sys.argv[1:]).returncode\n"
            "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)")
    proc = subprocess.run([sys.executable, "-c", peak, *argv], capture_output=True, text=True, timeout=900,
                          env={**os.environ, **device.env})
    assert not device.log.exists(), device.log.read_text()[-4000:]
    code, peak_mb = proc.stdout.splitlines()[-1].split()  # after the command's own report
    assert code == "0", proc.stderr
    notes = json.loads((tmp_path / "q.json").read_text())["notes"]
    plan = next(n for n in notes if n.startswith("memory plan: about"))
    assert "within rpi-zero2w's memory budget of 320 MB" in plan
    assert out.is_file() and float(peak_mb) <= 352, (peak_mb, plan)
