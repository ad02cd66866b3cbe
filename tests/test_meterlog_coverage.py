"""A meter log measures a window only from readings inside it, and only in the unit its header says (issue 37: R2
and the 1000x units).

A log with readings before and after the timed window but too few inside it (none, one per 25 s, a gap in the
middle, readings just at its edges) gave a figure drawn between readings outside the work (3.3x the real one),
exit 0; a log of mW under a 'W' header was taken as 1000x the power. Both are refused in one line, exit 2, by the
one reader of a log over a window (``meterlog.log_record``: profile/finetune --power-log and `energy attribute`).
The logs are generated, in the 'timestamp,power (W)' format a meter's logger writes (tests/metertools.py).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import metertools
from clitools import assert_user_error, run_edgetrain
from edgetrain.energy import meterlog
from edgetrain.errors import UsageError

T0 = 1_796_292_000.0  # 2026-12-03 10:00 UTC
WINDOW = (T0 + 60.0, T0 + 70.0)  # a 10 s timed window, as profile holds for a meter
IDLE_W, BUSY_W = 2.0, 5.0


def power(t: float) -> float:
    """The board: idle, busy inside the window (what a meter at its input reads)."""
    return BUSY_W if WINDOW[0] <= t <= WINDOW[1] else IDLE_W


def write_log(path: Path, times, watts=power, header: str = "timestamp,power (W)") -> Path:
    path.write_text(header + "\n" + "".join(f"{t:.3f},{watts(t):.6g}\n" for t in sorted(times)), encoding="utf-8")
    return path


def every(hz: float, phase: float = 0.0, skip=(), start: float = T0, end: float = T0 + 130.0) -> list[float]:
    """Reading times at ``hz`` from ``start`` (shifted by ``phase`` periods), none inside the ``skip`` spans."""
    n = int((end - start) * hz) + 1
    times = [start + (i + phase) / hz for i in range(n)]
    return [t for t in times if not any(a < t < b for a, b in skip)]


def outside_only(step: float = 1.0) -> list[float]:
    return [t for t in every(1.0 / step) if not WINDOW[0] <= t <= WINDOW[1]]


NAMED = {  # the campaign's logs, and their kin: each refused
    "no readings inside": outside_only(),
    "one reading per 25 s": every(1 / 25.0),
    "one reading per 25 s, one inside": every(1 / 25.0, phase=0.4),
    "a gap in the middle": every(10.0, skip=[(WINDOW[0] + 2.0, WINDOW[0] + 8.0)]),
    "a gap at the start": every(10.0, skip=[(WINDOW[0] - 1.0, WINDOW[0] + 3.0)]),
    "a gap at the end": every(10.0, skip=[(WINDOW[1] - 3.0, WINDOW[1] + 1.0)]),
    "readings just at the edges": outside_only() + [WINDOW[0], WINDOW[1]],
    "four readings inside": outside_only(5.0) + [WINDOW[0] + 1, WINDOW[0] + 3.5, WINDOW[0] + 6, WINDOW[0] + 8.5],
}
COVERED = {  # and logs that measure the window: accepted, with the board's figure
    "1 Hz": every(1.0),
    "10 Hz": every(10.0, phase=0.37),
    "10 Hz with a 1 s dropout": every(10.0, skip=[(WINDOW[0] + 4.0, WINDOW[0] + 5.0)]),
    "0.5 Hz": every(0.5, phase=0.5),
}


@pytest.mark.parametrize("case", sorted(NAMED))
def test_a_window_without_readings_enough_inside_it_is_refused(case, tmp_path):
    log = write_log(tmp_path / "meter.csv", NAMED[case])
    with pytest.raises(UsageError) as refused:
        meterlog.log_record(log, WINDOW)
    line = refused.value.line()
    assert "cannot measure the 10 s window" in line and "\n" not in line and str(log) in line
    assert "interpolated" in line and "log at least one reading every" in line


@pytest.mark.parametrize("case", sorted(COVERED))
def test_a_window_with_readings_inside_it_is_measured(case, tmp_path):
    rec = meterlog.log_record(write_log(tmp_path / "meter.csv", COVERED[case]), WINDOW)
    assert rec["joules"] == pytest.approx(BUSY_W * 10.0, rel=0.16)
    cov = rec["coverage"]
    assert cov["readings"] >= meterlog.MIN_WINDOW_READINGS and cov["longest_gap_s"] <= cov["max_gap_s"]


def test_every_log_is_refused_or_measured_near_the_truth(tmp_path):
    """As a class: meters from one reading per 40 s to 20 Hz, at three phases, with and without gaps of 1-6 s at
    the start, middle and end of the window: each log is refused in one line, or its figure is within 16% of the
    energy the board drew (what the rule allows: 20% of the window interpolated at most, half of it at each end)."""
    truth = BUSY_W * 10.0
    refused = measured = 0
    for hz in (1 / 40, 1 / 25, 1 / 10, 1 / 4, 1 / 3, 0.4, 0.5, 1.0, 2.0, 5.0, 20.0):
        for phase in (0.0, 0.3, 0.7):
            for gap in (None, 1.0, 2.0, 3.0, 6.0):
                for at in ((0.0, 4.0, 10.0 - (gap or 0)) if gap else (0.0,)):
                    skip = [(WINDOW[0] + at - 1e-9, WINDOW[0] + at + gap)] if gap else []
                    log = write_log(tmp_path / "meter.csv", every(hz, phase, skip))
                    try:
                        rec = meterlog.log_record(log, WINDOW)
                    except UsageError as exc:
                        assert "cannot measure" in exc.line(), exc.line()
                        refused += 1
                        continue
                    measured += 1
                    assert rec["joules"] == pytest.approx(truth, rel=0.16), (hz, phase, gap, at, rec["coverage"])
    assert refused > 50 and measured > 50, (refused, measured)  # both answers were given: the test sees both


def test_the_issues_sparse_log_no_longer_gives_a_figure_3x_too_high(tmp_path):
    """The campaign's case: a reading every 25 s. Its 'measured' figure was the line drawn between the readings
    around the window, not the board's draw inside it; it is refused, and a 1 Hz log of the same board gives the
    board's energy."""
    with pytest.raises(UsageError, match=r"\d reading\(s\) inside it"):
        meterlog.log_record(write_log(tmp_path / "sparse.csv", every(1 / 25.0)), WINDOW)
    good = meterlog.log_record(write_log(tmp_path / "good.csv", every(1.0)), WINDOW)
    assert good["joules"] == pytest.approx(BUSY_W * 10.0, rel=0.05)


