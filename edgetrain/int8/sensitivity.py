"""Which quantized nodes cost the most accuracy: per-node error between fp32 and int8 activations.

Uses ONNX Runtime's QDQ debugging tools (onnxruntime.quantization.qdq_loss_debug): both models are run
on the same samples with every matched activation exposed (one sample at a time: streamed_sqnr), and each
activation's signal-to-quantization-noise ratio (SQNR, dB; higher is better) is measured against the fp32
model. Errors accumulate down the graph, so a node is charged with the SQNR it *loses*: that of its worst
input minus that of its output.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import _lazy
from ..procmem import release_freed_memory
from ..results import Figure
from .ort import quiet_ort


@dataclass
class NodeError(Figure):
    """One node of the all-int8 model against fp32 (a QuantizeResult's ``node_errors``)."""

    node: str
    op: str
    output_sqnr_db: float     # its output's SQNR against fp32 (higher is better)
    lost_db: float            # the SQNR it loses: its worst input's minus its output's
    kept_fp32: bool = False   # the written model keeps it in fp32


def rank_nodes(fp32_path: Path, int8_path: Path, candidates: list[str], reader: Callable[[], object],
               workdir: Path, threads: int | None = None) -> list[tuple[str, float]]:
    """``candidates`` (node names of the fp32 model) sorted by the SQNR they lose, worst first.

    ``reader()`` returns a fresh CalibrationDataReader over the samples to compare on.
    """
    rows = {r.node: r for r in node_errors(fp32_path, int8_path, reader, workdir, threads)}
    costs = [(name, rows[name].lost_db if name in rows else 0.0) for name in candidates]
    costs.sort(key=lambda c: -c[1])
    return costs


def node_errors(fp32_path: Path, int8_path: Path, reader: Callable[[], object], workdir: Path,
                threads: int | None = None) -> list[NodeError]:
    """Every fp32 node whose output the int8 model quantizes: its output's SQNR (dB) against fp32 and the
    SQNR it loses (its worst input's minus its output's), the nodes that lose most first. A node whose
    output is not quantized has nothing measurable and is not listed."""
    onnx = _lazy.onnx()
    with quiet_ort():
        sqnr = streamed_sqnr(fp32_path, int8_path, reader(), threads, Path(workdir))
    release_freed_memory()  # both sessions

    best = max(sqnr.values(), default=0.0)
    rows = []
    for node in onnx.load(str(fp32_path)).graph.node:
        outs = [sqnr[o] for o in node.output if o in sqnr]
        if not outs:
            continue
        ins = [sqnr[i] for i in node.input if i in sqnr]
        rows.append(NodeError(node.name, node.op_type, round(min(outs), 2),
                              round((min(ins) if ins else best) - min(outs), 2)))
    rows.sort(key=lambda r: -r.lost_db)
    return rows


def streamed_sqnr(fp32_path: Path, int8_path: Path, reader, threads: int | None = None,
                  workdir: Path | None = None) -> dict[str, float]:
    """SQNR (dB) of every activation the int8 model quantizes, against fp32, over the samples ``reader``
    gives: the figure ``qdq_loss_debug.compute_activation_error`` computes (``xmodel_err``), one sample at a
    time. ORT's ``collect_activations`` holds every activation of every sample of both models before it
    compares them: 320 MB of the 579 MB quantize peaked at on MobileNetV2-1.0 at 96x96 (8 samples). Only two
    sums per activation are kept here (||fp32||^2 and ||fp32 - int8||^2), so memory is one sample's activations
    whatever the sample count.

    The tensors are ORT's (``modify_model_output_intermediate_tensors``' choice, matched by its
    ``create_activation_matching``), but each model is run with only the matched ones as its outputs, as they
    are: ORT's augmented model adds a flattened copy of every float tensor as an output, and a run holds all of
    them to its end, matched or not (the digits CNN at 560x560: 273 MB against 190 MB for the two runs)."""
    import numpy as np

    ort = _lazy.onnxruntime()
    create_activation_matching = _lazy.from_import("onnxruntime.quantization.qdq_loss_debug",
                                                   "create_activation_matching")
    workdir = Path(workdir if workdir is not None else Path(fp32_path).parent)
    fp32_model, fp32_names = _float_tensors(fp32_path)
    int8_model, int8_names = _float_tensors(int8_path)
    # ORT's own matching, on names: which int8 tensor (after its QDQ pair) answers which fp32 activation
    matched = create_activation_matching({n: n for n in int8_names}, {n: n for n in fp32_names})
    pairs = {act: (m["float"], m["post_qdq"]) for act, m in matched.items() if "float" in m}
    want_fp32 = sorted({f for f, _ in pairs.values()})
    want_int8 = sorted({q for _, q in pairs.values()})

    def session(model, names: list[str], name: str):
        path = _exposing(model, names, workdir / name)
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as collect_activations
        so.enable_cpu_mem_arena = so.enable_mem_pattern = False
        if threads:
            so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
        path.unlink(missing_ok=True)  # it holds every weight again: not kept beside the models
        return sess, [o.name for o in sess.get_outputs()]

    fp32, fp32_out = session(fp32_model, want_fp32, "fp32_debug.onnx")
    int8, int8_out = session(int8_model, want_int8, "int8_debug.onnx")
    del fp32_model, int8_model
    signal = dict.fromkeys(pairs, 0.0)
    noise = dict.fromkeys(pairs, 0.0)
    samples = 0
    for feed in iter(reader.get_next, None):
        f_out = dict(zip(want_fp32, fp32.run(fp32_out, feed)))
        q_out = dict(zip(want_int8, int8.run(int8_out, feed)))
        for act, (f, q) in pairs.items():
            s, n = _sums(f_out[f], q_out[q])
            signal[act] += s
            noise[act] += n
        samples += 1
        del f_out, q_out
    if not samples:
        raise RuntimeError("No data is collected while running augmented model!")
    eps = float(np.finfo("float").eps)
    return {act: 20 * math.log10(max(math.sqrt(signal[act]), eps) / max(math.sqrt(noise[act]), eps))
            for act in pairs}


_EXPOSED = "_edgetrain_exposed"  # a graph input given as an output goes through an Identity of this name


def _float_tensors(path: Path):
    """The model (shape-inferred) and the float tensors its nodes read and write: what ORT's
    ``modify_model_output_intermediate_tensors`` saves, chosen by the same code."""
    calibrater = _lazy.from_import("onnxruntime.quantization.calibrate", "CalibraterBase")(Path(path))
    names, value_infos = calibrater.select_tensors_to_calibrate(calibrater.model)
    return (calibrater.model, value_infos), names


def _exposing(model, names: list[str], out: Path) -> Path:
    """``model`` saved to ``out`` with ``names`` as its outputs, in that order, and nothing else: each tensor as
    the graph computes it (no copy), a graph input through an Identity."""
    onnx = _lazy.onnx()
    proto, value_infos = model
    inputs = {i.name for i in proto.graph.input}
    del proto.graph.output[:]
    for name in names:
        shown = name
        if name in inputs:
            shown = name + _EXPOSED
            proto.graph.node.append(onnx.helper.make_node("Identity", [name], [shown], name=shown))
        proto.graph.output.append(onnx.helper.make_tensor_value_info(
            shown, value_infos[name].type.tensor_type.elem_type, None))
    onnx.save(proto, str(out))
    return out


CHUNK = 1 << 18  # elements: the float64 sums run over 2 MB pieces of a tensor


def _sums(f, q) -> tuple[float, float]:
    """||f||^2 and ||f - q||^2 in float64, a piece at a time: a whole tensor's float64 copy and difference
    (4x its fp32 bytes, 6x while one replaced the last) set quantize's peak on a graph of few large tensors
    (the digits CNN at 500x500: 92 MB over the model's, ROUND5.md M3)."""
    import numpy as np

    f, q = f.reshape(-1), q.reshape(-1)
    signal = noise = 0.0
    for i in range(0, f.size, CHUNK):
        x = f[i:i + CHUNK].astype(np.float64)
        d = x - q[i:i + CHUNK]
        signal += float(np.dot(x, x))
        noise += float(np.dot(d, d))
    return signal, noise
