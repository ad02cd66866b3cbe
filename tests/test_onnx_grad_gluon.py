"""onnx_grad on what mx2onnx (mxnet 1.9.1, opset 13) really writes for Gluon layers beyond Conv/BatchNorm/Dense:
LayerNorm, InstanceNorm, the activations (sigmoid, tanh, LeakyReLU, ELU, Swish, softrelu, SELU, PReLU, softsign,
a hard swish, GELU), a concatenation (squeezenet's and densenet's HybridConcurrent) and a global max-pool. Each
exported net runs forward in NumPy as in ONNX Runtime, its gradients (every float weight an op differentiates)
equal central finite differences in float64, and the one-graph ONNX Runtime step (the ops' emitted backward)
equals NumPy's."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

from edgetrain.training.onnx_grad import GradGraph
from test_onnx_grad import _differentiable_initializers, _finite_difference_check, _ort
from test_ort_forward import _check_train

SHAPE = (2, 1, 16, 16)   # edgetrain.nets:digits_cnn's input


def _layers(kind: str):
    from mxnet.gluon import contrib, nn

    if kind == "layernorm":   # conftest.layernorm_prefix's net
        return [nn.Conv2D(8, 3, padding=1, use_bias=False), nn.BatchNorm(), nn.Activation("relu"), nn.MaxPool2D(2),
                nn.Conv2D(16, 3, padding=1), nn.Activation("relu"), nn.GlobalAvgPool2D(), nn.Flatten(), nn.LayerNorm(),
                nn.Dense(10)]
    if kind == "instancenorm":
        # no bias before it: the normalisation removes a per-channel shift (its gradient is zero)
        return [nn.Conv2D(4, 3, padding=1, use_bias=False), nn.InstanceNorm(), nn.Activation("relu"), nn.MaxPool2D(4),
                nn.Flatten(), nn.Dense(5)]
    if kind == "activations":
        acts = [nn.Activation("sigmoid"), nn.Activation("tanh"), nn.LeakyReLU(0.1), nn.ELU(), nn.Swish(),
                nn.Activation("softrelu"), nn.SELU(), nn.PReLU(), nn.Activation("softsign"),
                nn.HybridLambda(lambda F, x: x * F.hard_sigmoid(x, alpha=1 / 6, beta=0.5)), nn.GELU()]
        layers = [nn.MaxPool2D(2)]
        for act in acts:
            layers += [nn.Conv2D(3, 3, padding=1), act]
        return layers + [nn.Flatten(), nn.Dense(4)]
    if kind == "concat":
        fire = contrib.nn.HybridConcurrent(axis=1)
        fire.add(nn.Conv2D(3, 1), nn.Conv2D(2, 3, padding=1))
        return [nn.Conv2D(4, 3, padding=1, strides=2), nn.Activation("relu"), fire, nn.Activation("relu"),
                nn.GlobalMaxPool2D(), nn.Flatten(), nn.Dense(4)]
    raise ValueError(kind)


_exported: dict = {}


def _export(kind: str) -> bytes:
    """The net with random weights, exported as `edgetrain export` does (opset 13, checked)."""
    if kind not in _exported:
        import mxnet as mx
        from mxnet.gluon import nn

        from edgetrain.convert import build_onnx
        from edgetrain.models import load_gluon

        mx.random.seed(7)
        model = load_gluon("edgetrain.nets:digits_cnn")
        net = nn.HybridSequential(prefix=f"{kind}_")
        with net.name_scope():
            net.add(*_layers(kind))
        net.initialize(mx.init.Xavier())
        model.block = net
        net.hybridize()
        model.predict(np.zeros(SHAPE, np.float32))
        rng = np.random.default_rng(5)
        for name, p in net.collect_params().items():   # biases off zero: a ReLU input exactly at 0 is a kink
            if name.endswith(("_bias", "_beta")):
                p.set_data(mx.nd.array(0.1 * rng.standard_normal(p.shape)))
        _exported[kind] = build_onnx(model).SerializeToString()
    return _exported[kind]


KINDS = ("layernorm", "instancenorm", "activations", "concat")
WRITES = {"layernorm": {"ReduceMean", "Sub", "Pow", "Sqrt", "Div", "Neg"}, "instancenorm": {"InstanceNormalization"},
          "activations": {"Sigmoid", "Tanh", "LeakyRelu", "Elu", "Softplus", "Selu", "PRelu", "Softsign", "HardSigmoid",
                          "Erf"},
          "concat": {"Concat", "GlobalMaxPool"}}


def _input(seed=2) -> np.ndarray:
    return np.random.default_rng(seed).uniform(-1, 1, SHAPE).astype(np.float32)


@pytest.mark.parametrize("kind", KINDS)
def test_gluon_export_forward_equals_onnx_runtime(kind):
    model = _export(kind)
    assert WRITES[kind] <= {n.op_type for n in onnx.load_from_string(model).graph.node}
    x = _input()
    ours, _ = GradGraph(model, _differentiable_initializers(model)).forward(x)
    np.testing.assert_allclose(ours, _ort(model, x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_gluon_export_gradients_equal_finite_differences(kind):
    model = _export(kind)
    trainable = _differentiable_initializers(model)
    graph = _finite_difference_check(model, trainable, np.random.default_rng(3), SHAPE, per_param=3)
    assert len(graph.trainable) == len(set(trainable))


@pytest.mark.parametrize("kind", KINDS)
def test_gluon_export_one_graph_step_equals_numpy(kind):
    model = _export(kind)
    _check_train(model, _differentiable_initializers(model), _input())


@pytest.mark.parametrize("kind, weights", [("layernorm", ["layernorm_layernorm0_gamma", "layernorm_layernorm0_beta"]),
                                           ("instancenorm", ["instancenorm_instancenorm0_gamma",
                                                             "instancenorm_instancenorm0_beta"]),
                                           ("activations", ["activations_prelu0_alpha"]), ("concat", [])])
def test_the_weights_beyond_conv_dense_and_batchnorm_are_the_gluon_layers_own(kind, weights):
    """What `all` and `last:N` train besides Conv/Gemm/BatchNorm: the LayerNorm's, InstanceNorm's and PReLU's
    Gluon parameters; not the export's scalars (LayerNorm's epsilon and exponent, Swish's and GELU's constants)."""
    from edgetrain.training.onnx_grad import other_weights

    assert other_weights(onnx.load_from_string(_export(kind)).graph) == weights
