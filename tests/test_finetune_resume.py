"""Power-cut safety as a class: SIGKILL at every phase, for every --train-layers choice, with and without a
replaced output layer; resuming must end with weights bitwise identical to an uninterrupted run.

The kill is exact, not a race: EDGETRAIN_TEST_KILL_AT=PHASE:N (edgetrain.training.checkpoint.kill_point) makes
the real child process SIGKILL itself the N-th time it reaches PHASE.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clitools import run_edgetrain

pytestmark = pytest.mark.slow

MODELS = {"replaced-head": "edgetrain.nets:pretrained_digits",  # 5 outputs, the data has 10 classes
          "kept-head": "edgetrain.nets:digits_cnn"}             # 10 outputs: the output layer is kept
# a Gluon model trains as its ONNX export, written back as PREFIX: the modes that freeze a part, and all
LAYERS = ("head", "last:2", "all")
# last:2 of a model whose trained part holds a LayerNorm's ops (conftest.layernorm_prefix)
# an ONNX file (the device's input, no mxnet), every --train-layers choice it takes
ONNX_LAYERS = ("head", "last:2", "bias", "lite", "all")
CASES = ([(m, layers) for m in MODELS for layers in LAYERS] + [("layernorm-tail", "last:2")]
         + [("onnx", layers) for layers in ONNX_LAYERS])
NO_FEATURE_PASS = {("replaced-head", "all"), ("kept-head", "all"), ("onnx", "bias"), ("onnx", "lite"),
                   ("onnx", "all")}
# 240 training rows / batch 16 = 15 steps per epoch; the feature pass writes 10 batches of 32 rows
KILLS = {"feature pass": "features:3", "mid-epoch": "step:20", "between epochs": "epoch:1",
         "saving the first checkpoint": "save:1", "saving a later checkpoint": "save:2"}
EPOCHS = 3


def _args(model: str, layers: str, data: Path, out: Path, epochs: int = EPOCHS) -> list:
    return ["finetune", model, "--data", data, "-o", out, "--train-layers", layers, "--batch-size", "16",
            "--epochs", str(epochs), "--seed", "5", "--threads", "1", "--val-split", "0.2",
            "--allow-chance"]  # what is checked here is the weights (layernorm-tail's model has random ones)


def _final(out: Path) -> Path:
    return out / "model.onnx" if (out / "model.onnx").exists() or not (out / "model-0000.params").exists() \
        else out / "model-0000.params"


def _params(out: Path) -> dict:
    if _final(out).suffix == ".onnx":
        import onnx
        from onnx import numpy_helper

        return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out / "model.onnx")).graph.initializer}
    import mxnet as mx

    return {k: v.asnumpy() for k, v in mx.nd.load(str(out / "model-0000.params")).items()}


def _killed_run(args: list, kill: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "EDGETRAIN_DEBUG"}
    env["EDGETRAIN_TEST_KILL_AT"] = kill
    return subprocess.run([sys.executable, "-m", "edgetrain", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


_references: dict = {}


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """The head-only path's per-user export cache, kept out of the user's home."""
    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "edgetrain-cache"))


@pytest.fixture
def model_ref(layernorm_prefix, digits5_onnx):
    return lambda kind: {"layernorm-tail": str(layernorm_prefix), "onnx": str(digits5_onnx)}.get(kind) or MODELS[kind]


@pytest.fixture
def reference(digits_npz, tmp_path_factory, model_ref):
    def get(model_kind: str, layers: str) -> dict:
        key = (model_kind, layers)
        if key not in _references:
            out = tmp_path_factory.mktemp("ref") / "run"
            res = run_edgetrain(*_args(model_ref(model_kind), layers, digits_npz, out), "--json", "-")
            assert res.code == 0, res.err
            _references[key] = _params(out)
        return _references[key]
    return get


def _assert_identical(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for k in want:
        assert got[k].dtype == want[k].dtype and np.array_equal(got[k], want[k]), \
            f"{k}: max diff {np.abs(got[k] - want[k]).max()}"


@pytest.mark.parametrize("phase", list(KILLS))
@pytest.mark.parametrize("model_kind,layers", CASES)
def test_sigkill_then_resume_gives_identical_weights(model_kind, layers, phase, digits_npz, reference, model_ref,
                                                     tmp_path):
    if phase == "feature pass" and (model_kind, layers) in NO_FEATURE_PASS:
        pytest.skip("nothing is frozen whole: there is no feature pass to kill")
    out = tmp_path / "run"
    args = _args(model_ref(model_kind), layers, digits_npz, out)
    killed = _killed_run(args, KILLS[phase], tmp_path)
    assert killed.returncode == -signal.SIGKILL, f"not killed at {phase}: exit {killed.returncode}\n{killed.stderr}"
    assert not (out / "model-0000.params").exists() and not (out / "model.onnx").exists(), \
        "a killed run must not leave a final model"
    res = run_edgetrain(*args, "--resume", "--json", "-", cwd=tmp_path)
    assert res.code == 0, res.err
    _assert_identical(_params(out), reference(model_kind, layers))
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")], "temp files left behind"
    assert not (out / "features.cache").exists()


@pytest.mark.parametrize("model_kind,layers", CASES)
def test_a_finished_run_extended_with_more_epochs_matches_one_long_run(model_kind, layers, digits_npz, reference,
                                                                       model_ref, tmp_path):
    out = tmp_path / "run"
    first = run_edgetrain(*_args(model_ref(model_kind), layers, digits_npz, out, epochs=EPOCHS - 1), cwd=tmp_path)
    assert first.code == 0, first.err
    res = run_edgetrain(*_args(model_ref(model_kind), layers, digits_npz, out), "--resume", "--json", "-", cwd=tmp_path)
    assert res.code == 0, res.err
    assert res.json()["resumed_from"] == {"epoch": EPOCHS - 1, "step": 0}
    _assert_identical(_params(out), reference(model_kind, layers))
