"""Gluon -> ONNX: the one converter quantize, export, profile and finetune use.

mxnet 1.9.1's exporter with its breakages repaired (``compat/mxnet_onnx.py``), the opset pinned, weights
dropped from the graph inputs, nodes topologically sorted, and edgetrain's preprocessing recorded in the
file's metadata. ``build_onnx`` returns the checked ModelProto; ``export_onnx`` also writes it atomically.
Neither validates against the Gluon model: ``edgetrain export`` (ops) does that.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from . import __version__, _lazy
from .compat import mxnet_onnx
from .errors import RunFailed, UsageError
from .fileio import atomic_write_bytes, check_output_path
from .options import DEFAULT_OPSET
from .runners import OrtRunner

META_PREFIX = "edgetrain."


def export_onnx(model, path, opset: int = DEFAULT_OPSET, dynamic_batch: bool = True) -> Path:
    """Translate ``model`` (a GluonModel), repair it, record its preprocessing, and write it atomically.

    No validation: ``export`` does that. Raises UsageError for an operator the exporter cannot translate.
    """
    path = writable(Path(path))
    proto = build_onnx(model, opset=opset, dynamic_batch=dynamic_batch)
    write_atomically(proto.SerializeToString(), path)
    return path


def build_onnx(model, opset: int = DEFAULT_OPSET, dynamic_batch: bool = True, fp16: bool = False, check: bool = True):
    """The checked ONNX ModelProto for ``model`` (nothing written). ``check=False`` skips onnx.checker (which
    serializes the whole graph: ~2x the weights in peak memory) for a caller that runs the result against
    Gluon's outputs instead (finetune's export child).

    Batch policy, the same for every ONNX file edgetrain writes: a dynamic batch dimension unless the user
    fixes it (``dynamic_batch=False``: batch 1); ``check_batch_sizes`` proves a written file takes both."""
    onnx = _lazy.onnx()

    sym, params = _symbol_and_params(model)
    try:
        proto = mxnet_onnx.translate(sym, params, model.preprocess.input_name, model.preprocess.batch_shape(1),
                                     opset=opset, dynamic_batch=dynamic_batch, check=check)
    except mxnet_onnx.TranslationError as exc:
        layer = _gluon_layer(model.block, exc.layer)
        raise UsageError(f"cannot export operator '{exc.op}' to ONNX: {exc.reason}", f"layer {layer}",
                         "replace that layer with one built from supported operators "
                         "(see mxnet.onnx.get_operator_support())") from None
    if fp16:
        proto = to_fp16(proto)
    _add_metadata(proto, model, opset, "fp16" if fp16 else "fp32")
    if not check:
        return proto
    try:
        onnx.checker.check_model(proto, full_check=True)
    except Exception as exc:  # a translation bug, not the user's doing: keep it visible
        raise RunFailed(f"the translated model fails onnx.checker: {str(exc).splitlines()[0][:300]}",
                        model.ref.text, "report this with the model; EDGETRAIN_DEBUG=1 shows the details") from exc
    return proto


def to_fp16(proto):
    """fp16 weights and compute, fp32 inputs and outputs, by onnxruntime's maintained converter.

    Why onnxruntime.transformers.float16: it ships with onnxruntime (no new dependency) and is the
    maintained descendant of onnxconverter-common's converter. Its Cast nodes for the kept fp32 inputs
    are appended at the end of the graph, which the ONNX checker rejects, so the graph is re-sorted.
    """
    import logging

    convert_float_to_float16 = _lazy.from_import("onnxruntime.transformers.float16", "convert_float_to_float16")

    logging.getLogger("onnxruntime.transformers.float16").setLevel(logging.ERROR)
    proto = convert_float_to_float16(proto, keep_io_types=True)
    _topological_sort(proto.graph)
    return proto


def _topological_sort(graph) -> None:
    produced = {i.name for i in graph.input} | {t.name for t in graph.initializer} | {""}
    consumers: dict[str, list[int]] = {}
    waiting = []
    for k, node in enumerate(graph.node):
        missing = {i for i in node.input if i not in produced}
        waiting.append(len(missing))
        for name in missing:
            consumers.setdefault(name, []).append(k)
    ready = [k for k, n in enumerate(waiting) if n == 0]
    order, seen = [], set()
    while ready:
        k = ready.pop(0)
        order.append(k)
        for name in graph.node[k].output:
            if name in seen:
                continue
            seen.add(name)
            for c in consumers.get(name, ()):
                waiting[c] -= 1
                if waiting[c] == 0:
                    ready.append(c)
    if len(order) != len(graph.node):
        raise RunFailed("the fp16 graph has a cycle or a dangling input", "--fp16", "export without --fp16")
    nodes = [graph.node[k] for k in order]
    del graph.node[:]
    graph.node.extend(nodes)


def _symbol_and_params(model):
    """The model's symbol (input named as recorded) and its parameters by name, as Block.export would save."""
    mx = _lazy.mxnet()

    out = model.block(mx.sym.var(model.preprocess.input_name))
    sym = mx.sym.Group(list(out)) if isinstance(out, (list, tuple)) else out
    wanted = set(sym.list_inputs())
    params = {}
    for name, p in model.block.collect_params().items():
        if name in wanted:
            params[name] = p._reduce() if hasattr(p, "_reduce") else p.data()
    return sym, params


