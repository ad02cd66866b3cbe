"""`edgetrain tune MODEL --data DATA --grid NAME=V1,V2 -o OUTDIR`: the best fine-tune configuration, found on
the device within its budgets."""
from __future__ import annotations

import click

from ..ops.tune import tune as run
from ..options import TuneOptions
from .common import command, json_option, say
from .options import declared_options, parse

_GRID = TuneOptions.fields["grid"]


@click.command()
@click.argument("model")
@click.option(_GRID.flag, "grid", multiple=True, default=_GRID.default, metavar=_GRID.metavar, help=_GRID.help)
@declared_options(TuneOptions, skip=("grid",))
@json_option
def tune(model, json_path, grid, **values):
    """Search finetune's options for MODEL (an ONNX file) on DATA, on this device; keep the best.

    Successive halving over epochs by default: every point of the grid trains briefly, the best third goes on,
    the best one to --epochs. Writes OUTDIR/model.onnx (the chosen trial's model, its configuration in the
    metadata), OUTDIR/trials.csv, OUTDIR/tune.json and OUTDIR/report.html; --resume continues after a stop or a
    power cut. Exit 3 when the run went over its memory or time budget (outputs are kept).
    """
    try:
        call(model, parse(TuneOptions, {**values, "grid": ";".join(grid) or None}), json_path)
    except KeyboardInterrupt:
        raise click.exceptions.Abort() from None


def _summary(json_path, res) -> None:
    for note in res.notes:
        say(json_path, f"note      {note}")
    c = res.chosen
    say(json_path, f"chosen    trial {c['trial']}: {c['label']}  ({100 * (c['val_accuracy'] or 0):.1f}% held-out top-1 "
                   f"at {c['epochs_run']} epochs; lr {c['lr']})")
    say(json_path, f"model     {res.model}")
    say(json_path, f"search    {res.strategy} over {res.tried} of {res.points} points: {res.epochs_run} epochs trained "
                   f"(the full grid: {res.grid_epochs})" + ("; stopped by the time budget" if res.stopped_by_time else ""))
    say(json_path, f"time      {res.seconds:.1f}s  ({res.trial_seconds:.1f}s in trials, tuner overhead "
                   f"{res.overhead_pct:.2f}%)")
    budget = f" of {res.budget_mb:.0f} MB budget" if res.budget_mb else " (no budget)"
    peak = f"{res.peak_rss_mb:.0f} MB" if res.peak_rss_mb is not None else "unknown"
    say(json_path, f"memory    peak RSS {peak}{budget}")
    say(json_path, f"trials    {res.csv}")
    say(json_path, f"report    {res.report}")


call = command(run, _summary)
