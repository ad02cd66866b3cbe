"""`edgetrain quantize MODEL --calib DATA -o OUT`: int8 within an accuracy budget."""
from __future__ import annotations

import sys
import time

import click

from .common import device_option, json_option, quiet, say, setup, threads_option, write_json
from .options import input_shape_option, params_option


@click.command()
@click.argument("model")
@click.option("--calib", "calib", required=True, metavar="DATA", help="Data to calibrate activation ranges on.")
@click.option("-o", "--output", required=True, metavar="PATH",
              help="The int8 model: FILE.onnx (onnxruntime backend) or PREFIX (mxnet backend).")
@click.option("--val", "val", metavar="DATA", help="Labelled data to compare fp32 and int8 top-1 on.")
@click.option("--max-drop", default="1.0", show_default=True, metavar="PTS",
              help="Largest top-1 drop allowed, in percentage points (needs --val).")
@click.option("--method", type=click.Choice(["minmax", "entropy", "percentile"]), default="minmax",
              show_default=True, help="How activation ranges are calibrated.")
@click.option("--samples", type=click.IntRange(min=1), default=300, show_default=True,
              help="Calibration samples (fewer if --calib has fewer).")
@click.option("--per-channel/--per-tensor", default=True, show_default=True, help="Weight scales per output channel.")
@click.option("--max-fp32-nodes", type=click.IntRange(min=0), metavar="N",
              help="Most nodes the accuracy search may keep in fp32 (default: half of them; 0: all int8).")
@click.option("--backend", type=click.Choice(["onnxruntime", "mxnet"]), default="onnxruntime", show_default=True,
              help="onnxruntime: portable QDQ .onnx; mxnet: MXNet oneDNN int8 PREFIX (not exportable to ONNX).")
@device_option
@threads_option
@params_option
@input_shape_option
@json_option
def quantize(model, calib, output, val, max_drop, method, samples, per_channel, max_fp32_nodes, backend, device,
             threads, params, input_shape, json_path):
    """Quantize MODEL to int8, calibrated on DATA, and report accuracy, size and speed.

    MODEL is a Gluon MODEL or an fp32 .onnx made by `edgetrain export`. With --val, nodes that cost
    the most accuracy are kept in fp32 until the top-1 drop is within --max-drop; if no mix meets it,
    the best model is written and the exit code is 3.
    """
    from ..quantize import check_max_drop

    max_drop = check_max_drop(max_drop)
    profile, threads = setup(device, threads)
    from ..errors import BudgetExceeded
    from ..quantize import quantize as run

    res = run(model, calib, output, val=val, max_drop=max_drop, method=method, samples=samples,
              per_channel=per_channel, profile=profile, threads=threads, backend=backend, params=params,
              input_shape=input_shape, max_fp32_nodes=max_fp32_nodes, progress=_progress(json_path))
    write_json(json_path, res)
    render(res, json_path)
    if res.budget_met is False:
        a = res.accuracy
        raise BudgetExceeded(f"int8 top-1 drop {a['drop']:.2f} pts exceeds --max-drop {a['max_drop']:g}",
                             res.output, "best model kept; calibrate on more representative data, allow more "
                             "--max-fp32-nodes, or raise --max-drop")


def _progress(json_path):
    """A one-line bar on stderr when it is a terminal; nothing in --json - mode or when piped."""
    if quiet(json_path) or not sys.stderr.isatty():
        return None
    started = {}

    def show(stage, done, total):
        t0 = started.setdefault(stage, time.monotonic())
        width = 30
        fill = int(width * done / max(total, 1))
        eta = (time.monotonic() - t0) / max(done, 1) * (total - done)
        click.echo(f"\r{stage:<13} [{'#' * fill}{'.' * (width - fill)}] {done}/{total}  ETA {eta:4.0f}s",
                   err=True, nl=False)
        if done >= total:
            click.echo("", err=True)

    return show


def _size(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def render(res, json_path) -> None:
    if json_path == "-":
        for w in res.warnings:
            click.echo(f"warning: {w}", err=True)
        return
    s = res.scheme
    say(json_path, f"quantized  {res.model} -> {res.output} ({res.backend})")
    say(json_path, f"scheme     {s['name']} for {s['target']}")
    say(json_path, f"           why: {s['reason']}")
    c = res.calibration
    say(json_path, f"calibrated {c['method']} on {c['samples']} samples of {c['source']}")
    a = res.accuracy
    if a.get("checked"):
        say(json_path, f"accuracy   fp32 {a['fp32_top1']:.2f}%  int8 {a['int8_top1']:.2f}%  drop {a['drop']:+.2f} pts "
                       f"(budget {a['max_drop']:g}) on {a['samples']} samples of {a['source']}")
        for st in res.steps:
            what = "all quantized nodes int8" if st.step == 0 else f"+ {', '.join(st.added)} in fp32"
            say(json_path, f"  step {st.step:<2}  {what}: top-1 {st.int8_top1:.2f}% (drop {st.drop:+.2f})")
    else:
        say(json_path, "accuracy   not checked (no --val)")
    say(json_path, f"fp32 nodes {', '.join(res.nodes_kept_fp32) if res.nodes_kept_fp32 else 'none'}")
    z = res.size
    say(json_path, f"size       {_size(z['fp32_bytes'])} -> {_size(z['int8_bytes'])} ({z['ratio']:.2f}x smaller)")
    if res.latency:
        lt = res.latency
        say(json_path, f"latency    p50 fp32 {lt['fp32_p50_ms']:.3f} ms, int8 {lt['int8_p50_ms']:.3f} ms "
                       f"({lt['speedup']:.2f}x) in {lt['runtime']}, batch {lt['batch']}, {lt['threads']} thread(s)")
        say(json_path, f"           measured on {lt['measured_on']}")
    if not res.onnx_exportable:
        say(json_path, "onnx       this model cannot be exported to ONNX (MXNet's quantized graphs have no ONNX "
                       "translation); use --backend onnxruntime for a portable int8 model")
    for w in res.warnings:
        say(json_path, f"warning    {w}")
    for n in res.notes:
        say(json_path, f"note       {n}")
