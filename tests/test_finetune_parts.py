"""The parts of `edgetrain finetune`: graph split, checkpoints, feature cache, memory plan (real MXNet)."""
from __future__ import annotations

import numpy as np
import pytest

from edgetrain.training import checkpoint as ckpt
from edgetrain.errors import UsageError
from edgetrain.training.featurecache import FeatureCache
from edgetrain.training.memplan import Costs, choose
from edgetrain.options import FinetuneOptions, TrainLayers


@pytest.mark.parametrize("text,fragment", [("last:0", "trains nothing"), ("tail", "cannot read"),
                                           ("last:x", "cannot read")])
def test_bad_train_layers(text, fragment):
    with pytest.raises(UsageError, match=fragment):
        TrainLayers(text)
    with pytest.raises(UsageError, match=fragment):   # the declaration reads it so, from the API as from the CLI
        FinetuneOptions.parse({"data": "d", "out": "o", "train_layers": text})


@pytest.mark.parametrize("text,kind,n,canonical", [("head", "last", 1, "head"), (" LAST:1", "last", 1, "head"),
                                                   ("last:3", "last", 3, "last:3"), ("Bias", "bias", 1, "bias"),
                                                   ("lite", "lite", 1, "lite"), ("all", "all", 1, "all")])
def test_train_layers_is_parsed_once_into_one_value(text, kind, n, canonical):
    """The declaration's value is what every consumer reads: its meaning (kind, n), and its text wherever it
    travels as text (JSON, a recipe, a fleet message, a pickle), read back to the same value."""
    import copy
    import json
    import pickle

    value = FinetuneOptions.parse({"data": "d", "out": "o", "train_layers": text}).train_layers
    assert isinstance(value, TrainLayers) and (value.kind, value.n) == (kind, n) and value == canonical
    assert json.loads(json.dumps({"t": value}))["t"] == canonical
    for again in (pickle.loads(pickle.dumps(value)), copy.deepcopy(value), TrainLayers(value), TrainLayers(str(value))):
        assert isinstance(again, TrainLayers) and (again.kind, again.n) == (kind, n)
    assert value.head_only == (canonical == "head")


