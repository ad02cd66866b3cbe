"""The NumPy gradient engine on ONNX graphs (edgetrain.training.onnx_grad): forward equal to ONNX Runtime,
gradients equal to central finite differences in float64, a tape without frozen layers' activations, and a
one-line refusal of what it cannot differentiate."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from edgetrain.training import lite
from edgetrain.training.onnx_grad import (OPS, GradGraph, Unsupported, logits_name, softmax_cross_entropy)
from onnx_models import Builder, inverted_residual, mobilenet_v2

SHAPE = (2, 4, 7, 7)


def _front(b: Builder) -> str:
    """A Conv with a bias in front of the op under test: in bias mode the gradient crosses that op."""
    return b.conv(b.input, 4, 3)


def _head(b: Builder, x: str) -> str:
    return b.gemm(b.flatten(x), 3)


def _case(build):
    def make():
        b = Builder(SHAPE, seed=1)
        return b, build(b, _front(b))
    return make


CASES = {
    "conv_s1_p1": lambda b, x: _head(b, b.conv(x, 5, 3)),
    "conv_s2_asym_pads": lambda b, x: _head(b, b.conv(x, 3, 3, stride=2, pads=(0, 1, 1, 0))),
    "conv_dilated": lambda b, x: _head(b, b.conv(x, 3, 3, dilation=2)),
    "conv_grouped": lambda b, x: _head(b, b.conv(x, 6, 3, group=2)),
    "conv_depthwise_s2": lambda b, x: _head(b, b.conv(x, 4, 3, stride=2, group=4)),
    "conv_depthwise_x2": lambda b, x: _head(b, b.conv(x, 8, 3, group=4, pads=(1, 0, 1, 2))),
    "conv_1x1_s2_nobias": lambda b, x: _head(b, b.conv(x, 6, 1, stride=2, bias=False)),
    "bn_relu": lambda b, x: _head(b, b.relu(b.bn(x))),
    "relu6": lambda b, x: _head(b, b.clip(b.bn(x))),
    "clip_min_only": lambda b, x: _head(b, b.clip(x, lo=-0.1, hi=None)),
    "clip_max_only": lambda b, x: _head(b, b.clip(x, lo=None, hi=0.2)),
    "residual_add": lambda b, x: _head(b, b.add(x, b.relu(b.conv(x, 4, 3)))),
    "mul_const": lambda b, x: _head(b, b.mul(x, b.small("scale", (1, 4, 1, 1), 1.0))),
    "mul_activations": lambda b, x: _head(b, b.mul(b.conv(x, 4, 1), b.clip(b.conv(x, 4, 3), 0.0, 1.0))),
    "gap": lambda b, x: b.gemm(b.flatten(b.gap(b.relu(x))), 3),
    "avgpool_pad_excluded": lambda b, x: _head(b, b.pool("AveragePool", x, 3, 2, (1, 1, 1, 1))),
    "avgpool_pad_included": lambda b, x: _head(b, b.pool("AveragePool", x, 3, 2, (1, 1, 1, 1),
                                                         count_include_pad=1)),
    "maxpool_3x3_s2_p1": lambda b, x: _head(b, b.pool("MaxPool", x, 3, 2, (1, 1, 1, 1))),
    "maxpool_2x2_s2": lambda b, x: _head(b, b.pool("MaxPool", x, 2, 2)),
    "maxpool_dilated": lambda b, x: _head(b, b.pool("MaxPool", x, 2, 1, dilation=2)),
    "reshape_identity_dropout": lambda b, x: b.gemm(b.unary("Dropout", b.unary("Identity", b.reshape(x, (0, -1)))), 3),
    "flatten_axis2": lambda b, x: b.gemm(b.reshape(b.flatten(x, axis=2), (2, -1)), 3),
    "gemm_no_transb": lambda b, x: b.gemm(b.flatten(x), 3, trans_b=0, alpha=0.5, beta=2.0),
    "gemm_gemm": lambda b, x: b.gemm(b.relu(b.gemm(b.flatten(x), 6)), 3),
    "matmul_add": lambda b, x: b.add(b.matmul(b.flatten(x), 3), b.small("mm_bias", (3,))),
    "softmax": lambda b, x: b.unary("Softmax", _head(b, x), axis=1),
    "expand_upsample": lambda b, x: _head(b, _upsample(b, x)),
    "slice_crop": lambda b, x: _head(b, b.node("Slice", [x, b.init("sl_starts", np.asarray([1, -6], np.int64)),
                                                        b.init("sl_ends", np.asarray([6, 99], np.int64)),
                                                        b.init("sl_axes", np.asarray([2, -1], np.int64))],
                                                   (2, 4, 5, 6))),
    # what mx2onnx writes for Gluon's nn.LayerNorm, elementwise ops, activations and shape ops (Gluon zoo, user nets)
    "layernorm_gluon": lambda b, x: b.gemm(_layernorm(b, b.flatten(x)), 3),
    "sub_broadcast": lambda b, x: _head(b, b.node("Sub", [b.small("sub_c", (1, 4, 1, 1)), _sub(b, x, _mean(b, x, [1]))],
                                                  SHAPE)),
    "div_activations_broadcast": lambda b, x: _head(b, _div(b, x, _plus(b, _square(b, _mean(b, b.conv(x, 4, 1), [1])),
                                                                     1.0))),
    "div_by_const": lambda b, x: _head(b, _div(b, x, b.init("div_c", (1 + 0.5 * np.random.default_rng(0).random(
        (4, 1, 1))).astype(np.float32)))),
    "pow3": lambda b, x: _head(b, b.node("Pow", [x, b.init("pow_p", np.float32(3.0))], SHAPE)),
    "sqrt_of_square": lambda b, x: _head(b, b.unary("Sqrt", _plus(b, _square(b, x), 0.5))),
    "neg_exp_log": lambda b, x: _head(b, b.unary("Log", _plus(b, b.unary("Exp", b.unary("Neg", x)), 1.0))),
    "sigmoid": lambda b, x: _head(b, b.unary("Sigmoid", x)),
    "tanh": lambda b, x: _head(b, b.unary("Tanh", x)),
    "softplus": lambda b, x: _head(b, b.unary("Softplus", x)),
    "elu": lambda b, x: _head(b, b.unary("Elu", x, alpha=0.5)),
    "selu": lambda b, x: _head(b, b.unary("Selu", x)),
    "leakyrelu": lambda b, x: _head(b, b.unary("LeakyRelu", x, alpha=0.1)),
    "prelu": lambda b, x: _head(b, b.node("PRelu", [x, b.init("prelu_slope", np.asarray([[[0.25]], [[0.1]], [[-0.2]],
                                                                                       [[0.5]]], np.float32))], SHAPE)),
    "swish": lambda b, x: _head(b, b.mul(x, b.unary("Sigmoid", b.mul(x, b.init("swish_beta", np.float32(1.5)))))),
    "reducemean_keepdims0": lambda b, x: b.gemm(b.node("ReduceMean", [x], (2, 4), axes=[2, 3], keepdims=0), 3),
    "reducesum_axes_input": lambda b, x: b.gemm(b.flatten(b.node(
        "ReduceSum", [x, b.init("rs_axes", np.asarray([1], np.int64))], (2, 7, 7), keepdims=0)), 3),
    "concat_channels": lambda b, x: _head(b, b.node("Concat", [x, b.relu(b.conv(x, 3, 3))], (2, 7, 7, 7), axis=1)),
    "concat_last_axis_const": lambda b, x: _head(b, b.node("Concat", [b.small("cat_c", (2, 4, 7, 2)), x], (2, 4, 7, 9),
                                                           axis=-1)),
    "gelu_erf": lambda b, x: _head(b, b.mul(x, _plus(b, b.unary("Erf", b.mul(x, b.init("gelu_s", np.float32(0.7)))),
                                                     1.0))),
    "global_maxpool": lambda b, x: b.gemm(b.flatten(b.node("GlobalMaxPool", [x], (2, 4, 1, 1))), 3),
    "maxpool_ceil_2x2_s2": lambda b, x: _head(b, b.node("MaxPool", [x], (2, 4, 4, 4), kernel_shape=[2, 2], strides=[2, 2],
                                                        ceil_mode=1)),
    "maxpool_ceil_3x3_s2_p1": lambda b, x: _head(b, b.node("MaxPool", [x], (2, 4, 4, 4), kernel_shape=[3, 3],
                                                           strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1)),
    "softsign": lambda b, x: _head(b, b.unary("Softsign", x)),
    "hard_swish": lambda b, x: _head(b, b.mul(x, b.unary("HardSigmoid", x, alpha=1 / 6, beta=0.5))),
    "instancenorm": lambda b, x: _head(b, b.node("InstanceNormalization", [
        x, b.init("in_gamma", (1 + 0.1 * b.rng.standard_normal(4)).astype(np.float32)), b.small("in_beta", (4,))],
        SHAPE, epsilon=1e-5)),
    "transpose": lambda b, x: _head(b, b.node("Transpose", [x], (2, 7, 7, 4), perm=[0, 2, 3, 1])),
    "squeeze_unsqueeze": lambda b, x: b.gemm(b.flatten(b.node("Unsqueeze", [
        b.node("Squeeze", [b.gap(x), b.init("sq_axes", np.asarray([2, 3], np.int64))], (2, 4)),
        b.init("usq_axes", np.asarray([-1], np.int64))], (2, 4, 1))), 3),
}


def _mean(b: Builder, x: str, axes: list) -> str:
    reduced = [a % len(b.shapes[x]) for a in axes]
    return b.node("ReduceMean", [x], tuple(1 if i in reduced else n for i, n in enumerate(b.shapes[x])), axes=axes)


def _sub(b: Builder, x: str, y: str) -> str:
    return b.node("Sub", [x, y], np.broadcast_shapes(b.shapes[x], b.shapes[y]))


def _div(b: Builder, x: str, y: str) -> str:
    return b.node("Div", [x, y], np.broadcast_shapes(b.shapes[x], b.shapes[y]))


def _plus(b: Builder, x: str, value: float) -> str:
    return b.add(x, b.init(f"plus{b.count + 1}", np.float32(value)))


def _square(b: Builder, x: str) -> str:
    return b.node("Pow", [x, b.init(f"two{b.count + 1}", np.float32(2.0))], b.shapes[x])


def _layernorm(b: Builder, x: str) -> str:
    """Gluon's nn.LayerNorm as mx2onnx (mxnet 1.9.1, opset 13) writes it: the shift subtracted as its negation."""
    f = b.shapes[x][-1]
    centred = _sub(b, x, _mean(b, x, [-1]))
    var = _mean(b, _square(b, centred), [-1])
    normed = _div(b, centred, b.unary("Sqrt", _plus(b, var, 1e-5)))
    scaled = b.mul(normed, b.init("ln_gamma", (1 + 0.1 * b.rng.standard_normal(f)).astype(np.float32)))
    return _sub(b, scaled, b.unary("Neg", b.small("ln_beta", (f,))))


