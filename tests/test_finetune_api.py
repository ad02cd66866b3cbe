"""finetune in-process (edgetrain.api): the plan's choices (micro-batches, disk cache) change memory, not the
result; head only and last:2 of a Gluon model (trained as its ONNX export, no mxnet in the process), and last:2
of one whose trained part has a LayerNorm."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgetrain.training import memplan
from edgetrain.api import finetune as finetune_model


LAYERS = ("head", "last:2", "layernorm-tail")  # layernorm-tail: last:2 of conftest.layernorm_prefix


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """The head-only path's per-user export cache, kept out of the user's home."""
    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "edgetrain-cache"))


@pytest.fixture(params=LAYERS)
def layers(request, layernorm_prefix):
    if request.param == "layernorm-tail":
        return ("last:2", str(layernorm_prefix))
    return (request.param, "edgetrain.nets:pretrained_digits")


def _run(data, out, layers, **kw):
    train_layers, model = layers
    res = finetune_model(model, str(data), out, epochs=3, seed=3, train_layers=train_layers, allow_chance=True, **kw)
    import mxnet as mx

    return res, {k: v.asnumpy() for k, v in mx.nd.load(str(Path(out) / "model-0000.params")).items()}


_refs: dict = {}


@pytest.fixture
def reference(digits_npz, tmp_path_factory, layers):
    if layers not in _refs:
        _refs[layers] = _run(digits_npz, tmp_path_factory.mktemp("ref") / "o", layers)
    return _refs[layers]


def test_micro_batches_accumulate_to_the_full_batch_update(digits_npz, reference, tmp_path, monkeypatch, layers):
    """With BatchNorm the base's affine map (its statistics frozen: head, and here last:2 with training mode off),
    micro-batches sum to the same gradient whatever trains. (In training mode, engine_onnx.BATCH_STATS, a
    micro-batch normalises by its own statistics, as PyTorch's would: another update, by design.)"""
    from edgetrain.training import engine_onnx

    ref_res, ref_params = reference
    if engine_onnx.BATCH_STATS and layers[0] != "head":
        monkeypatch.setattr(engine_onnx, "BATCH_STATS", ())
        ref_res, ref_params = _run(digits_npz, tmp_path / "ref", layers)
    assert ref_res.plan["micro_batch"] == 32 and ref_res.plan["cache"] == "memory"
    monkeypatch.setattr(memplan, "UNBUDGETED_TRAIN_MB", 0.0)  # forces micro-batch 1: 32 backward passes per step
    res, params = _run(digits_npz, tmp_path / "o", layers)
    assert res.plan["micro_batch"] == 1
    # Adam divides by sqrt(v): 32 micro-batches summed in another order than one batch move a weight whose gradient
    # is near zero by a few 1e-5 over the run (measured 4.5e-5 on one of LayerNorm's tail's 1,152 weights); a
    # micro-batch missing from the sum takes 1/32 of every step's gradient away
    for k in params:
        np.testing.assert_allclose(params[k], ref_params[k], rtol=1e-4, atol=1e-4, err_msg=k)


def test_disk_feature_cache_trains_the_same_model(digits_npz, reference, tmp_path, monkeypatch, layers):
    _, ref_params = reference
    monkeypatch.setattr(memplan, "UNBUDGETED_CACHE_MB", 0.0)
    res, params = _run(digits_npz, tmp_path / "o", layers)
    assert res.plan["cache"] == "disk"
    for k in params:
        np.testing.assert_array_equal(params[k], ref_params[k], err_msg=k)
    assert not (tmp_path / "o" / "features.cache").exists(), "the cache file is removed when the run is done"


def test_last_partial_batch_is_masked(digits_npz, tmp_path, layers):
    # 240 training samples, batch 64: the last step has 48 real rows padded to 64; accuracy counts only real rows
    res, _ = _run(digits_npz, tmp_path / "o", layers, batch_size=64, val_split=0.2)
    first = res.epochs[0]
    assert first["samples"] == 240
    assert abs(first["train_accuracy"] * 240 - round(first["train_accuracy"] * 240)) < 1e-6


def test_interrupted_run_reuses_its_disk_feature_cache(digits_npz, reference, tmp_path, monkeypatch, layers):
    import os
    import signal

    from edgetrain.training import Interrupted

    _, ref_params = reference
    monkeypatch.setattr(memplan, "UNBUDGETED_CACHE_MB", 0.0)

    def stop_after_first_epoch(event):
        if event.stage == "epoch" and event.metrics.get("epoch") == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # caught by finetune: checkpoint, then Interrupted

    with pytest.raises(Interrupted) as err:
        _run(digits_npz, tmp_path / "o", layers, progress=stop_after_first_epoch)
    assert err.value.exit_code == 128 + signal.SIGTERM
    assert (tmp_path / "o" / "features.cache").exists()
    res, params = _run(digits_npz, tmp_path / "o", layers, resume=True)
    assert "feature cache on disk reused from the interrupted run" in res.notes
    assert res.resumed_from == {"epoch": 1, "step": 0}
    for k in params:
        np.testing.assert_array_equal(params[k], ref_params[k], err_msg=k)


def test_cache_interrupted_mid_pass_is_computed_again(digits_npz, reference, tmp_path, monkeypatch, layers):
    import os
    import signal

    from edgetrain.training import Interrupted

    _, ref_params = reference
    monkeypatch.setattr(memplan, "UNBUDGETED_CACHE_MB", 0.0)

    def stop_in_feature_pass(event):
        if event.stage == "features":
            os.kill(os.getpid(), signal.SIGINT)

    with pytest.raises(Interrupted):
        _run(digits_npz, tmp_path / "o", layers, progress=stop_in_feature_pass)
    res, params = _run(digits_npz, tmp_path / "o", layers, resume=True)
    assert "feature cache on disk reused from the interrupted run" not in res.notes
    for k in params:
        np.testing.assert_array_equal(params[k], ref_params[k], err_msg=k)