# --- units: figures the board cannot draw -------------------------------------------------------------------

BOARD_W = (2.7, 6.4)  # rpi4b-4gb's idle and busy watts


@pytest.mark.parametrize("header,scale,likely", [
    ("timestamp,power (W)", 1000.0, "mW under a header saying W"),
    ("timestamp,power (mW)", 1000.0, "µW under a header saying mW"),
    ("timestamp,power (mW)", 1e-3, "W under a header saying mW"),
    ("timestamp,watts", 1000.0, "mW under a header saying W"),
    ("timestamp,voltage (V),current (A)", 1000.0, "mA under a header saying A"),
])
def test_a_log_in_another_unit_than_its_header_says_is_refused_naming_the_likely_one(header, scale, likely, tmp_path):
    times = every(1.0)
    if "current" in header:  # 5 V x the current, the current column 1000x (mA written under an A header)
        text = header + "\n" + "".join(f"{t:.3f},5.0,{power(t) / 5.0 * scale:.6g}\n" for t in times)
        log = tmp_path / "meter.csv"
        log.write_text(text, encoding="utf-8")
    else:
        log = write_log(tmp_path / "meter.csv", times, lambda t: power(t) * scale * (1000 if "mW" in header else 1),
                        header)
    with pytest.raises(UsageError) as refused:
        meterlog.log_record(log, WINDOW, board_w=BOARD_W)
    line = refused.value.line()
    assert likely in line and "2.7-6.4 W" in line and "\n" not in line
    # the same log in the unit its header says is measured
    good = write_log(tmp_path / "good.csv", times)
    assert meterlog.log_record(good, WINDOW, board_w=BOARD_W)["joules"] == pytest.approx(50.0, rel=0.05)


