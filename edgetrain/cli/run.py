"""`edgetrain run [RECIPE]`: run a recipe's steps into one run folder."""
from __future__ import annotations

import click

from .common import json_option, quiet, say, setup, threads_option, write_json


@click.command()
@click.argument("recipe", required=False)
@click.option("-o", "--output", "rundir", metavar="RUNDIR",
              help="Run folder, new or empty (default: ./edgetrain-run-NAME, or NAME-2, -3... if taken).")
@click.option("--device", metavar="NAME", help="Run for this device instead of the recipe's.")
@click.option("--resume", "resume_dir", metavar="RUNDIR",
              help="Continue the run in RUNDIR, skipping the steps whose outputs are complete.")
@threads_option
@json_option
def run(recipe, rundir, device, resume_dir, threads, json_path):
    """Run RECIPE (a YAML path or a bundled name; default: the quickstart) step by step.

    Steps (finetune, quantize, export, profile, report) run in order, each as its own edgetrain
    command, each taking the previous one's artifact. Exit code: the first failing step's (1 or 2),
    else 3 if a budget was not met, else 0.
    """
    from ..pipeline import run_recipe
    from ..recipes import read_recipe

    if resume_dir and rundir and resume_dir != rundir:
        from ..errors import UsageError

        raise UsageError("-o and --resume name different run folders", "--resume", "give only --resume RUNDIR")
    setup(None, threads)
    loaded = read_recipe(recipe)
    show = (lambda m: None) if quiet(json_path) else (lambda m: click.echo(m, err=True))
    res = run_recipe(loaded, rundir=resume_dir or rundir, device=device, threads=threads,
                     resume=bool(resume_dir), progress=show)
    write_json(json_path, res)
    if not quiet(json_path):
        _render_summary(json_path, res)
    if res.exit_code:
        click.get_current_context().exit(res.exit_code)


def _render_summary(json_path, res) -> None:
    from ..run_report import summary_rows

    say(json_path, "")
    say(json_path, f"recipe {res.recipe} for {res.device} -> {res.rundir}")
    for label, value in summary_rows(res.summary):
        say(json_path, f"  {label:<28} {value}")
    if res.failed_step:
        step = next(s for s in res.steps if s.name == res.failed_step)
        say(json_path, f"step '{step.name}' {step.status} (exit {step.exit_code}): {step.error or 'see ' + step.log}")
    if res.report:
        say(json_path, f"report: {res.report}")
