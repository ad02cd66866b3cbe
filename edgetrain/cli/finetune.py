"""`edgetrain finetune MODEL --data DATA -o OUTDIR`: train on the device within its RAM and thread cap."""
from __future__ import annotations

import click

from ..ops.finetune import finetune as run
from ..options import FinetuneOptions
from .common import command, json_option, say
from .options import declared_options, parse


@click.command()
@click.argument("model")
@declared_options(FinetuneOptions)
@json_option
def finetune(model, json_path, **values):
    """Fine-tune MODEL on DATA on this device, within a memory budget and thread cap; resumable.

    Writes OUTDIR/model (a PREFIX the other commands take, with class names), OUTDIR/metrics.json and
    OUTDIR/checkpoint.npz. Exit 3 when the run's peak RSS went over the budget (outputs are kept).
    """
    try:
        call(model, parse(FinetuneOptions, values), json_path)
    except KeyboardInterrupt:  # Ctrl-C before training began (during training it checkpoints instead)
        raise click.exceptions.Abort() from None


def _summary(json_path, res) -> None:
    for note in res.notes[res.notes_before_training:]:  # the earlier ones were progress lines, just above
        say(json_path, f"note      {note}")
    plan = res.plan
    say(json_path, f"model     {res.model}  ({len(res.classes)} classes, trained {res.train_layers}: "
                   f"{res.trained_parameters:,} of {res.trained_parameters + res.frozen_parameters:,} parameters)")
    cache = {"memory": "features cached in memory", "disk": "features cached on disk",
             "none": "no frozen part"}[plan["cache"]]
    say(json_path, f"plan      micro-batch {plan['micro_batch']}, feature batch {plan['feature_batch']}, {cache} "
                   f"({plan['method']} estimate {plan['estimate_mb']:.0f} MB)")
    if res.final_accuracy is not None:
        say(json_path, f"accuracy  {res.final_accuracy:.3f} top-1 on {res.accuracy_on} samples")
    say(json_path, f"time      {res.seconds:.1f}s  ({res.feature_seconds:.1f}s feature pass, "
                   f"{res.samples_per_s:.0f} samples/s, {res.threads} thread{'s' if res.threads != 1 else ''})")
    budget = f" of {res.budget_mb:.0f} MB budget" if res.budget_mb else " (no budget)"
    peak = f"{res.peak_rss_mb:.0f} MB" if res.peak_rss_mb is not None else "unknown (no /proc here)"
    say(json_path, f"memory    peak RSS {peak}{budget}")
    if res.energy:
        for line in run_energy_lines(res.energy, res.joules_per_epoch, res.joules_per_sample):
            say(json_path, line)
    else:
        say(json_path, "energy    pass --device NAME for a modelled energy figure")


def run_energy_lines(record, per_epoch: float | None = None, per_sample: float | None = None) -> list[str]:
    """A fine-tune's energy record as the terminal shows it: the device's figure (measured on it, or modelled from
    its speed and power), the one-time host work left out of it, and a measurement of this machine when it is
    not the device ("host, measured"), beside the device's figure, never in its place."""
    from ..energy import EnergyRecord, carbon_text

    e = EnergyRecord.of(record, "J")
    per = ""
    if per_epoch is not None and per_sample is not None:
        per = f"; {per_epoch:.3g} J/epoch, {per_sample * 1000:.3g} mJ/sample"
    lines = [f"energy    {e.text()}{per}", f"          {e.source}"]
    once = e.get("one_time")
    if once:
        lines.append(f"          left out: {once['seconds']:.2f} s of one-time host work ({once['what']})")
    here = EnergyRecord.of(e.get("measured_here"), "J")
    if here is not None:
        lines.append(f"energy    {here.text()} for the same run on this machine, which is not the device")
    if e.get("carbon"):
        lines.append(f"carbon    {carbon_text(e['carbon'])} for the run")
    return lines


call = command(run, _summary)
