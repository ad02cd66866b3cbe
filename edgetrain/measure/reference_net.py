"""The speed reference's network written as ONNX directly, so `profile --device` needs no mxnet.

Every device profile's speed reference is the Gluon model zoo's MobileNetV2-1.0 (devices/*.yaml: a published
device latency set against this host's latency on the same network). The host used to get that network by
exporting ``zoo:mobilenetv2_1.0`` through mxnet; a device has no mxnet (README, "Host and device"), so the same
graph is built here with onnx.helper: the ops, attributes, weight shapes and order that ``edgetrain export
zoo:mobilenetv2_1.0`` writes (Conv without bias, BatchNormalization, Clip 0..6, Add, GlobalAveragePool, a 1x1
Conv classifier, Flatten; opset 13), with random weights, as the zoo's are without ``--params``. A test holds it
op for op equal to a fresh export where mxnet is installed (tests/test_device_commands.py).
"""
from __future__ import annotations

import json

# Gluon's MobileNetV2 (mxnet/gluon/model_zoo/vision/mobilenet.py): every LinearBottleneck has the 1x1 expansion,
# even at t=1; (in_channels, out_channels, t, stride) per bottleneck, multiplier 1.0.
_IN = [32, 16] + [24] * 2 + [32] * 3 + [64] * 4 + [96] * 3 + [160] * 3
_OUT = [16] + [24] * 2 + [32] * 3 + [64] * 4 + [96] * 3 + [160] * 3 + [320]
_T = [1] + [6] * 16
_STRIDES = [1, 2] * 2 + [1, 1, 2] + [1] * 6 + [2] + [1] * 3
BOTTLENECKS = list(zip(_IN, _OUT, _T, _STRIDES))

BUILT = ("mobilenetv2_1.0",)
# what `edgetrain export zoo:mobilenetv2_1.0` records (the zoo's ImageNet preprocessing)
PREPROCESS = {"input_shape": [3, 224, 224], "mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225],
              "input_name": "data", "layout": "NCHW", "resize": "bilinear", "pixel_range": "0..1", "class_names": None}


def reference_onnx(name: str, side: int = 224, classes: int = 1000, seed: int = 0, dynamic_batch: bool = False) -> bytes:
    """The serialized ONNX model of zoo network ``name`` (one of BUILT) at ``side`` x ``side``."""
    if name not in BUILT:
        raise ValueError(f"no built-in ONNX graph for {name!r} (built: {', '.join(BUILT)})")
    import numpy as np

    from .. import _lazy

    TensorProto, helper, numpy_helper = _lazy.from_import("onnx", "TensorProto", "helper", "numpy_helper")

    rng = np.random.default_rng(seed)
    nodes: list = []
    inits: list = []
    p = "mobilenetv20_"

    def init(key: str, value) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, np.float32), key))
        return key

    def conv(x: str, prefix: str, cin: int, cout: int, k: int = 1, stride: int = 1, group: int = 1) -> str:
        fan_in = cin // group * k * k
        w = init(prefix + "_weight", rng.standard_normal((cout, cin // group, k, k)) * np.sqrt(2.0 / fan_in))
        out = prefix + "_fwd"
        nodes.append(helper.make_node("Conv", [x, w], [out], dilations=[1, 1], group=group, kernel_shape=[k, k],
                                      pads=[k // 2] * 4, strides=[stride, stride]))
        return out

    def bn(x: str, prefix: str, c: int) -> str:
        ins = [x, init(prefix + "_gamma", np.ones(c)), init(prefix + "_beta", np.zeros(c)),
               init(prefix + "_running_mean", np.zeros(c)), init(prefix + "_running_var", np.ones(c))]
        out = prefix + "_fwd"
        nodes.append(helper.make_node("BatchNormalization", ins, [out], epsilon=1e-5, momentum=0.9))
        return out

    def relu6(x: str, prefix: str) -> str:
        out = prefix + "_relu6"
        nodes.append(helper.make_node("Clip", [x, init(out + "_min", 0.0), init(out + "_max", 6.0)], [out]))
        return out

    f = p + "features_"
    x = relu6(bn(conv("data", f + "conv0", 3, 32, 3, 2), f + "batchnorm0", 32), f + "relu60")
    for i, (cin, cout, t, stride) in enumerate(BOTTLENECKS):
        b = f"{f}linearbottleneck{i}_"
        y = relu6(bn(conv(x, b + "conv0", cin, cin * t), b + "batchnorm0", cin * t), b + "relu60")
        y = relu6(bn(conv(y, b + "conv1", cin * t, cin * t, 3, stride, cin * t), b + "batchnorm1", cin * t), b + "relu61")
        y = bn(conv(y, b + "conv2", cin * t, cout), b + "batchnorm2", cout)
        if stride == 1 and cin == cout:
            nodes.append(helper.make_node("Add", [y, x], [b + "elemwise_add0"]))
            y = b + "elemwise_add0"
        x = y
    x = relu6(bn(conv(x, f + "conv1", 320, 1280), f + "batchnorm1", 1280), f + "relu61")
    nodes.append(helper.make_node("GlobalAveragePool", [x], [f + "pool0_fwd"]))
    logits = conv(f + "pool0_fwd", p + "output_pred", 1280, classes)
    out = p + "output_flatten0_flatten0"
    nodes.append(helper.make_node("Flatten", [logits], [out]))
    batch: str | int = "batch" if dynamic_batch else 1
    graph = helper.make_graph(nodes, "mobilenetv20",
                              [helper.make_tensor_value_info("data", TensorProto.FLOAT, [batch, 3, side, side])],
                              [helper.make_tensor_value_info(out, TensorProto.FLOAT, [batch, classes])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    meta = {"edgetrain.preprocess": json.dumps({**PREPROCESS, "input_shape": [3, side, side]}),
            "edgetrain.class_names": "null", "edgetrain.num_classes": str(classes),
            "edgetrain.source_model": f"zoo:{name}", "edgetrain.random_weights": "true", "edgetrain.opset": "13",
            "edgetrain.precision": "fp32", "edgetrain.built_without_mxnet": "edgetrain.measure.reference_net"}
    for key, value in meta.items():
        model.metadata_props.add(key=key, value=value)
    return model.SerializeToString()
