"""Where an ONNX inference graph can be cut into layers: the tensors no skip connection crosses.

``last:N`` cuts the graph right before its N-th weighted layer from the end; ``lite`` finds its blocks among
the same layers (lite.py). A layer is a weighted node (Conv, Gemm, MatMul with an initializer weight) and
what follows it up to the next one; a residual block is one layer, since no cut can enter it.
"""
from __future__ import annotations

import numpy as np

from .. import _lazy
from ..errors import UsageError

WEIGHTED = ("Conv", "Gemm", "MatMul")


def cuts(graph, initializers: set) -> list[tuple[int, str]]:
    """(node index, tensor) of each node whose single output alone carries everything later nodes need
    from it and before it: cutting there leaves no edge (a skip connection) crossing. Constants (initializers,
    Constant nodes) are not edges: each side has its own copy."""
    constant = set(initializers) | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    last_use: dict[str, int] = {}
    for j, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in constant:
                last_use[name] = j
    # the furthest node that a tensor made so far (the data input first) is still used by
    reach = max((last_use.get(i.name, -1) for i in graph.input if i.name not in constant), default=-1)
    cuts = []
    for i, node in enumerate(graph.node):
        if node.op_type != "Constant" and len(node.output) == 1 and reach <= i:
            cuts.append((i, node.output[0]))
        for out in node.output:
            reach = max(reach, last_use.get(out, -1))
    return cuts


def layer_points(graph, initializers: set) -> list[tuple[int, str]]:
    """(node index, tensor) of the cut right before each weighted layer, in graph order (the data input, at
    index -1, before a first layer that starts the graph); a residual block's layers share one."""
    found = [(-1, i.name) for i in graph.input if i.name not in initializers][:1] + cuts(graph, initializers)
    weighted = [j for j, node in enumerate(graph.node)
                if node.op_type in WEIGHTED and len(node.input) > 1 and node.input[1] in initializers]
    points: list[tuple[int, str]] = []
    for j in weighted:
        before = [(i, name) for i, name in found if i < j]
        if before and (not points or points[-1] != before[-1]):
            points.append(before[-1])
    return points


def cut_before_layer(graph, initializers: set, n: int) -> str:
    """The tensor at which ``last:n`` cuts: right before the n-th weighted layer from the end (a layer being
    a block no cut can enter)."""
    points = [name for i, name in layer_points(graph, initializers) if i >= 0]
    if n > len(points):
        raise UsageError(f"--train-layers last:{n}: the model has {len(points)} layer(s) that can train from the end",
                         "--train-layers", f"use last:{len(points)} at most, or all")
    return points[-n]


def weightless(proto):
    """A copy of ``proto`` for shape inference: large float initializers become graph inputs of their shape
    (inference reads a weight's shape, not its values; on MobileNetV2 at 160x160, inferring the whole model
    raised the fine-tune's RSS by 43 MB: its weights serialized and parsed twice). Small ones stay: a Reshape's
    target shape is read from its values."""
    helper = _lazy.onnx().helper
    light = type(proto)()
    light.ir_version = proto.ir_version
    light.opset_import.extend(proto.opset_import)
    graph = light.graph
    graph.node.extend(proto.graph.node)
    graph.input.extend(proto.graph.input)
    graph.output.extend(proto.graph.output)
    for t in proto.graph.initializer:
        size = int(np.prod(t.dims)) if t.dims else 1
        if t.data_type == 1 and size > 64:
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            graph.initializer.append(t)
    return light


def shapes_of(proto) -> dict[str, tuple]:
    """(C, H, W, ...) of every tensor whose shape inference knows every dimension but the batch."""
    inferred = _lazy.onnx().shape_inference.infer_shapes(weightless(proto))
    found = {}
    for v in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = [d.dim_value for d in v.type.tensor_type.shape.dim][1:]
        if dims and all(d > 0 for d in dims):
            found[v.name] = tuple(dims)
    return found


def extract(proto, inputs: list[str], outputs: list[str], shapes: dict[str, tuple]):
    """The part of ``proto`` that computes ``outputs`` from ``inputs`` (and its own initializers), as a model:
    what onnx.utils.Extractor does, without inferring the shapes of the whole weighted model again (twice,
    in the Extractor) to type the part's inputs and outputs: ``shapes`` (shapes_of) has them."""
    helper = _lazy.onnx().helper
    graph = proto.graph
    wanted, keep = set(outputs), []
    for node in reversed(graph.node):
        if any(o in wanted for o in node.output):
            keep.append(node)
            wanted.update(i for i in node.input if i and i not in inputs)
    batch = graph.input[0].type.tensor_type.shape.dim[0]
    first = batch.dim_param or batch.dim_value or "batch"

    def typed(name):
        return helper.make_tensor_value_info(name, 1, [first, *shapes[name]])

    part = type(proto)()
    part.ir_version = proto.ir_version
    part.opset_import.extend(proto.opset_import)
    part.graph.name = graph.name
    part.graph.node.extend(keep[::-1])
    part.graph.input.extend(typed(name) for name in inputs)
    part.graph.output.extend(typed(name) for name in outputs)
    part.graph.initializer.extend(t for t in graph.initializer if t.name in wanted)
    return part
