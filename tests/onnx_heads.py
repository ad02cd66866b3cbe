"""Small ONNX classifiers built in code for the fine-tune's role tests: every form an output layer takes in the
files exporters write (Gemm, MatMul+Add, MatMul alone, a 1x1 Conv on pooled features then Flatten/Reshape), one
the engine cannot recognise, and the exporters' quirks (initializers also listed as inputs, dynamic H/W, shared
initializers, opsets, Identity/Reshape between layers, value_info present) applied to any of them.

Each model carries the shipped digits base's edgetrain metadata (16x16 grayscale), so ``finetune`` and
``predict`` take it with the builtin digits data; :func:`roles` says, from how the model was built, which
initializer is what."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

import edgetrain
from onnx_models import Builder

SHIPPED = Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx"
HEADS = ("gemm", "gemm_transb0", "matmul_add", "add_matmul", "matmul", "conv1x1_flatten", "conv1x1_reshape",
         "conv1x1_reshape_n", "conv1x1_relu_gap")
MODES = ("bias", "lite", "head", "last:2", "all")


@dataclass
class Built:
    """A model and its initializers' roles, as the builder knows them."""

    proto: object
    classifier: list[str]                 # the output layer's weight and bias
    biases: list[str]                     # every other layer's bias and every BatchNorm shift
    last2: list[str]                      # what the last two layers hold (last:2), classifier included
    weights: list[str] = field(default_factory=list)   # every initializer that trains with `all`
    class_targets: list[str] = field(default_factory=list)   # Reshape targets that spell the class count

    def bias_set(self) -> set:
        return set(self.biases) | set(self.classifier)


def _with_metadata(proto):
    shipped = {p.key: p.value for p in onnx.load(str(SHIPPED)).metadata_props}
    helper.set_model_props(proto, {k: v for k, v in shipped.items() if k != "edgetrain.source_model"})
    return proto


def _batch_dynamic(proto):
    for v in (proto.graph.input[0], proto.graph.output[0]):
        v.type.tensor_type.shape.dim[0].dim_param = "batch"
    return proto


def classifier(head: str, classes: int = 5, seed: int = 0) -> Built:
    """conv 3x3 (bias) -> BN -> Relu -> conv 3x3 (no bias) -> BN -> Relu -> global pool -> the head ``head``."""
    b = Builder((1, 1, 16, 16), seed=seed)

    def made(fn, *args, **kw):   # the output of fn and the initializers it added
        before = set(b.inits)
        out = fn(*args, **kw)
        return out, [n for n in b.inits if n not in before]

    x, first = made(lambda: b.relu(b.bn(b.conv(b.input, 8, 3, stride=2))))
    spatial, second = made(lambda: b.relu(b.bn(b.conv(x, 12, 3, bias=False))))
    x = b.gap(spatial)
    if head == "gemm":
        out, cls = made(b.gemm, b.flatten(x), classes)
    elif head == "gemm_transb0":
        out, cls = made(b.gemm, b.flatten(x), classes, trans_b=0)
    elif head in ("matmul_add", "add_matmul", "matmul"):
        out, cls = made(b.matmul, b.flatten(x), classes)
        if head != "matmul":
            cls.append(b.small("fc_add_bias", (classes,)))
            out = b.node("Add", [out, cls[-1]] if head == "matmul_add" else [cls[-1], out], b.shapes[out])
    elif head == "conv1x1_flatten":
        out, cls = made(b.conv, x, classes, 1, pads=[0, 0, 0, 0])
        out = b.flatten(out)
    elif head == "conv1x1_reshape":
        out, cls = made(b.conv, x, classes, 1, pads=[0, 0, 0, 0])
        out = b.reshape(out, [0, -1])
    elif head == "conv1x1_reshape_n":   # the target spells the class count
        out, cls = made(b.conv, x, classes, 1, pads=[0, 0, 0, 0])
        out, targets = made(b.reshape, out, [-1, classes])
    elif head == "conv1x1_relu_gap":   # SqueezeNet's: a 1x1 conv on the features, then ReLU and the pool
        out, cls = made(b.conv, spatial, classes, 1, pads=[0, 0, 0, 0])
        out = b.flatten(b.gap(b.relu(out)))
    elif head in UNRECOGNISED:
        out, cls = UNRECOGNISED[head](b, spatial, classes), []
    else:
        raise ValueError(head)
    proto = _with_metadata(_batch_dynamic(onnx.load_from_string(b.model(out))))
    targets = targets if head == "conv1x1_reshape_n" else []
    stats = ("_mean", "_var")
    biases = [n for n in first + second if n.endswith(("_bias", "_beta"))]
    weights = [n for n in first + second + cls if not n.endswith(stats)]
    last2 = [n for n in second + cls if not n.endswith(stats)]
    return Built(proto, cls, biases, last2, weights, targets)


