"""Tiny ONNX inference graphs built in code (opset 13, weights as initializers, NCHW float32), the shape
``edgetrain export`` writes: a builder that tracks shapes, and a MobileNetV2-style stack."""
from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper


class Builder:
    """Adds nodes one at a time; every method takes a value name and returns the new value's name."""

    def __init__(self, shape: tuple, seed: int = 0):
        self.rng = np.random.default_rng(seed)
        self.input = "data"
        self.shapes = {"data": tuple(shape)}
        self.nodes, self.inits = [], {}
        self.count = 0

    def _name(self, op: str) -> str:
        self.count += 1
        return f"{op.lower()}{self.count}"

    def init(self, name: str, value) -> str:
        self.inits[name] = np.asarray(value)
        self.shapes[name] = self.inits[name].shape
        return name

    def node(self, op: str, inputs: list, shape: tuple, name: str | None = None, **attrs) -> str:
        name = name or self._name(op)
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        self.shapes[name] = tuple(shape)
        return name

    def weight(self, name: str, shape: tuple, fan_in: int) -> str:
        return self.init(name, (self.rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(np.float32))

    def small(self, name: str, shape: tuple, scale: float = 0.1) -> str:
        return self.init(name, (self.rng.standard_normal(shape) * scale).astype(np.float32))

    # -- layers
    def conv(self, x, cout, k=3, stride=1, pads=None, group=1, dilation=1, bias=True, **extra) -> str:
        n, c, h, w = self.shapes[x]
        pads = [k // 2 * dilation] * 4 if pads is None else list(pads)
        name = self._name("Conv")
        inputs = [x, self.weight(f"{name}_weight", (cout, c // group, k, k), c // group * k * k)]
        if bias:
            inputs.append(self.small(f"{name}_bias", (cout,)))
        ho = (h + pads[0] + pads[2] - dilation * (k - 1) - 1) // stride + 1
        wo = (w + pads[1] + pads[3] - dilation * (k - 1) - 1) // stride + 1
        return self.node("Conv", inputs, (n, cout, ho, wo), name, kernel_shape=[k, k], strides=[stride, stride],
                         pads=pads, group=group, dilations=[dilation, dilation], **extra)

    def bn(self, x) -> str:
        c = self.shapes[x][1]
        name = f"bn{self.count + 1}"
        ins = [x, self.init(f"{name}_gamma", (1 + 0.1 * self.rng.standard_normal(c)).astype(np.float32)),
               self.small(f"{name}_beta", (c,)), self.small(f"{name}_mean", (c,)),
               self.init(f"{name}_var", self.rng.uniform(0.5, 1.5, c).astype(np.float32))]
        return self.node("BatchNormalization", ins, self.shapes[x], epsilon=1e-5, momentum=0.9)

    def relu(self, x) -> str:
        return self.node("Relu", [x], self.shapes[x])

    def clip(self, x, lo=0.0, hi=6.0) -> str:
        name = f"clip{self.count + 1}"
        ins = [x, "" if lo is None else self.init(f"{name}_min", np.float32(lo)),
               "" if hi is None else self.init(f"{name}_max", np.float32(hi))]
        while ins[-1] == "":
            ins.pop()
        return self.node("Clip", ins, self.shapes[x])

    def add(self, a, b) -> str:
        return self.node("Add", [a, b], np.broadcast_shapes(self.shapes[a], self.shapes[b]))

    def mul(self, a, b) -> str:
        return self.node("Mul", [a, b], np.broadcast_shapes(self.shapes[a], self.shapes[b]))

    def gap(self, x) -> str:
        n, c = self.shapes[x][:2]
        return self.node("GlobalAveragePool", [x], (n, c, 1, 1))

    def pool(self, op, x, k, stride, pads=(0, 0, 0, 0), dilation=1, **extra) -> str:
        n, c, h, w = self.shapes[x]
        ho = (h + pads[0] + pads[2] - dilation * (k - 1) - 1) // stride + 1
        wo = (w + pads[1] + pads[3] - dilation * (k - 1) - 1) // stride + 1
        if dilation != 1:
            extra["dilations"] = [dilation, dilation]
        return self.node(op, [x], (n, c, ho, wo), kernel_shape=[k, k], strides=[stride, stride], pads=list(pads),
                         **extra)

    def flatten(self, x, axis=1) -> str:
        s = self.shapes[x]
        return self.node("Flatten", [x], (int(np.prod(s[:axis])), int(np.prod(s[axis:]))), axis=axis)

    def reshape(self, x, shape) -> str:
        target = self.init(f"shape{self.count + 1}", np.asarray(shape, np.int64))
        full = [self.shapes[x][i] if s == 0 else s for i, s in enumerate(shape)]
        if -1 in full:
            full[full.index(-1)] = int(np.prod(self.shapes[x]) // -np.prod(full))
        return self.node("Reshape", [x, target], tuple(full))

    def gemm(self, x, out, trans_b=1, bias=True, **extra) -> str:
        n, f = self.shapes[x]
        name = f"fc{self.count + 1}"
        ins = [x, self.weight(f"{name}_weight", (out, f) if trans_b else (f, out), f)]
        if bias:
            ins.append(self.small(f"{name}_bias", (out,)))
        return self.node("Gemm", ins, (n, out), transB=trans_b, **extra)

    def matmul(self, x, out) -> str:
        n, f = self.shapes[x]
        return self.node("MatMul", [x, self.weight(f"mm{self.count + 1}_weight", (f, out), f)], (n, out))

    def unary(self, op, x, **attrs) -> str:
        return self.node(op, [x], self.shapes[x], **attrs)

    def model(self, output: str, opset: int = 13) -> bytes:
        graph = helper.make_graph(
            self.nodes, "g", [helper.make_tensor_value_info("data", TensorProto.FLOAT, self.shapes["data"])],
            [helper.make_tensor_value_info(output, TensorProto.FLOAT, self.shapes[output])],
            [numpy_helper.from_array(v, k) for k, v in self.inits.items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        return model.SerializeToString()


def inverted_residual(b: Builder, x: str, cout: int, stride: int, expand: int) -> str:
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 project (no ReLU6), residual when shapes match."""
    cin = b.shapes[x][1]
    y = x
    if expand != 1:
        y = b.clip(b.bn(b.conv(y, cin * expand, 1, bias=False)))
    y = b.clip(b.bn(b.conv(y, cin * expand, 3, stride=stride, group=cin * expand, bias=False)))
    y = b.bn(b.conv(y, cout, 1, bias=False))
    return b.add(x, y) if stride == 1 and cin == cout else y


MOBILENET_V2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2),
                (6, 320, 1, 1))   # (expansion, channels, repeats, first stride), Sandler et al. 2018


def mobilenet_v2(shape=(8, 3, 160, 160), classes=10, stages=MOBILENET_V2, last=1280, seed=0) -> bytes:
    """A MobileNetV2-1.0 layout with random weights (a Gemm head, no Softmax)."""
    b = Builder(shape, seed)
    x = b.clip(b.bn(b.conv(b.input, 32, 3, stride=2, bias=False)))
    for expand, channels, repeats, stride in stages:
        for r in range(repeats):
            x = inverted_residual(b, x, channels, stride if r == 0 else 1, expand)
    x = b.clip(b.bn(b.conv(x, last, 1, bias=False)))
    return b.model(b.gemm(b.flatten(b.gap(x)), classes))