def _gluon_layer(block, node: str) -> str:
    """The Gluon layer a symbol node belongs to: the block with the longest name prefix of the node's
    name (a node is named after its block, e.g. ``net_groupnorm0_groupnorm0`` or ``net_dense0_fwd``)."""
    best = ""
    stack = [block]
    while stack:
        b = stack.pop()
        prefix = getattr(b, "prefix", "") or ""
        if prefix and node.startswith(prefix) and len(prefix) > len(best):
            best = prefix
        stack.extend(getattr(b, "_children", {}).values())
    layer = best.rstrip("_") if best else node
    return layer if layer == node else f"{layer}, node {node}"


def _add_metadata(proto, model, opset: int, precision: str) -> None:
    pre = model.preprocess
    meta = {
        "preprocess": json.dumps(pre.to_dict()),
        "class_names": json.dumps(list(pre.class_names) if pre.class_names is not None else None),
        "num_classes": str(model.num_classes),
        "source_model": model.ref.text,
        "random_weights": "true" if model.random_weights else "false",
        "version": __version__,
        "opset": str(opset),
        "precision": precision,
    }
    for key, value in meta.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = META_PREFIX + key, value
    proto.doc_string = (f"Exported by edgetrain {__version__} from {model.ref.text}; preprocessing in metadata "
                        f"'{META_PREFIX}preprocess' (JSON): pixels to [0,1], resize, (x-mean)/std, NCHW.")


def writable(path: Path) -> Path:
    """Fail before any work if ``path`` cannot be written (root passes os.access checks, /sys still refuses)."""
    import os
    import tempfile

    path = check_output_path(path, "output")
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=path.parent)
    except OSError as exc:
        raise UsageError(f"output folder is not writable: {exc.strerror}", str(path.parent),
                         "choose another location for -o") from None
    os.close(fd)
    os.unlink(probe)
    return path


def write_atomically(blob: bytes, path: Path) -> None:
    try:
        atomic_write_bytes(path, blob, "output")
    except OSError as exc:  # disk full, folder removed meanwhile: the temp file is already gone
        raise RunFailed(f"cannot write the ONNX file: {exc.strerror or exc}", str(path),
                        "free space or choose another location for -o") from None


BATCH_SIZES = (1, 3)  # a dynamic-batch file is run at both


def check_batch_sizes(model, preprocess, threads: int | None = None, where: str = "output",
                      rtol: float = 1e-3) -> dict:
    """Prove an ONNX file (path or bytes) follows the batch policy: a dynamic file runs at every size in
    BATCH_SIZES and a batch gives each sample the output it gets alone, within ``rtol`` of the outputs'
    largest magnitude (an int8 model may differ by a few quantization steps: ORT's kernels accumulate in
    another order at another batch size and a value on a rounding edge moves one step). Returns what was
    checked; a file that fails is a bug in edgetrain, not the user's doing (RunFailed)."""
    runner = OrtRunner(model, threads)
    declared = runner.session.get_inputs()[0].shape[0]
    if runner.fixed_batch is not None:
        return {"dynamic": False, "batch": runner.fixed_batch, "checked_sizes": [runner.fixed_batch]}
    mean = np.asarray(preprocess.mean, dtype=np.float32).reshape(-1, 1, 1)
    std = np.asarray(preprocess.std, dtype=np.float32).reshape(-1, 1, 1)
    x = ((np.random.RandomState(7).rand(max(BATCH_SIZES), *preprocess.input_shape).astype(np.float32) - mean)
         / std).astype(np.float32)
    alone = np.concatenate([runner.run(x[i:i + 1])[0] for i in range(len(x))])
    worst = 0.0
    for n in BATCH_SIZES:
        try:
            together = runner.run(x[:n])[0]
        except Exception as exc:
            raise RunFailed(f"the written model does not run at batch {n} although its batch is dynamic: "
                            f"{str(exc).splitlines()[0][:200]}", where, "report this with the model") from exc
        scale = max(float(np.abs(alone[:n]).max()), 1e-6)
        err = float(np.abs(together - alone[:n]).max()) / scale
        if together.shape[0] != n or err > rtol:
            raise RunFailed(f"the written model gives a batch of {n} other outputs than one sample at a time "
                            f"(max rel error {err:.3g})", where, "report this with the model")
        worst = max(worst, err)
    return {"dynamic": True, "batch": declared if isinstance(declared, str) else None,
            "checked_sizes": list(BATCH_SIZES), "max_rel_error": worst}