def _upsample(b: Builder, x: str) -> str:
    """The lite residual's 2x nearest upsampling: Reshape -> Expand -> Reshape."""
    n, c, h, w = b.shapes[x]
    x = b.reshape(x, (0, c, h, 1, w, 1))
    x = b.node("Expand", [x, b.init("up_expand", np.asarray([1, 1, 1, 2, 1, 2], np.int64))], (n, c, h, 2, w, 2))
    return b.reshape(x, (0, c, 2 * h, 2 * w))


@pytest.fixture(params=sorted(CASES))
def case(request):
    b, out = _case(CASES[request.param])()
    return request.param, b.model(out)


def _data(seed=2, shape=SHAPE) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _ort(model: bytes, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, {"data": x})[0]


def test_forward_equals_onnx_runtime(case):
    name, model = case
    x = _data()
    ours, _ = GradGraph(model, "bias+head").forward(x)
    assert ours.dtype == np.float32
    np.testing.assert_allclose(ours, _ort(model, x), rtol=1e-4, atol=1e-5, err_msg=name)


def _differentiable_initializers(model: bytes) -> list:
    """Every float initializer at an input position its op differentiates (not BN statistics, Clip bounds)."""
    graph = onnx.load_from_string(model).graph
    inits = {t.name for t in graph.initializer if t.data_type == onnx.TensorProto.FLOAT}
    return [n for node in graph.node for i, n in enumerate(node.input)
            if n in inits and i in OPS[node.op_type].differentiable]


