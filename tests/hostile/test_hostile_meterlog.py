"""Meter logs no meter should write (issue 26, closing campaign): clock times in Unix microseconds or
nanoseconds, a reading of 1e30 W, a line over csv's field limit, a FIFO or a device given as the log. Each is
one `Error:` line naming the line (exit 2), before the work when the log is there already; never a
traceback after the work ("year 58892 is out of range" when the run's window was printed), a hang on a
FIFO with no writer, or an energy figure from a unit mistake."""
from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from edgetrain.energy.meterlog import check_power_log, parse_power_log
from edgetrain.errors import UsageError
from clitools import assert_user_error, run_edgetrain

ONNX = str(Path(__file__).resolve().parents[2] / "edgetrain" / "_builtin" / "digits5.onnx")


def _log(path: Path, header: str, time_of, watts="2.5", n: int = 40) -> Path:
    now = time.time()
    rows = [f"{time_of(now - 10 + i * 0.5)},{watts}" for i in range(n)]
    path.write_text("\n".join([header, *rows]) + "\n")
    return path


# id -> (header, the time a row writes from Unix seconds, the watts column, fragment of the refusal or None)
LOGS = {
    "unix-us-no-unit": ("timestamp,power (W)", lambda t: f"{t * 1e6:.0f}", "2.5", "no clock time"),
    "unix-ns-no-unit": ("timestamp,power (W)", lambda t: f"{t * 1e9:.0f}", "2.5", "no clock time"),
    "iso-year-9999": ("timestamp,power (W)", lambda t: "9999-12-31T23:59:59", "2.5", "no clock time"),
    "unix-1990": ("timestamp,power (W)", lambda t: f"{t - 36 * 365 * 86400:.3f}", "2.5", "no clock time"),
    "power-1e30-W": ("timestamp,power (W)", lambda t: f"{t:.3f}", "1e30", "more than any device"),
    "power-mW-under-W": ("timestamp,power (W)", lambda t: f"{t:.3f}", "25000", "more than any device"),
    "field-over-csv-limit": ("timestamp,power (W)", lambda t: f"{t:.3f}", "9" * 200_000, "cannot read"),
    # what a header names is read at its scale: not refused
    "unix-ns-unit": ("timestamp (ns),power (W)", lambda t: f"{t * 1e9:.0f}", "2.5", None),
    "unix-us-unit": ("timestamp (us),power (W)", lambda t: f"{t * 1e6:.0f}", "2.5", None),
}


@pytest.mark.parametrize("case", list(LOGS))
def test_log_values_out_of_range_are_one_line(tmp_path, case):
    header, time_of, watts, refusal = LOGS[case]
    path = _log(tmp_path / "meter.csv", header, time_of, watts)
    if refusal is None:
        readings, _ = parse_power_log(path)
        assert abs(readings[0][0] - (time.time() - 10)) < 60 and readings[0][1] == 2.5
        return
    with pytest.raises(UsageError) as err:
        parse_power_log(path)
    assert refusal in err.value.line() and ":2)" in err.value.line()


def test_header_over_csv_limit_is_one_line(tmp_path):
    path = tmp_path / "meter.csv"
    path.write_text("timestamp," + "p" * 200_000 + "\n1,2\n")
    with pytest.raises(UsageError, match="header"):
        parse_power_log(path)


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "dev-null"])
def test_non_regular_log_refused_before_reading(tmp_path, kind):
    """Reading a FIFO blocks until a writer comes; /dev/zero never ends: refused without opening them."""
    if kind == "fifo":
        path = tmp_path / "meter.csv"
        os.mkfifo(path)
    else:
        path = Path("/dev/zero" if kind == "dev-zero" else "/dev/null")
    t0 = time.monotonic()
    with pytest.raises(UsageError, match="not a regular file"):
        check_power_log(path)
    with pytest.raises(UsageError, match="not a regular file"):
        parse_power_log(path)
    assert time.monotonic() - t0 < 5


def test_finetune_with_fifo_log_is_refused_before_work(tmp_path):
    fifo = tmp_path / "meter.csv"
    os.mkfifo(fifo)
    res = run_edgetrain("finetune", ONNX, "--data", "builtin:digits", "--epochs", "1", "--train-layers", "bias",
                        "-o", tmp_path / "out", "--power-log", fifo, timeout=120)
    assert_user_error(res, 2, "not a regular file")
    assert not (tmp_path / "out" / "model.onnx").exists()


def test_finetune_with_unix_microseconds_log_is_refused_before_work(tmp_path):
    log = _log(tmp_path / "meter.csv", "timestamp,power (W)", lambda t: f"{t * 1e6:.0f}", n=4000)
    res = run_edgetrain("finetune", ONNX, "--data", "builtin:digits", "--epochs", "1", "--train-layers", "bias",
                        "-o", tmp_path / "out", "--power-log", log, timeout=120)
    assert_user_error(res, 2, "no clock time")
    assert not (tmp_path / "out" / "model.onnx").exists()


@pytest.mark.parametrize("value", ["2001", "1e8", "350000"])
def test_grid_intensity_beyond_any_grid_is_refused_before_work(tmp_path, value):
    """g CO2e per MWh (or a typo) given as per kWh made grams 1000x too high, exit 0."""
    res = run_edgetrain("finetune", ONNX, "--data", "builtin:digits", "--epochs", "1", "--train-layers", "bias",
                        "-o", tmp_path / "out", "--grid-intensity", value, timeout=120)
    assert_user_error(res, 2, "beyond any grid")
    assert not (tmp_path / "out").exists()


def test_grid_intensity_api_bound():
    import edgetrain.energy.carbon as carbon

    assert carbon.grid_intensity(grid_g_per_kwh=2000)["g_co2e_per_kwh"] == 2000
    with pytest.raises(UsageError, match="beyond any grid"):
        carbon.grid_intensity(grid_g_per_kwh=2000.5)
