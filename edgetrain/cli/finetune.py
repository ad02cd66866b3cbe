"""`edgetrain finetune MODEL --data DATA -o OUTDIR`: train on the device within its RAM and thread cap."""
from __future__ import annotations

import sys

import click

from .common import device_option, json_option, quiet, say, setup, threads_option, write_json
from .options import input_shape_option, params_option


class _Progress:
    """One rewritten status line on a terminal (stderr); a line per epoch otherwise; nothing with --json -."""

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.live = enabled and sys.stderr.isatty()
        self.width = 0

    def __call__(self, info: dict) -> None:
        if not self.enabled:
            return
        phase = info["phase"]
        mem = f"RSS {info['rss_mb']:.0f} MB" if info.get("rss_mb") else ""
        if info.get("budget_mb"):
            mem += f"/{info['budget_mb']:.0f}"
        eta = f"ETA {info['eta_s']:.0f}s" if info.get("eta_s") is not None else ""
        if phase == "epoch":
            val = f"  val acc {info['val_accuracy']:.3f}" if info.get("val_accuracy") is not None else ""
            self._line(f"epoch {info['epoch']}: loss {info['loss']:.4f}  acc {info['train_accuracy']:.3f}{val}  "
                       f"{info['samples_per_s']:.0f} samples/s  {info['seconds']:.1f}s  {mem}", final=True)
            return
        if not self.live:
            return
        if phase == "features":
            text = f"features {info['done']}/{info['total']}  {info['samples_per_s']:.0f} samples/s  {mem}  {eta}"
        else:
            text = (f"epoch {info['epoch']}/{info['epochs']} step {info['step']}/{info['steps']}  "
                    f"loss {info['loss']:.4f} acc {info['acc']:.3f}  {info['samples_per_s']:.0f} samples/s  "
                    f"{mem}  {eta}")
        self._line(text)

    def _line(self, text: str, final: bool = False) -> None:
        if self.live:
            sys.stderr.write("\r" + text.ljust(self.width))
            self.width = len(text)
            if final:
                sys.stderr.write("\n")
                self.width = 0
        elif final:
            sys.stderr.write(text + "\n")
        sys.stderr.flush()


@click.command()
@click.argument("model")
@click.option("--data", "data_ref", required=True, metavar="DATA", help="Training data (classes come from it).")
@click.option("-o", "--out", "outdir", required=True, metavar="OUTDIR",
              help="Folder for the model (OUTDIR/model), metrics.json and the checkpoint.")
@click.option("--val", "val_ref", metavar="DATA", help="Held-out data to report accuracy on.")
@click.option("--val-split", type=click.FloatRange(0, 1, max_open=True), metavar="F",
              help="Hold out this fraction of DATA (stratified) for accuracy; default 0.2 unless --val.")
@click.option("--epochs", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--batch-size", type=click.IntRange(min=1), default=32, show_default=True,
              help="Effective batch size (micro-batches accumulate up to it).")
@click.option("--lr", type=float, metavar="LR",
              help="Learning rate (default: adam 0.02 / sgd 0.2 for the head alone, else 0.003 / 0.05).")
@click.option("--optimizer", type=click.Choice(["sgd", "adam"]), default="adam", show_default=True)
@click.option("--train-layers", default="head", show_default=True, metavar="head|last:N|all",
              help="What trains: the output layer, the last N trainable layers/blocks, or everything.")
@click.option("--memory-budget", metavar="SIZE", help="Peak RSS bound for the whole process, e.g. 512MB "
              "(default: the device's).")
@click.option("--resume", is_flag=True, help="Continue the run checkpointed in OUTDIR.")
@click.option("--seed", type=int, default=0, show_default=True)
@params_option
@input_shape_option
@device_option
@threads_option
@json_option
def finetune(model, data_ref, outdir, val_ref, val_split, epochs, batch_size, lr, optimizer, train_layers,
             memory_budget, resume, seed, params, input_shape, device, threads, json_path):
    """Fine-tune MODEL on DATA on this device, within a memory budget and thread cap; resumable.

    Writes OUTDIR/model (a PREFIX the other commands take, with class names), OUTDIR/metrics.json and
    OUTDIR/checkpoint.npz. Exit 3 when the run's peak RSS went over the budget (outputs are kept).
    """
    profile, threads = setup(device, threads)
    from ..errors import BudgetExceeded
    from ..finetune import finetune as run

    try:
        res = run(model, data_ref, outdir, val=val_ref, val_split=val_split, epochs=epochs, batch_size=batch_size,
                  lr=lr, optimizer=optimizer, train_layers=train_layers, memory_budget=memory_budget, seed=seed,
                  resume=resume, params=params, input_shape=input_shape, threads=threads, profile=profile,
                  progress=_Progress(not quiet(json_path)))
    except KeyboardInterrupt:  # Ctrl-C before training began (during training it checkpoints instead)
        raise click.exceptions.Abort() from None
    write_json(json_path, res)
    if not quiet(json_path):
        _summary(json_path, res)
    if res.within_budget is False:
        raise BudgetExceeded(f"peak RSS {res.peak_rss_mb:.0f} MB went over the memory budget "
                             f"{res.budget_mb:.0f} MB", "finetune", "lower --batch-size or train fewer layers; "
                             "the model and metrics are kept")


def _summary(json_path, res) -> None:
    for note in res.notes:
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
    say(json_path, f"memory    peak RSS {res.peak_rss_mb:.0f} MB{budget}")
    if res.energy:
        e = res.energy
        say(json_path, f"energy    {e['joules']:.1f} J {e['provenance']} ({e['source']}); {res.joules_per_epoch:.2f} J/epoch, "
                       f"{res.joules_per_sample * 1000:.2f} mJ/sample")
    else:
        say(json_path, "energy    pass --device NAME for a modelled energy figure")
