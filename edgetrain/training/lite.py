"""``--train-layers lite``: TinyTL's lite residual modules written into an ONNX inference graph.

TinyTL (Cai et al., NeurIPS 2020; mit-han-lab/tinyml, ``LiteResidualModule``) freezes every weight, trains
the biases, and adds to each block a small branch that learns what the frozen features lack for the new
domain. Here that branch is made of ordinary ONNX ops, so the fine-tuned file is an inference graph that
``predict``, ``quantize`` and ``profile`` run like any other, and onnx_grad differentiates it like any other:

    X (block input, C x H x W) -> AveragePool 2x2 (a 2x-downsampled copy)
      -> Conv 3x3, stride of the block, 2 groups, C' = C rounded up to 8 channels -> Relu
      -> Conv 1x1 to the block's output channels -> 2x nearest upsampling [-> Slice to an odd H/W]
      -> Add to the block's output Y, which every later node then reads instead of Y

TinyTL's two BatchNorms are folded into the convolutions' biases (an inference-time BatchNorm is an
affine map) and its upsampling is nearest rather than bilinear (an exact 2x repeat, written Reshape ->
Expand -> Reshape: the same arithmetic in NumPy and in ONNX Runtime, and no multiply-adds). Its last
BatchNorm starts with a zero scale so the model is unchanged at step 0; here the 1x1 projection and its
bias start at zero, which does the same.

What a *block* is in an ONNX graph. The graph is read as the layers ``last:N`` counts (onnx_layers: a
weighted node and what follows it up to the next, a residual block being one layer since no cut can enter
it). Consecutive layers are merged into a block until the block either holds a full k x k convolution
(k > 1, not depthwise: a plain CNN's or a ResNet's stage) or ends on a tensor narrower than the widest one
inside it (an inverted residual's linear bottleneck: MobileNetV2's expand -> depthwise -> project is one
block, with or without its skip connection). So MobileNetV2 gets one module per inverted residual block,
as in TinyTL, plus one for the stem convolution; a plain CNN one per convolution stage. A block ends at the
last tensor before the classifier that still has rows and columns (a global pool and the output layer get
none), and a block whose input is smaller than 2 x 2 gets none. Each module pools its block's input as the
model computes it, the module before it added (TinyTL's chaining).

The module's own inputs are what its weights' gradients need, and they are small: the pooled copy (a
quarter of the block input) and the 3x3 convolution's output at that resolution. On MobileNetV2-1.0 at
160x160 they take the tape from 0.40 to 1.36 MiB per sample (the float activations: 38 MiB).
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from .. import _lazy
from ..errors import UsageError
from . import roles
from .onnx_grad import logits_name
from .onnx_layers import WEIGHTED, cuts, layer_points, shapes_of

GROUPS = 2
KERNEL = 3


@dataclass(frozen=True)
class Block:
    """One lite module's place: the block's input and output tensors and their (C, H, W)."""

    start: str
    end: str
    in_shape: tuple
    out_shape: tuple


def _full_conv(node, inits: dict) -> bool:
    """A k x k convolution (k > 1) that mixes channels (not depthwise)."""
    if node.op_type != "Conv" or node.input[1] not in inits:
        return False
    dims = tuple(inits[node.input[1]].dims)
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    return len(dims) == 4 and (group == 1 or dims[1] > 1) and dims[2] * dims[3] > 1


def find_blocks(proto) -> list[Block]:
    """The blocks that get a lite module, in graph order (see the module's doc)."""
    graph = proto.graph
    inits = {t.name: t for t in graph.initializer}
    return _blocks(graph, inits, shapes_of(proto), _classifier_output(proto))


def _classifier_output(proto) -> str | None:
    """The classifier's output (roles): no block reaches it (a 1x1 Conv classifier on features that still have
    rows and columns, SqueezeNet's, is no block). None: no classifier is recognised (the engine refuses that)."""
    try:
        return roles.graph_classifier(proto.graph, logits_name(proto)).output
    except UsageError:
        return None


def _blocks(graph, inits: dict, shapes: dict, classifier: str | None = None) -> list[Block]:
    four_d = lambda name: len(shapes.get(name, ())) == 3  # noqa: E731
    points = layer_points(graph, set(inits))
    all_cuts = cuts(graph, set(inits))
    ends = points[1:] + [(len(graph.node) - 1, graph.output[0].name)]
    blocks: list[Block] = []
    start, widest, full = None, 0, False
    for (first, begin), (last, end) in zip(points, ends):
        span = graph.node[first + 1:last + 1]
        if any(n.op_type in WEIGHTED[1:] or classifier in n.output for n in span):
            break  # the classifier (or a fully connected layer before it: no rows and columns after)
        closes = four_d(end)
        if not closes:  # the layer before the classifier: its last 4-D tensor (before a global pool)
            end = next((name for i, name in reversed(all_cuts)
                        if first < i <= last and four_d(name) and min(shapes[name][1:]) >= 2), None)
            if end is None:
                break
        if start is None:
            if not four_d(begin):
                continue
            start, widest, full = begin, 0, False
        widest = max([widest] + [shapes[o][0] for n in span for o in n.output if len(shapes.get(o, ())) == 3])
        full = full or any(_full_conv(n, inits) for n in span)
        if full or shapes[end][0] < widest:
            if min(shapes[start][1:]) >= 2:
                blocks.append(Block(start, end, shapes[start], shapes[end]))
            start = None
        if not closes:
            break
    return blocks


def _stride(h: int, ho: int) -> int | None:
    """The 3x3 convolution's stride that takes the pooled ceil(h/2) rows to ceil(ho/2) (None: none does)."""
    pooled = math.ceil(h / 2)
    return next((s for s in range(1, 5) if math.ceil(pooled / s) == math.ceil(ho / 2)), None)


def _upsample(helper, p: str, x: str) -> list:
    """Nearest 2x upsampling of ``x`` as Reshape -> Expand -> Reshape: each pixel repeated 2 x 2.
    (Resize would say it in one node, but ONNX Runtime's symbolic shape inference, which quantize runs first,
    then loses the batch dimension: 'floor(1.0*batch)'.)"""
    return [helper.make_node("Reshape", [x, f"{p}up_split"], [f"{p}up_split_out"], name=f"{p}up_split"),
            helper.make_node("Expand", [f"{p}up_split_out", f"{p}up_expand"], [f"{p}up_expand_out"],
                             name=f"{p}up_expand"),
            helper.make_node("Reshape", [f"{p}up_expand_out", f"{p}up_merge"], [f"{p}up"], name=f"{p}up")]


def _prefix(names: set) -> str:
    base = "lite"
    while any(re.match(re.escape(base) + r"\d+/", n) for n in names):
        base += "_"
    return base


def insert(proto, seed: int = 0):
    """``proto`` with a lite module on each block, changed in place (a copy of its weights would be most of
    its bytes); returns (proto, the new weights' names, the blocks). The new 3x3 weights are He-initialised
    from ``seed``; the 1x1 projections are zero, so the model computes what it did."""
    onnx = _lazy.onnx()
    helper, numpy_helper = onnx.helper, _lazy.from_import("onnx", "numpy_helper")
    graph = proto.graph
    blocks = [b for b in find_blocks(proto) if all(_stride(i, o) for i, o in zip(b.in_shape[1:], b.out_shape[1:]))]
    names = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output} | \
        {n.name for n in graph.node} | {i.name for i in graph.input}
    base = _prefix(names)
    rng = np.random.RandomState(seed)
    producer = {o: j for j, n in enumerate(graph.node) for o in n.output}
    after: dict[int, list] = {}   # node index -> new nodes to place right after it (-1: first)
    weights, inits = [], []
    renames: dict[str, str] = {}
    for k, b in enumerate(blocks):
        p = f"{base}{k}/"
        (c, h, w), (co, ho, wo) = b.in_shape, b.out_shape
        mid = max(8, -(-c // 8) * 8)
        groups = GROUPS if c % GROUPS == 0 else 1
        stride = [_stride(h, ho), _stride(w, wo)]
        w1 = rng.standard_normal((mid, c // groups, KERNEL, KERNEL)) * np.sqrt(2.0 / (c // groups * KERNEL ** 2))
        arrays = {f"{p}conv1_weight": w1.astype(np.float32), f"{p}conv1_bias": np.zeros(mid, np.float32),
                  f"{p}conv2_weight": np.zeros((co, mid, 1, 1), np.float32), f"{p}conv2_bias": np.zeros(co, np.float32),
                  f"{p}up_split": np.asarray([0, co, math.ceil(ho / 2), 1, math.ceil(wo / 2), 1], np.int64),
                  f"{p}up_expand": np.asarray([1, 1, 1, 2, 1, 2], np.int64),
                  f"{p}up_merge": np.asarray([0, co, 2 * math.ceil(ho / 2), 2 * math.ceil(wo / 2)], np.int64)}
        inits += [numpy_helper.from_array(v, n) for n, v in arrays.items()]
        weights += [f"{p}conv1_weight", f"{p}conv2_weight"]
        # the block's input as the model now computes it: with the module before it added, as in TinyTL
        pool = helper.make_node("AveragePool", [renames.get(b.start, b.start)], [f"{p}pool"], name=f"{p}pool",
                                kernel_shape=[2, 2],
                                strides=[2, 2], pads=[0, 0, h % 2, w % 2])
        after.setdefault(producer.get(b.start, -1), []).append(pool)
        tail = [helper.make_node("Conv", [f"{p}pool", f"{p}conv1_weight", f"{p}conv1_bias"], [f"{p}conv1"],
                                 name=f"{p}conv1", kernel_shape=[KERNEL, KERNEL], pads=[KERNEL // 2] * 4,
                                 strides=stride, group=groups),
                helper.make_node("Relu", [f"{p}conv1"], [f"{p}relu"], name=f"{p}relu"),
                helper.make_node("Conv", [f"{p}relu", f"{p}conv2_weight", f"{p}conv2_bias"], [f"{p}conv2"],
                                 name=f"{p}conv2", kernel_shape=[1, 1])]
        tail += _upsample(helper, p, f"{p}conv2")
        up = f"{p}up"
        if 2 * math.ceil(ho / 2) != ho or 2 * math.ceil(wo / 2) != wo:
            for what, value in (("starts", [0, 0]), ("ends", [ho, wo]), ("axes", [2, 3])):
                inits.append(numpy_helper.from_array(np.asarray(value, np.int64), f"{p}crop_{what}"))
            tail.append(helper.make_node("Slice", [up, f"{p}crop_starts", f"{p}crop_ends", f"{p}crop_axes"],
                                         [f"{p}crop"], name=f"{p}crop"))
            up = f"{p}crop"
        tail.append(helper.make_node("Add", [b.end, up], [f"{p}out"], name=f"{p}add"))
        after.setdefault(producer[b.end], []).extend(tail)
        renames[b.end] = f"{p}out"
    nodes = list(after.get(-1, []))
    for j, node in enumerate(graph.node):
        copy = type(node)()
        copy.CopyFrom(node)
        for i, name in enumerate(copy.input):
            if name in renames:
                copy.input[i] = renames[name]
        nodes.append(copy)
        nodes.extend(after.get(j, []))
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(inits)
    del graph.value_info[:]
    return proto, weights, blocks
