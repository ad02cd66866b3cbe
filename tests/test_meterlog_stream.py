"""A meter's log read in one pass, in memory bounded by its readings' arrays (16 bytes a reading).

An hour of an Otii export at 4 kHz is 14.4 M rows: read whole (the text, its list of lines, a tuple a reading)
it took several GB. The log is now read a block of lines at a time into two float64 arrays; what the reader
says of every line (its refusals, their line numbers, a last line cut short) is what it said when it read the
whole text first, and what callers integrate over the arrays is what they integrated over the tuples.
"""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from edgetrain.energy import meterlog
from edgetrain.errors import UsageError

LOGS = Path(__file__).parent / "fixtures" / "power" / "logs"
START = datetime(2026, 12, 3, 10, 0, 0, tzinfo=timezone.utc).timestamp()  # 1796292000.0
ROOT = Path(__file__).resolve().parents[1]


def _local(text: str) -> float:
    """A naive ISO time the way the reader places it: this machine's local time."""
    return datetime.fromisoformat(text).timestamp()


# What the whole-text reader (main at 04df823, before this change) gave for every fixture, derived by running
# it: readings, first and last (t, W), mean W, and the info. The pyummeter fixture's times are naive local ISO.
BEFORE = {
    "fnirsi-logger-readme.txt": ({}, 9, (1657568326.775, 0.0), (1657568326.824, 0.0), 0.0,
                                 {"format": "CSV with units in its header", "columns": ["voltage_V", "current_A"],
                                  "time": "clock"}),
    "pyummeter-um34c.csv": ({}, 20, (_local("2026-12-03 10:00:00"), 1.672), (_local("2026-12-03 10:00:19"), 1.672),
                            1.6720000000000002, {"format": "CSV with units in its header", "columns": ["Power (W)"],
                                                 "time": "clock"}),
    "joulescope-statistics-utc.csv": ({}, 20, (START, 1.9), (START + 9.5, 1.9), 1.8999999999999992,
                                      {"format": "Joulescope UI statistics record", "columns": ["power"],
                                       "time": "clock"}),
    "joulescope-statistics-relative.csv": ({"start": START}, 5, (START, 1.9), (START + 2.0, 1.9), 1.9,
                                           {"format": "Joulescope UI statistics record", "columns": ["power"],
                                            "time": "from the recording's start (given)"}),
    "ppk2-export.csv": ({"voltage": 3.3, "start": START}, 10, (START, 0.010609912499999999),
                        (1796292000.00009, 0.0106396125), 0.0106247625,
                        {"format": "Nordic Power Profiler export", "columns": ["Current(uA)", "3.3 V (given)"],
                         "time": "from the recording's start (given)", "voltage_v": 3.3}),
    "witrn-wtm2csv.csv": ({"start": START}, 10, (START, 2.055024), (1796292000.09, 2.055024), 2.055024,
                          {"format": "CSV with units in its header", "columns": ["voltage (V)", "current (A)"],
                           "time": "from the recording's start (given)"}),
    "Main power - Arc.csv": ({"start": START}, 40, (START, 3.20000005), (1796292000.00975, 3.80000019),
                             3.5121876670000005, {"format": meterlog.OTII_FORMAT, "columns": ["Main power (W)"],
                                                  "time": "from the recording's start (given)"}),
    "Main current - Arc.csv": ({"voltage": 5.1, "start": START}, 40, (START, 3.2000001153),
                               (1796292000.00975, 3.8000003814), 3.5121877061099993,
                               {"format": meterlog.OTII_FORMAT, "columns": ["Main current (A)", "5.1 V (given)"],
                                "time": "from the recording's start (given)", "voltage_v": 5.1}),
}


def test_every_log_fixture_is_covered():
    names = {p.name for p in LOGS.iterdir()}
    assert names - set(BEFORE) == {"VBUS - Ace.csv"}  # a voltage channel: refused, by test_power_fixtures


@pytest.mark.parametrize("name", sorted(BEFORE))
def test_every_fixture_reads_as_the_whole_text_reader_read_it(name):
    given, count, first, last, mean, info = BEFORE[name]
    readings, got = meterlog.parse_power_log(meterlog.PowerLog(LOGS / name, **given))
    assert len(readings) == len(readings.t) == len(readings.w) == count
    assert readings[0] == first and readings[-1] == last
    assert sum(w for _, w in readings) / len(readings) == pytest.approx(mean, rel=1e-12, abs=1e-15)
    assert got == info
    assert list(readings) == list(zip(readings.t.tolist(), readings.w.tolist()))  # the pairs are the arrays


def _ramp(t):
    """Watts at time ``t`` s: piecewise linear with knots every 0.25 s, so a trapezoid over any sampling whose
    instants include the knots is exact."""
    knots = np.array([2.0, 3.5, 1.0, 4.0, 2.5, 3.0, 1.5, 2.0])
    x = np.asarray(t) / 0.25
    i = np.floor(x).astype(int)
    f = x - i
    return knots[i % 8] * (1 - f) + knots[(i + 1) % 8] * f