def _two_heads(b, x, classes):
    """Two classifiers whose logits are added: neither alone is the output layer."""
    f = b.flatten(b.gap(x))
    return b.add(b.gemm(f, classes), b.gemm(f, classes))


def _computed_weight(b, x, classes):
    """A Gemm whose weight is computed by the graph (a Transpose of an initializer)."""
    f = b.flatten(b.gap(x))
    w = b.node("Transpose", [b.weight("fc_t_weight", (12, classes), 12)], (classes, 12), perm=[1, 0])
    return b.node("Gemm", [f, w], (1, classes), transB=1)


UNRECOGNISED = {
    "conv3x3_gap": lambda b, x, classes: b.flatten(b.gap(b.conv(x, classes, 3))),   # the 3x3 conv makes the classes
    "two_heads": _two_heads,
    "computed_weight": _computed_weight,
    "grouped_conv1x1": lambda b, x, classes: b.flatten(b.conv(b.gap(x), classes * 2, 1, pads=[0] * 4, group=2)),
}


# --- the exporters' quirks, each a function of a built model (changed in place) --------------------------------
def inits_as_inputs(built: Built) -> None:
    """Older exporters (mxnet's among them) list every weight as a graph input as well (ORT: an overridable
    default)."""
    g = built.proto.graph
    g.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in g.initializer)


def dynamic_hw(built: Built) -> None:
    dims = built.proto.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_param, dims[3].dim_param = "height", "width"


def value_info(built: Built) -> None:
    """Every intermediate's type, as exporters that run shape inference write them."""
    inferred = onnx.shape_inference.infer_shapes(built.proto)
    built.proto.graph.value_info.extend(inferred.graph.value_info)


def identity_between(built: Built) -> None:
    """Identity after every Relu, and a Flatten done as a Reshape (0, -1): PyTorch's and tf2onnx's leftovers."""
    g = built.proto.graph
    nodes = []
    for node in g.node:
        if node.op_type == "Flatten":
            shape = f"{node.output[0]}_shape"
            g.initializer.append(numpy_helper.from_array(np.asarray([0, -1], np.int64), shape))
            nodes.append(helper.make_node("Reshape", [node.input[0], shape], list(node.output), name=node.name))
            continue
        nodes.append(node)
        if node.op_type == "Relu":
            out = node.output[0]
            node.output[0] = f"{out}_pre"
            nodes.append(helper.make_node("Identity", [f"{out}_pre"], [out], name=f"{out}_identity"))
    del g.node[:]
    g.node.extend(nodes)


def shared_bias(built: Built) -> None:
    """The classifier's bias and the first conv's are one tensor (a deduplicating exporter's doing: equal values,
    one initializer); the classifier then has as many outputs as that conv has channels."""
    g = built.proto.graph
    inits = {t.name: t for t in g.initializer}
    conv = next(n for n in g.node if n.op_type == "Conv" and len(n.input) > 2)
    cls_bias = built.classifier[-1]
    if cls_bias == conv.input[2] or inits[cls_bias].dims != inits[conv.input[2]].dims:
        raise ValueError("the head has no bias the size of the first conv's")
    for node in g.node:
        for i, name in enumerate(node.input):
            if name == cls_bias:
                node.input[i] = conv.input[2]
    g.initializer.remove(inits[cls_bias])
    # the file's tensor stays the conv's: the classifier trains (and is resized in) a copy of its own
    built.classifier = [n for n in built.classifier if n != cls_bias]
    built.last2 = [n for n in built.last2 if n != cls_bias]
    built.weights = [n for n in built.weights if n != cls_bias]


