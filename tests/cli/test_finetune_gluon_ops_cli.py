"""`edgetrain finetune` of a Gluon PREFIX whose trained part holds ops beyond Conv/BatchNorm/Gemm: mx2onnx's
LayerNorm (ReduceMean, Sub, Pow, Add, Sqrt, Div, Mul, Neg) before the output layer trains through the ONNX
engine (onnx_grad's op classes) with last:2 and all, and the written model.onnx runs in ONNX Runtime."""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

LN = ("lndigits_layernorm0_gamma", "lndigits_layernorm0_beta")


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """The Gluon export cache, kept out of the user's home (shared by both runs: one mxnet child)."""
    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "edgetrain-cache"))


def _initializers(path) -> dict:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}


@pytest.mark.parametrize("layers, trained", [("last:2", ("lndigits_conv1_weight", "lndigits_dense0_weight")),
                                             ("all", ("lndigits_conv0_weight", "lndigits_batchnorm0_gamma"))])
def test_a_layernorm_before_the_output_layer_trains_in_onnx(cli, tmp_path, layernorm_prefix, digits_npz, layers,
                                                             trained):
    import mxnet as mx

    before = {k.split(":", 1)[1]: v.asnumpy() for k, v in mx.nd.load(f"{layernorm_prefix}-0000.params").items()}
    res = cli("finetune", layernorm_prefix, "--data", digits_npz, "-o", tmp_path / "out", "--epochs", "2",
              "--train-layers", layers, "--threads", "1", "--lr", "0.05", "--json", "-",
              "--allow-chance", cwd=tmp_path)   # random weights
    assert res.code == 0, res.err[-3000:]
    assert "cannot differentiate" not in res.err
    record = res.json()
    assert record["train_layers"] == layers and record["passed"]
    model = tmp_path / "out" / "model.onnx"
    ops = {n.op_type for n in onnx.load(str(model)).graph.node}
    assert {"ReduceMean", "Sub", "Pow", "Sqrt", "Div", "Neg"} <= ops, ops
    after = _initializers(model)
    # the LayerNorm's scale and shift train with the layers around it; the export's scalars (epsilon, exponent) do not
    for name in (*LN, *trained):
        assert not np.allclose(after[name], before[name]), name
    assert after["lndigits_layernorm0_layernorm0_2_s"] == 2.0
    assert after["lndigits_layernorm0_layernorm0_eps"] == pytest.approx(1e-5)
    # the fine-tuned Gluon files hold the same trained weights as model.onnx
    prefix = {k.split(":", 1)[1]: v.asnumpy() for k, v in mx.nd.load(str(tmp_path / "out" / "model-0000.params")).items()}
    for name in (*LN, *trained):
        np.testing.assert_array_equal(prefix[name], after[name], err_msg=name)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    shape = [d if isinstance(d, int) else 3 for d in session.get_inputs()[0].shape]
    out = session.run(None, {session.get_inputs()[0].name: np.random.default_rng(0).random(shape, np.float32)})[0]
    assert out.shape == (3, 10) and np.isfinite(out).all()
