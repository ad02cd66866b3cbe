"""A whole training step of a :class:`~.onnx_grad.GradGraph` as one ONNX Runtime graph: forward, the loss's
gradient and the backward, with ``--train-layers bias`` and ``lite``.

The graph is the model's, with the trainable initializers made inputs (fed their current values at each
run) and, after its nodes, an If on a TRAIN input holding the softmax cross-entropy's dL/dlogits (from one-hot
labels and the 1/batch scale, both inputs) and the backward: each node's from :meth:`~.onnx_grad._Op.emit`,
beside its NumPy backward (a frozen Conv's input gradient is a ConvTranspose of the same initializer, a
ReLU/ReLU6's a multiply by the boolean computed beside it in the forward, a bias's a ReduceSum, a trained Conv's
weight gradient a Conv of the swapped input and dy, a non-overlapping MaxPool's a MaxUnpool of its Indices).
Its outputs are the logits (the loss and the count of right answers are NumPy's, from them) and one gradient
per trainable initializer; with TRAIN false (evaluation) the If runs nothing, and the same session is the
forward alone.

So the masks never leave ONNX Runtime and the frozen weights are in the process once: they are inputs of the
graph like the trained ones, fed the buffers GradGraph holds at each run (ONNX Runtime reads a fed array where
it is; given them through ``add_external_initializers`` it kept a copy, 9 MB for MobileNetV2-1.0), the
forward's Conv and the backward's ConvTranspose reading the same one. A node runs where the graph places it
(the boolean of a ReLU's input right before the ReLU, so that input dies there as in inference; the backward
in reverse order after the forward).

A graph with an op whose backward has no ONNX form here (:class:`~.onnx_grad.NotEmitted`) is refused at
build; the engine then trains it with the forward in ONNX Runtime and NumPy's backward (ort_forward).
Measured (MobileNetV2-1.0 lite, 160x160, 2 threads, a loaded machine): 24-38 ms a one-sample step, against
about 73 a sample for NumPy's and 39 with ort_forward (batch 4); the library and session about 45 MB against
ort_forward's 92.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import _lazy
from .onnx_grad import GradGraph, NotEmitted, load_model
from .onnx_layers import shapes_of, without_weights

ONEHOT, SCALE, TRAIN, PREFIX = "edgetrain_onehot", "edgetrain_scale", "edgetrain_train", "edgetrain_bwd"
BATCH = "edgetrain_batch_stats"   # BatchNorm on the batch's statistics (a step, the settle pass) or the running ones

# What the session takes beyond the process before it (the library, 20 MB; the graph, its kernels and thread
# pool; the first run's arena is STEP_PER_SAMPLE's), MiB: measured 38 MB for MobileNetV2-1.0 bias (an 8.7 MB
# file) and 44 for lite (11.5 MB), at 160x160, when the session held its own copy of the frozen weights; 8-9 MB
# less since they are fed.
SESSIONS_FIXED_MB = 30.0
SESSIONS_PER_MODEL_MB = 0.5


# A step's tensors per sample against NumPy's figure for it (its peak, tape and temporaries, plus the masks at a
# byte per value): measured 15 MB against 13.2 (MobileNetV2-1.0 lite, 160x160, batch 1 and 4, ORT's arena).
STEP_PER_SAMPLE = 1.25


def sessions_mb(model_bytes: int) -> float:
    return SESSIONS_FIXED_MB + SESSIONS_PER_MODEL_MB * model_bytes / 2**20


class _Emitter:
    """What an op's :meth:`emit` writes through: backward nodes, constants, and what it reads of the forward
    (static dims, a Shape, a ReLU/Clip mask or a MaxPool's Indices added to the forward beside the node)."""

    def __init__(self, grad: GradGraph, shapes: dict):
        self.grad, self.shapes = grad, shapes
        self.nodes: list = []
        self.inits: list = []
        self.before: dict[str, list] = {}     # forward node (first output) -> nodes that run just before it
        self.outputs: dict[str, list] = {}    # forward node (first output) -> its added outputs
        self.current: Any = None  # (node, op) being differentiated
        self.batch_norm: dict[str, tuple] = {}   # training-mode BatchNorm (output) -> (centred input, 1/deviation, gain)
        self.opset = 13
        self._count = 0
        self._ints: dict[tuple, str] = {}
        self._shape: dict[str, str] = {}
        self.helper = _lazy.onnx().helper
        self.numpy_helper = _lazy.from_import("onnx", "numpy_helper")

    def _name(self) -> str:
        self._count += 1
        return f"{PREFIX}{self._count}"

    def node(self, op: str, inputs: list, **attrs) -> str:
        out = self._name()
        self.nodes.append(self.helper.make_node(op, list(inputs), [out], name=out, **attrs))
        return out

    def const(self, value) -> str:
        name = self._name()
        self.inits.append(self.numpy_helper.from_array(np.asarray(value), name))
        return name

    def ints(self, values) -> str:
        key = tuple(int(v) for v in values)
        if key not in self._ints:
            self._ints[key] = self.const(np.asarray(key, np.int64))
        return self._ints[key]

    def const_value(self, name: str) -> np.ndarray:
        return self.grad.const(name)

    def const_shape(self, name: str) -> tuple:
        return tuple(self.grad.const(name).shape)

    def dims(self, name: str) -> tuple:
        """The value's shape, None for the batch (an activation); an initializer's own."""
        if name in self.grad.params or name in self.grad._constants:
            return self.const_shape(name)
        if name in self.shapes:
            return (None, *self.shapes[name])
        folded = self._folded(name)
        if folded is not None:
            return folded.shape
        node, op = self.current
        raise NotEmitted(op.op, op.label, f"the shape of {name} cannot be inferred")

    def _folded(self, name: str):
        """The value of ``name`` if only initializers and constants compute it (mx2onnx's LayerNorm writes its
        shift as Neg(beta)), by the ops' NumPy forwards; else None. Its shape has no batch axis."""
        for node, op in self.grad.nodes:
            if name in node.output:
                ins = [None if not n else self._folded(n) if n not in self.grad.params and n not in self.grad._constants
                       else self.grad.const(n) for n in node.input]
                if any(v is None for n, v in zip(node.input, ins) if n):
                    return None
                return op.forward(ins)[0]
        return None

    def _forward(self, node, made) -> None:
        self.before.setdefault(node.output[0], []).append(made)

    def shape(self, name: str) -> str:
        """A Shape of a value of the forward, taken just before the node being differentiated."""
        if name not in self._shape:
            self._shape[name] = out = self._name()
            self._forward(self.current[0], self.helper.make_node("Shape", [name], [out], name=out))
        return self._shape[name]

    def mask(self, node, op) -> str:
        """The boolean where ``node``'s input was inside (low, high), computed just before the node."""
        consts = [self.grad.const(n) if c else None for n, c in zip(node.input, op.is_const)]
        parts = []
        for bound, cmp in zip(op.mask_bounds(consts), ("Greater", "Less")):
            if bound is not None:
                out = self._name()
                self._forward(node, self.helper.make_node(cmp, [node.input[0], self.const(np.float32(bound))], [out],
                                                          name=out))
                parts.append(out)
        if not parts:
            return self.const(np.ones((), bool))
        if len(parts) == 2:
            out = self._name()
            self._forward(node, self.helper.make_node("And", parts, [out], name=out))
            parts = [out]
        return parts[0]

    def reduce_mean(self, t: str, axes: list, out: str | None = None, into: list | None = None) -> str:
        """ReduceMean of ``t`` over ``axes``, dims kept, in the model's opset's form (axes an attribute before 18,
        an input from 18), into ``out`` (else a new name) appended to ``into`` (else the backward's nodes)."""
        out = out or self._name()
        if self.opset >= 18:
            node = self.helper.make_node("ReduceMean", [t, self.ints(axes)], [out], name=out, keepdims=1)
        else:
            node = self.helper.make_node("ReduceMean", [t], [out], name=out, axes=list(axes), keepdims=1)
        (self.nodes if into is None else into).append(node)
        return out

    def channel_sum(self, t: str, rank: int) -> str:
        """``t`` (N, C, ...) of ``rank`` summed over every axis but the channels: (C,). As (N, C, rest) summed
        over its last axis, then over N: ORT's ReduceSum over axes (0, 2, 3) at once, off its fast paths, took
        11 of a 77 ms step when profiled (MobileNetV2 lite at 160x160, one sample; 1 ms for a 384x10x10 value)."""
        if rank <= 2:
            return self.node("ReduceSum", [t, self.ints([0])], keepdims=0)
        rows = self.node("ReduceSum", [self.node("Reshape", [t, self.ints((0, 0, -1))]), self.ints([2])], keepdims=0)
        return self.node("ReduceSum", [rows, self.ints([0])], keepdims=0)

    def masked(self, dy: str, mask: str) -> str:
        """``dy`` where ``mask`` holds, else 0: a multiply by the mask cast to float (ORT's Where against a scalar
        0 took 13.6 of a 52 ms step, MobileNetV2 lite at 160x160; this, a third of that)."""
        return self.node("Mul", [dy, self.node("Cast", [mask], to=1)])

    def indices(self, node) -> str:
        """The forward node's second output (MaxPool's Indices), added."""
        out = self._name()
        self.outputs.setdefault(node.output[0], []).append(out)
        return out

    def unbroadcast(self, g: str, gdims: tuple, name: str) -> str:
        """``g`` (of ``gdims``) summed back over the axes ``name`` was broadcast along."""
        dims = self.dims(name)
        if tuple(gdims) == tuple(dims):
            return g
        lead = len(gdims) - len(dims)
        axes = list(range(lead)) + [lead + i for i, d in enumerate(dims) if d == 1 and gdims[lead + i] != 1]
        if axes:
            g = self.node("ReduceSum", [g, self.ints(axes)], keepdims=1)
        if lead:
            g = self.node("Reshape", [g, self.ints(dims) if None not in dims else self.shape(name)])
        return g


class OrtTrain:
    """``step(x, labels, scale) -> (logits, {trainable: gradient})`` of the summed cross-entropy times
    ``scale``, and ``predict(x)``, each one ONNX Runtime run. Raises NotEmitted for a graph it cannot write."""

    def __init__(self, model, grad: GradGraph):
        if grad.dtype != np.float32:
            raise NotEmitted("model", "graph", "only float32 graphs")
        onnx = _lazy.onnx()
        helper = onnx.helper
        model = load_model(model)
        # the frozen weights are inputs too, fed GradGraph's arrays (ONNX Runtime reads a fed array where it is;
        # given as add_external_initializers, it kept a copy of its own: 9 MB more for MobileNetV2-1.0)
        shared = frozen_weights(model.graph, grad)
        proto = without_weights(model, shared)
        self.grad = grad
        trainable = set(grad.trainable)
        e = _Emitter(grad, shapes_of(proto))
        e.opset = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 13)
        out_dims = e.dims(grad.output) if grad.output in e.shapes else None
        if out_dims is None:
            raise NotEmitted("model", grad.output, "the output's shape cannot be inferred")
        self.classes = int(np.prod(out_dims[1:]))
        swap, self.stat_outputs = self._batch_norms(e, grad)

        # the loss: dL/dlogits = (softmax(logits) - onehot) * scale, shaped as the logits
        flat = e.node("Flatten", [grad.output], axis=1)
        diff = e.node("Sub", [e.node("Softmax", [flat], axis=1), ONEHOT])
        pending: dict[str, list] = {grad.output: [e.node("Reshape", [e.node("Mul", [diff, SCALE]),
                                                                     e.ints((-1, *out_dims[1:]))])]}

        def take(name: str) -> str | None:
            parts = pending.pop(name, [])
            return None if not parts else parts[0] if len(parts) == 1 else e.node("Sum", parts)

        for node, op in reversed(grad.nodes):
            if not any(op.need):
                continue
            dy = take(node.output[0])
            if dy is None:
                continue
            e.current = (node, op)
            for name, need, g in zip(node.input, op.need, op.emit(e, node, dy)):
                if need and g is not None:
                    pending.setdefault(name, []).append(g)
        self.grad_outputs, inner = {}, []
        made = {o for node in e.nodes for o in node.output}
        for i, name in enumerate(grad.trainable):
            g = take(name)
            if g is None:   # no path from this initializer to the output: its gradient is zero
                g = e.const(np.zeros(grad.params[name].shape, np.float32))
            self.grad_outputs[name] = f"{PREFIX}_grad{i}"
            if g in made and g not in inner:   # the branch's own value: its output as it is (fewer nodes to run)
                inner.append(g)
            else:   # a constant, or a value given twice: an output of its own
                inner.append(f"{PREFIX}_g{i}")
                e.nodes.append(helper.make_node("Identity", [g], [inner[-1]], name=inner[-1]))

        graph = proto.graph
        fed = trainable | set(shared) | set(grad.statistics())   # the running statistics change: always fed
        moved = [t for t in graph.initializer if t.name in fed]
        kept = [t for t in graph.initializer if t.name not in fed]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in moved)
        del graph.output[:]
        del graph.value_info[:]
        graph.output.append(helper.make_empty_tensor_value_info(grad.output))
        nodes = list(graph.node)
        del graph.node[:]
        for node in nodes:   # in place: a mask computed last would keep every ReLU input alive to the end
            graph.node.extend(e.before.get(node.output[0], []))
            if node.output[0] in swap:   # training-mode BatchNorm, written out
                graph.node.extend(swap[node.output[0]])
                continue
            node.output.extend(e.outputs.get(node.output[0], []))
            graph.node.append(node)
        # the loss and the backward run only when TRAIN is true (evaluation: the forward alone, in the same
        # session; a second, forward-only session cost 10 MB more and its run 7, MobileNetV2 lite at 160x160)
        float_out = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in inner]
        backward = helper.make_graph(e.nodes, f"{PREFIX}_backward", [], float_out)
        nothing = [f"{PREFIX}_none{i}" for i in range(len(inner))]
        skipped = helper.make_graph(
            [helper.make_node("Constant", [], [n], value=self._empty(onnx)) for n in nothing], f"{PREFIX}_skipped", [],
            [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in nothing])
        graph.node.append(helper.make_node("If", [TRAIN], list(self.grad_outputs.values()), name=f"{PREFIX}_if",
                                           then_branch=backward, else_branch=skipped))
        used = {name for node in e.nodes + list(graph.node) for name in node.input}   # ORT warns of an unused one
        graph.initializer.extend(t for t in e.inits if t.name in used)
        graph.input.extend([helper.make_tensor_value_info(ONEHOT, onnx.TensorProto.FLOAT, [None, self.classes]),
                            helper.make_tensor_value_info(SCALE, onnx.TensorProto.FLOAT, []),
                            helper.make_tensor_value_info(TRAIN, onnx.TensorProto.BOOL, [])])
        if self.stat_outputs:
            graph.input.append(helper.make_tensor_value_info(BATCH, onnx.TensorProto.BOOL, []))
        graph.output.extend(helper.make_empty_tensor_value_info(n) for n in self.grad_outputs.values())
        graph.output.extend(helper.make_empty_tensor_value_info(n) for _, mean, var, _ in self.stat_outputs
                            for n in (mean, var))
        self.fed = [t.name for t in moved]
        self.outputs = [grad.output, *self.grad_outputs.values(),
                        *(n for _, mean, var, _ in self.stat_outputs for n in (mean, var))]
        self.proto = proto
        self.session: Any = None

    @staticmethod
    def _batch_norms(e: _Emitter, grad: GradGraph) -> tuple:
        """Each training-mode BatchNorm (GradGraph's batch_stats) as ONNX nodes: normalised by the batch's mean and
        variance when BATCH is true (each an output, for the running statistics), by the running ones (fed) when
        false. Returns {BatchNorm output: its nodes} and [(node index, mean output, variance output, values per
        channel per sample)]; the backward (onnx_grad's emit) reads the centred input, 1/deviation and the gain."""
        helper = e.helper
        swap, stats = {}, list[tuple]()
        for index, (node, op) in enumerate(grad.nodes):
            if not getattr(op, "batch_stats", False):
                continue
            x, scale, b, mean, var = node.input
            e.current = (node, op)
            dims = e.dims(x)
            rank = len(dims)
            axes, per_channel = [0] + list(range(2, rank)), e.ints([1, -1] + [1] * (rank - 2))
            made: list = []

            def add(op_type, inputs, out=None, made=made, **attrs):
                out = out or e._name()
                made.append(helper.make_node(op_type, inputs, [out], name=out, **attrs))
                return out
            batch_mean, batch_var = f"{PREFIX}_bnmean{len(stats)}", f"{PREFIX}_bnvar{len(stats)}"
            e.reduce_mean(x, axes, batch_mean, made)
            d = add("Sub", [x, add("Where", [BATCH, batch_mean, add("Reshape", [mean, per_channel])])])
            e.reduce_mean(add("Mul", [d, d]), axes, batch_var, made)
            used_var = add("Where", [BATCH, batch_var, add("Reshape", [var, per_channel])])
            eps = e.const(np.float32(op.a.get("epsilon", 1e-5)))
            inv = add("Reciprocal", [add("Sqrt", [add("Add", [used_var, eps])])])
            # y = d (scale inv) + b: the normalised input is never made (one pass over the values fewer)
            gain = add("Mul", [inv, add("Reshape", [scale, per_channel])])
            add("Add", [add("Mul", [d, gain]), add("Reshape", [b, per_channel])], node.output[0])
            swap[node.output[0]] = made
            e.batch_norm[node.output[0]] = (d, inv, gain)
            stats.append((index, batch_mean, batch_var, int(np.prod(dims[2:]))))
        return swap, stats

    @staticmethod
    def _empty(onnx):
        return onnx.numpy_helper.from_array(np.zeros(0, np.float32))

    def start(self, threads: int) -> OrtTrain:
        """The session (with ORT's arena: its tensors' sizes repeat every step)."""
        self.session = _session(self.proto, threads, True)
        return self

    def stop(self) -> None:
        """The session gone (its arena with it): the plan's probe makes another for a smaller micro-batch."""
        self.session = None

    def done(self) -> None:
        """The graph is the session's now (no second session will be made)."""
        self.proto = None

    def step(self, x: np.ndarray, labels: np.ndarray, scale: float) -> tuple:
        """(logits, {trainable: gradient})."""
        logits, grads = self._run(x, labels, scale, True)
        k = len(self.grad_outputs)
        return logits, {n: g.reshape(self.grad.params[n].shape) for n, g in zip(self.grad_outputs, grads[:k])}

    def predict(self, x: np.ndarray) -> np.ndarray:
        return self._run(x, np.zeros(len(x), np.int64), 0.0, False)[0]

    def batch_statistics(self, x: np.ndarray) -> dict[int, tuple]:
        """The forward alone with BatchNorm on the batch's statistics: each training-mode BatchNorm's (mean,
        variance, values per channel per sample), for GradGraph.set_statistics (no backward runs)."""
        got = self._run(x, np.zeros(len(x), np.int64), 0.0, False, batch=True)[1][len(self.grad_outputs):]
        return {index: (got[2 * i], got[2 * i + 1], n) for i, (index, _, _, n) in enumerate(self.stat_outputs)}

    def _run(self, x, labels, scale, train: bool, batch: bool | None = None) -> tuple:
        feeds = {self.grad.input: np.asarray(x, np.float32)}
        feeds.update({n: self.grad.params[n] for n in self.fed})
        onehot = np.zeros((len(labels), self.classes), np.float32)
        onehot[np.arange(len(labels)), np.asarray(labels, np.int64)] = 1
        feeds[ONEHOT], feeds[SCALE], feeds[TRAIN] = onehot, np.asarray(scale, np.float32), np.asarray(train)
        if self.stat_outputs:
            feeds[BATCH] = np.asarray(train if batch is None else batch)
        got = self.session.run(self.outputs, feeds)
        return got[0], got[1:]


