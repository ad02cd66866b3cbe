"""What each initializer of an ONNX classifier is for, read from the ops that use it, whatever the exporter.

Every ``--train-layers`` choice is a set of initializer names, and the sets are made of roles:

- a layer's *weight* (Conv ``W``, Gemm ``B``, MatMul's initializer operand) and its *bias* (Conv ``B``, Gemm ``C``,
  or the constant an ``Add`` puts on a MatMul's or bias-less Conv's output: PyTorch and tf2onnx write a linear
  layer as MatMul+Add), each BatchNorm's *scale* and *shift*;
- the *classifier*: the layer whose outputs are the classes. The logits are traced back through ops that keep
  the class axis (Flatten, Reshape, Squeeze, Identity, Dropout, Relu, pooling, a final Softmax) to a Gemm, a
  MatMul (with or without an Add), or a 1x1 Conv (ungrouped: a fully connected layer on pooled features, as the
  Gluon zoo's MobileNetV2 and SqueezeNet write it). Anything else is not recognised and :func:`classifier`
  refuses it in one line: a mode that trains "the classifier" must not train some other layer instead.

``bias`` is every bias and BatchNorm shift plus the classifier (TinyTL); ``lite`` that plus its modules; the
classifier is what a class count the data changes resizes (engine_onnx).
"""
from __future__ import annotations

from typing import NoReturn

from dataclasses import dataclass

from ..errors import UsageError
from .onnx_layers import WEIGHTED

# ops between the classifier and the logits that keep the class axis where it is
_KEEPS_CLASSES = ("Flatten", "Reshape", "Squeeze", "Identity", "Dropout", "Relu", "GlobalAveragePool",
                  "AveragePool", "GlobalMaxPool", "MaxPool", "Softmax", "LogSoftmax")
_FIX = ("fine-tune a model whose output layer is a Gemm, a MatMul (with or without an Add) or a 1x1 Conv with "
        "initializer weights, followed only by Flatten/Reshape/pooling")


@dataclass(frozen=True)
class Classifier:
    """The output layer: its node, form, weight and bias initializers, and how many classes it has."""

    form: str                 # "Gemm", "MatMul+Add", "MatMul", "1x1 Conv"
    node: str                 # the weighted node's label (name, else first output)
    output: str               # its output (unique in the graph, where a name may not be)
    weight: str
    bias: str | None
    outputs: int              # the class count the file's layer has
    class_axis: int           # the weight's axis that holds the classes
    reshapes: tuple = ()      # initializers of Reshape targets between it and the logits

    @property
    def names(self) -> list[str]:
        return [self.weight] + ([self.bias] if self.bias else [])


def _attr(node, name: str, default=0):
    return next((a.i for a in node.attribute if a.name == name), default)


def _label(node) -> str:
    return node.name or node.output[0]


def float_shapes(graph) -> dict[str, tuple]:
    """Each float initializer's shape (an initializer without its data keeps its dims)."""
    return {t.name: tuple(int(d) for d in t.dims) for t in graph.initializer if t.data_type == 1}


def outputs_of(node, shapes: dict) -> int | None:
    """How many outputs (channels) a weighted node with an initializer weight has; None: not such a node."""
    if node.op_type not in WEIGHTED or len(node.input) < 2 or node.input[1] not in shapes or \
            node.input[0] in shapes:
        return None
    w = shapes[node.input[1]]
    if node.op_type == "Conv":
        return w[0] if len(w) >= 3 else None
    if len(w) != 2:
        return None
    if node.op_type == "Gemm":
        return w[0] if _attr(node, "transB") else w[1]
    return w[1]


def _add_bias(add, producer: dict, shapes: dict):
    """(the layer, its bias) when ``add`` puts a constant on a weighted layer's output that has no bias of its
    own, one value per output channel; else None."""
    if add.op_type != "Add" or len(add.input) != 2:
        return None
    consts = [i for i in add.input if i in shapes]
    acts = [i for i in add.input if i not in shapes]
    if len(consts) != 1 or len(acts) != 1 or acts[0] not in producer:
        return None
    layer = producer[acts[0]]
    n = outputs_of(layer, shapes)
    if n is None or (len(layer.input) > 2 and layer.input[2]):
        return None
    shape = shapes[consts[0]]
    per_channel = (n,) if layer.op_type != "Conv" else (n, 1, 1)
    if tuple(s for s in shape) not in (per_channel, (1, *per_channel)):
        return None
    return layer, consts[0]


