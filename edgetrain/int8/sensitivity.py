"""Which quantized nodes cost the most accuracy: per-node error between fp32 and int8 activations.

Uses ONNX Runtime's QDQ debugging tools (onnxruntime.quantization.qdq_loss_debug): both models are run
on the same samples with every activation exposed (one sample at a time: streamed_sqnr), and each
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
    modify_model_output_intermediate_tensors = _lazy.from_import(
        "onnxruntime.quantization.qdq_loss_debug", "modify_model_output_intermediate_tensors")

    workdir = Path(workdir)
    fp32_aug, int8_aug = workdir / "fp32_debug.onnx", workdir / "int8_debug.onnx"
    with quiet_ort():
        modify_model_output_intermediate_tensors(str(fp32_path), str(fp32_aug))
        modify_model_output_intermediate_tensors(str(int8_path), str(int8_aug))
        sqnr = streamed_sqnr(fp32_aug, int8_aug, reader(), threads)
    for path in (fp32_aug, int8_aug):  # each holds every weight again: not kept beside the models
        path.unlink(missing_ok=True)
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


def streamed_sqnr(fp32_aug: Path, int8_aug: Path, reader, threads: int | None = None) -> dict[str, float]:
    """SQNR (dB) of every activation the int8 model quantizes, against fp32, over the samples ``reader``
    gives: the figure ``qdq_loss_debug.compute_activation_error`` computes (``xmodel_err``), one sample at a
    time. ORT's ``collect_activations`` holds every activation of every sample of both models before it
    compares them: 320 MB of the 579 MB quantize peaked at on MobileNetV2-1.0 at 96x96 (8 samples). Only two
    sums per activation are kept here (||fp32||^2 and ||fp32 - int8||^2), so memory is one sample's activations
    whatever the sample count. ``fp32_aug``/``int8_aug``: the models as ``modify_model_output_intermediate_tensors``
    wrote them (every tensor an output)."""
    import numpy as np

    ort = _lazy.onnxruntime()
    (create_activation_matching, postfix) = _lazy.from_import(
        "onnxruntime.quantization.qdq_loss_debug", "create_activation_matching", "_TENSOR_SAVE_POSTFIX")

    def session(path: Path):
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # as collect_activations
        so.enable_cpu_mem_arena = so.enable_mem_pattern = False
        if threads:
            so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        sess = ort.InferenceSession(str(path), sess_options=so, providers=["CPUExecutionProvider"])
        saved = [o.name[:-len(postfix)] for o in sess.get_outputs() if o.name.endswith(postfix)]
        return sess, saved

    fp32, fp32_names = session(fp32_aug)
    int8, int8_names = session(int8_aug)
    # ORT's own matching, on names: which int8 tensor (after its QDQ pair) answers which fp32 activation
    matched = create_activation_matching({n: n for n in int8_names}, {n: n for n in fp32_names})
    pairs = {act: (m["float"], m["post_qdq"]) for act, m in matched.items() if "float" in m}
    want_fp32 = sorted({f for f, _ in pairs.values()})
    want_int8 = sorted({q for _, q in pairs.values()})
    signal = dict.fromkeys(pairs, 0.0)
    noise = dict.fromkeys(pairs, 0.0)
    samples = 0
    for feed in iter(reader.get_next, None):
        f_out = dict(zip(want_fp32, fp32.run([n + postfix for n in want_fp32], feed)))
        q_out = dict(zip(want_int8, int8.run([n + postfix for n in want_int8], feed)))
        for act, (f, q) in pairs.items():
            x = f_out[f].astype(np.float64, copy=False)
            signal[act] += float(np.dot(x, x))
            d = x - q_out[q]
            noise[act] += float(np.dot(d, d))
        samples += 1
        del f_out, q_out
    if not samples:
        raise RuntimeError("No data is collected while running augmented model!")
    eps = float(np.finfo("float").eps)
    return {act: 20 * math.log10(max(math.sqrt(signal[act]), eps) / max(math.sqrt(noise[act]), eps))
            for act in pairs}