def _finite_difference_check(model: bytes, trainable, rng, shape=SHAPE, per_param=4, extra=()):
    graph = GradGraph(model, trainable, dtype=np.float64, extra=extra)
    x = _data(shape=shape).astype(np.float64)
    out, tape = graph.forward(x)
    weights = rng.standard_normal(out.shape)   # L = sum(out * weights), so dL/dout = weights
    grads = graph.backward(tape, weights)
    assert set(grads) == set(graph.trainable)
    for name in graph.trainable:
        p = graph.params[name]
        assert grads[name].shape == p.shape
        for flat in rng.choice(p.size, min(per_param, p.size), replace=False):
            idx = np.unravel_index(flat, p.shape)
            keep, eps = p[idx], 1e-6
            p[idx] = keep + eps
            up = (graph.forward(x)[0] * weights).sum()
            p[idx] = keep - eps
            down = (graph.forward(x)[0] * weights).sum()
            p[idx] = keep
            numeric = (up - down) / (2 * eps)
            assert grads[name][idx] == pytest.approx(numeric, rel=1e-5, abs=1e-7), (name, idx)
    return graph


@pytest.mark.parametrize("mode", ["bias", "head", "bias+head", "explicit"])
def test_gradients_equal_finite_differences(case, mode):
    name, model = case
    rng = np.random.default_rng(3)
    trainable = _differentiable_initializers(model) if mode == "explicit" else mode
    graph = _finite_difference_check(model, trainable, rng)
    if mode == "bias":
        assert all(n.endswith(("_bias", "_beta")) for n in graph.trainable), graph.trainable