def test_checkpoint_round_trip_and_refusals(tmp_path):
    arrays = {"param/w": np.arange(6, dtype=np.float32).reshape(2, 3), "order": np.arange(5)}
    fp = {"classes": ["a", "b"], "model": "m1", "seed": 0}
    path = tmp_path / "checkpoint.npz"
    ckpt.save(path, {"fingerprint": fp, "epoch": 2}, arrays)
    meta, back = ckpt.load(path)
    assert meta["epoch"] == 2 and np.array_equal(back["param/w"], arrays["param/w"])
    ckpt.check_matches(meta, fp, path)
    with pytest.raises(UsageError, match=r"data classes differ.*checkpoint has 2 \(a, b\), data has 3"):
        ckpt.check_matches(meta, {**fp, "classes": ["a", "b", "c"]}, path)
    with pytest.raises(UsageError, match="model differ"):
        ckpt.check_matches(meta, {**fp, "model": "m2"}, path)
    raw = bytearray(path.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    path.write_bytes(bytes(raw))
    with pytest.raises(UsageError, match="corrupt|checksum"):
        ckpt.load(path)
    path.write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(UsageError, match="corrupt or truncated"):
        ckpt.load(path)
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.npz"], "temp files left behind"


def test_rng_state_round_trip():
    rng = np.random.RandomState(3)
    rng.permutation(10)
    meta, arrays = ckpt.rng_to_arrays(rng)
    again = ckpt.rng_from(meta, arrays["rng_keys"])
    assert np.array_equal(again.permutation(50), rng.permutation(50))


def test_feature_cache_on_disk_reads_what_memory_holds(tmp_path):
    values = np.random.RandomState(1).rand(10, 4, 2).astype("float32")
    caches = [FeatureCache(10, (4, 2), "memory"), FeatureCache(10, (4, 2), "disk", tmp_path / "f.cache")]
    for c in caches:
        c.write(0, values[:6])
        c.write(6, values[6:])
    idx = np.array([9, 0, 3, 3])
    for c in caches:
        np.testing.assert_array_equal(c.read(idx), values[idx])
    caches[1].close(delete=True)
    assert not (tmp_path / "f.cache").exists()


def _costs(**kw):
    base = dict(base_mb=150.0, frozen_per_sample=25.0, train_per_sample=0.1, params_mb=0.1,
                input_per_sample=0.3, cache_rows=256, feature_bytes=5120, effective_batch=32, has_frozen=True)
    return Costs(**{**base, **kw})


def test_plan_shrinks_the_feature_batch_to_fit_the_budget():
    small = dict(frozen_per_sample=0.3)   # a pass of 32 samples within memplan.FROZEN_PASS_MB
    roomy = choose(_costs(**small), 4096)
    tight = choose(_costs(**small), 195)
    assert roomy.feature_batch == 32 and roomy.micro_batch == 32 and roomy.cache == "memory"
    assert tight.feature_batch < 32 and tight.estimate_mb <= 195
    # a frozen part whose one sample takes more than FROZEN_PASS_MB passes one sample at a time, budget or not
    assert choose(_costs(), 4096).feature_batch == choose(_costs(), None).feature_batch == 1


def test_plan_moves_the_cache_to_disk_when_memory_is_short():
    plan = choose(_costs(cache_rows=20000, feature_bytes=20000), 500)
    assert plan.cache == "disk"


def test_plan_refuses_with_what_would_fit():
    with pytest.raises(UsageError) as err:
        choose(_costs(), 160)
    assert "impossible" in err.value.fix and "too small" in err.value.what
    with pytest.raises(UsageError) as err:
        choose(_costs(frozen_per_sample=200.0), 300)
    assert "raise --memory-budget to at least" in err.value.fix and "--train-layers" in err.value.fix


@pytest.mark.parametrize("budget", [None, 4096, 300, 200, 195, 190])
def test_batchnorm_in_training_mode_is_never_planned_one_sample_at_a_time(budget):
    """min_micro 2 (BatchNorm normalising by the micro-batch's statistics): every budget plans 2 or more, or is
    refused naming micro-batch 2 and why; the same costs without it plan 1 where 2 does not fit."""
    costs = dict(has_frozen=False, train_per_sample=12.0, base_mb=140.0, effective_batch=32)
    try:
        plan = choose(_costs(**costs, min_micro=2), budget)
    except UsageError as err:
        assert budget is not None and "even micro-batch 2 (BatchNorm" in err.what
        assert choose(_costs(**costs), budget).micro_batch == 1   # the budget that only fits one sample
        return
    assert plan.micro_batch >= 2 and (budget is None or plan.estimate_mb <= budget)


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "uint8", "int32", "int8", "int64"])
def test_params_written_without_mxnet_are_byte_identical_to_mx_nd_save(dtype, tmp_path):
    import mxnet as mx

    rng = np.random.RandomState(0)
    arrays = {"arg:w": (rng.rand(3, 4, 1, 1) * 100).astype(dtype), "arg:b": (rng.rand(7) * 100).astype(dtype),
              "aux:scalar_like": (rng.rand(1) * 100).astype(dtype), "arg:ü-name": (rng.rand(2, 5) * 100).astype(dtype)}
    path = tmp_path / "m-0000.params"
    mx.nd.save(str(path), {k: mx.nd.array(v, dtype=dtype) for k, v in arrays.items()})
    assert ckpt.params_bytes(arrays) == path.read_bytes()
    for mapped in (False, True):  # mapped: read-only views of the file, the same arrays
        back = ckpt.read_params(path, mapped=mapped)
        assert list(back) == list(arrays)
        for k in arrays:
            assert back[k].dtype == arrays[k].dtype and np.array_equal(back[k], arrays[k])
            assert back[k].flags.writeable is not mapped  # nothing writes into the export cache through them
        assert ckpt.params_bytes(back) == path.read_bytes()  # written out again, byte for byte


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_numpy_optimizers_update_as_mxnet_does(name):
    """The NumPy optimizers make the updates MXNet's fused ops (what Gluon's Trainer runs) make."""
    import math

    import mxnet as mx

    from edgetrain.training.optimizers import make_numpy_optimizer

    rng = np.random.RandomState(1)
    w0 = rng.randn(5, 6).astype("float32")
    w, state = mx.nd.array(w0), [mx.nd.zeros(w0.shape), mx.nd.zeros(w0.shape)]
    mine = {"w": w0.copy()}
    opt = make_numpy_optimizer(name, mine, 0.05)
    for t in range(1, 6):
        g = rng.randn(*w0.shape).astype("float32")
        if name == "sgd":
            mx.nd.sgd_mom_update(w, mx.nd.array(g), state[0], out=w, lr=0.05, momentum=0.9, wd=1e-4)
        else:
            lr = 0.05 * math.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
            mx.nd.adam_update(w, mx.nd.array(g), state[0], state[1], out=w, lr=lr, beta1=0.9, beta2=0.999,
                              epsilon=1e-8, wd=1e-4)
        opt.step({"w": g})
    np.testing.assert_allclose(mine["w"], w.asnumpy(), rtol=1e-5, atol=1e-6)
    assert opt.t == 5
    assert sorted(opt.state_arrays()) == sorted(f"w:{i}" for i in range(1 if name == "sgd" else 2))


def test_checkpoint_record_is_covered_by_the_checksum(tmp_path):
    import json

    path = tmp_path / "checkpoint.npz"
    ckpt.save(path, {"fingerprint": {"seed": 0}, "epoch": 2}, {"order": np.arange(4)})
    with np.load(path) as npz:
        arrays = {k: npz[k] for k in npz.files}
    record = json.loads(arrays["meta"].tobytes())
    record["epoch"] = 3  # a changed record with the old checksum
    arrays["meta"] = np.frombuffer(json.dumps(record).encode(), dtype=np.uint8)
    with open(path, "wb") as fh:
        np.savez(fh, **arrays)
    with pytest.raises(UsageError, match="do not match their checksum"):
        ckpt.load(path)


def test_export_mismatch_is_measured_against_the_outputs_scale():
    from edgetrain.training.gluon import mismatch as _mismatch

    want = np.random.RandomState(2).rand(2, 8).astype("float32") * 50
    assert _mismatch(want + 1e-5, want) is None
    assert "max abs error" in _mismatch(want + 1.0, want)
    bad = want.copy()
    bad[0, 0] = np.nan
    assert _mismatch(bad, want) is not None
    assert "shape" in _mismatch(want[:1], want)
