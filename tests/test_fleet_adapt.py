"""A fleet adapts with --train-layers bias and lite (issue 23, item 5): a real loopback fleet of the shipped
ONNX base (the digits model's export, trained on digits 0-4), the coordinator and two devices as
`edgetrain fleet` processes in which mxnet cannot be imported (a stand-in ``mxnet`` package that raises,
ahead of the real one: the device's environment, as tests/test_device_loop.py makes it). What travels is
the trainable arrays only; the lite modules start identical on every side (from the coordinator, at zero
output); the global arrays move; the written model predicts what the coordinator measured."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from clitools import run_edgetrain  # noqa: E402
from fleettools import make_shares, no_mxnet, onnx_reference, report  # noqa: E402


@pytest.fixture(scope="module")
def shares(tmp_path_factory):
    return make_shares(tmp_path_factory)


def _arrays(path: Path) -> dict[str, np.ndarray]:
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.slow
@pytest.mark.parametrize("layers", ["bias", "lite"])
def test_a_fleet_of_an_onnx_base_adapts_with_bias_and_lite_without_mxnet(layers, tmp_path_factory, shares):
    """The run is the fault-free one tests/test_fleet_faults.py compares its kills with (made once a session):
    two rounds, 2-bit updates with SCAFFOLD, --export int8."""
    folder = onnx_reference(tmp_path_factory, shares, tmp_path_factory.mktemp("fleet-cache"), layers)[2]
    run, env = folder / "run", no_mxnet(tmp_path_factory.getbasetemp())
    res = report(run)
    assert res["passed"] and res["rounds_completed"] == 2 and res["train_layers"] == layers
    start, end = _arrays(run / "global-0000.npz"), _arrays(run / "global-0002.npz")
    # what travels is the trainable part: biases and BatchNorm shifts (and the output layer, which learns the
    # new classes); with lite, the modules' weights too; never a frozen convolution weight or a statistic
    frozen = [k for k in start if k.endswith("_weight") and not k.startswith(("lite", "digits_dense"))]
    assert not frozen, frozen
    assert any(k.endswith("_beta") for k in start) and "digits_dense0_weight" in start
    lite = [k for k in start if k.startswith("lite")]
    assert bool(lite) == (layers == "lite")
    for k in lite:  # each module's output projection starts at zero: the model starts as the base
        if "conv2" in k:
            assert not start[k].any(), k
    moved = [k for k in start if not np.array_equal(start[k], end[k])]
    assert set(moved) == set(start), sorted(set(start) - set(moved))
    assert res["final_accuracy"] > res["initial_accuracy"] + 0.1, (res["initial_accuracy"], res["final_accuracy"])
    # the deployable model is the ONNX file (a fleet of an .onnx base has no PREFIX), and predict agrees with
    # the coordinator's held-out check, in the device's environment
    assert set(res["models"]) == {"onnx", "int8"}
    pred = run_edgetrain("predict", res["models"]["onnx"], shares["val"], "--json", "-", "--threads", 1, env=env)
    assert pred.code == 0, pred.err
    out = json.loads(pred.out)
    assert abs(out["accuracy"]["top1"] / 100 - res["final_accuracy"]) <= 1 / out["accuracy"]["samples"] + 1e-9
    for kind in ("onnx", "int8"):
        prof = run_edgetrain("profile", res["models"][kind], "--runs", 3, "--warmup", 1, "--threads", 1, "--json", "-",
                             env=env)
        assert prof.code == 0, prof.err