def _bias_free_front_stack():
    """Two MobileNetV2 blocks (one with a residual), a MaxPool and a Gemm head, 16x16 input."""
    b = Builder((4, 3, 16, 16), seed=4)
    x = b.clip(b.bn(b.conv(b.input, 8, 3, stride=2, bias=False)))
    x = inverted_residual(b, x, 8, 1, 4)
    x = inverted_residual(b, x, 12, 2, 4)
    x = b.pool("MaxPool", b.relu(x), 2, 2)
    return b, b.model(b.gemm(b.flatten(b.gap(x)), 5))


def test_stack_gradients_equal_finite_differences():
    b, model = _bias_free_front_stack()
    _finite_difference_check(model, "bias+head", np.random.default_rng(5), b.shapes["data"], per_param=2)


def test_bias_tape_keeps_bits_not_activations():
    _, model = _bias_free_front_stack()
    graph = GradGraph(model, "bias")
    out, tape = graph.forward(_data(shape=(4, 3, 16, 16)))
    kept = tape.kept()
    assert kept and {k.kind for k in kept} <= {"mask", "argmax"}, kept
    assert not [k for k in kept if k.dtype.startswith("float")]
    masks = [k for k in kept if k.kind == "mask"]
    assert {k.op for k in masks} == {"Clip", "Relu"}
    # a mask costs 1 bit of a 32-bit activation; only the ReLU/ReLU6 outputs carry one
    assert all(k.nbytes * 32 <= 4 * np.prod(k.shape) + 32 for k in masks)
    assert tape.tape_bytes == sum(k.nbytes for k in kept)
    assert tape.bytes_per_sample < tape.activation_bytes / tape.batch / 20, (tape.nbytes, tape.activation_bytes)
    graph.backward(tape, np.ones_like(out))
    assert tape.nbytes == 0 and tape.tape_bytes > 0   # backward released what it used


def test_head_tape_keeps_only_the_head_input():
    b, model = _bias_free_front_stack()
    graph = GradGraph(model, "head")
    assert graph.trainable == ("fc%d_weight" % (b.count,), "fc%d_bias" % (b.count,))
    _, tape = graph.forward(_data(shape=(4, 3, 16, 16)))
    [kept] = tape.kept()
    assert (kept.op, kept.kind, kept.shape) == ("Gemm", "operand0", (4, 12))
    _, tape = GradGraph(model, "bias+head").forward(_data(shape=(4, 3, 16, 16)))
    assert [k.op for k in tape.kept() if k.dtype == "float32"] == ["Gemm"]


