"""The one fine-tuning engine: the model's ONNX graph, with no MXNet anywhere.

The file is one ``edgetrain export`` (or quantize's fp32 input, or finetune's own export of a Gluon model:
gluon.py) wrote: its preprocessing and class names are in its metadata. What trains follows ``--train-layers``:

- ``head`` / ``last:N``: the graph is cut at a tensor that alone separates the frozen layers from the
  trained ones (a residual block is one layer: no skip connection may cross the cut). The frozen part runs
  in ONNX Runtime once per sample into the feature cache (from a file in OUTDIR: the model this engine holds
  keeps no frozen weight); the trained part, every initializer of it training, steps on the cached features,
  its BatchNorm in training mode (below).
- ``bias``: every bias and BatchNorm shift of every layer trains, every other weight is frozen, plus the
  output layer, which must learn the new classes (TinyTL, NeurIPS 2020). Nothing is frozen whole, so every
  step runs the whole graph; what the backward pass keeps is a bit mask per ReLU/ReLU6 activation and a
  byte per max-pool output, not the activations (onnx_grad).
- ``lite``: ``bias`` plus TinyTL's lite residual modules (lite.py), written into the graph as ordinary ONNX
  ops: a small group convolution on a 2x-downsampled copy of each block's input, a 1x1 projection, upsampled
  and added to the block's output. Their weights train from a zero output; every original weight is frozen.
  The backward pass keeps the same bit masks as ``bias`` plus the modules' own (downsampled) inputs.
- ``all``: every weight trains (the activations a weight's gradient needs are kept).

With ``all``, ``last:N`` and ``lite`` (BATCH_STATS) BatchNorm trains in training mode, as PyTorch's
``model.train()``: a step normalises by its micro-batch's own statistics and differentiates through them (the
normalised input is kept); the running statistics, which no step reads, are re-estimated from the weights at
each epoch's end (``settle_statistics``; ``statistics()``: checkpointed, written into model.onnx, averaged by a
fleet). Measured on a held-out shift (tools/bench_torch_peer.py) it took
``all`` from 0.457 to 0.571 top-1 (adam 0.0003; 0.730 at 0.001, its default since) and ``lite`` from 0.548 to
0.712 (PyTorch's full fine-tune: 0.601; 0.503 with its BatchNorm frozen); refreshing the frozen statistics on the
data once before training changed nothing (0.460, 0.535); refreshing them after training lost (0.457 -> 0.174)
(statistics taken in inference mode lose here too: 0.18-0.60 on weights where the settle pass's, taken in training
mode, gave 0.57-0.80).
``head`` and ``bias`` keep the file's statistics as constants.

In every mode the whole step (forward, the loss's gradient, backward) is one ONNX Runtime graph (ort_train, the
backward written by onnx_grad's op classes) at the largest micro-batch the memory plan fits. NumPy's backward is
kept in one place, for a graph whose backward ONNX cannot write here (then with ``bias``/``lite`` the forward
runs in ONNX Runtime, ort_forward) or a budget ONNX Runtime's sessions do not fit; onnx_grad's NumPy engine stays
the reference the others are tested against.

The result is OUTDIR/model.onnx: the same graph with the trained initializers (a replaced output layer
resized; with ``lite``, the modules' nodes added), and its metadata saying the classes and preprocessing,
so quantize, predict and profile take it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .. import _lazy, procmem, runtime
from ..convert import META_PREFIX
from ..errors import UsageError
from ..fileio import atomic_write_bytes
from ..models import load_onnx
from ..preprocess import Preprocess
from . import checkpoint as ckpt
from . import lite, onnx_grad, roles, store
from . import ort_forward, ort_train
from .engine import EngineContext, Inputs
from .ort_forward import OrtForward
from .memplan import HEADROOM, MB, MEASURED_SPREAD_MB, READ_AHEAD, Costs, MemoryPlan, choose, plan_for
from .onnx_layers import cut_before_layer, extract, shapes_of, without_weights, write_streamed
from .optimizers import Corrected, make_numpy_optimizer

# The modes whose training steps run BatchNorm in training mode (onnx_grad's batch_stats): normalised by each
# micro-batch's own statistics, the running ones re-estimated from the weights before they are read (written into
# model.onnx, checkpointed, averaged by a fleet); the other modes keep the file's running statistics as constants.
BATCH_STATS = ("all", "tail", "lite")


# ONNX Runtime's arena grows again at a session's second run, then hardly (MobileNetV2-1.0 lite at 96x96, micro-batch
# 32: 441 MB after the first step, 490 after the second, 501 after the third, 520 at the run's peak): a probe of one
# step planned 449 MB for that run. The probe runs two (zero-scaled: no weight moves).
PROBE_STEPS = 2

# The rows of training data the running statistics are re-estimated from at an epoch's end (settle_statistics): a
# forward over them. MobileNetV2-1.0 lite at 96x96, seed 1, epochs 1-3, held-out top-1 re-estimated from all 500
# rows: 0.629 0.740 0.755; from 256: 0.626 0.732 0.765; 128: 0.629 0.737 0.745; 64: 0.634 0.750 0.740 (step by
# step, momentum 0.9: 0.470 0.667 0.667). 256 rows took 2.8 CPU s beside an epoch's 11.6 s of steps (500 rows).
SETTLE_ROWS = 128


def settle_rows(rows: int) -> np.ndarray:
    """The training rows the settle pass reads: SETTLE_ROWS of them, evenly spaced (all when fewer)."""
    return np.unique(np.linspace(0, rows - 1, min(rows, SETTLE_ROWS)).round().astype(np.int64))


def _probe_steps(step: ort_train.OrtTrain, m: int, shape: tuple) -> None:
    for _ in range(PROBE_STEPS):
        step.step(np.zeros((m, *shape), np.float32), np.zeros(m, np.int64), 0.0)


def _weights_of(graph) -> list[str]:
    """The initializers gradients train: each layer's weight and bias (a MatMul+Add's too), each BatchNorm's scale
    and shift (not its running statistics, which stay the file's)."""
    return list(dict.fromkeys(roles.layer_weights(graph.node, roles.float_shapes(graph))
                              + onnx_grad.other_weights(graph)))   # and a LayerNorm's, a PReLU's


def _within(names: list[str], within: set[str] | None) -> list[str]:
    return names if within is None else [n for n in names if n in within]


def _as_trained(proto, input_shape: tuple, where: str, note: Callable[[str], None]) -> Any:
    """The graph as the engine trains it, computing what it did: exporters' quirks undone (in place, but for an
    opset conversion). Returns the model; what was changed is said through ``note``.

    - A model of an opset before 13 is converted to 13 (onnx's version converter), the semantics the gradient
      code reads; one it cannot convert is refused in one line.
    - Nodes out of topological order (ONNX Runtime sorts them itself) are sorted.
    - Initializers also listed as graph inputs (older exporters: an overridable default) are inputs no more:
      the step graph feeds weights as inputs of its own, and the gradient engine takes one data input.
    - An initializer several nodes share (an exporter that deduplicates equal tensors: all-zero biases, a
      Reshape target) gets a copy per node: each layer's bias trains for that layer, a resized classifier
      never writes into another layer's tensor, and a trained part never changes a frozen one.
    - A batch written into the input's and outputs' types becomes symbolic (refused where a Reshape spells it).
    - A data input with symbolic H/W takes the preprocessing's: the shapes the cut, the lite modules and the
      step graph need are then known (the model is trained, and written, at that size)."""
    numpy_helper = _lazy.from_import("onnx", "numpy_helper")
    version = next((o.version for o in proto.opset_import if o.domain in ("", "ai.onnx")), 13)
    if version < 13:
        try:
            proto = _lazy.from_import("onnx", "version_converter").convert_version(proto, 13)
        except Exception as exc:   # the converter's errors have no common type
            raise UsageError(f"the model's opset {version} cannot be converted to 13 (what the gradient code reads): "
                             f"{str(exc).splitlines()[0] if str(exc) else type(exc).__name__}", where,
                             "export the model with opset 13 or later") from None
        note(f"the model's opset {version} was converted to 13 (the model written is opset 13)")
    graph = proto.graph
    _topological(graph)
    inits = {t.name: t for t in graph.initializer}
    data = [i for i in graph.input if i.name not in inits]
    if len(data) < len(graph.input):
        del graph.input[:]
        graph.input.extend(data)
    seen, copies = set(), 0
    taken = set(inits) | {o for n in graph.node for o in n.output} | {i.name for i in graph.input}
    for node in graph.node:
        for k, name in enumerate(node.input):
            if name not in inits:
                continue
            if name not in seen:
                seen.add(name)
                continue
            fresh = next(f"{name}_{j}" for j in range(1, len(taken) + 2) if f"{name}_{j}" not in taken)
            taken.add(fresh)
            graph.initializer.append(numpy_helper.from_array(numpy_helper.to_array(inits[name]), fresh))
            node.input[k] = fresh
            copies += 1
    if copies:
        note(f"{copies} initializer use(s) shared with another node got a copy of their own (each layer "
                    "trains its own)")
    dims = graph.input[0].type.tensor_type.shape.dim if graph.input else []
    batch = dims[0].dim_value if dims else 0
    if batch:   # a batch written into the types (predict runs such a file a sample at a time; training batches)
        for v in [graph.input[0], *graph.output]:
            if v.type.tensor_type.shape.dim:
                v.type.tensor_type.shape.dim[0].dim_param = "batch"
        for node in graph.node:   # a batch written into a Reshape's target cannot be undone as surely
            target = numpy_helper.to_array(inits[node.input[1]]) if node.op_type == "Reshape" and \
                len(node.input) > 1 and node.input[1] in inits else None
            if target is not None and target.ndim == 1 and len(target) and target[0] == batch:
                raise UsageError(f"the model fixes its batch at {batch}: Reshape node {node.name or node.output[0]!r} "
                                 f"has the target {target.tolist()}", where,
                                 "export the model with a dynamic batch (a Reshape target starting with 0 or -1)")
        del graph.value_info[:]
    if len(dims) == 1 + len(input_shape) and any(not d.dim_value for d in dims[1:]):
        for d, size in zip(dims[1:], input_shape):
            if not d.dim_value:
                d.dim_value = int(size)
        note(f"the model's input has symbolic sides: trained (and written) at the preprocessing's "
                    f"{'x'.join(map(str, input_shape))}")
        del graph.value_info[:]   # shapes inferred for the symbolic sizes
    return proto


def _topological(graph) -> None:
    """``graph``'s nodes in an order where each comes after what it reads (a sorted graph is left as it is); a
    graph no order satisfies is left as it is too, for the gradient code to refuse naming the node."""
    def start():
        return {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}

    known, nodes = start(), list(graph.node)
    for n in nodes:
        if not all(i in known for i in n.input):
            break
        known.update(n.output)
    else:
        return
    known, pending, ordered = start(), list(range(len(nodes))), []
    while pending:
        ready = [j for j in pending if all(i in known for i in nodes[j].input)]
        if not ready:
            return
        for j in ready:
            known.update(nodes[j].output)
        ordered += ready
        pending = [j for j in pending if j not in set(ready)]
    copies = []
    for j in ordered:
        copy = type(nodes[j])()
        copy.CopyFrom(nodes[j])
        copies.append(copy)
    del graph.node[:]
    graph.node.extend(copies)


class OnnxEngine:
    def __init__(self, ctx: EngineContext):
        self.ctx = ctx
        self.kind = ctx.layers.kind if ctx.layers.kind != "last" else ("head" if ctx.layers.head_only else "tail")
        self.name = f"onnx-{self.kind}"  # a checkpoint resumes on the same engine
        self.random_weights = self.replaced_head = False
        self.model_fp = ""
        self.proto: Any = None       # the model (onnx.ModelProto), its output layer resized when the classes differ
        self.grad: onnx_grad.GradGraph   # the gradient graph (load makes it)
        self.input_shape: tuple = ()     # one sample's, the preprocessing's (load)
        self.fwd: OrtForward | None = None   # bias/lite: the forward in ONNX Runtime (the backward: self.grad)
        self.step_graph: ort_train.OrtTrain | None = None   # the whole step in ONNX Runtime
        self.step_model: Any = None   # head/last:N: the trained part's graph, until the step graph is made of it
        self.stripped: list[str] = []   # frozen initializers whose values only self.grad.params holds
        self.weights: dict[str, np.ndarray] = {}
        self.stats: dict[str, np.ndarray] = {}   # BatchNorm's running statistics training mode updates
        self.cut_name: str | None = None   # the value the frozen part ends at (head/last:N)
        self.frozen_bytes: bytes | None = None
        self.frozen_path: Path | None = None   # where the frozen part was written (then frozen_bytes goes)
        self.source = Path()               # the ONNX file loaded (MODEL, or a Gluon model's export)
        self.source_names: set[str] = set()
        self.from_model: list[str] = []   # frozen initializers the model held: read back from the source to write it
        self.feature_shape: tuple = ()   # one sample's at the cut
        self.frozen_per_sample_mb = 0.0
        self.opt: Corrected | None = None   # make_optimizer makes it (the job's, for its run)
        self.eval_session: Any = None   # an onnxruntime.InferenceSession of the frozen part
        self.meta: dict = {}

    # --- set-up ------------------------------------------------------------------------------------

    def open(self, source: Path) -> Preprocess:
        """Read the ONNX graph ``source``; returns its preprocessing (the data is read for it, then ``load``)."""
        model = load_onnx(source)
        self.source = Path(source)
        self.source_names = {t.name for t in model.proto.graph.initializer}   # before any exporter quirk is undone
        if model.preprocess is None:
            raise UsageError("the ONNX file has no edgetrain preprocessing record", self.ctx.model,
                             "export it with `edgetrain export` (its metadata says the input shape and mean/std)")
        self.meta = dict(model.metadata)
        self.random_weights = self.meta.get(f"{META_PREFIX}random_weights") == "true"
        self.proto = model.proto
        return model.preprocess

    def load(self, pre: Preprocess, within: set[str] | None = None) -> None:
        """Make the trainable part of the graph ``open`` read, for the data's preprocessing ``pre`` (its input shape
        and classes); ``within``: the only initializers that may train (a Gluon model's weights: the PREFIX written
        at the end holds nothing else)."""
        ctx = self.ctx
        self.input_shape = tuple(pre.input_shape)
        self.model_fp = hashlib.sha256(self.proto.SerializeToString()).hexdigest()[:16]
        self.proto = _as_trained(self.proto, self.input_shape, ctx.model, ctx.note)
        logits = onnx_grad.logits_name(self.proto)
        self._fit_head(logits, len(pre.class_names or []))
        initializers = {t.name for t in self.proto.graph.initializer}
        if self.kind in ("head", "tail"):
            self.cut_name = cut = cut_before_layer(self.proto.graph, initializers, ctx.layers.n)
            shapes = shapes_of(self.proto)   # inferred once, without the weights
            if cut not in shapes:
                raise UsageError(f"the shape of {cut} cannot be inferred", ctx.model,
                                 "export the model with a fixed input shape")
            tail = extract(self.proto, [cut], [logits], shapes)
            self.grad = onnx_grad.GradGraph(tail, _within(_weights_of(tail.graph), within), output=logits,
                                            batch_stats=self.kind in BATCH_STATS)
            self.step_model = tail   # the step graph's (plan): the trained part on the cached features
            frozen = extract(self.proto, [self.proto.graph.input[0].name], [cut], shapes)
            self._frozen_figures(frozen, shapes, cut)
            self.frozen_bytes = frozen.SerializeToString()
        elif self.kind == "lite":
            self.proto, extra, blocks = lite.insert(self.proto, ctx.seed)
            if not blocks:
                raise UsageError("--train-layers lite: the model has no block a lite residual module fits "
                                 "(a 4-D block input of at least 2x2 before the classifier)", ctx.model,
                                 "use --train-layers bias")
            self.grad = onnx_grad.GradGraph(self.proto, "bias+head", output=logits, extra=extra,
                                            batch_stats=self.kind in BATCH_STATS)
            added = sum(int(self.grad.params[n].size) for n in extra)
            ctx.note(f"lite: {len(blocks)} residual modules added ({added} weights, starting at zero output)")
        else:
            mode = "bias+head" if self.kind == "bias" else _within(_weights_of(self.proto.graph), within)
            self.grad = onnx_grad.GradGraph(self.proto, mode, output=logits, batch_stats=self.kind in BATCH_STATS)
        self.weights = {k: self.grad.params[k] for k in self.grad.trainable}
        # BatchNorm in training mode (BATCH_STATS): its running statistics, re-estimated by settle_statistics
        self.stats = {k: self.grad.params[k] for k in self.grad.statistics()}

    def _fit_head(self, logits: str, classes: int) -> None:
        """Resize the classifier (roles.classifier: a Gemm, a MatMul with or without its Add, or a 1x1 Conv on pooled
        features, whatever follows it) when the data has other classes (new weights: netsplit's initialisation). A
        head the roles do not recognise is refused here, whatever the mode: bias/lite train it by name, and a
        resize must not land on another layer. Shared tensors were split at load (_as_trained)."""
        numpy_helper = _lazy.from_import("onnx", "numpy_helper")
        graph = self.proto.graph
        head = roles.graph_classifier(graph, logits, self.ctx.model)
        if head.outputs == classes:
            return
        inits = {t.name: t for t in graph.initializer}
        rng = np.random.RandomState(self.ctx.seed)
        w = numpy_helper.to_array(inits[head.weight])
        shape = list(w.shape)
        shape[head.class_axis] = classes
        replace = {head.weight: store.xavier(tuple(shape), rng)}
        if head.bias:
            b = list(inits[head.bias].dims)
            if int(np.prod(b)) <= 1:   # one value for every class, broadcast
                b = [classes]
            else:   # (C,), (1, C); a Conv's (C, 1, 1), (1, C, 1, 1)
                b[len(b) - 3 if head.form == "1x1 Conv" and len(b) >= 3 else len(b) - 1] = classes
            replace[head.bias] = np.zeros(b, np.float32)
        constants = {n.output[0]: a.t for n in graph.node if n.op_type == "Constant" for a in n.attribute
                     if a.name == "value"}
        for name in head.reshapes:   # a Reshape target (an initializer or a Constant node) that spells the class count
            tensor = inits.get(name, constants.get(name))
            target = numpy_helper.to_array(tensor) if tensor is not None else None
            if target is not None and target.ndim == 1 and len(target) == 2 and target[1] == head.outputs:
                replace[name] = np.asarray([target[0], classes], target.dtype)
        for name, value in replace.items():   # (each is an initializer or a Constant's value: read above)
            (inits[name] if name in inits else constants[name]).CopyFrom(numpy_helper.from_array(value, name))
        for out in graph.output:  # the class axis of the output is the new count
            dims = out.type.tensor_type.shape.dim
            if len(dims) >= 2:
                dims[1].dim_value = classes
        del graph.value_info[:]  # shapes inferred for the old head
        self.replaced_head = True
        self.ctx.note(f"output layer replaced: the model has {head.outputs} outputs, the data {classes} "
                              "classes; the new layer starts from random weights")

    def _frozen_figures(self, frozen, shapes: dict, cut: str) -> None:
        """The feature shape (one sample) and a bound of one sample's activations in the frozen part: twice
        the most that is alive at once when each value lives from its node to its last reader (ONNX Runtime's
        memory pattern frees the same way; its arena may round a growth up to twice what it needs). The sum
        of every value, the bound used before, is 38 MB for MobileNetV2 at 160x160; this, 12 MB."""
        self.feature_shape = tuple(shapes[cut])
        size = {name: int(np.prod(dims)) * 4 for name, dims in shapes.items()}
        last = {name: j for j, node in enumerate(frozen.graph.node) for name in node.input}
        inputs = [i.name for i in frozen.graph.input]
        live = {name: size.get(name, 0) for name in inputs}
        peak = sum(live.values())
        for j, node in enumerate(frozen.graph.node):
            live.update({o: size.get(o, 0) for o in node.output})
            peak = max(peak, sum(live.values()))
            for name in node.input:
                if last.get(name) == j:
                    live.pop(name, None)
        self.frozen_per_sample_mb = 2 * peak / MB

    @property
    def has_frozen(self) -> bool:
        return self.cut_name is not None

    def plan(self, rows: int, saved: dict | None) -> tuple[MemoryPlan, Costs]:
        x = np.zeros((1, *self.input_shape), np.float32)
        if self.has_frozen and self.frozen_bytes is not None:
            self._frozen_to_file(self.frozen_bytes)
        base_mb = procmem.rss_mb() or 0.0   # before the probe: what one sample's pass takes is train_mb's
        probe = self.features(x) if self.has_frozen else x
        # (the frozen part's session stays for the probe of a feature pass at the plan's batch: _probe)
        out, tape = self.grad.forward(probe)
        masks_mb = ort_forward.mask_bytes(tape) / MB
        self.grad.backward(tape, np.zeros_like(out))   # its peak too: the gradients it holds at once
        # the most one sample holds at once (live values, tape, gradients), plus room for an op's temporaries
        # (im2col columns, padded copies, unpacked masks): two of the largest activation
        train_mb = (tape.peak_bytes + 2 * tape.largest_bytes) / MB
        n_weights = sum(int(v.size) for v in self.weights.values())
        frozen_size = self.frozen_path.stat().st_size if self.frozen_path is not None else len(self.frozen_bytes or b"")
        session_mb = 2.65 * frozen_size / MB + 30.0 if self.has_frozen else 0.0
        spread_mb = 0.0
        now = procmem.rss_mb()
        if self.has_frozen and now is not None and base_mb > 0:
            # The probe made the frozen part's session and ran one sample through it, so the process now holds
            # what the guess above stands for, measured: the session, the runtime it loaded, and one sample's
            # pass in its arena and the tape (the estimate adds those back per sample). The guess stays an upper
            # bound (MobileNetV2-1.0 last:2 at 160x160: it made the base 146 MB where the whole run peaked at 141).
            after = now - self.frozen_per_sample_mb - train_mb
            measured = max(after - base_mb, 0.0)
            spread_mb = MEASURED_SPREAD_MB if measured < session_mb else 0.0
            session_mb = min(session_mb, measured)
        params_mb = sum(int(v.nbytes) for v in self.grad.params.values()) / MB
        feat = int(np.prod(self.feature_shape)) if self.has_frozen else 0
        costs = Costs(base_mb + session_mb, self.frozen_per_sample_mb, train_mb,
                      params_mb + 3 * n_weights * 4 / MB, int(np.prod(self.input_shape)) * 4 / MB, rows,
                      feat * 4, self.ctx.batch_size, self.has_frozen, spread_mb=spread_mb,
                      min_micro=2 if self.stats else 1)
        return self._plan_runtime(costs, train_mb, masks_mb, saved)

    def _frozen_to_file(self, frozen: bytes) -> None:
        """head/last:N: the frozen part goes to OUTDIR (its sessions read the file) and its weights leave the model
        this engine holds (MODEL has them; write_model reads them back): 26 MB less during the run's passes
        (MobileNetV2-1.0 at 160x160: the serialized frozen part and its weights in the model)."""
        path = self.ctx.outdir / store.FROZEN_ONNX
        atomic_write_bytes(path, frozen, "frozen part")
        self.frozen_bytes, self.frozen_path = None, path
        # (an initializer this run made, a shared one's copy, stays in the model: the file does not hold it)
        self.from_model = [t.name for t in self.proto.graph.initializer
                           if t.data_type == 1 and t.name not in self.grad.params and t.name in self.source_names]
        self.proto = without_weights(self.proto, self.from_model)
        store.release_freed_memory()

    def _plan_runtime(self, costs: Costs, train_mb: float, masks_mb: float,
                      saved: dict | None) -> tuple[MemoryPlan, Costs]:
        """Where the step runs, the fastest that fits the budget (always the first without one), as a resumed run's
        plan says (the three round differently):
        - ``ort_step``: the whole step as one ONNX Runtime graph (ort_train), when the graph's backward can be
          written in ONNX: every mode (head and last:N on the cached features of the frozen part);
        - ``ort_forward`` (bias/lite): the forward in ONNX Runtime, the backward NumPy's with ORT's ConvTranspose;
        - else NumPy's forward and backward (onnx_grad), which stays the reference the others are tested against.
        ONNX Runtime's sessions cost memory up front, and its tensors (masks a byte per value) per sample. The
        micro-batch is the largest that fits the budget: the step's time per sample falls as it grows (fewer,
        larger kernels). The first step at that micro-batch is the probe: a measured peak over the budget shrinks
        it, and the plan's estimate becomes what was measured plus what the run still adds (its optimizer's state,
        the cache)."""
        ctx = self.ctx
        model = self.step_model if self.has_frozen else self.proto
        size = model.ByteSize()
        fused = dataclasses.replace(costs, base_mb=costs.base_mb + ort_train.sessions_mb(size),
                                    train_per_sample=ort_train.STEP_PER_SAMPLE * (train_mb + masks_mb))
        with_ort = dataclasses.replace(costs, base_mb=costs.base_mb + ort_forward.sessions_mb(size),
                                       train_per_sample=train_mb + masks_mb)
        step = None
        # measured, not guessed: head/last:N's step graph is small, and BatchNorm in training mode may not step
        # below 2 samples, where the analytic bound (STEP_PER_SAMPLE) is loosest: the probe decides, for BatchNorm
        # where the bound is within the whole budget (a probe over it would take the run over: a lite step of 2
        # samples under 89 MB peaked at 97)
        measured = self.has_frozen or bool(self.stats) and self._fits(fused, whole=True)
        if saved.get("ort_step", False) if saved is not None else measured or self._fits(fused):
            try:   # written only when it may run: the graph's making alone takes memory (a NumPy plan's margin)
                step = ort_train.OrtTrain(model, self.grad)
            except onnx_grad.NotEmitted as e:
                ctx.note(f"the backward runs in NumPy: {e}")
        partial = self.kind in ("bias", "lite")   # a forward alone in ORT serves a graph with frozen weights
        if saved is not None:
            # (a step graph the saved plan used and this one cannot write: NumPy's backward, said in the notes)
            use_step = saved.get("ort_step", False) and step is not None
            use_fwd = saved.get("ort_forward", False) and not self.stats
        else:
            use_step = step is not None
            use_fwd = partial and not use_step and not self.stats and self._fits(with_ort)
            if partial and not use_step and self.stats:
                ctx.note("the forward runs in NumPy too: BatchNorm in training mode has no ONNX Runtime "
                                 "forward beside NumPy's backward (ort_forward)")
        numpy_costs, costs = costs, fused if use_step else with_ort if use_fwd else costs
        refused = None
        try:
            plan = plan_for(costs, ctx.budget_mb, saved)
        except UsageError as e:
            if not (use_step and measured):
                raise
            # the analytic bound (its headroom on top) refused: the smallest plan is probed and refused only if what
            # it measures breaks the budget
            refused, plan = e, MemoryPlan(1, costs.least_micro, "disk" if self.has_frozen else "none", 0.0, ctx.budget_mb,
                                          costs.cache_mb)
        plan.ort_step, plan.ort_forward = use_step, use_fwd
        if not use_fwd and not self.has_frozen:
            # the graph's copy of the frozen weights is GradGraph's: hold one (OrtForward reads the graph's)
            self.stripped = ort_train.frozen_weights(self.proto.graph, self.grad)
            self.proto = without_weights(self.proto, self.stripped)
            store.release_freed_memory()
        model = None
        self.step_model = None
        if use_step and step is not None:   # (use_step says step was made)
            self.step_graph, plan = self._probe(step, plan, costs, saved)
            if refused is None or ctx.budget_mb is None or plan.estimate_mb <= ctx.budget_mb:
                return plan, costs
            if self.has_frozen or saved is not None:
                raise refused
            # BatchNorm's 2 samples do not fit beside ONNX Runtime's sessions, measured: NumPy's step, which has no
            # sessions, may (MobileNetV2-1.0 lite at 96x96 under 200 MB: 4 samples, 137 MB)
            step.stop()
            self.step_graph, costs = None, numpy_costs
            store.release_freed_memory()
            plan = plan_for(costs, ctx.budget_mb, saved)
            plan.ort_step = plan.ort_forward = use_step = False
        if plan.arena is False:   # a saved plan's: the feature pass makes its own session without the arena
            self.eval_session = None
        x = np.zeros((1, *self.input_shape), np.float32)
        if use_fwd:
            self.fwd = OrtForward(self.proto, self.grad, ctx.threads)
            out, tape = self.fwd.forward(x)   # its ConvTranspose sessions are made at first use
            self.grad.backward(tape, np.zeros_like(out))
        elif saved is None and (partial or refused is not None):
            sessions = min(ort_train.sessions_mb(size), ort_forward.sessions_mb(size))
            ctx.note(f"the step runs in NumPy: ONNX Runtime's sessions (about {sessions:.0f} MB) do not fit "
                             "the memory budget")
        return plan, costs

    def _probe(self, step: ort_train.OrtTrain, plan: MemoryPlan, costs: Costs,
               saved: dict | None) -> tuple[ort_train.OrtTrain, MemoryPlan]:
        """The step graph's session and the plan, probed by a first step at the planned micro-batch (it allocates
        what later steps reuse). A peak over the budget shrinks the micro-batch by the measured ratio and makes the
        session again (a new arena); a resumed run keeps its saved plan."""
        threads, budget = self.ctx.threads, self.ctx.budget_mb
        shape = self.feature_shape if self.has_frozen else self.input_shape
        before = procmem.rss_mb() or 0.0
        # what the run adds after the probe: the optimizer's state and the summed gradients (at the first real
        # step), and the cache (filled after the plan)
        later = 3 * sum(int(v.nbytes) for v in self.weights.values()) / MB
        scale = 1.0
        if self.has_frozen:
            # the feature pass comes after the plan, beside the step graph's session: one pass at the plan's feature
            # batch through the frozen part's session (the pass makes its own, alike) is measured here with it
            self.features(np.zeros((plan.feature_batch, *self.input_shape), np.float32))
            # decoded inputs the pass holds beyond the probe's (ParallelReader: READ_AHEAD at a time, and a copy)
            later += costs.input_per_sample * max(plan.feature_batch, READ_AHEAD) * 2
        for _ in range(4):
            step.start(threads)
            m = plan.micro_batch
            _probe_steps(step, m, shape)
            peak = procmem.peak_rss_mb() or 0.0
            plan.method, plan.probe_peak_mb = "probe", round(peak, 1)
            plan.estimate_mb = round(max(peak, (procmem.rss_mb() or 0.0) + later
                                         + (costs.cache_mb if plan.cache == "memory" else 0.0)), 1)
            if budget is None or saved is not None or plan.estimate_mb <= budget * HEADROOM:
                break
            if m <= costs.least_micro:   # the least that trains: the caller decides
                break
            scale *= max(1.0, (plan.estimate_mb - before) / max(costs.train_per_sample * m, 1.0)) * 1.1
            try:
                smaller = choose(costs, budget, scale=scale)
            except UsageError:
                smaller = dataclasses.replace(plan, micro_batch=1)
            plan = dataclasses.replace(plan, micro_batch=max(min(smaller.micro_batch, m // 2 or 1), costs.least_micro),
                                       notes=list(plan.notes))
            step.stop()
            store.release_freed_memory()
        if budget is not None and saved is None and plan.estimate_mb <= budget * HEADROOM:
            plan = self._grow(step, plan, shape, before, later, costs, budget)
        step.done()
        return step, plan

    def _grow(self, step: ort_train.OrtTrain, plan: MemoryPlan, shape: tuple, before: float, later: float,
              costs: Costs, budget: float) -> MemoryPlan:
        """The analytic figure per sample is an upper bound (MobileNetV2-1.0 lite at 96x96 under 200 MB: micro-batch
        4 measured 162 MB): once, the largest micro-batch the probe's own figure per sample says fits is probed, and
        kept if its measured peak fits too (else the probed one is made again)."""
        m, batch, threads = plan.micro_batch, self.ctx.batch_size, self.ctx.threads
        per_sample = max((plan.probe_peak_mb or before) - before, 0.0) / m   # the session's fixed part too: an upper bound
        room = budget * HEADROOM - plan.estimate_mb
        bigger = [d for d in range(m + 1, batch + 1) if batch % d == 0 and per_sample * (d - m) <= room]
        if not bigger:
            return plan
        tried = dataclasses.replace(plan, micro_batch=bigger[-1], notes=list(plan.notes))
        step.stop()
        store.release_freed_memory()
        step.start(threads)
        _probe_steps(step, tried.micro_batch, shape)
        peak = procmem.peak_rss_mb() or 0.0
        tried.probe_peak_mb = round(peak, 1)
        tried.estimate_mb = round(max(peak, (procmem.rss_mb() or 0.0) + later
                                      + (costs.cache_mb if plan.cache == "memory" else 0.0)), 1)
        if tried.estimate_mb <= budget * HEADROOM:
            return tried
        step.stop()
        store.release_freed_memory()
        step.start(threads)
        step.step(np.zeros((m, *shape), np.float32), np.zeros(m, np.int64), 0.0)
        plan.estimate_mb = max(plan.estimate_mb, round(peak, 1))   # the process touched the larger probe's peak
        return plan

    def _fits(self, costs: Costs, whole: bool = False) -> bool:
        """Whether a plan fits the budget by the analytic bound (``whole``: all of it, the headroom too)."""
        if self.ctx.budget_mb is None:
            return True
        try:
            choose(costs, self.ctx.budget_mb / (HEADROOM if whole else 1.0))
        except UsageError:
            return False
        return True

    # --- a build another job of the process takes (buildstore) -------------------------------------

    def loaded_state(self) -> dict[str, np.ndarray]:
        """Right after load: copies of the loaded arrays the graph may not keep (BatchNorm's running statistics,
        whose data leaves the graph at the plan as a frozen weight's does); ``reset`` reads the weights back from
        the graph."""
        return {k: v.copy() for k, v in self.stats.items()}

    def shareable(self) -> bool:
        """Another job may take this build: its whole step is the ONNX Runtime step graph (fed every array at
        each run, so the session holds nothing of a run; NumPy's and ort_forward's steps keep state of their own)
        and the graph still holds every trained weight's loaded value."""
        if self.step_graph is None or self.fwd is not None or self.proto is None:
            return False
        external = _lazy.onnx().TensorProto.EXTERNAL
        held = {t.name for t in self.proto.graph.initializer if t.data_location != external}
        return all(name in held for name in self.weights)

    def reset(self, initial: dict[str, np.ndarray]) -> None:
        """The trained arrays back to what load made (in place: the step graph is fed these very arrays): the
        weights from the graph, the rest from ``initial`` (loaded_state's)."""
        to_array = _lazy.from_import("onnx", "numpy_helper").to_array
        graph = {t.name: t for t in self.proto.graph.initializer if t.name in self.weights}
        for name, value in self.weights.items():
            value[...] = to_array(graph[name])
        for name, value in self.stats.items():
            value[...] = initial[name]

    def attach(self, ctx: EngineContext) -> None:
        """Bound to the context of the job that runs it now."""
        self.ctx, self.opt = ctx, None

    def detach(self) -> None:
        """Between jobs: nothing of the last one held (its optimizer, the frozen part's probe session; its context
        holds only its notes list)."""
        self.opt, self.eval_session = None, None

    def release(self) -> None:
        """Let go of what the build holds (sessions, graphs, arrays), by reference: the tuner may have frozen the
        engine out of the collector's reach (gc.freeze)."""
        self.grad.params.clear()   # (a build is of a loaded engine: load made the graph)
        if self.step_graph is not None:
            self.step_graph.session = None
        self.detach()
        self.fwd = self.step_graph = self.proto = self.step_model = None
        del self.grad
        self.weights, self.stats = {}, {}

    def start_from(self, arrays: dict[str, np.ndarray]) -> None:
        for name in self.weights:
            self.weights[name][...] = arrays[name]
        for name in self.stats:   # (arrays from before training mode may lack them: the file's stay)
            if name in arrays:
                self.stats[name][...] = arrays[name]

    def make_optimizer(self, name: str, lr: float, momentum: float | None, weight_decay: float | None,
                       correction: dict | None) -> Corrected:
        runtime.cap_loaded_blas(self.ctx.threads)
        self.opt = Corrected(make_numpy_optimizer(name, self.weights, lr, momentum, weight_decay), correction)
        return self.opt

    # --- the frozen part ---------------------------------------------------------------------------

    def frozen_fn(self, arena: bool) -> tuple[Callable[[np.ndarray], np.ndarray], str]:
        """The frozen part's pass for the feature cache (``plan`` wrote its file), with the arena or not (the plan's),
        and the file's sha256."""
        path = self.ctx.outdir / store.FROZEN_ONNX
        # the plan's probe session (the same file, with the arena) serves the pass: a second one made here took
        # 23 MB more at MobileNetV2-1.0 160x160 head, where the run peaked
        session = self.eval_session if self.eval_session is not None and arena else \
            store.ort_session(path, self.ctx.threads, arena)
        self.eval_session = None
        name = session.get_inputs()[0].name
        return (lambda x: session.run(None, {name: x})[0]), store.file_sha(path)

    def features(self, x: np.ndarray) -> np.ndarray:
        if not self.has_frozen:
            return x
        if self.eval_session is None:
            frozen = self.frozen_bytes if self.frozen_bytes is not None else self.frozen_path
            self.eval_session = _lazy.ort_session(frozen, self.ctx.threads, spinning=True, stop_spinning_after_run=True)
        return self.eval_session.run(None, {self.eval_session.get_inputs()[0].name: x})[0]

    # --- training ----------------------------------------------------------------------------------

    def step(self, inputs: Inputs, idx: np.ndarray, labels: np.ndarray, micro: int) -> tuple[float, int]:
        real = len(idx)
        grads: dict[str, np.ndarray] = {}
        loss_sum, correct = 0.0, 0

        def add(got: dict) -> None:
            for k, g in got.items():
                if k in grads:
                    grads[k] += g
                else:   # the first micro-batch's own arrays (ORT's outputs are the caller's): no zeros to add to
                    grads[k] = g if real <= micro else g.copy()
        with np.errstate(over="ignore", invalid="ignore"):  # a diverged loss is reported by the job, once
            for start in range(0, real, micro):
                part = idx[start:start + micro]
                if self.step_graph is not None:
                    out, got = self.step_graph.step(inputs(part), labels[part], 1.0 / real)
                    loss, right, _ = onnx_grad.softmax_cross_entropy(out.reshape(len(part), -1), labels[part])
                    loss_sum, correct = loss_sum + loss, correct + right
                    add(got)
                    out = got = None
                    continue
                out, tape = self._forward(inputs(part))
                loss, right, dlogits = onnx_grad.softmax_cross_entropy(out.reshape(len(part), -1), labels[part])
                loss_sum, correct = loss_sum + loss, correct + right
                add(self.grad.backward(tape, (dlogits / np.float32(real)).reshape(out.shape)))
        assert self.opt is not None, "make_optimizer before a step"
        self.opt.step(grads)
        return loss_sum, correct

    def _forward(self, x: np.ndarray) -> tuple:
        return self.fwd.forward(x) if self.fwd is not None else self.grad.forward(x)

    def _output(self, x: np.ndarray) -> np.ndarray:
        if self.step_graph is not None:
            return self.step_graph.predict(x)
        return self.fwd.predict(x) if self.fwd is not None else self.grad.forward(x, train=False)[0]

    def evaluate(self, inputs: Inputs, labels: np.ndarray, micro: int) -> tuple[float, float]:
        correct, loss_sum = 0, 0.0
        for start in range(0, len(labels), micro):
            idx = np.arange(start, min(start + micro, len(labels)))
            out = self._output(inputs(idx))
            loss, right, _ = onnx_grad.softmax_cross_entropy(out.reshape(len(idx), -1), labels[idx])
            loss_sum, correct = loss_sum + loss, correct + right
        return correct / len(labels), loss_sum / len(labels)

    def settle_statistics(self, inputs: Inputs, rows: int, micro: int) -> None:
        """BatchNorm's running statistics (BATCH_STATS) re-estimated from the current weights: a forward with
        BatchNorm on each micro-batch's statistics over SETTLE_ROWS of the ``rows`` training rows (evenly spaced),
        pooled; no weight moves. Training normalises by the batch, so the running statistics are only what the
        evaluation and the written model read: followed step by step (momentum 0.9), they lagged the weights
        (MobileNetV2 lite's held-out top-1 swung 0.39-0.67 over seeds)."""
        if not self.stats:
            return
        idx = settle_rows(rows)

        def parts():
            for start in range(0, len(idx), micro):
                x = inputs(idx[start:start + micro])
                yield len(x), (self.step_graph.batch_statistics(x) if self.step_graph is not None
                               else self._forward(x)[1].stats)
        self.grad.set_statistics(parts())

    def predict(self, arrays: dict[str, np.ndarray], features: np.ndarray) -> np.ndarray:
        self.start_from(arrays)
        return np.concatenate([self._output(features[s:s + 64]).reshape(len(features[s:s + 64]), -1)
                               .argmax(axis=1) for s in range(0, len(features), 64)])

    # --- arrays ------------------------------------------------------------------------------------

    def trainable_arrays(self) -> dict[str, np.ndarray]:
        return {**self.weights, **self.stats}

    def statistics(self) -> set[str]:
        """BatchNorm's running statistics where training mode updates them (BATCH_STATS); else none: the file's
        constants."""
        return set(self.stats)

    def restore(self, arrays: dict[str, np.ndarray], where: str) -> None:
        ckpt.restore_arrays({**self.weights, **self.stats}, arrays, where)

    def param_counts(self) -> tuple[int, int]:
        trained = sum(int(v.size) for v in self.weights.values())
        total = sum(int(np.prod(t.dims)) for t in self.proto.graph.initializer if t.data_type == 1)
        return trained, total - trained

    def write_model(self, path: Path, pre: Preprocess, extra: dict) -> None:
        """OUTDIR/model.onnx: the graph with the trained initializers, its metadata the run's (set in the engine's
        own graph: a copy of it took 20 MB more at the end of a run, MobileNetV2 at 160x160, where a bias/lite
        run peaked), written a weight at a time, the frozen ones the graph no longer holds from GradGraph's."""
        proto = self.proto
        meta = {**{k: v for k, v in self.meta.items()}, f"{META_PREFIX}preprocess": json.dumps(pre.to_dict()),
                f"{META_PREFIX}class_names": json.dumps(list(pre.class_names or [])),
                f"{META_PREFIX}num_classes": str(len(pre.class_names or [])),
                f"{META_PREFIX}finetune": json.dumps(extra)}
        del proto.metadata_props[:]
        for key, value in meta.items():
            entry = proto.metadata_props.add()
            entry.key, entry.value = key, value
        values = {name: self.grad.params[name] for name in [*self.stripped, *self.stats]}
        if self.from_model:   # read back from MODEL one at a time as they are written (not all at once: 14 MB)
            store.release_freed_memory()   # first what the feature pass's session left to the heap (its arena)
            inits = {t.name: t for t in load_onnx(self.source).proto.graph.initializer if t.name in set(self.from_model)}
            write_streamed(path, proto, _FromTensors(inits, {**values, **self.weights}), "model")
            return
        write_streamed(path, proto, {**values, **self.weights}, "model")


class _FromTensors(dict):
    """``arrays``, and the initializers ``tensors`` as arrays made when asked (write_streamed asks for one at a time)."""

    def __init__(self, tensors: dict, arrays: dict):
        super().__init__(arrays)
        self.tensors = tensors

    def __contains__(self, name) -> bool:
        return super().__contains__(name) or name in self.tensors

    def __getitem__(self, name):
        if super().__contains__(name):
            return super().__getitem__(name)
        return _lazy.from_import("onnx", "numpy_helper").to_array(self.tensors[name])