@pytest.mark.parametrize("watts,ok", [(BOARD_W[0] / 10 * 1.01, True), (BOARD_W[0] / 10 * 0.99, False),
                                      (BOARD_W[1] * 10 * 0.99, True), (BOARD_W[1] * 10 * 1.01, False)])
def test_the_plausible_range_is_the_boards_idle_to_busy_within_10x(watts, ok, tmp_path):
    log = write_log(tmp_path / "meter.csv", every(1.0), lambda t: watts)
    if ok:
        assert meterlog.log_record(log, WINDOW, board_w=BOARD_W)["average_w"] == pytest.approx(watts)
    else:
        with pytest.raises(UsageError, match="by more than 10x"):
            meterlog.log_record(log, WINDOW, board_w=BOARD_W)


# --- the command line: `energy attribute` over a real profile's windows ----------------------------------------

@pytest.fixture(scope="module")
def profiled(tmp_path_factory) -> dict:
    """A finished `profile --meter-export --device <this machine> --json RESULT` (no sensor), its windows."""
    from test_profile_models import conv_gemm_onnx

    folder = tmp_path_factory.mktemp("coverage")
    result = metertools.meter_export_result(folder, conv_gemm_onnx(folder / "convgemm.onnx"))
    d = json.loads(result.read_text())
    return {"result": result, "windows": d["meter_windows"], "board_w": d["meter_windows"]["board_w"]}


def _attribute(profiled, tmp_path, times, watts, header="timestamp,power (W)"):
    log = tmp_path / "meter.csv"
    log.write_text(header + "\n" + "".join(f"{t:.3f},{watts(t):.6g}\n" for t in sorted(times)), encoding="utf-8")
    return run_edgetrain("energy", "attribute", profiled["result"], log, "-o", tmp_path / "measured.json", "--json", "-")


def _run_times(profiled, kind: str) -> list[float]:
    timed = profiled["windows"]["configs"][0]["timed"]
    idle = profiled["windows"]["configs"][0]["idle"]
    a, b = math.floor(idle[0]) - 5.0, math.ceil(timed[1]) + 5.0
    grid = [a + i * 0.5 for i in range(int((b - a) / 0.5) + 1)]  # a 2 Hz meter
    if kind == "covered":
        return grid
    if kind == "no readings inside":
        return [t for t in grid if not timed[0] <= t <= timed[1]]
    if kind == "one reading per 25 s":
        return [a + i * 25.0 for i in range(int((b - a) / 25.0) + 2)]
    if kind == "a gap in the middle":
        mid = (timed[0] + timed[1]) / 2
        return [t for t in grid if not mid - 3.0 < t < mid + 3.0]
    if kind == "readings just at the edges":
        return [t for t in grid if not timed[0] <= t <= timed[1]] + list(timed)
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["no readings inside", "one reading per 25 s", "a gap in the middle",
                                  "readings just at the edges"])
def test_attribute_refuses_a_log_without_readings_enough_inside_the_window(profiled, tmp_path, kind):
    idle, busy = profiled["board_w"]
    res = _attribute(profiled, tmp_path, _run_times(profiled, kind), lambda t: (idle + busy) / 2)
    assert_user_error(res, 2, "cannot measure the", "meter.csv")
    assert not (tmp_path / "measured.json").exists()


def test_attribute_measures_a_covered_log_and_refuses_it_in_milliwatts(profiled, tmp_path):
    idle, busy = profiled["board_w"]
    watts = idle / 2  # this machine's profile (x86-64-generic's figures): 10-30 W; in mW, under the 10 kW any log may read
    times = _run_times(profiled, "covered")
    res = _attribute(profiled, tmp_path, times, lambda t: watts)
    assert res.code == 0, res.err
    cfg = res.json()["configs"][0]["power"]
    assert cfg["average_w"] == pytest.approx(watts) and cfg["coverage"]["readings"] >= 20
    (tmp_path / "measured.json").unlink()
    res = _attribute(profiled, tmp_path, times, lambda t: watts * 1000)  # mW under the 'W' header
    assert_user_error(res, 2, "mW under a header saying W", f"{idle:g}-{busy:g} W")
    assert not (tmp_path / "measured.json").exists()
