"""Peak resident memory predicted BEFORE a configuration runs, from the model alone.

peak RSS = runtime baseline (measured once per runtime in a child, cached for this process)
         + weights x w         (the copies a runtime holds or makes while loading)
         + conv weights x wc   (re-laid-out copies for the convolution kernels)
         + live activations x a (largest sum of tensors alive at once, in graph order)
         + a constant (allocator arenas, thread pools) + the input batch

Weights and activations come from the graph: ONNX shape inference for .onnx files, ``infer_shape`` for
MXNet symbols. The coefficients are the model's only fitted numbers: least squares over the VmHWM of
Gluon model-zoo networks (1.8 MB to 507 MB of weights, 224x224, batch 1, 1 thread) measured by
edgetrain.measure.child on x86-64 with onnxruntime 1.32 and mxnet 1.9.1, rounded.
tests/test_acceptance.py re-measures them and fails when a prediction is off by more than 20%.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import _lazy, models

MB = 1024 * 1024

# onnxruntime: the file is parsed into a protobuf, initializers are copied into OrtValues and the
# protobuf released: ~1.75x weights at the peak; Conv weights are also pre-packed (NCHWc), ~0.9x more.
# Activations live in an arena that grows in chunks: ~2.5x the planned live set.
# mxnet: nd.load and the block's parameters overlap at load (2x; 2.55x for freshly initialised
# random weights, whose initializer makes temporaries); the un-fused hybridized graph plus oneDNN's
# reorder buffers hold ~4x the live activations; the engine's pools add ~14 MB.
COEFFICIENTS = {
    "onnxruntime": {"w": 1.75, "w_random": 1.75, "wc": 0.9, "a": 2.5, "const_mb": 3.0},
    "mxnet": {"w": 2.0, "w_random": 2.55, "wc": 0.2, "a": 4.0, "const_mb": 14.0},
}

_baselines: dict[str, float] = {}


@dataclass
class GraphStats:
    weights_bytes: int
    activation_peak_bytes: int   # largest sum of tensors alive at the same time, in graph order
    activation_total_bytes: int  # every intermediate tensor added up (no reuse at all)
    input_bytes: int
    nodes: int
    conv_weights_bytes: int      # the part of weights_bytes that convolutions use (re-laid-out by runtimes)
    source: str
    input_shape: list[int] = field(default_factory=list)  # the data input's, as sized (a batch the graph fixes)
    folded_bytes: int = 0        # the part of activation_total_bytes an optimiser folds away (BatchNorm after Conv)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class MemoryPrediction:
    runtime: str
    peak_rss_mb: float
    baseline_mb: float
    weights_mb: float
    activations_mb: float
    other_mb: float
    stats: GraphStats
    random_weights: bool = False
    provenance: str = "modelled"

    @property
    def source(self) -> str:
        c = COEFFICIENTS[self.runtime]
        w = c["w_random"] if self.random_weights else c["w"]
        return (f"runtime baseline {self.baseline_mb:.0f} MB (measured in a child) + weights "
                f"{self.stats.weights_bytes / MB:.1f} MB x {w} + conv weights {self.stats.conv_weights_bytes / MB:.1f}"
                f" MB x {c['wc']} + live activations {self.stats.activation_peak_bytes / MB:.1f} MB x {c['a']} + "
                f"{c['const_mb']} MB + input ({self.stats.source}; coefficients fitted on zoo models, "
                "see edgetrain/measure/memory_model.py)")

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if k != "stats"}
        d["stats"] = self.stats.to_dict()
        d["source"] = self.source
        return d


def predict(runtime: str, stats: GraphStats, random_weights: bool = False,
            baseline_mb: float | None = None) -> MemoryPrediction:
    """Peak RSS of one configuration of ``runtime`` running a graph with ``stats``."""
    c = COEFFICIENTS[runtime]
    base = runtime_baseline_mb(runtime) if baseline_mb is None else baseline_mb
    weights = (stats.weights_bytes * (c["w_random"] if random_weights else c["w"])
               + stats.conv_weights_bytes * c["wc"]) / MB
    acts = stats.activation_peak_bytes * c["a"] / MB
    other = c["const_mb"] + stats.input_bytes / MB
    return MemoryPrediction(runtime, base + weights + acts + other, base, weights, acts, other, stats,
                            random_weights)


def runtime_baseline_mb(runtime: str) -> float:
    """RSS of a process that imported ``runtime`` and ran a trivial graph; measured once per process."""
    if runtime not in _baselines:
        from .. import child

        proc = child.run(child.python_argv("edgetrain.measure.child", "--baseline", runtime),
                         what=f"the {runtime} baseline", timeout=300, where="memory model")
        if proc.code != 0:
            from ..errors import RunFailed

            raise RunFailed(f"could not measure the {runtime} baseline: {child.death(proc.code)}"
                            f"{child.last_line(proc.err)}", "memory model",
                            "run `edgetrain doctor` to check the installation")
        _baselines[runtime] = float(json.loads(proc.out.strip().splitlines()[-1])["rss_mb"])
    return _baselines[runtime]


def _pythonpath() -> str:
    here = str(Path(__file__).resolve().parent.parent)
    old = os.environ.get("PYTHONPATH")
    return here + (os.pathsep + old if old else "")


# --- graph statistics ---------------------------------------------------------------------------------

_ONNX_CONV = {"Conv", "ConvTranspose", "QLinearConv", "ConvInteger"}
_ONNX_ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}


def _liveness_peak(order: list[tuple[list[str], list[str]]], sizes: dict[str, int], keep: set[str]) -> int:
    """Largest sum of tensor bytes alive at once when nodes run in ``order`` (inputs, outputs)."""
    last_use: dict[str, int] = {}
    for i, (ins, _outs) in enumerate(order):
        for name in ins:
            last_use[name] = i
    live: dict[str, int] = {}
    peak = 0
    for i, (_ins, outs) in enumerate(order):
        for name in outs:
            if name in sizes:
                live[name] = sizes[name]
        peak = max(peak, sum(live.values()))
        for name in list(live):
            if name not in keep and last_use.get(name, -1) <= i:
                del live[name]
    return peak


def onnx_stats(path: str | Path, input_shape: list[int] | None = None, batch: int = 1) -> GraphStats:
    """Weights and activation sizes of an ONNX model, from shape inference at a concrete input shape."""
    import numpy as np
    onnx = _lazy.onnx()
    shape_inference = _lazy.from_import("onnx", "shape_inference")

    model = onnx.load(str(path))
    graph = model.graph
    init_names = {t.name for t in graph.initializer}
    weights = 0
    for t in graph.initializer:
        weights += int(np.prod(t.dims, dtype=np.int64)) * _ONNX_ITEMSIZE.get(t.data_type, 4)
    input_bytes, first_shape = 0, []
    for inp in graph.input:
        if inp.name in init_names:
            continue
        dims = inp.type.tensor_type.shape.dim
        for i, d in enumerate(dims):
            if d.dim_value > 0:
                continue
            d.ClearField("dim_param")
            if i == 0:
                d.dim_value = batch
            elif input_shape and len(input_shape) == len(dims):
                d.dim_value = int(input_shape[i])
        shape = [d.dim_value for d in dims]
        first_shape = first_shape or shape
        input_bytes += int(np.prod(shape, dtype=np.int64)) * _ONNX_ITEMSIZE.get(inp.type.tensor_type.elem_type, 4)
    inferred = shape_inference.infer_shapes(model)
    sizes: dict[str, int] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = vi.type.tensor_type
        dims = [d.dim_value for d in tt.shape.dim]
        if dims and all(d > 0 for d in dims):
            sizes[vi.name] = int(np.prod(dims, dtype=np.int64)) * _ONNX_ITEMSIZE.get(tt.elem_type, 4)
    order = [([n for n in node.input if n and n not in init_names], list(node.output)) for node in graph.node]
    outputs = {o.name for o in graph.output}
    init_bytes = {t.name: int(np.prod(t.dims, dtype=np.int64)) * _ONNX_ITEMSIZE.get(t.data_type, 4)
                  for t in graph.initializer}
    conv = {n for node in graph.node if node.op_type in _ONNX_CONV for n in node.input[1:] if n in init_bytes}
    return GraphStats(weights, _liveness_peak(order, sizes, outputs), sum(sizes.values()), input_bytes,
                      len(graph.node), sum(init_bytes[n] for n in conv), "ONNX shape inference", first_shape,
                      _folded_bytes(graph, sizes))


def _folded_bytes(graph, sizes: dict[str, int]) -> int:
    """Bytes of the BatchNormalization outputs that follow a Conv: an optimiser folds each into its Conv's weights
    (quantize's pre-processing does), so the tensor is not there to be run, calibrated or compared."""
    made_by = {out: node.op_type for node in graph.node for out in node.output}
    return sum(sizes.get(node.output[0], 0) for node in graph.node
               if node.op_type == "BatchNormalization" and made_by.get(node.input[0]) == "Conv")


def mxnet_stats(model_text: str, params: str | None = None, chw=None, batch: int = 1, with_info: bool = False):
    """Weights and activation sizes of a Gluon MODEL, from its symbol's infer_shape.

    With ``with_info`` also returns {"preprocess", "random_weights", "notes"} of the loaded model.
    """
    mx = _lazy.mxnet()
    import numpy as np

    # load_gluon validates the reference (and runs it once): a broken model is a UsageError here.
    model = models.load_gluon(model_text, params=params, input_shape=tuple(chw) if chw else None,
                              hybridize=False)
    pre = model.preprocess
    random_weights, notes = model.random_weights, list(model.notes)
    data_name = pre.input_name
    sym = model.block(mx.sym.var(data_name))
    if isinstance(sym, (list, tuple)):
        sym = sym[0]
    if chw:
        pre = pre.with_shape(tuple(chw))
    shape = pre.batch_shape(batch)
    arg_shapes, _, aux_shapes = sym.infer_shape(**{data_name: shape})
    arg_names, aux_names = sym.list_arguments(), sym.list_auxiliary_states()
    weights = sum(int(np.prod(s)) * 4 for n, s in zip(arg_names, arg_shapes) if n != data_name)
    weights += sum(int(np.prod(s)) * 4 for s in aux_shapes)
    del aux_names
    internals = sym.get_internals()
    _, out_shapes, _ = internals.infer_shape(**{data_name: shape})
    out_names = internals.list_outputs()
    graph = json.loads(sym.tojson())
    nodes = graph["nodes"]
    sizes: dict[str, int] = {}
    for name, s in zip(out_names, out_shapes):
        if s is not None:
            sizes[name] = int(np.prod(s)) * 4
    order = []
    for node in nodes:
        if node["op"] == "null":
            continue
        ins = [_mx_out_name(nodes, j, k, sizes) for j, k, *_ in node["inputs"] if nodes[j]["op"] != "null"]
        outs = [n for n in out_names if n == node["name"] + "_output"
                or re.fullmatch(re.escape(node["name"]) + r"_output\d+", n)]
        order.append((ins, outs))
    heads = {_mx_out_name(nodes, j, k, sizes) for j, k, *_ in graph["heads"]}
    acts = {k: v for k, v in sizes.items() if k not in set(arg_names)}
    arg_bytes = {n: int(np.prod(s)) * 4 for n, s in zip(arg_names, arg_shapes)}
    conv = {nodes[j]["name"] for node in nodes if "Convolution" in node["op"] or "conv" in node["op"].lower()
            for j, *_ in node["inputs"][1:] if nodes[j]["op"] == "null"}
    stats = GraphStats(weights, _liveness_peak(order, acts, heads), sum(acts.values()),
                       int(np.prod(shape)) * 4, len(order), sum(arg_bytes.get(n, 0) for n in conv),
                       "MXNet infer_shape")
    if with_info:
        return stats, {"preprocess": pre.to_dict(), "random_weights": random_weights, "notes": notes}
    return stats


def _mx_out_name(nodes, j: int, k: int, known: dict) -> str:
    """The internals' name of output ``k`` of node ``j``: "<name>_output" when it has one, else "_output<k>"."""
    name = nodes[j]["name"]
    if nodes[j]["op"] == "null":
        return name
    return f"{name}_output" if k == 0 and f"{name}_output" in known else f"{name}_output{k}"
