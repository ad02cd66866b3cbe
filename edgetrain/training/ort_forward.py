"""The forward pass of a :class:`~.onnx_grad.GradGraph` run by ONNX Runtime, its tape made as NumPy's would be.

With ``--train-layers bias`` or ``lite`` every step runs the whole graph forward, and in NumPy that forward
costs about what the backward does (MobileNetV2-1.0, 160x160, batch 8: 153 ms; ONNX Runtime: 22 ms). Here
ONNX Runtime runs it, on the same graph with two changes:

- the trainable initializers are graph inputs, fed their current values at each run (the session is made
  once; the frozen weights stay initializers, so ORT optimises around them);
- what the backward needs is an extra graph output: for each ReLU/Clip a boolean of where its input was
  inside the range (Greater/Less/And: one byte per value, packed to bits as soon as it arrives), for a node
  whose tape holds an input (a trained Conv's input, the lite modules' pooled copies) that input, and for
  every shape the backward reads a ``Shape`` of it (a few int64s).

The backward stays :meth:`GradGraph.backward` (NumPy), reading a :class:`Tape` equal to the one NumPy's
forward keeps (float32 rounding aside: a ReLU input within rounding of 0 may fall on the other side).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import _lazy
from .onnx_grad import BitMask, GradGraph, Tape, load_model

PREPACK = False   # MLAS's packed copy of each weight: off saved 3 MB and was no slower (MobileNetV2 lite, 160x160)


# What the sessions take beyond the process before them (the library, the forward's copy of the model, one
# ConvTranspose session per Conv, their first runs), MiB: measured 92 MB for MobileNetV2-1.0 lite (a 9 MB file)
# at 160x160: this bound is 45 + 5x the file.
SESSIONS_FIXED_MB = 45.0
SESSIONS_PER_MODEL_MB = 5.0


def sessions_mb(model_bytes: int) -> float:
    return SESSIONS_FIXED_MB + SESSIONS_PER_MODEL_MB * model_bytes / 2**20


def mask_bytes(tape: Tape) -> int:
    """What the masks of ``tape`` (a forward of the same graph) take as the session returns them: a byte per
    value, until they are packed."""
    return sum(int(np.prod(v.shape)) for saved in tape.saved.values() for v in saved.values()
               if isinstance(v, BitMask))


class OrtForward:
    """``forward(x) -> (output, tape)`` as :meth:`GradGraph.forward`, run by an ONNX Runtime session."""

    def __init__(self, model, grad: GradGraph, threads: int, arena: bool = False, conv_transpose: bool = True):
        onnx = _lazy.onnx()
        helper = onnx.helper
        proto = onnx.ModelProto()
        proto.CopyFrom(load_model(model))
        graph = proto.graph
        self.grad = grad
        trainable = set(grad.trainable)
        kept = [t for t in graph.initializer if t.name not in trainable]
        moved = [t for t in graph.initializer if t.name in trainable]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in moved)
        del graph.output[:]
        del graph.value_info[:]
        outputs = [grad.output]
        self.plan: list[tuple] = []   # (index, masks or None, {input position: output}, [shape output per input])
        before: dict[str, list] = {}   # node (by first output) -> the extra nodes reading its inputs, run just before it

        def out(name: str, dtype) -> str:
            if name == grad.input or name in outputs:
                return name
            outputs.append(name)
            return name

        def const(value: float, name: str) -> str:
            graph.initializer.append(onnx.numpy_helper.from_array(np.asarray(value, grad.dtype), name))
            return name

        for index, (node, op) in enumerate(grad.nodes):
            if not any(op.need):
                continue
            tag = f"ortfwd{index}"
            extra = before.setdefault(node.output[0], [])
            if hasattr(op, "mask_bounds"):
                consts = [grad.const(n) if c else None for n, c in zip(node.input, op.is_const)]
                lo, hi = op.mask_bounds(consts)
                parts = []
                if lo is not None:
                    extra.append(helper.make_node("Greater", [node.input[0], const(lo, f"{tag}_lo")], [f"{tag}_gt"]))
                    parts.append(f"{tag}_gt")
                if hi is not None:
                    extra.append(helper.make_node("Less", [node.input[0], const(hi, f"{tag}_hi")], [f"{tag}_lt"]))
                    parts.append(f"{tag}_lt")
                if len(parts) == 2:
                    extra.append(helper.make_node("And", parts, [f"{tag}_mask"]))
                    parts = [f"{tag}_mask"]
                if not parts:   # a Clip with no bounds: everything passes
                    extra.append(helper.make_node("Shape", [node.input[0]], [f"{tag}_shape"]))
                    self.plan.append((index, None, {}, [out(f"{tag}_shape", None)], True))
                    continue
                self.plan.append((index, out(parts[0], bool), {}, [], True))
                continue
            positions = op.kept_inputs()
            if positions is None:
                positions = tuple(i for i, c in enumerate(op.is_const) if not c and node.input[i])
            values = {i: out(node.input[i], None) for i in positions if node.input[i]}
            shapes: list[str | None] = []
            for i, name in enumerate(node.input):
                if not name or op.is_const[i]:
                    shapes.append(None)
                    continue
                extra.append(helper.make_node("Shape", [name], [f"{tag}_shape{i}"]))
                shapes.append(out(f"{tag}_shape{i}", None))
            self.plan.append((index, None, values, shapes, False))
        # in place, not at the end: ONNX Runtime runs nodes in the graph's order, and a mask computed last would
        # keep every ReLU input alive to the end of the pass (all the activations: 4x the memory, measured)
        nodes = list(graph.node)
        del graph.node[:]
        for node in nodes:
            graph.node.extend(before.get(node.output[0], []))
            graph.node.append(node)
        graph.output.extend(helper.make_empty_tensor_value_info(name) for name in outputs)
        self.outputs = outputs
        self.trainable = [t.name for t in moved]
        self.session = _lazy.ort_session(proto.SerializeToString(), threads, arena=arena, priority_order=True, prepack=PREPACK)
        if conv_transpose:
            use_ort_conv_transpose(grad, threads)

    def run(self, x: np.ndarray, names: list[str]) -> list[np.ndarray]:
        feeds = {self.grad.input: np.asarray(x, self.grad.dtype)}
        feeds.update({n: self.grad.params[n] for n in self.trainable})
        return self.session.run(names, feeds)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """The output alone (evaluation: no tape)."""
        return self.run(x, [self.grad.output])[0]

    def forward(self, x: np.ndarray) -> tuple:
        x = np.asarray(x, self.grad.dtype)
        got = dict(zip(self.outputs, self.run(x, self.outputs)))
        got[self.grad.input] = x
        tape = Tape(x.shape[0])
        for index, mask, values, shapes, is_mask in self.plan:
            node, op = self.grad.nodes[index]
            if is_mask:
                saved = {"mask": BitMask(got.pop(mask) if mask else np.ones(got[shapes[0]], bool))}
            else:
                consts = [self.grad.const(n) if c else None for n, c in zip(node.input, op.is_const)]
                xs = [consts[i] if consts[i] is not None else got.get(values.get(i)) for i in range(len(node.input))]
                dims = [tuple(c.shape) if c is not None else (tuple(got[s]) if s else None)
                        for c, s in zip(consts, shapes)]
                saved = op.keep(xs, dims)
            tape.saved[index], tape.labels[index] = saved, (op.label, op.op)
        tape.tape_bytes = tape.nbytes
        return got[self.grad.output], tape


class ConvTranspose:
    """A frozen-or-trained Conv's input gradient as ONNX Runtime's ConvTranspose with the forward's weight
    (its (M, C/group, kh, kw) layout is ConvTranspose's (in, out/group, kh, kw)): the same strides, pads,
    dilations and groups, and an output_padding that gives back the input's rows and columns (a strided
    Conv drops the last rows a window does not reach). One session per input size, made at first use; the
    weight is an initializer unless it trains (then fed at each run)."""

    def __init__(self, node, op, trains: bool, threads: int):
        self.node, self.op, self.trains, self.threads = node, op, trains, threads
        self.sessions: dict[tuple, Any] = {}

    def _session(self, w: np.ndarray, h: int, wd: int):
        onnx = _lazy.onnx()
        helper = onnx.helper
        attrs = self.op.win.transpose_attrs(h, wd)
        ho, wo = (int(v) for v in self.op.win.out_hw(h, wd))
        node = helper.make_node("ConvTranspose", ["dy", "w"], ["dx"], group=self.op.groups, **attrs)
        inputs = [helper.make_tensor_value_info("dy", onnx.TensorProto.FLOAT, [None, int(w.shape[0]), int(ho), int(wo)])]
        if self.trains:
            inputs.append(helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, list(w.shape)))
        inits = [] if self.trains else [onnx.numpy_helper.from_array(np.asarray(w, np.float32), "w")]
        graph = helper.make_graph([node], "conv_transpose", inputs,
                                  [helper.make_tensor_value_info("dx", onnx.TensorProto.FLOAT, None)], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        return _lazy.ort_session(model.SerializeToString(), self.threads, arena=False, prepack=PREPACK)

    def __call__(self, dy: np.ndarray, w: np.ndarray, shape: tuple) -> np.ndarray:
        key = tuple(shape[2:])
        if key not in self.sessions:
            self.sessions[key] = self._session(w, *(int(v) for v in key))
        feeds = {"dy": np.ascontiguousarray(dy, np.float32)}
        if self.trains:
            feeds["w"] = w
        return self.sessions[key].run(None, feeds)[0]


def use_ort_conv_transpose(grad: GradGraph, threads: int) -> int:
    """Give every Conv of ``grad`` whose input gradient the backward computes ONNX Runtime's ConvTranspose for it
    (float32 graphs only); the number of Convs that got one."""
    if grad.dtype != np.float32:
        return 0
    trainable = set(grad.trainable)
    count = 0
    for node, op in grad.nodes:
        if op.op == "Conv" and op.need and op.need[0]:
            op.transposed = ConvTranspose(node, op, node.input[1] in trainable, threads)
            count += 1
    return count
