"""Where an ONNX inference graph can be cut into layers: the tensors no skip connection crosses.

``last:N`` cuts the graph right before its N-th weighted layer from the end; ``lite`` finds its blocks among
the same layers (lite.py). A layer is a weighted node (Conv, Gemm, MatMul with an initializer weight) and
what follows it up to the next one; a residual block is one layer, since no cut can enter it.
"""
from __future__ import annotations

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