def _otii(path: Path, hz: float, seconds: float) -> Path:
    s = np.arange(int(seconds * hz) + 1) / hz
    with open(path, "w") as f:
        f.write('"Timestamp","Value"\n')
        for a in range(0, len(s), 100_000):
            f.write("".join(f"{t:.6f},{w:.9f}\n" for t, w in zip(s[a:a + 100_000].tolist(),
                                                                 _ramp(s[a:a + 100_000]).tolist())))
    return path


def _csv_ms_mw(path: Path, hz: float, seconds: float) -> Path:
    """The same series written differently: Unix milliseconds, power in mW, semicolons, CR LF, a comment."""
    s = np.arange(int(seconds * hz) + 1) / hz
    rows = [f"{(START + t) * 1000:.3f};{w * 1000:.6f}" for t, w in zip(s.tolist(), _ramp(s).tolist())]
    rows.insert(len(rows) // 2, "# meter: range changed")
    path.write_bytes(("Time;Power (mW)\r\n" + "\r\n".join(rows) + "\r\n").encode())
    return path


def test_the_same_series_at_two_rates_and_in_two_formats_gives_the_same_figures(tmp_path):
    seconds = 60.0
    fast = meterlog.PowerLog(_otii(tmp_path / "Main power - Arc.csv", 4000.0, seconds), start=START)
    slow = _csv_ms_mw(tmp_path / "meter.csv", 40.0, seconds)
    window, idle = (START + 10.0, START + 50.0), (START + 1.0, START + 9.0)
    a, b = meterlog.log_record(fast, window, idle), meterlog.log_record(slow, window, idle)
    exact = 19.5 / 8  # the ramp's mean over whole periods (8 knots, 2 s): the knots' mean; both windows hold whole ones
    assert a["average_w"] == pytest.approx(exact, rel=1e-6) and b["average_w"] == pytest.approx(exact, rel=1e-6)
    assert a["joules"] == pytest.approx(b["joules"], rel=1e-6)
    assert a["idle_w"] == pytest.approx(b["idle_w"], rel=1e-6)
    assert a["samples"] == 40 * 4000 + 1 and b["samples"] == 40 * 40 + 1
    assert a["rate_hz"] == pytest.approx(4000.0, rel=1e-2) and b["rate_hz"] == pytest.approx(40.0, rel=1e-2)
    assert a["samples_total"] == 60 * 4000 + 1 and b["samples_total"] == 60 * 40 + 1
    # the spread of the readings inside the window: the arrays' figure is the tuples' statistics.stdev
    import statistics

    inside = [w for t, w in meterlog.read_power_log(slow) if window[0] <= t <= window[1]]
    assert b["power_sd_w"] == pytest.approx(statistics.stdev(inside), rel=1e-9)


def _blocks_log(path: Path, rows: int, extra: dict[int, str], end: str = "\n") -> tuple[Path, list[str]]:
    """A Unix-seconds log of ``rows`` readings, with lines replaced or inserted (``extra``: index -> text, an
    index of a reading's line replaced by it), spanning several of the reader's blocks."""
    lines = ["timestamp,power (W)"] + [f"{1700000000 + i * 0.01:.2f},{2.0 + (i % 5) * 0.1:.1f}" for i in range(rows)]
    for i, text in sorted(extra.items()):
        lines[i] = text
    path.write_text("\n".join(lines) + end, encoding="utf-8")
    return path, lines


def test_line_numbers_are_the_whole_texts_past_blocks_blanks_and_comments(tmp_path):
    rows = 120_000  # ~2.6 MB: several blocks
    skipped = {5: "", 7: "# a comment", 70_000: "   ", 70_001: "#x,y"}
    # a reading far below the meter's zero, deep in the file: named by its line, counted past the skipped lines
    path, lines = _blocks_log(tmp_path / "neg.csv", rows, {**skipped, 100_000: "1700000999.99,-3.0"})
    with pytest.raises(UsageError) as err:
        meterlog.parse_power_log(path)
    assert f"line {100_001} reads -3 W" in err.value.line() and f"neg.csv:{100_001})" in err.value.line()
    # a line that does not read, in a later block
    path, lines = _blocks_log(tmp_path / "bad.csv", rows, {**skipped, 90_000: "1700000900.00,two"})
    with pytest.raises(UsageError, match="cannot read the power log's line 90001: '1700000900.00,two'"):
        meterlog.parse_power_log(path)
    # a step back of many periods, named at the line it lands on
    path, lines = _blocks_log(tmp_path / "back.csv", rows, {**skipped, 110_000: "1700000000.50,2.0"})
    with pytest.raises(UsageError, match=r"go back 1\.1e\+03 s at line 110001"):
        meterlog.parse_power_log(path)
    # the skipped lines are not readings; the rest are, in order
    path, lines = _blocks_log(tmp_path / "ok.csv", rows, skipped)
    readings = meterlog.read_power_log(path)
    assert len(readings) == rows - len(skipped)  # four readings' lines replaced by lines that are none
    assert bool(np.all(np.diff(readings.t) > 0))


def test_a_form_feed_or_a_cr_lf_split_between_blocks_numbers_lines_as_the_whole_text_does(tmp_path):
    """splitlines breaks at \\x0c and \\x1e as well as at line feeds: the lines are counted as it counts them."""
    rows = [f"{1700000000 + i * 0.01:.2f},2.5" for i in range(60_000)]
    rows[30_000] = rows[30_000] + "\x0c"  # an extra (blank) line after it, for splitlines
    rows[50_000] = "1700000500.00,oops"
    text = "timestamp,power (W)\r\n" + "\r\n".join(rows) + "\r\n"
    path = tmp_path / "ff.csv"
    path.write_bytes(text.encode())
    want = next(i + 1 for i, ln in enumerate(text.splitlines()) if ln.endswith("oops"))
    assert want == 50_003  # the header, the blank line the form feed makes, 1-based
    with pytest.raises(UsageError, match=f"line {want}:"):
        meterlog.parse_power_log(path)


def test_a_cut_last_line_is_no_reading_and_an_earlier_bad_line_still_is_an_error(tmp_path):
    path, _ = _blocks_log(tmp_path / "cut.csv", 50_000, {}, end="\n1700000500.00,2.")
    assert len(meterlog.read_power_log(path)) == 50_000 + 1  # '2.' reads: a line without its newline that reads
    path.write_text(path.read_text() + "5\n17000005")
    assert len(meterlog.read_power_log(path)) == 50_000 + 1  # '17000005': not a reading yet, ignored
    path.write_text(path.read_text() + "00.01,oops\n")
    with pytest.raises(UsageError, match="line 50003"):  # the same line, now ended: an error
        meterlog.read_power_log(path)


def test_a_read_error_later_in_the_log_is_what_it_is_refused_for(tmp_path):
    """Read whole, the log's undecodable byte was refused before any line was looked at: still so."""
    path, lines = _blocks_log(tmp_path / "enc.csv", 40_000, {3: "1700000000.03,oops"})
    path.write_bytes(path.read_bytes() + b"1700000400.00,2.\xff5\n")
    with pytest.raises(UsageError, match="cannot read the power log: UnicodeDecodeError"):
        meterlog.parse_power_log(path)


def test_an_otii_export_cut_short_is_refused_as_such_before_its_bad_lines(tmp_path):
    path = _otii(tmp_path / "Main power - Arc.csv", 4000.0, 20.0)
    text = path.read_text().splitlines()
    text[1000] = "0.249750,bad"
    path.write_text("\n".join(text) + "\n20.000250,3.1")
    with pytest.raises(UsageError, match=rf"ends inside its line {len(text) + 1} \('20.000250,3.1'\)"):
        meterlog.parse_power_log(meterlog.PowerLog(path, start=START))


CHILD = textwrap.dedent("""
    import json, resource, sys
    from edgetrain.energy import meterlog
    import numpy as np  # loaded by the reader too: part of the baseline, not of the log

    def peak():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024

    base = peak()
    log = meterlog.PowerLog(meterlog.Path(sys.argv[1]), start=float(sys.argv[2]))
    readings, info = meterlog.parse_power_log(log)
    read = peak()
    t0, t1 = float(readings.t[0]), float(readings.t[-1])
    n = len(readings)
    del readings  # log_record reads the log itself
    rec = meterlog.log_record(log, (t0 + 0.3 * (t1 - t0), t0 + 0.9 * (t1 - t0)), (t0, t0 + 0.2 * (t1 - t0)))
    print(json.dumps({"base": base, "read": read, "record": peak(), "n": n,
                      "average_w": rec["average_w"], "idle_w": rec["idle_w"]}))
""")


@pytest.mark.slow
def test_a_large_log_is_read_in_memory_bounded_by_its_readings(tmp_path):
    """1.5 M readings (6 min of Otii at 4 kHz, a 40 MB file): the child's peak RSS above its baseline stays under
    3 x 16 bytes a reading, reading it and making its record (read whole, it took over 300 bytes a reading)."""
    rows_s = 375.0
    path = _otii(tmp_path / "Main power - Arc.csv", 4000.0, rows_s)
    small = _otii(tmp_path / "Main power - small.csv", 40.0, rows_s)
    res = subprocess.run([sys.executable, "-c", CHILD, str(path), str(START)], capture_output=True, text=True,
                         cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, timeout=600)
    assert res.returncode == 0, res.stderr
    got = json.loads(res.stdout)
    n = got["n"]
    assert n == int(rows_s * 4000) + 1
    bound = got["base"] + 3 * 16 * n
    assert got["read"] <= bound and got["record"] <= bound, (got, bound)
    # the figures are those of the same series sampled 100x less often
    t0, t1 = START, START + rows_s
    ref = meterlog.log_record(meterlog.PowerLog(small, start=START), (t0 + 0.3 * (t1 - t0), t0 + 0.9 * (t1 - t0)),
                              (t0, t0 + 0.2 * (t1 - t0)))
    assert got["average_w"] == pytest.approx(ref["average_w"], rel=1e-6)
    assert got["idle_w"] == pytest.approx(ref["idle_w"], rel=1e-6)
