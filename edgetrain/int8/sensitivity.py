"""Which quantized nodes cost the most accuracy: per-node error between fp32 and int8 activations.

Uses ONNX Runtime's QDQ debugging tools (onnxruntime.quantization.qdq_loss_debug): both models are run
on the same samples with every activation exposed, and each activation's signal-to-quantization-noise
ratio (SQNR, dB; higher is better) is measured against the fp32 model. Errors accumulate down the
graph, so a node is charged with the SQNR it *loses*: that of its worst input minus that of its output.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .. import _lazy
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
               workdir: Path) -> list[tuple[str, float]]:
    """``candidates`` (node names of the fp32 model) sorted by the SQNR they lose, worst first.

    ``reader()`` returns a fresh CalibrationDataReader over the samples to compare on.
    """
    rows = {r.node: r for r in node_errors(fp32_path, int8_path, reader, workdir)}
    costs = [(name, rows[name].lost_db if name in rows else 0.0) for name in candidates]
    costs.sort(key=lambda c: -c[1])
    return costs


def node_errors(fp32_path: Path, int8_path: Path, reader: Callable[[], object], workdir: Path) -> list[NodeError]:
    """Every fp32 node whose output the int8 model quantizes: its output's SQNR (dB) against fp32 and the
    SQNR it loses (its worst input's minus its output's), the nodes that lose most first. A node whose
    output is not quantized has nothing measurable and is not listed."""
    onnx = _lazy.onnx()
    (collect_activations, compute_activation_error, create_activation_matching,
     modify_model_output_intermediate_tensors) = _lazy.from_import(
        "onnxruntime.quantization.qdq_loss_debug", "collect_activations", "compute_activation_error",
        "create_activation_matching", "modify_model_output_intermediate_tensors")

    workdir = Path(workdir)
    fp32_aug, int8_aug = workdir / "fp32_debug.onnx", workdir / "int8_debug.onnx"
    with quiet_ort():
        modify_model_output_intermediate_tensors(str(fp32_path), str(fp32_aug))
        modify_model_output_intermediate_tensors(str(int8_path), str(int8_aug))
        float_acts = collect_activations(str(fp32_aug), reader())
        int8_acts = collect_activations(str(int8_aug), reader())
    matched = {name: m for name, m in create_activation_matching(int8_acts, float_acts).items() if "float" in m}
    sqnr = {name: float(e["xmodel_err"]) for name, e in compute_activation_error(matched).items()}

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
