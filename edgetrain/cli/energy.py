"""`edgetrain energy calibrate METER_LOG`: fit the board's own power sensor to a meter logging at the same time."""
from __future__ import annotations

import click

from ..options import EnergyAttributeOptions, EnergyCalibrateOptions
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


@energy.command()
@click.argument("result", metavar="RESULT")
@click.argument("meter_log", metavar="METER_LOG")
@declared_options(EnergyAttributeOptions)
@json_option
def attribute(result, meter_log, json_path, **values):
    """Attribute a meter's export, written after the run, to a finished `edgetrain profile --meter-export --json
    RESULT`: the Nordic PPK2 and Otii apps export their CSV only once the recording is stopped, too late for
    --power-log. METER_LOG is read (the formats --power-log reads, with --power-log-voltage and --power-log-start
    as there) over each configuration's idle stretch and timed window recorded in RESULT, and the result is
    written with the measured energy (and carbon, provenance, uncertainty) the run would have had with
    --power-log: to -o (default RESULT-measured.json), never over RESULT. Exit 2 when the log does not cover the
    windows, RESULT has none, was written by another edgetrain version, or was changed after the run (its windows
    carry a SHA-256 seal of the whole result).
    """
    import json
    from pathlib import Path

    from ..energy import read_meter_export
    from ..errors import UsageError
    from ..fileio import atomic_write_text, check_outputs, parse_json
    from ..measure import attribute as attribute_log
    from ..measure import first_window

    opts = parse(EnergyAttributeOptions, values)
    src = Path(result)
    out = Path(opts.output) if opts.output else src.with_name(src.stem + "-measured.json")
    check_outputs({"RESULT": result, "METER_LOG": meter_log}, {"-o": str(out), "--json": json_path})
    grid = opts.carbon_grid()  # an unknown country, or both given: refused before anything is read
    try:
        data = parse_json(src.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError("the result does not exist", result, "give the --json file a profile wrote") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        why = str(exc) if str(exc).startswith("JSON nested") else type(exc).__name__
        raise UsageError(f"cannot read the result as JSON ({why})", result,
                         "give the --json file a profile wrote") from None
    # read once, whole, before the result's windows are checked (a bad log is refused first, as before)
    log, parsed = read_meter_export(meter_log, opts.power_log_voltage, opts.power_log_start, first_window(data))
    done = attribute_log(data, log, result, parsed, grid)
    atomic_write_text(out, json.dumps(done, indent=2) + "\n", "-o")
    write_json(json_path, done)
    for line in attributed_lines(done):
        say(json_path, line)
    say(json_path, f"written   {out}")


def attributed_lines(done: dict) -> list[str]:
    """What `energy attribute` prints: the device's headline (measured when the run was on the device, else
    modelled, with its interval and grams) and the meter's figures, each labelled as what it is."""
    from ..energy import EnergyRecord, carbon_text
    from ..measure import host_energy_lines
    from .finetune import run_energy_lines

    if "configs" not in done:  # a fine-tune
        en = done.get("energy") or {}
        return run_energy_lines(en, done.get("joules_per_epoch"), done.get("joules_per_sample"))
    lines = []
    en = done.get("energy") or {}
    if en.get("per_inference"):
        head = EnergyRecord.of(en["per_inference"], "mJ")
        lines.append(f"device    {en.get('device')}: {head.text()} per inference")
        if en.get("carbon"):
            lines.append(f"carbon    {carbon_text(en['carbon'], per_inference=True)} per inference")
    return lines + host_energy_lines({"board": (done.get("host_energy") or {}).get("board") or []})