def frozen_weights(graph, grad: GradGraph) -> list[str]:
    """The initializers a session takes from ``grad.params`` rather than from the graph: the frozen float32
    weights (a scalar or a few values stay in the graph, where constant folding may read them; the trained ones
    are inputs). A frozen grouped Conv's weight (a depthwise one) stays in the graph too: ONNX Runtime lays a
    constant one out for its blocked (NCHWc) depthwise kernel, several times faster than its NCHW one, which
    loops over every channel of every sample (MobileNetV2-1.0's are 0.25 MB of its 9)."""
    trainable = set(grad.trainable)
    grouped = {node.input[1] for node in graph.node if node.op_type == "Conv" and len(node.input) > 1
               and any(a.name == "group" and a.i > 1 for a in node.attribute)}
    return [t.name for t in graph.initializer if t.name in grad.params and t.name not in trainable
            and t.name not in grouped and t.data_type == 1 and grad.params[t.name].dtype == np.float32
            and grad.params[t.name].size > 16 and grad.params[t.name].flags.c_contiguous]


def _session(proto, threads: int, arena: bool):
    """A session of ``proto`` (its weights are inputs: one copy of them in the process, GradGraph's)."""
    ort = _lazy.onnxruntime()
    opts = _lazy.ort_session_options(threads, arena=arena, priority_order=True, prepack=False)
    # the arena without ORT's memory pattern: the pattern's one block came on top of the first run's chunks,
    # which the arena keeps (a batch-4 lite step at 160x160 peaked 36 MB higher with it, at the same speed)
    opts.enable_mem_pattern = False
    # ort_session_options' ENABLE_ALL lays out the Convs whose weights are constants (frozen depthwise ones, the
    # backward's flipped ones) in NCHWc; the fed weights are not copied: a MobileNetV2-1.0 lite step at 96x96 took
    # 8-11% less CPU at 32 samples and at 2 than with ENABLE_EXTENDED (load 14-18)
    return ort.InferenceSession(proto.SerializeToString(), opts, providers=["CPUExecutionProvider"])
