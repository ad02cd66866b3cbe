"""`edgetrain export MODEL -o model.onnx`: Gluon to an ONNX file proven equal to it in ONNX Runtime."""
from __future__ import annotations

from collections import Counter

import click

from ..measure import energy_lines
from ..ops.export import export as run
from ..options import ExportOptions
from .common import command, json_option, say
from .options import declared_options, parse


@click.command()
@click.argument("model")
@declared_options(ExportOptions)
@json_option
def export(model, json_path, **values):
    """Export MODEL to ONNX and validate it: Gluon (MXNet) and ONNX Runtime run the same inputs and every
    output is compared (max/mean/median abs and rel error). Exit 3 if an output is out of tolerance (the
    file is still written). With --device it ends with the energy-budget report of `edgetrain profile`
    for the exported model (exit 3 if over --budget-mj or the peak memory does not fit)."""
    call(model, parse(ExportOptions, values), json_path)


def _render(json_path, res) -> None:
    shape = lambda s: "x".join(str(d) for d in s)  # noqa: E731
    say(json_path, f"wrote      {res.path} ({res.size_bytes:,} bytes, opset {res.opset}, {res.precision}"
                   + (", dynamic batch" if res.dynamic_batch else "") + ")")
    for i in res.inputs:
        say(json_path, f"input      {i.name} {shape(i.shape)} {i.dtype}")
    for o in res.outputs:
        say(json_path, f"output     {o.name} {shape(o.shape)} {o.dtype}")
    say(json_path, f"ops        {sum(res.ops.values())} nodes: "
                   + ", ".join(f"{k} {v}" for k, v in sorted(res.ops.items(), key=lambda kv: -kv[1])))
    kinds = Counter(("random" if b.source.startswith("random") else b.source, b.batch)
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


call = command(run, _render)


def _render_energy(json_path, e) -> None:
    lat, rep = e.get("latency") or {}, e.get("report") or {}
    if lat.get("mean_ms") is not None:
        say(json_path, f"latency    on {rep.get('device', '')}: mean {lat['mean_ms']:.3g} ms, p50 {lat['p50_ms']:.3g} ms "
                       f"[{lat['provenance']}] ({e['runs']} runs at {e['threads']} thread(s))")
    else:
        say(json_path, f"latency    {lat.get('note', 'no device latency')}")

    for line in energy_lines(rep):
        say(json_path, line)