def layer_biases(nodes, shapes: dict) -> list[str]:
    """Every layer's bias and every BatchNorm's shift, in graph order."""
    nodes = list(nodes)
    producer = {o: n for n in nodes for o in n.output}
    names = []
    for node in nodes:
        if node.op_type in ("Conv", "Gemm", "BatchNormalization") and len(node.input) > 2 and node.input[2] in shapes:
            names.append(node.input[2])
        elif node.op_type == "Add":
            found = _add_bias(node, producer, shapes)
            if found:
                names.append(found[1])
    return list(dict.fromkeys(names))


def layer_weights(nodes, shapes: dict) -> list[str]:
    """What ``all`` and ``last:N`` train of these nodes: each layer's weight and bias, each BatchNorm's scale and
    shift (not its running statistics, which stay the file's)."""
    nodes = list(nodes)
    producer = {o: n for n in nodes for o in n.output}
    names = []
    for node in nodes:
        if node.op_type in (*WEIGHTED, "BatchNormalization"):
            names += [name for name in node.input[1:3] if name in shapes]
        elif node.op_type == "Add":
            found = _add_bias(node, producer, shapes)
            if found:
                names.append(found[1])
    return list(dict.fromkeys(names))


def classifier(nodes, shapes: dict, logits: str, where: str = "model", declared: int | None = None) -> Classifier:
    """The layer that makes the classes of ``logits`` (see the module's doc); a UsageError (one line) when the
    graph's output is made some other way, or has ``declared`` classes (its type's, if known) where the layer
    has another count."""
    nodes = list(nodes)
    producer = {o: n for n in nodes for o in n.output}

    def refuse(why: str) -> NoReturn:
        raise UsageError(f"the model's classifier is not recognised: {why}", where, _FIX)

    name, reshapes, bias = logits, [], None
    node = producer.get(name)
    while node is not None and node.op_type in _KEEPS_CLASSES:
        if node.op_type == "Flatten" and _attr(node, "axis", 1) != 1:
            refuse(f"Flatten node {_label(node)!r} has axis {_attr(node, 'axis', 1)}, not 1")
        if node.op_type == "Reshape":
            reshapes.append(node.input[1])
        node = producer.get(node.input[0])
    if node is not None and node.op_type == "Add":
        found = _add_bias(node, producer, shapes)
        if found is None:
            refuse(f"the logits come from Add node {_label(node)!r}, which is not a layer's bias")
        node, bias = found
    if node is None:
        refuse(f"no layer makes {logits!r}")
    n = outputs_of(node, shapes)
    if n is None:
        why = "its weight is computed by the graph" if node.op_type in WEIGHTED else "it is not a weighted layer"
        refuse(f"the logits come from {node.op_type} node {_label(node)!r} ({why})")
    if node.op_type == "Gemm" and _attr(node, "transA"):
        refuse(f"Gemm node {_label(node)!r} takes its input transposed (transA=1)")
    if node.op_type == "Conv":
        w = shapes[node.input[1]]
        if len(w) != 4 or w[2:] != (1, 1) or _attr(node, "group", 1) != 1:
            refuse(f"the logits come from Conv node {_label(node)!r} with a {'x'.join(map(str, w[2:]))} kernel "
                   f"in {_attr(node, 'group', 1)} group(s), not an ungrouped 1x1 Conv")
    if declared and declared != n:
        refuse(f"the output has {declared} classes where {node.op_type} node {_label(node)!r} has {n} outputs")
    own = node.input[2] if len(node.input) > 2 and node.input[2] in shapes else None
    form = {"Gemm": "Gemm", "Conv": "1x1 Conv", "MatMul": "MatMul+Add" if bias else "MatMul"}[node.op_type]
    axis = 0 if node.op_type == "Conv" or node.op_type == "Gemm" and _attr(node, "transB") else 1
    return Classifier(form, _label(node), node.output[0], node.input[1], own or bias, int(n), axis, tuple(reshapes))


def graph_classifier(graph, logits: str, where: str = "model") -> Classifier:
    """:func:`classifier` of a whole graph, checked against the class count its output's type declares."""
    dims = graph.output[0].type.tensor_type.shape.dim if graph.output else []
    return classifier(graph.node, float_shapes(graph), logits, where, dims[1].dim_value if len(dims) > 1 else None)