def test_mobilenet_v2_bias_tape_is_about_a_hundredth_of_its_activations():
    graph = GradGraph(mobilenet_v2((2, 3, 64, 64)), "bias")
    assert len(graph.trainable) == 52 + 1   # every BatchNorm shift and the Gemm bias
    _, tape = graph.forward(_data(shape=(2, 3, 64, 64)))
    assert tape.bytes_per_sample < tape.activation_bytes / tape.batch / 50


# ------------------------------------------------------------------------------ lite residual modules
def _lite_stack(shape=(2, 3, 9, 9)):
    """A plain conv stage, an inverted residual with its skip and one without (stride 2), odd sizes (9 -> 5 -> 3):
    three blocks, two of whose modules crop their upsampled output."""
    b = Builder(shape, seed=8)
    x = b.relu(b.bn(b.conv(b.input, 6, 3, stride=2)))
    x = inverted_residual(b, x, 6, 1, 2)
    x = inverted_residual(b, x, 8, 2, 2)
    return b.model(b.gemm(b.flatten(b.gap(x)), 3))


def _lit(model: bytes, live: bool = True):
    """The model with its lite modules (onnx bytes, their weights' names, the blocks); ``live``: every module
    weight and bias random, as after training (inserted, the projections are zero and the modules add nothing)."""
    proto, names, blocks = lite.insert(onnx.load_from_string(model), seed=3)
    if live:
        rng = np.random.default_rng(9)
        for t in proto.graph.initializer:
            if t.name.startswith("lite") and t.name.endswith(("_weight", "_bias")):
                value = numpy_helper.to_array(t)
                t.CopyFrom(numpy_helper.from_array(value + 0.3 * rng.standard_normal(value.shape).astype(np.float32),
                                                   t.name))
    return proto.SerializeToString(), names, blocks


def _producers(model) -> dict:
    return {o: n.op_type for n in model.graph.node for o in n.output}


def test_lite_blocks_of_mobilenet_v2_are_its_stem_and_inverted_residuals():
    model = onnx.load_from_string(mobilenet_v2((1, 3, 64, 64)))
    blocks = lite.find_blocks(model)
    ops = [_producers(model)[b.end] for b in blocks]
    # the stem's ReLU6, then each block's narrow output: its projection's BatchNorm, or the Add of its skip
    assert ops[0] == "Clip" and set(ops[1:]) == {"BatchNormalization", "Add"} and ops.count("Add") == 10, ops
    assert [b.out_shape[0] for b in blocks] == [32, 16, 24, 24, 32, 32, 32, 64, 64, 64, 64, 96, 96, 96, 160, 160, 160, 320]
    assert blocks[0].start == "data" and all(a.end == b.start for a, b in zip(blocks, blocks[1:]))


