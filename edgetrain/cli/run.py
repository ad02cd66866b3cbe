"""`edgetrain run [RECIPE]`: run a recipe's steps into one run folder."""
from __future__ import annotations

import click

from ..errors import UsageError
from ..ops.run import run_recipe
from ..options import RunOptions
from ..recipes import read_recipe
from ..run_report import summary_rows
from .common import json_option, quiet, say, setup, write_json
from .options import declared_options, parse


@click.command()
@click.argument("recipe", required=False)
@declared_options(RunOptions)
@json_option
def run(recipe, json_path, **values):
    """Run RECIPE (a YAML path or a bundled name; default: the quickstart, or quickstart-device where mxnet is
    not installed) step by step.

    Steps (finetune, quantize, export, profile, report) run in order, each as its own edgetrain
    command, each taking the previous one's artifact. Exit code: the first failing step's (1 or 2),
    else 3 if a budget was not met, else 0.
    """
    opts = parse(RunOptions, values)
    if opts.resume and opts.output and opts.resume != opts.output:
        raise UsageError("-o and --resume name different run folders", "--resume", "give only --resume RUNDIR")
    setup(opts)
    loaded = read_recipe(recipe, opts.resume)
    show = (lambda m: None) if quiet(json_path) else (lambda m: click.echo(m, err=True))
    opts.carbon_grid()  # both --country and --grid-intensity: refused before the first step
    res = run_recipe(loaded, rundir=opts.resume or opts.output, device=opts.device, threads=opts.threads,
                     resume=bool(opts.resume), progress=show, carbon={"country": opts.country,
                                                                      "grid_intensity": opts.grid_intensity})
    write_json(json_path, res)
    if not quiet(json_path):
        _render_summary(json_path, res)
    if res.exit_code:
        click.get_current_context().exit(res.exit_code)


def _render_summary(json_path, res) -> None:
    say(json_path, "")
    say(json_path, f"recipe {res.recipe} for {res.device} -> {res.rundir}")
    for label, value in summary_rows(res.summary):
        say(json_path, f"  {label:<28} {value}")
    for text in res.warnings:
        say(json_path, f"  warning: {text}")
    if res.failed_step:
        step = next(s for s in res.steps if s.name == res.failed_step)
        say(json_path, f"step '{step.name}' {step.outcome}")
    if res.report:
        say(json_path, f"report: {res.report}")
