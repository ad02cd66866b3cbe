"""`edgetrain profile MODEL`: latency, peak memory and energy, every figure labelled with its provenance."""
from __future__ import annotations

from pathlib import Path

import click

from ..fileio import check_command_outputs, check_output_path
from ..measure import text_summary
from ..ops.profile import profile as run
from ..options import ProfileOptions
from .common import finish, json_option, quiet, say, setup
from .options import declared_options, parse
from .render import ProgressLine


@click.command()
@click.argument("model")
@declared_options(ProfileOptions)
@json_option
def profile(model, json_path, **values):
    """Measure MODEL's latency (load, first inference, p50/p90/p99), peak memory and per-op time, each
    configuration in a fresh process; with --device, say whether it fits and what it costs in energy.

    Figures measured elsewhere than on the device are labelled estimated (with how they were derived);
    energy is measured by the board's sensors (Pi 5 PMIC, Jetson INA3221, hwmon) or --power-log where
    available, else modelled from the profile's cited power figures; RAPL is reported for this host.
    Exit 3 (report and JSON kept) when the peak memory does not fit the device or the energy per
    inference is over --budget-mj.
    """
    call(model, parse(ProfileOptions, values), json_path)


def call(model: str, opts: ProfileOptions, json_path: str | None) -> None:
    """The command's work with its options read (the click command; a recipe step, edgetrain.cli.step)."""
    check_command_outputs(model, opts, json_path)  # no output overwrites an input, before any work
    setup(opts)
    if json_path and json_path != "-":
        check_output_path(Path(json_path), "--json")
    res = run(model, opts, progress=ProgressLine(not quiet(json_path)))
    finish(json_path, res, lambda json_path, res: _render(json_path, res.to_dict(), opts.report))


def _render(json_path, d: dict, report_path) -> None:
    for line in text_summary(d):
        say(json_path, line)
    if report_path:
        say(json_path, f"report     {report_path}")
