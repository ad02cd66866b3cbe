"""`edgetrain quantize MODEL --calib DATA -o OUT`: int8 within an accuracy budget."""
from __future__ import annotations

import click

from ..ops.quantize import quantize as run
from ..options import QuantizeOptions
from .common import command, json_option, say
from .options import declared_options, parse


@click.command()
@click.argument("model")
@declared_options(QuantizeOptions)
@json_option
def quantize(model, json_path, **values):
    """Quantize MODEL to int8, calibrated on DATA, and report accuracy, size and speed.

    MODEL is a Gluon MODEL or an fp32 .onnx made by `edgetrain export`. With --val, nodes that cost
    the most accuracy are kept in fp32 until the top-1 drop is within --max-drop; if no mix meets it,
    the best model is written and the exit code is 3.
    """
    call(model, parse(QuantizeOptions, values), json_path)


def render(json_path, res) -> None:
    s = res.scheme
    say(json_path, f"quantized  {res.model} -> {res.output} ({res.backend})")
    say(json_path, f"scheme     {s.name} for {s.target}")
    say(json_path, f"           why: {s.reason}")
    for line in candidate_table(s.candidates):
        say(json_path, line)
    c = res.calibration
    say(json_path, f"calibrated {c.method} on {c.samples} samples of {c.source}")
    a = res.accuracy
    if a.checked:
        say(json_path, f"accuracy   fp32 {a.fp32_top1:.2f}%  int8 {a.int8_top1:.2f}%  drop {a.drop:+.2f} pts "
                       f"(budget {a.max_drop:g}) on {a.samples} samples of {a.source}")
        for st in res.steps:
            what = "all quantized nodes int8" if st.step == 0 else f"+ {', '.join(st.added)} in fp32"
            say(json_path, f"  step {st.step:<2}  {what}: top-1 {st.int8_top1:.2f}% (drop {st.drop:+.2f})")
    else:
        say(json_path, "accuracy   not checked (no --val)")
    say(json_path, f"fp32 nodes {', '.join(res.nodes_kept_fp32) if res.nodes_kept_fp32 else 'none'}")
    for line in node_error_table(res.node_errors):
        say(json_path, line)
    z = res.size
    say(json_path, f"size       fp32 {z.fp32_bytes:,} B -> int8 {z.int8_bytes:,} B ({z.change})")
    if res.latency:
        lt = res.latency
        fastest = ", fp32 the fastest of all candidates" if res.fp32_fastest else ""
        say(json_path, f"latency    p50 fp32 {lt.fp32_p50_ms:.3f} ms, int8 {lt.int8_p50_ms:.3f} ms "
                       f"(int8 {lt.change}{fastest}) in {lt.runtime}, batch {lt.batch}, {lt.threads} thread(s)")
        say(json_path, f"           measured on {lt.measured_on}")
    if not res.onnx_exportable:
        say(json_path, "onnx       this model cannot be exported to ONNX (MXNet's quantized graphs have no ONNX "
                       "translation); use --backend onnxruntime for a portable int8 model")
    for w in res.warnings:
        say(json_path, f"warning    {w}")
    for n in res.notes:
        say(json_path, f"note       {n}")


call = command(run, render)


def candidate_table(candidates) -> list[str]:
    """The measured schemes: p50 latency, size, accuracy; * marks the one written."""
    if not candidates:
        return []
    lines = ["candidates (batch 1, each timed in fresh processes; * the one written; fp32 is the reference, "
             "never written)",
             f"             {'candidate':<38} {'p50 ms':>8} {'bytes':>11} {'top-1':>7} {'drop':>6}"]
    for c in candidates:
        mark = "*" if c.chosen else " "
        name = c.name + (" [rule]" if c.rule else "")
        if c.error:
            lines.append(f"           {mark} {name:<38} {c.error}")
            continue
        top1 = f"{c.top1:.2f}" if c.top1 is not None else "-"
        drop = f"{c.drop:+.2f}" if c.drop is not None else "-"
        over = "  over --max-drop" if c.within_budget is False else ""
        if c.excluded and c.kind != "fp32":
            over += f"  not written: {c.excluded}"
        p50 = f"{c.p50_ms:.3f}" if c.p50_ms is not None else "-"
        size = f"{c.size_bytes:,}" if c.size_bytes is not None else "-"
        lines.append(f"           {mark} {name:<38} {p50:>8} {size:>11} {top1:>7} {drop:>6}{over}")
    if any(c.kind == "dynamic" and c.top1 is not None for c in candidates):
        lines.append(DYNAMIC_BATCH_NOTE)
    return lines


# Dynamic int8 quantizes each activation with the range of the whole batch it arrives in (ORT's
# DynamicQuantizeLinear): one input's scores, and so a top-1 over many, depend on its batch-mates.
DYNAMIC_BATCH_NOTE = ("             dynamic int8 scales activations by each batch's own range: its top-1 (fixed batches "
                      "in the data's order) changes with which inputs share a batch, as predict's does with --batch")


def node_error_table(rows) -> list[str]:
    """Per-node SQNR of the all-int8 model against fp32: why a node was kept in fp32."""
    if not rows:
        return []
    lines = ["node SQNR  all-int8 vs fp32, the nodes that lose most (dB; higher SQNR is better)"]
    for r in rows:
        kept = "  kept in fp32" if r.kept_fp32 else ""
        lines.append(f"           {r.node[:44]:<44} {r.op[:18]:<18} SQNR {r.output_sqnr_db:6.1f}  "
                     f"lost {r.lost_db:5.1f}{kept}")
    return lines
