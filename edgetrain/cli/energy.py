"""`edgetrain energy calibrate METER_LOG`: fit the board's own power sensor to a meter logging at the same time."""
from __future__ import annotations

import click

from ..options import EnergyCalibrateOptions
from .common import json_option, quiet, say, setup, write_json
from .options import declared_options, parse


@click.group("energy")
def energy():
    """The board's power sensor: fit it to an external meter, so later energy figures read through the fit."""


@energy.command()
@click.argument("meter_log", metavar="METER_LOG")
@declared_options(EnergyCalibrateOptions)
@json_option
def calibrate(meter_log, json_path, **values):
    """Sample the board's sensor (Pi 5 PMIC, Jetson INA3221, hwmon) for --seconds, alternating idle and busy,
    while a meter at the board's input logs to METER_LOG (started before, stopped after; the formats --power-log
    reads), and fit meter W = gain x sensor W + offset W by least squares over the overlapping readings.

    The fit is written where later runs find it (-o to write it elsewhere; EDGETRAIN_POWER_CALIBRATION=FILE
    reads another, empty reads none): every energy figure measured by that sensor afterwards is read through it
    and says so ("calibrated" beside the instrument, and `calibration` in the JSON), with the fit's error in its
    uncertainty. Exit 2 when the log cannot be read, does not overlap the sampling, or has too few readings.
    """
    from ..energy import calibrate as fit_and_write
    from ..fileio import check_outputs

    opts = parse(EnergyCalibrateOptions, values)
    check_outputs({"METER_LOG": meter_log}, {"-o": opts.output, "--json": json_path})
    setup(None)
    if not quiet(json_path):
        say(json_path, f"sampling the board's sensor for {opts.seconds:g} s (idle and busy, {opts.phase:g} s each) "
                       f"while the meter logs to {meter_log}...")
    cal = fit_and_write(meter_log, opts.output, seconds=opts.seconds, phase_s=opts.phase)
    write_json(json_path, cal)
    r2 = f", r2 {cal['r2']:.4f}" if cal.get("r2") is not None else ""
    say(json_path, f"fit       meter W = {cal['gain']:.4g} x sensor W + {cal['offset_w']:.4g} W (residual "
                   f"{cal['residual_w']:.3g} W over {cal['points']} readings{r2})")
    say(json_path, f"sensor    {cal['instrument']}, {cal['sensor_range_w'][0]:.3g}-{cal['sensor_range_w'][1]:.3g} W "
                   "during the fit")
    say(json_path, f"written   {cal['file']}" + ("" if opts.output else " (read by every later measurement)"))