def test_lite_blocks_of_a_plain_cnn_are_its_convolution_stages():
    import edgetrain

    model = onnx.load(str(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx"))
    assert [(b.start, b.end) for b in lite.find_blocks(model)] == [
        ("data", "digits_pool0_fwd"), ("digits_pool0_fwd", "digits_pool1_fwd"), ("digits_pool1_fwd", "digits_relu2_fwd")]


@pytest.mark.parametrize("build", [_lite_stack, lambda: mobilenet_v2((2, 3, 40, 40))], ids=["stack", "mobilenet_v2"])
def test_lite_modules_start_as_nothing_then_numpy_equals_onnx_runtime(build):
    model = build()
    x = _data(shape=onnx_shape(model))
    fresh, names, blocks = _lit(model, live=False)
    pools = [n for n in onnx.load_from_string(fresh).graph.node if n.op_type == "AveragePool"]
    # each module reads its block's input as the model computes it: with the module before it added
    assert [n.input[0] for n in pools] == [blocks[0].start] + [f"lite{k}/out" for k in range(len(blocks) - 1)]
    # the model is unchanged at step 0: bit for bit in NumPy (+ 0.0), to rounding in ONNX Runtime (which fuses
    # the Add into the convolution before it)
    assert np.array_equal(GradGraph(fresh, "bias").forward(x)[0], GradGraph(model, "bias").forward(x)[0])
    np.testing.assert_allclose(_ort(fresh, x), _ort(model, x), rtol=1e-5, atol=1e-5)
    assert blocks and len(names) == 2 * len(blocks)
    live, names, _ = _lit(model)
    graph = GradGraph(live, "bias+head", extra=names)
    ours, want = graph.forward(x)[0], _ort(live, x)
    assert np.abs(want - _ort(model, x)).max() > 0.1   # the modules now change the output
    np.testing.assert_allclose(ours, want, rtol=1e-4, atol=1e-4)


def onnx_shape(model: bytes) -> tuple:
    return tuple(d.dim_value for d in onnx.load_from_string(model).graph.input[0].type.tensor_type.shape.dim)


def test_lite_gradients_equal_finite_differences():
    model, names, blocks = _lit(_lite_stack())
    assert [b.out_shape[1:] for b in blocks] == [(5, 5), (5, 5), (3, 3)]   # odd: each module crops (Slice)
    graph = _finite_difference_check(model, "bias+head", np.random.default_rng(10), (2, 3, 9, 9), per_param=3,
                                     extra=names)
    assert set(names) <= set(graph.trainable)


def test_lite_tape_keeps_masks_and_only_the_modules_small_inputs():
    model, names, blocks = _lit(mobilenet_v2((2, 3, 64, 64)))
    graph = GradGraph(model, "bias+head", extra=names)
    out, tape = graph.forward(_data(shape=(2, 3, 64, 64)))
    floats = [k for k in tape.kept() if k.dtype == "float32"]
    assert {k.op for k in floats} == {"Conv", "Gemm"}
    lite_floats = [k for k in floats if k.op == "Conv"]
    assert all(k.node.startswith("lite") and k.node.endswith(("/conv1", "/conv2")) for k in lite_floats)
    # each module keeps its pooled input (a quarter of the block input) and its 3x3 convolution's output
    pooled = {k.node.split("/")[0]: k.shape for k in lite_floats if k.node.endswith("/conv1")}
    for i, b in enumerate(blocks):
        c, h, w = b.in_shape
        assert pooled[f"lite{i}"] == (2, c, -(-h // 2), -(-w // 2))
    assert {k.kind for k in tape.kept() if k.dtype != "float32"} <= {"mask"}
    bias_tape = GradGraph(mobilenet_v2((2, 3, 64, 64)), "bias+head").forward(_data(shape=(2, 3, 64, 64)))[1]
    assert tape.bytes_per_sample < tape.activation_bytes / tape.batch / 8, (tape.bytes_per_sample, tape.activation_bytes)
    assert tape.bytes_per_sample > bias_tape.bytes_per_sample


def test_lite_training_lowers_the_loss():
    model, names, _ = _lit(_lite_stack(), live=False)
    graph = GradGraph(model, "bias+head", extra=names)
    x, labels = _data(11, (2, 3, 9, 9)), np.asarray([0, 2])
    losses = []
    for _ in range(30):
        out, tape = graph.forward(x)
        loss, _, dlogits = softmax_cross_entropy(out, labels)
        for name, g in graph.backward(tape, dlogits / len(labels)).items():
            graph.params[name] -= 0.1 * g
        losses.append(loss)
    assert losses[-1] < 0.5 * losses[0], losses
    assert all(np.abs(graph.params[n]).max() > 0 for n in names if n.endswith("conv2_weight"))


def _with_node(model: bytes, node, output_shape) -> bytes:
    m = onnx.load_from_string(model)
    m.graph.node.append(node)
    out = m.graph.output[0]
    del m.graph.output[:]
    m.graph.output.append(helper.make_tensor_value_info(node.output[0], out.type.tensor_type.elem_type,
                                                        output_shape))
    return m.SerializeToString()


def test_refuses_an_op_it_lacks_naming_op_and_node():
    b = Builder(SHAPE)
    x = b.conv(b.input, 4, 3)
    scales = b.init("scales", np.asarray([1, 1, 2, 2], np.float32))
    model = _with_node(b.model(x), helper.make_node("Resize", [x, "", scales], ["up"], name="upsample1"),
                       (2, 4, 14, 14))
    with pytest.raises(Unsupported) as err:
        GradGraph(model, "bias")
    assert "Resize" in str(err.value) and "'upsample1'" in str(err.value) and "\n" not in str(err.value)
    assert (err.value.op, err.value.node, err.value.exit_code) == ("Resize", "upsample1", 2)


@pytest.mark.parametrize("attrs, word", [({"auto_pad": "SAME_UPPER"}, "auto_pad"), ({}, "computed by the graph")])
def test_refuses_an_unsupported_attribute_or_input(attrs, word):
    b = Builder(SHAPE)
    if attrs:
        x = b.conv(b.input, 4, 3, pads=(0, 0, 0, 0), **attrs)
    else:   # the weight comes out of a node, not from an initializer
        w = b.unary("Identity", b.weight("w", (4, 4, 3, 3), 36))
        x = b.node("Conv", [b.input, w], (2, 4, 7, 7), name="conv_w_from_graph", kernel_shape=[3, 3], pads=[1] * 4)
    with pytest.raises(Unsupported) as err:
        GradGraph(b.model(x), "bias+head")
    assert "Conv" in str(err.value) and word in str(err.value)


def test_refuses_to_train_running_statistics():
    b = Builder(SHAPE)
    model = b.model(b.bn(_front(b)))
    with pytest.raises(Unsupported, match="BatchNormalization.*input 3 .bn2_mean. cannot train"):
        GradGraph(model, ["bn2_mean"])


def test_logits_name_skips_a_final_softmax():
    b, out = _case(CASES["softmax"])()
    model = b.model(out)
    name = logits_name(model)
    graph = GradGraph(model, "bias", output=name)
    assert graph.output == name and all(node.op_type != "Softmax" for node, _ in graph.nodes)


def test_softmax_cross_entropy_sum_correct_and_gradient():
    rng = np.random.default_rng(6)
    logits = rng.standard_normal((5, 4)).astype(np.float32)
    labels = np.asarray([0, 3, 1, 1, 2])
    loss, correct, grad = softmax_cross_entropy(logits, labels)
    p = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    assert loss == pytest.approx(-np.log(p[np.arange(5), labels]).sum(), rel=1e-5)
    assert correct == int((logits.argmax(1) == labels).sum())
    assert grad.dtype == np.float32
    np.testing.assert_allclose(grad, p - np.eye(4)[labels], atol=1e-6)


def test_bias_training_lowers_the_loss():
    _, model = _bias_free_front_stack()
    graph = GradGraph(model, "bias")
    x, labels = _data(7, (4, 3, 16, 16)), np.asarray([0, 1, 2, 3])
    losses = []
    for _ in range(20):
        out, tape = graph.forward(x)
        loss, _, dlogits = softmax_cross_entropy(out, labels)
        for name, g in graph.backward(tape, dlogits / len(labels)).items():
            graph.params[name] -= 0.5 * g
        losses.append(loss)
    assert losses[-1] < 0.5 * losses[0], losses


@pytest.mark.timing
def test_speed_mobilenet_v2_160_batch_8(capsys):
    """Forward+backward in NumPy against ONNX Runtime's forward of the same graph (numbers printed)."""
    model = mobilenet_v2((8, 3, 160, 160))
    x = _data(shape=(8, 3, 160, 160))
    session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
    session.run(None, {"data": x})
    for mode in ("bias", "bias+head"):
        graph = GradGraph(model, mode)
        times = {"ort forward": [], "numpy forward": [], "numpy backward": []}
        for _ in range(3):
            t0 = time.perf_counter()
            session.run(None, {"data": x})
            t1 = time.perf_counter()
            out, tape = graph.forward(x)
            t2 = time.perf_counter()
            graph.backward(tape, np.ones_like(out))
            t3 = time.perf_counter()
            times["ort forward"].append(t1 - t0)
            times["numpy forward"].append(t2 - t1)
            times["numpy backward"].append(t3 - t2)
        with capsys.disabled():
            print(f"\n{mode}: tape {tape.bytes_per_sample / 1024:.0f} KiB/sample, activations "
                  f"{tape.activation_bytes / tape.batch / 2**20:.1f} MiB/sample; " +
                  ", ".join(f"{k} {min(v) * 1000:.0f} ms" for k, v in times.items()))
        assert min(times["numpy forward"]) > 0