def opset(version: int):
    def quirk(built: Built) -> None:
        built.proto.opset_import[0].version = version
    quirk.__name__ = f"opset{version}"
    return quirk


def fixed_batch(built: Built) -> None:
    """A batch of 1 written into the input's and output's types (no symbolic batch)."""
    for v in (built.proto.graph.input[0], built.proto.graph.output[0]):
        v.type.tensor_type.shape.dim[0].dim_value = 1


def float_data(built: Built) -> None:
    """Weights as float_data rather than raw bytes (older protobuf writers)."""
    g = built.proto.graph
    for t in g.initializer:
        if t.data_type == 1:
            values = numpy_helper.to_array(t).ravel().tolist()
            t.ClearField("raw_data")
            t.float_data.extend(values)


def batch_in_reshape(built: Built) -> None:
    """A batch of 1 written into the types and into a Reshape's target: every Flatten is a Reshape (1, -1)."""
    fixed_batch(built)
    g = built.proto.graph
    nodes = []
    for node in g.node:
        if node.op_type == "Flatten":
            shape = f"{node.output[0]}_shape"
            g.initializer.append(numpy_helper.from_array(np.asarray([1, -1], np.int64), shape))
            node = helper.make_node("Reshape", [node.input[0], shape], list(node.output), name=node.name)
        nodes.append(node)
    del g.node[:]
    g.node.extend(nodes)


def softmax_output(built: Built) -> None:
    """The probabilities are the output (a final Softmax), as most exporters of a deployable model write it."""
    g = built.proto.graph
    g.node.append(helper.make_node("Softmax", [g.output[0].name], ["probs"], name="softmax", axis=1))
    g.output[0].name = "probs"


def log_softmax_output(built: Built) -> None:
    g = built.proto.graph
    g.node.append(helper.make_node("LogSoftmax", [g.output[0].name], ["logp"], name="logsoftmax", axis=1))
    g.output[0].name = "logp"


def two_outputs(built: Built) -> None:
    """The logits and the probabilities, both outputs."""
    g = built.proto.graph
    g.node.append(helper.make_node("Softmax", [g.output[0].name], ["probs"], name="softmax", axis=1))
    probs = g.output.add()
    probs.CopyFrom(g.output[0])
    probs.name = "probs"


def constant_nodes(built: Built) -> None:
    """Integer constants (Reshape targets) as Constant nodes rather than initializers (PyTorch's habit)."""
    g = built.proto.graph
    ints = [t for t in g.initializer if t.data_type == onnx.TensorProto.INT64]
    for t in ints:
        g.initializer.remove(t)
    nodes = [helper.make_node("Constant", [], [t.name], name=f"const_{t.name}", value=t) for t in ints] + list(g.node)
    del g.node[:]
    g.node.extend(nodes)


def tf_names(built: Built) -> None:
    """tf2onnx's names: slashes and a ':0'."""
    g = built.proto.graph
    rename = {t.name: f"model/{t.name}/kernel:0" for t in g.initializer}
    for t in g.initializer:
        t.name = rename[t.name]
    for node in g.node:
        for i, name in enumerate(node.input):
            node.input[i] = rename.get(name, name)
    for role in ("classifier", "biases", "last2", "weights", "class_targets"):
        setattr(built, role, [rename[n] for n in getattr(built, role)])


def unsorted(built: Built) -> None:
    """Nodes in reverse order: ONNX Runtime sorts them itself (a graph edited by hand or by a surgeon tool)."""
    g = built.proto.graph
    nodes = list(g.node)[::-1]
    del g.node[:]
    g.node.extend(nodes)


def ir_version_6(built: Built) -> None:
    built.proto.ir_version = 6


def unnamed_nodes(built: Built) -> None:
    for node in built.proto.graph.node:
        node.name = ""


QUIRKS = {q.__name__: q for q in (inits_as_inputs, dynamic_hw, value_info, identity_between,
                                  shared_bias, opset(9), opset(11), opset(17), opset(21), ir_version_6, fixed_batch,
                                  batch_in_reshape, softmax_output, log_softmax_output, two_outputs, constant_nodes,
                                  tf_names, unsorted, float_data, unnamed_nodes)}


def save(proto, path) -> Path:
    onnx.save(proto, str(path))
    return Path(path)


def initializers(path) -> dict:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
