"""`edgetrain export MODEL -o model.onnx`: Gluon to an ONNX file proven equal to it in ONNX Runtime."""
from __future__ import annotations

from collections import Counter

import click

from .common import device_option, json_option, progress_lines, say, setup, threads_option, write_json
from .options import input_shape_option, params_option


@click.command()
@click.argument("model")
@click.option("-o", "--output", required=True, type=click.Path(), metavar="FILE",
              help="Where to write the ONNX model (written atomically; kept even if validation fails).")
@input_shape_option
@click.option("--opset", type=int, default=13, show_default=True, metavar="N",
              help="ONNX opset to translate for (12 or 13, the opsets mxnet 1.9.1's exporter knows).")
@click.option("--dynamic-batch", is_flag=True, help="Variable batch size (validated at batch 1 and 3).")
@click.option("--atol", type=float, metavar="X", help="Absolute tolerance (default 1e-4; 1e-2 with --fp16).")
@click.option("--rtol", type=float, metavar="X", help="Relative tolerance (default 1e-3; 1e-2 with --fp16).")
@click.option("--data", "data_ref", metavar="DATA", help="Also validate on real samples from DATA.")
@params_option
@click.option("--fp16", is_flag=True, help="fp16 weights and compute (fp32 inputs/outputs), for GPU targets.")
@device_option
@click.option("--battery-wh", type=float, metavar="WH", help="With --device: battery capacity for the energy budget.")
@click.option("--rate", metavar="N/h", help="With --device: inferences per hour for the daily energy budget.")
@click.option("--budget-mj", type=float, metavar="MJ", help="With --device: energy budget per inference (exit 3 if over).")
@threads_option
@json_option
def export(model, output, input_shape, opset, dynamic_batch, atol, rtol, data_ref, params, fp16, device, battery_wh,
           rate, budget_mj, threads, json_path):
    """Export MODEL to ONNX and validate it: Gluon (MXNet) and ONNX Runtime run the same inputs and every
    output is compared (max/mean/median abs and rel error). Exit 3 if an output is out of tolerance (the
    file is still written). With --device it ends with the energy-budget report of `edgetrain profile`
    for the exported model (exit 3 if over --budget-mj or the peak memory does not fit)."""
    profile, threads = setup(device, threads)
    from ..export import export as run

    progress = progress_lines(json_path)
    res = run(model, output, params=params, input_shape=input_shape, opset=opset, dynamic_batch=dynamic_batch,
              atol=atol, rtol=rtol, data=data_ref, device=profile, fp16=fp16, battery_wh=battery_wh, rate=rate,
              budget_mj=budget_mj, progress=progress)
    write_json(json_path, res)
    _render(json_path, res)
    if not res.passed:
        raise _validation_failed(res)


def _validation_failed(res):
    from ..errors import BudgetExceeded

    if res.comparison.passed:  # the export is right; the device budget is not met
        return BudgetExceeded(res.failed_checks[0], res.device, "the file is kept; see the energy report above")

    worst = res.comparison.failed[0]
    keep = "the file is kept for inspection"
    if worst.error:  # NaN, a wrong shape: no tolerance would pass
        return BudgetExceeded(f"ONNX output '{worst.name}' does not match the Gluon model: {worst.error}", res.path,
                              f"{keep}; report this with the model")
    cmp = res.comparison
    return BudgetExceeded(f"ONNX output '{worst.name}' differs from the Gluon model beyond tolerance (max abs "
                          f"{worst.max_abs:.3g}, max rel {worst.max_rel:.3g}; atol {cmp.atol:g}, rtol {cmp.rtol:g})",
                          res.path, f"{keep}; it would pass with --atol {worst.atol_needed:.3g}")


def _render(json_path, res) -> None:
    if json_path == "-":
        return
    shape = lambda s: "x".join(str(d) for d in s)  # noqa: E731
    say(json_path, f"wrote      {res.path} ({res.size_bytes:,} bytes, opset {res.opset}, {res.precision}"
                   + (", dynamic batch" if res.dynamic_batch else "") + ")")
    for i in res.inputs:
        say(json_path, f"input      {i['name']} {shape(i['shape'])} {i['dtype']}")
    for o in res.outputs:
        say(json_path, f"output     {o['name']} {shape(o['shape'])} {o['dtype']}")
    say(json_path, f"ops        {sum(res.ops.values())} nodes: "
                   + ", ".join(f"{k} {v}" for k, v in sorted(res.ops.items(), key=lambda kv: -kv[1])))
    kinds = Counter(("random" if b["source"].startswith("random") else b["source"], b["batch"])
                    for b in res.validated_with)
    batches = ", ".join(f"{n} {kind} x{size}" for (kind, size), n in kinds.items())
    say(json_path, f"validated  Gluon (MXNet) vs ONNX Runtime on {len(res.validated_with)} batches ({batches}), "
                   f"atol {res.comparison.atol:g}, rtol {res.comparison.rtol:g}")
    for line in res.comparison.summaries():
        say(json_path, f"  {line}")
    if res.device:
        say(json_path, f"device     {res.device}, {res.threads} thread(s)")
    if res.energy:
        _render_energy(json_path, res.energy)
    for note in res.notes:
        say(json_path, f"note       {note}")
    say(json_path, f"result     {'PASS' if res.passed else 'FAIL'}")


def _render_energy(json_path, e) -> None:
    lat, rep = e.get("latency") or {}, e.get("report") or {}
    if lat.get("mean_ms") is not None:
        say(json_path, f"latency    on {rep.get('device', '')}: mean {lat['mean_ms']:.3g} ms, p50 {lat['p50_ms']:.3g} ms "
                       f"[{lat['provenance']}] ({e['runs']} runs at {e['threads']} thread(s))")
    else:
        say(json_path, f"latency    {lat.get('note', 'no device latency')}")
    from ..report import energy_lines

    for line in energy_lines(rep):
        say(json_path, line)
