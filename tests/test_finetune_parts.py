"""The parts of `edgetrain finetune`: graph split, checkpoints, feature cache, memory plan (real MXNet)."""
from __future__ import annotations

import numpy as np
import pytest

from edgetrain import checkpoint as ckpt
from edgetrain.errors import UsageError
from edgetrain.featurecache import FeatureCache
from edgetrain.memplan import Costs, choose
from edgetrain.netsplit import TrainLayers, cut_for, graph_of, parse_train_layers, replace_head, split


@pytest.fixture(scope="module")
def digits():
    from edgetrain.models import load_gluon

    return load_gluon("edgetrain.nets:pretrained_digits")


def test_split_parts_compute_what_the_whole_model_computes(digits):
    import mxnet as mx

    x = np.random.RandomState(0).rand(3, 1, 16, 16).astype("float32")
    ref = digits.predict(x)
    g = graph_of(digits.block, "data")
    assert len(g.cuts) == 4  # three convolutions and the dense layer
    for n in (1, 2, 3):
        s = split(g, cut_for(g, TrainLayers("last", n)), (1, 16, 16))
        y = s.trained(s.frozen(mx.nd.array(x))).asnumpy()
        np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    s = split(g, cut_for(g, parse_train_layers("all")), (1, 16, 16))
    assert s.frozen is None and s.feature_shape == (1, 16, 16)


def test_head_replacement_gives_new_outputs(digits):
    import mxnet as mx

    g = graph_of(digits.block, "data")
    assert sorted(replace_head(g, 7)) == ["digits_dense0_bias", "digits_dense0_weight"]
    s = split(g, cut_for(g, TrainLayers("last", 1)), (1, 16, 16))
    assert s.trained(s.frozen(mx.nd.zeros((2, 1, 16, 16)))).shape == (2, 7)
    assert sorted(s.new_params) == ["digits_dense0_bias", "digits_dense0_weight"]


def test_residual_blocks_are_not_cut_inside():
    from edgetrain.models import load_gluon

    model = load_gluon("zoo:mobilenetv2_0.25", input_shape=(3, 32, 32))
    g = graph_of(model.block, "data")
    names = [g.nodes[c]["name"] for c in g.cuts]
    # a residual bottleneck's inner convolutions are spanned by its skip connection: no cut there
    assert not any("linearbottleneck15_relu60" in n for n in names)
    assert any(n.endswith("linearbottleneck15_elemwise_add0") for n in names)


@pytest.mark.parametrize("text,fragment", [("last:0", "trains nothing"), ("tail", "cannot read"),
                                           ("last:x", "cannot read")])
def test_bad_train_layers(text, fragment):
    with pytest.raises(UsageError, match=fragment):
        parse_train_layers(text)


def test_train_layers_beyond_depth(digits):
    g = graph_of(digits.block, "data")
    with pytest.raises(UsageError, match="beyond the model's depth: it has 4"):
        cut_for(g, TrainLayers("last", 5))


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
    roomy = choose(_costs(), 4096)
    tight = choose(_costs(), 400)
    assert roomy.feature_batch == 32 and roomy.micro_batch == 32 and roomy.cache == "memory"
    assert tight.feature_batch < 8 and tight.estimate_mb <= 400
    assert choose(_costs(), None).feature_batch * 25 <= 160


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
