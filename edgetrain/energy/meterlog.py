"""An external power meter's log: read as the meter (or its logging program) writes it.

A log is a text table: a header line naming the columns, then one reading per line, separated by commas,
semicolons, tabs or blanks. What each column holds comes from its header and nothing else:

- a time column (``timestamp``, ``time``, ``date``, ...): Unix seconds (or milliseconds), ISO 8601 in
  either form (``2026-12-03 10:00:00.5``, ``20261203T100000.5Z``), or the time of day alone
  (``10:00:00.5``, placed on the day of the run). A time counted from the start of the recording (the
  PPK2's ``Timestamp(ms)``, the Joulescope's "relative" time format, WITRN's ``HH:MM:SS:MS``) is placed
  against the run's clock only with the clock time its recording started (``--power-log-start``);
  without it, refused, saying what to pass.
- power, or voltage and current, each with its unit in the header: ``Power (W)``, ``current_A``,
  ``Current(uA)``, ``mW``... A power, voltage or current column whose header names no unit is refused:
  an INA219 library's ``current`` is mA where a meter's is A, and guessing wrong is a 1000x error.
  The one exception is a format whose writer fixes the units: the Joulescope UI's statistics record
  (``#time,current,voltage,power,charge,energy``, SI units, written by
  ``joulescope_ui/widgets/statistics_record/statistics_record.py``).
- current alone (the Nordic Power Profiler's export, ``Timestamp(ms),Current(uA)[,D0-D7]``, written by
  pc-nrfconnect-ppk ``src/actions/exportChartAction.ts``): the supply voltage is not in the export (the
  PPK2 in source mode sets it), so it is given (``--power-log-voltage V``) and power is V x the current;
  without it, refused in one line naming that flag.
- the Otii 3 desktop app's CSV export (Qoitech Otii Arc / Ace): one file per channel, named
  ``<channel> - <device>.csv`` (``Main power - Arc.csv``), header ``"Timestamp","Value"``, seconds from the
  recording's start and the channel's SI unit (current A, power W, voltage V), as andyshinn/otiio's tests
  check byte for byte against Otii's own export. The channel, and so the unit, is in the file name alone:
  ``Main power`` is read as W, ``Main current`` as A with ``--power-log-voltage``; a voltage, energy or
  temperature channel is refused (no power in it), and so is the format under a name that names no channel.

A meter's zero is not exact: a sleeping board's current reads a little below 0 (Otii's Main current around
0 A). Readings down to -max(5 mW, 1% of the log's peak power) are that offset noise, counted as read (not
clamped) and counted in the record (``negative_readings``, and a note in its source); one further below, or
a log more than half below 0 (a shunt wired backwards), is refused in one line.

Meters stamp readings in bursts (FNIRSI's logger stamps each 4-sample USB packet from the time it
arrived, so consecutive packets overlap by a few milliseconds): a step back shorter than
``BACKSTEP_PERIODS`` sampling periods is that jitter, and the readings are put in time order; a longer
step back (two recordings appended, a clock change) is refused.

``check_power_log`` runs before any work: a log that already exists must be readable in full now (a meter
still appending is fine: an empty file, or a last line without its newline that does not read yet, is not
an error), so a bad log costs seconds, not a fine-tune.

A log is read in one pass, a block of lines at a time, into two float64 arrays (``sensors.PowerSeries``, 16
bytes a reading: an hour of an Otii export at 4 kHz is 14.4 M rows, 230 MB): never its whole text, its list of
lines or a tuple a reading. A block of plain numbers is read at once; any other line is read alone, and says
what it always said, at the line number ``splitlines`` gives it in the whole text. What needs the whole series
(the order, the negative readings against the peak, the day) is done on the arrays after the pass.
"""
from __future__ import annotations

import csv
import math
import os
import re
import stat
from datetime import datetime, timedelta
from pathlib import Path

from dataclasses import dataclass

from ..errors import UsageError
from . import sensors


@dataclass(frozen=True)
class PowerLog:
    """A meter's log and what its format leaves out: the supply voltage of a current-only log, and the clock
    time (Unix s) a log timed from its own start began."""

    path: Path
    voltage: float | None = None
    start: float | None = None

    @property
    def name(self) -> str:
        return self.path.name

    def __str__(self) -> str:
        return str(self.path)


def as_log(log) -> PowerLog:
    return log if isinstance(log, PowerLog) else PowerLog(Path(log))


# A step back in time shorter than this many median sampling periods is the meter's packet jitter.
BACKSTEP_PERIODS = 10
# No device edgetrain measures draws more: a reading above it is a unit mistake (mW under a 'W' header).
MAX_WATTS = 10000.0

_LOG_FIX = ("give the meter's log with a header line: a time column (Unix seconds, ISO 8601 or time of day) and "
            "power, or voltage and current, each with its unit, e.g. 'timestamp,power (W)'")
_UNIT_FIX = "name the unit in the log's header, e.g. '{q} ({milli})' or '{q}_{unit}'"
_EXAMPLE_UNITS = {"power": ("mW", "W"), "voltage": ("mV", "V"), "current": ("mA", "A")}

# unit (lower case, as written in a header) -> (quantity, factor to W / V / A)
_UNITS = {
    "w": ("power", 1.0), "mw": ("power", 1e-3), "uw": ("power", 1e-6), "µw": ("power", 1e-6), "kw": ("power", 1e3),
    "watt": ("power", 1.0), "watts": ("power", 1.0), "milliwatts": ("power", 1e-3),
    "v": ("voltage", 1.0), "mv": ("voltage", 1e-3), "uv": ("voltage", 1e-6), "µv": ("voltage", 1e-6),
    "volt": ("voltage", 1.0), "volts": ("voltage", 1.0), "millivolts": ("voltage", 1e-3),
    "a": ("current", 1.0), "ma": ("current", 1e-3), "ua": ("current", 1e-6), "µa": ("current", 1e-6),
    "na": ("current", 1e-9), "amp": ("current", 1.0), "amps": ("current", 1.0), "ampere": ("current", 1.0),
    "amperes": ("current", 1.0), "milliamps": ("current", 1e-3), "microamps": ("current", 1e-6),
}
_QUANTITIES = {"power": "power", "p": "power", "watt": "power", "voltage": "voltage", "volt": "voltage",
               "vbus": "voltage", "u": "voltage", "current": "current", "curr": "current", "intensity": "current",
               "i": "current", "ibus": "current", "amp": "current"}
_TIME_NAMES = {"timestamp", "time", "t", "unix", "unixtime", "epoch", "datetime", "date", "timestamps", "times",
               "timeunix", "clock"}
_TIME_UNITS = {"s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9}
# A clock time outside these years is a unit the header does not name (Unix microseconds or nanoseconds
# read as milliseconds), not a reading of this run: refused on its line, never a crash when it is printed.
_CLOCK_RANGE = (datetime(2000, 1, 1).timestamp(), datetime(2100, 1, 1).timestamp())
# Formats whose writer fixes the units though the header does not name them: header cells -> units.
_KNOWN_FORMATS = {
    ("time", "current", "voltage", "power", "charge", "energy"): ("Joulescope UI statistics record", {
        "current": "A", "voltage": "V", "power": "W"}),
}
# The Otii 3 app's CSV export: '"Timestamp","Value"', the channel in the file name '<channel> - <device>.csv'.
# Channel labels as the app names them (andyshinn/otiio src/otiio/channels.py; units from Qoitech's TCP server
# docs, recording_downsample_channel: mc A, mv V, me J, ...) -> (quantity, unit); the unit is the app's, fixed.
OTII_FORMAT = "Otii 3 CSV export"
_OTII_HEADER = ("timestamp", "value")
_OTII_CHANNELS = {
    "main current": ("current", "A"), "main current 1": ("current", "A"), "main current 2": ("current", "A"),
    "main current 3": ("current", "A"), "adc current": ("current", "A"),
    "main power": ("power", "W"), "adc power": ("power", "W"),
    "main voltage": ("voltage", "V"), "adc voltage": ("voltage", "V"), "vbus": ("voltage", "V"),
    "sense+ voltage": ("voltage", "V"), "sense- voltage": ("voltage", "V"), "dc jack voltage": ("voltage", "V"),
    "power supply voltage": ("voltage", "V"), "main energy": ("energy", "J"), "adc energy": ("energy", "J"),
    "temperature": ("temperature", "°C"), "gpi1": ("digital input", None), "gpi2": ("digital input", None),
    "uart logs": ("text", None),
}
_OTII_FIX = ("export the 'Main power' channel in Otii (one file per channel, under the name Otii gives it, "
             "e.g. 'Main power - Arc.csv'), or 'Main current' with --power-log-voltage V")
_TOD = re.compile(r"^(\d{1,2}):(\d{2}):(\d{2}(?:\.\d+)?)$")
_ELAPSED = re.compile(r"^\d+:\d{2}:\d{2}:\d{3}$")  # HH:MM:SS:MS from the recording's start (WITRN, wtm2csv.py)
_SPLIT_UNIT = re.compile(r"^(.*?)[\s_]*[\(\[]\s*([^\)\]]*?)\s*[\)\]]\s*$")  # 'Power (W)', 'Current(uA)', 'p[mW]'


class Column:
    def __init__(self, index: int, header: str, quantity: str | None, unit: str | None, factor: float | None):
        self.index, self.header, self.quantity, self.unit, self.factor = index, header, quantity, unit, factor


def _column(index: int, header: str, fixed_units: dict | None = None) -> Column:
    """What a header cell names: a quantity and its unit (either may be None)."""
    text = header.strip().lstrip("#").strip()
    low = text.lower()
    m = _SPLIT_UNIT.match(low)
    if m:
        name, unit = m.group(1).strip(), m.group(2).strip()
    else:
        name, unit = low, None
        parts = re.split(r"[\s_]+", low)
        if len(parts) > 1 and parts[-1] in _UNITS or (len(parts) > 1 and parts[-1] in _TIME_UNITS):
            name, unit = " ".join(parts[:-1]), parts[-1]
    key = re.sub(r"[^a-z0-9µ]", "", name)
    if unit is None and key in _UNITS:  # the header is the unit itself: 'W', 'mA', 'volts'
        quantity, factor = _UNITS[key]
        return Column(index, text, quantity, key, factor)
    if key in _TIME_NAMES:
        return Column(index, text, "time", unit, _TIME_UNITS.get(unit or "", None))
    quantity = _QUANTITIES.get(key)
    if quantity is None:
        return Column(index, text, None, unit, None)
    if unit is None and fixed_units and quantity in fixed_units:
        unit = fixed_units[quantity].lower()
    if unit is None:
        return Column(index, text, quantity, None, None)
    unit_key = unit.replace("μ", "µ").lower()
    if unit_key not in _UNITS or _UNITS[unit_key][0] != quantity:
        return Column(index, text, quantity, unit, float("nan"))  # a unit we do not know for this quantity
    return Column(index, text, quantity, unit, _UNITS[unit_key][1])


def _split(line: str, delimiter: str | None) -> list[str]:
    if delimiter is None:
        return line.split()
    try:
        return next(csv.reader([line], delimiter=delimiter))
    except csv.Error as exc:  # a field over csv's limit (131072 characters), a NUL: not a meter's line
        raise ValueError(str(exc)) from None


def _cells(line: str, delimiter: str | None, at: str) -> list[str]:
    """A header line's cells; one-line UsageError for a line no meter writes."""
    try:
        return _split(line, delimiter)
    except ValueError:
        raise UsageError(f"cannot read the power log's header: '{line[:80]}'", at, _LOG_FIX) from None


def _delimiter(header: str) -> str | None:
    for d in (",", ";", "\t"):
        if d in header:
            return d
    return None  # blank-separated (fnirsi_logger.py prints 'timestamp sample_in_packet voltage_V ...')


class _Layout:
    """The header's reading: where the time and the power (or voltage and current) are."""

    def __init__(self, where: str, line_no: int, header: str, voltage: float | None = None):
        self.where, self.line_no = where, line_no
        self.delimiter = _delimiter(header)
        cells = _cells(header, self.delimiter, f"{where}:{line_no}")
        names = tuple(re.sub(r"[^a-z]", "", c.lower()) for c in cells)  # 'Timestamp(ms)' -> 'timestampms'
        self.format, fixed = _KNOWN_FORMATS.get(names, (None, None))
        self.columns = [_column(i, c, fixed) for i, c in enumerate(cells)]
        at = f"{where}:{line_no}"
        if names == _OTII_HEADER:
            self.format = OTII_FORMAT
            self.columns[1] = _otii_value(Path(where).name, cells[1], at)
        self.time = next((c for c in self.columns if c.quantity == "time"), None)
        if self.time is None:
            shown = ", ".join(c.header for c in self.columns) or "none"
            raise UsageError(f"the power log's header has no time column (columns: {shown})", at, _LOG_FIX)
        by_q = {}
        for c in self.columns:
            if c.quantity in ("power", "voltage", "current") and c.quantity not in by_q:
                by_q[c.quantity] = c
        use = [by_q["power"]] if "power" in by_q else [by_q[q] for q in ("voltage", "current") if q in by_q]
        self.voltage = None
        if names[:2] == ("timestampms", "currentua") and not self.format:
            self.format = "Nordic Power Profiler export"
        if use and len(use) == 1 and use[0].quantity == "current":
            if voltage is None:
                what = ("the power log is a Nordic Power Profiler (PPK2) export: current only; the supply voltage "
                        "is not in it" if self.format == "Nordic Power Profiler export" else
                        f"the power log is Otii's export of its '{use[0].header.split(' (')[0]}' channel: current only; the "
                        "supply voltage is not in it" if self.format == OTII_FORMAT else
                        f"the power log has current ('{use[0].header}') but no voltage or power column")
                raise UsageError(what, at, "pass the voltage the board was supplied at with --power-log-voltage V "
                                           + ("(the Otii's main voltage), or export its 'Main power' channel"
                                              if self.format == OTII_FORMAT else "(the PPK2's source-mode voltage)"))
            self.voltage = voltage
        if not use or (len(use) == 1 and use[0].quantity == "voltage"):
            missing = "voltage" if "current" in by_q else "current" if "voltage" in by_q else None
            shown = ", ".join(c.header for c in self.columns)
            what = (f"the power log has a {use[0].quantity} column but no {missing} column (columns: {shown})"
                    if missing else f"the power log has no power column, nor voltage and current (columns: {shown})")
            raise UsageError(what, at, _LOG_FIX)
        for c in use:
            if c.factor is None:
                raise UsageError(f"the power log's column '{c.header}' has no unit", at,
                                 _UNIT_FIX.format(q=c.header, milli=_EXAMPLE_UNITS[c.quantity][0],
                                                  unit=_EXAMPLE_UNITS[c.quantity][1]))
            if math.isnan(c.factor):
                raise UsageError(f"the power log's column '{c.header}' has a unit edgetrain does not know", at,
                                 f"use one of W, mW, uW, V, mV, A, mA, uA in the header, e.g. '{c.quantity} (mA)'")
        self.use = use

    def watts(self, row: list[str]) -> float:
        w = 1.0 if self.voltage is None else self.voltage
        for c in self.use:
            w *= float(row[c.index]) * c.factor
        return w


def _otii_label(filename: str) -> str:
    """The channel an Otii export's file name names: 'Main power - Arc.csv' -> 'Main power'."""
    stem = filename[:-4] if filename.lower().endswith(".csv") else filename
    return stem.split(" - ", 1)[0].strip()


def _otii_named(path: Path) -> bool:
    """A file named as Otii names a channel's export: never a log a meter is still writing."""
    return " - " in path.name and _otii_label(path.name).lower() in _OTII_CHANNELS


def _otii_value(filename: str, header: str, at: str) -> Column:
    """The 'Value' column of an Otii export: its quantity and unit from the channel the file name names."""
    label = _otii_label(filename)
    quantity, unit = _OTII_CHANNELS.get(label.lower(), (None, None))
    if quantity is None:
        raise UsageError(f"the power log's column '{header}' has no unit: it is laid out as Otii's CSV export, which "
                         f"names its channel (and so the unit) only in the file name, and '{filename}' names none",
                         at, "keep the name Otii gives the file ('Main power - Arc.csv': power in W), or name the "
                             "unit in the header, e.g. 'Timestamp,power (W)'")
    if quantity not in ("power", "current"):
        raise UsageError(f"the power log is Otii's export of its '{label}' channel ({quantity}"
                         f"{', ' + unit if unit else ''}), which holds no power or current", at, _OTII_FIX)
    return Column(1, f"{label} ({unit})", quantity, unit, 1.0)


def _seconds(text: str, col: Column) -> tuple[float, str]:
    """(value, kind): kind 'unix' (seconds since 1970), 'day' (seconds since local midnight), 'relative'."""
    text = text.strip()
    if _ELAPSED.match(text):
        h, mi, s, ms = (int(x) for x in text.split(":"))
        return h * 3600 + mi * 60 + s + ms / 1000.0, "relative"
    m = _TOD.match(text)
    if m:
        h, mi, s = int(m.group(1)), int(m.group(2)), float(m.group(3))
        if h > 23 or mi > 59 or s >= 61:
            raise ValueError(text)
        return h * 3600 + mi * 60 + s, "day"
    try:
        t = float(text)
    except ValueError:
        d = datetime.fromisoformat(text.replace("Z", "+00:00"))
        return d.timestamp(), "unix"  # a naive time is this machine's local time, as a meter on it logs
    if col.factor is not None and col.factor != 1.0:
        t *= col.factor
        return t, "unix" if t > 1e8 else "relative"
    if t > 1e11:  # Unix milliseconds
        return t / 1000.0, "unix"
    return t, "unix" if t > 1e8 else "relative"  # before 1973: seconds from the start of the recording


# Characters read at a time: the pass holds one block's lines (and their readings) beyond the arrays.
_BLOCK = 1 << 18
# Where str.splitlines breaks a line: the lines are numbered as the whole text's splitlines numbers them.
_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"


def _open(path: Path):
    where = str(path)
    _regular(path)
    try:
        # newline="": the line breaks as written ('\r\n' is one break to splitlines), so the file's last
        # character says whether its last line is whole
        return open(path, encoding="utf-8-sig", newline="")
    except IsADirectoryError:
        raise UsageError("the power log is a folder", where, "give the meter's log file") from None
    except FileNotFoundError:
        raise UsageError("the power log does not exist", where,
                         "record the meter's log while the command runs and give its path") from None
    except OSError as exc:
        raise UsageError(f"cannot read the power log: {type(exc).__name__}", where, _LOG_FIX) from None


class _Lines:
    """A log's lines, as ``splitlines`` of its whole text numbers them, a block at a time: the whole text is
    never in memory. After the last block: ``count`` lines, the last one ``last``, and ``cut``, its number when
    it has no line break after it (a meter may be writing it now), else None."""

    def __init__(self, f):
        self.f, self.count, self.last, self.cut, self._end = f, 0, "", None, ""

    def blocks(self):
        carry = ""
        while True:
            text = self.f.read(_BLOCK)
            while text.endswith("\r"):  # a CR LF split between two reads is one break, as in the whole text
                more = self.f.read(1)
                if not more:
                    break
                text += more
            if not text:
                break
            self._end = text[-1]
            text = carry + text
            lines = text.splitlines()
            carry = "" if self._end in _BREAKS else lines.pop()
            if lines:
                self.count += len(lines)
                self.last = lines[-1]
                yield lines
        if carry:
            self.count += 1
            self.last = carry
            yield [carry]
        self.cut = self.count if self.count and self._end != "\n" else None

    def drain(self, blocks) -> None:
        for _ in blocks:
            pass


def _header_line(line: str, n: int, where: str) -> bool:
    """Whether line ``n`` is the header: the first non-blank line that names columns. A '#' line is a comment
    unless it is the header itself (the Joulescope UI writes '#time,current,...')."""
    s = line.strip()
    if not s:
        return False
    if s.startswith("#"):
        cells = _cells(s, _delimiter(s), f"{where}:{n}")
        return len(cells) > 1 and any(_column(j, c).quantity == "time" for j, c in enumerate(cells))
    return True


class _Pass:
    """The readings of a log's lines after its header, kept as float64 arrays as they are read."""

    def __init__(self, log: PowerLog, layout: _Layout, header_n: int):
        from array import array

        self.log, self.layout, self.where = log, layout, str(log.path)
        self.t, self.w = array("d"), array("d")
        self.first = header_n + 1  # the line of reading i is first + i + the lines skipped before it
        self.skips = array("q")  # for each blank or '#' line: how many readings came before it
        self.kind = None
        self.samples = False  # a non-blank line after the header (Otii's export holds one at least)
        self.pending = None  # (line, error): the block's last line did not read: an error unless it is cut short

    def line_of(self, i: int) -> int:
        import bisect

        return self.first + i + bisect.bisect_right(self.skips, i)

    def feed(self, lines: list[str], n0: int) -> None:
        """Lines ``n0``, ``n0 + 1``, ... of the log."""
        if self.pending is not None:
            raise self.pending[1]
        strip = [s.strip() for s in lines]
        keep = [s for s in strip if s and s[0] != "#"]
        if len(keep) != len(strip):
            self.samples = self.samples or any(strip)
            done = len(self.t)
            for s in strip:
                if s and s[0] != "#":
                    done += 1
                else:
                    self.skips.append(done)
        elif keep:
            self.samples = True
        got = self._fast(keep) if keep else None
        if got is not None:
            self.t.frombytes(got[0].tobytes())
            self.w.frombytes(got[1].tobytes())
            self.kind = got[2]
            return
        for j, s in enumerate(strip):
            if s and s[0] != "#":
                self._line(n0 + j, s, j == len(strip) - 1)

    def _fast(self, keep: list[str]):
        """The block's readings read at once, or None when any line needs reading alone: anything but plain
        numbers in a steady time kind is read line by line below, with its own message."""
        import numpy as np
        from operator import itemgetter

        lay, d = self.layout, self.layout.delimiter
        if d is None:
            rows = [s.split() for s in keep]
        else:
            # csv's reading of a line with no quote, no NUL and no field over its limit is str.split's
            joined, limit = "".join(keep), csv.field_size_limit()
            if '"' in joined or "\0" in joined or (len(joined) >= limit and max(map(len, keep)) >= limit):
                return None
            del joined
            rows = [s.split(d) for s in keep]
        try:
            t = np.fromiter(map(float, map(itemgetter(lay.time.index), rows)), np.float64, len(rows))
            cols = [np.fromiter(map(float, map(itemgetter(c.index), rows)), np.float64, len(rows)) for c in lay.use]
        except (ValueError, IndexError):
            return None
        del rows
        w = np.float64(1.0 if lay.voltage is None else lay.voltage)
        for c, v in zip(lay.use, cols):
            w = w * (v * c.factor)
        if not (np.isfinite(t).all() and np.isfinite(w).all()) or (w > MAX_WATTS).any():
            return None
        factor = lay.time.factor
        if factor is not None and factor != 1.0:
            t = t * factor
            unix = t > 1e8
        else:
            unix = t > 1e8
            ms = t > 1e11  # Unix milliseconds
            if ms.any():
                t = np.where(ms, t / 1000.0, t)
        n_unix = int(unix.sum())
        if 0 < n_unix < len(t):
            return None
        kind = "unix" if n_unix else "relative"
        if kind == "relative" and self.log.start is not None:
            t, kind = self.log.start + t, "placed"
        if kind != self.kind and (self.kind is not None or kind == "relative"):
            return None
        if kind == "unix" and not ((t >= _CLOCK_RANGE[0]).all() and (t <= _CLOCK_RANGE[1]).all()):
            return None
        return t, w, kind

    def _line(self, n: int, s: str, last: bool) -> None:
        """One line read alone, as every line was before the blocks: each refusal with its line."""
        layout, where, log = self.layout, self.where, self.log
        try:
            row = _split(s, layout.delimiter)
            t, k = _seconds(row[layout.time.index], layout.time)
            w = layout.watts(row)
        except (ValueError, IndexError):
            err = UsageError(f"cannot read the power log's line {n}: '{s[:80]}'", f"{where}:{n}", _LOG_FIX)
            if last:  # the block's last line: the log's last, cut short, is not a reading yet
                self.pending = (n, err)
                return
            raise err from None
        if k == "relative" and log.start is not None:  # time 0 of the recording is the clock time given
            t, k = log.start + t, "placed"
        if self.kind is None:
            self.kind = k
            if k == "relative":
                how = ("set the statistics recording's time format to UTC in the Joulescope UI, or pass"
                       if layout.format and "Joulescope" in layout.format else
                       "pass" if layout.format == OTII_FORMAT else  # the export has no other time format
                       "log clock times (Unix seconds or ISO 8601) rather than times from the start of the recording"
                       ", or pass")
                raise UsageError(f"the power log's times count from the start of its recording ('{row[layout.time.index]}'"
                                 f" in column '{layout.time.header}'), so they cannot be placed against the run",
                                 f"{where}:{n}", how + " the clock time its recording started with "
                                 "--power-log-start TIME (ISO 8601 or Unix seconds)")
        elif k != self.kind:
            raise UsageError(f"the power log's line {n} has a time of another kind than the lines before it",
                             f"{where}:{n}", "give one time format throughout")
        if not (math.isfinite(t) and math.isfinite(w)):
            raise UsageError(f"the power log's line {n} has an impossible value: '{s[:80]}'", f"{where}:{n}",
                             "give finite readings")
        if w > MAX_WATTS:
            raise UsageError(f"the power log's line {n} reads {w:.3g} W, more than any device edgetrain measures "
                             f"draws ({MAX_WATTS:.0f} W)", f"{where}:{n}",
                             "check the power column's unit in the header (mW logged under a 'W' header reads "
                             "1000x too high)")
        if k == "unix" and not _CLOCK_RANGE[0] <= t <= _CLOCK_RANGE[1]:
            raise UsageError(f"the power log's line {n} has the time '{row[layout.time.index].strip()[:40]}', "
                             "which is no clock time between 2000 and 2100 in Unix seconds or milliseconds",
                             f"{where}:{n}", "name the time unit in the header, e.g. 'timestamp (us)' or "
                             "'timestamp (ns)', or log Unix seconds or ISO 8601 times")
        self.t.append(t)
        self.w.append(w)


def parse_power_log(path, near: float | None = None, partial: bool = False) -> tuple[sensors.PowerSeries, dict]:
    """A meter's log -> (its readings in time order, what was read); one-line UsageError otherwise.

    The readings are a ``sensors.PowerSeries``: Unix times (s) and watts as float64 arrays (``.t``, ``.w``), and
    the sequence of (t, w) pairs. The log is read in one pass, a block of lines at a time: what it holds beyond
    the arrays is one block, whatever the log's size.

    ``path``: a file, or a ``PowerLog`` (with the supply voltage or start time its format leaves out).
    ``near``: a Unix time on the day of the run, for logs with the time of day alone (default: the log's
    modification time). ``partial``: the log may still be being written (fewer than two readings is fine).
    """
    log = as_log(path)
    where = str(log.path)
    key = _parse_key(log)
    kept = _parsed.get(key) if key is not None else None
    if kept is not None:
        readings, info, placed_near = kept
        if (info.get("time") != _TIME_KINDS["day"] or placed_near == near) and (partial or len(readings) >= 2):
            return readings, info  # the same file, unchanged since it was read: not read again
    f = _open(log.path)
    lines = _Lines(f)
    blocks = lines.blocks()
    got: dict = {}
    try:
        with f:
            try:
                out = _read(log, lines, blocks, near, partial, got)
                _parsed.clear()  # one log kept: the last one read
                if key is not None and out[1].get("format") is not None:
                    _parsed[key] = (out[0], out[1], near)
                return out
            except UsageError:
                # What the log was refused for when it was read whole first: a read error further on, or
                # an Otii export cut short
                lines.drain(blocks)
                if got.get("pass") is not None:
                    _whole_export(got["pass"], lines)
                raise
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read the power log: {type(exc).__name__}", where, _LOG_FIX) from None


# The last log read, by what identifies its content (path, what was given for it, size, modification time, inode):
# the check before the work and the read after it (profile, finetune, attribute) parse a log that has not changed
# since once, not once each. A log still being written changes its size and time, and is read again.
_parsed: dict = {}


def _parse_key(log: PowerLog):
    try:
        st = log.path.stat()
    except OSError:
        return None
    return (str(log.path.resolve()), log.voltage, log.start, st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _read(log: PowerLog, lines: _Lines, blocks, near, partial: bool, got: dict):
    import numpy as np

    path, where = log.path, str(log.path)
    run, written = None, False
    for block in blocks:
        n0 = lines.count - len(block) + 1
        if run is None:
            j = next((i for i, line in enumerate(block) if _header_line(line, n0 + i, where)), None)
            if j is None:
                written = written or any(line.strip() for line in block)
                continue
            layout = _Layout(where, n0 + j, block[j], log.voltage)
            run = _Pass(log, layout, n0 + j)
            if layout.format == OTII_FORMAT:
                got["pass"] = run
            block, n0 = block[j + 1:], n0 + j + 1
            if not block:
                continue
        run.feed(block, n0)
    if run is None:
        if partial and not written and not _otii_named(path):
            return sensors.PowerSeries([], []), {"format": None, "columns": [], "time": None}  # nothing written yet
        raise UsageError("the power log is empty", where, _LOG_FIX)
    layout = run.layout
    if layout.format == OTII_FORMAT:
        _whole_export(run, lines)
    if run.pending is not None and run.pending[0] != lines.cut:
        raise run.pending[1]
    kind = run.kind
    t, w = (np.frombuffer(a, dtype=np.float64) if len(a) else np.zeros(0) for a in (run.t, run.w))
    line_of = run.line_of
    negatives = _check_negatives(w, line_of, where)
    if kind == "day":
        _place_on_day(t, near if near is not None else path.stat().st_mtime)
    readings = _in_order(t, w, line_of, where)
    if len(readings) < 2 and not partial:
        raise UsageError(f"the power log has {len(readings)} reading(s)", where, "record at least two readings")
    info = {"format": layout.format or "CSV with units in its header",
            "columns": [c.header for c in layout.use], "time": _TIME_KINDS.get(kind, kind)}
    if negatives is not None:
        info["negative_readings"] = negatives
    if layout.voltage is not None:
        info["voltage_v"] = layout.voltage
        info["columns"] = info["columns"] + [f"{layout.voltage:g} V (given)"]
    return readings, info


# A meter's zero is not exact: a sleeping board's current reads a little below 0 (offset noise, Otii's Main
# current around 0). A reading down to -max(NOISE_FLOOR_W, NOISE_FRACTION x the log's peak) is that noise and is
# counted as measured, as read (not clamped: clamping would bias the idle figure up); the record says how many
# there were. Below it, or a log mostly below 0 (a shunt wired the wrong way round), is refused.
NOISE_FLOOR_W = 0.005
NOISE_FRACTION = 0.01


def _check_negatives(w, line_of, where: str) -> dict | None:
    """None when no reading is below 0; else what the log's negative readings were (within the noise), or a
    one-line UsageError for a reversed shunt or a negative reading beyond the meter's noise. ``w``: the watts in
    the log's order; ``line_of(i)``: the line of reading i."""
    import numpy as np

    count = sum(int(np.count_nonzero(w[a:a + sensors.CHUNK] < 0)) for a in range(0, len(w), sensors.CHUNK))
    if not count:
        return None
    if 2 * count > len(w):
        raise UsageError(f"the power log reads below 0 W in {count} of its {len(w)} readings: the current flowed "
                         "backwards through the meter", where, "connect the meter with its input to the supply and "
                         "its output to the board (or swap the shunt's leads), then record again")
    peak = float(w.max())
    floor = max(NOISE_FLOOR_W, NOISE_FRACTION * peak)
    i = int(np.argmin(w))  # the lowest, the first of equals: the one on the earliest line
    lowest, line = float(w[i]), line_of(i)
    if lowest < -floor:
        raise UsageError(f"the power log's line {line} reads {lowest:.3g} W, below the meter's zero by more than its "
                         f"noise ({floor:.3g} W: the larger of {NOISE_FLOOR_W * 1000:g} mW and "
                         f"{NOISE_FRACTION:.0%} of the log's peak {peak:.3g} W)", f"{where}:{line}",
                         "zero the meter (or check the current column's unit and the shunt's wiring) and record again")
    return {"count": count, "of": len(w), "lowest_w": lowest, "noise_floor_w": floor,
            "rule": f"readings down to -{floor:.3g} W (the larger of {NOISE_FLOOR_W * 1000:g} mW and "
                    f"{NOISE_FRACTION:.0%} of the log's peak) are the meter's offset noise, counted as read, not "
                    "clamped"}


_TIME_KINDS = {"unix": "clock", "day": "time of day", "placed": "from the recording's start (given)"}


def _whole_export(run: _Pass, lines: _Lines) -> None:
    """An export is written whole, after its recording, every line ending in a line break: one cut short or
    holding no sample is a file that did not arrive whole, refused now, not read as a meter still logging."""
    where = run.where
    if lines.cut is not None:
        raise UsageError(f"the power log ends inside its line {lines.cut} ('{lines.last.strip()[:40]}'): an Otii export "
                         "ends every line with a line break, so this one was cut short", f"{where}:{lines.cut}",
                         "export the channel from Otii again, or copy the whole file")
    if not run.samples:
        raise UsageError("the power log is an Otii export with no samples in it", where,
                         "export the recording that ran during the command (its 'Main power' channel) from Otii")


def _place_on_day(t, near: float) -> None:
    """Seconds since midnight -> Unix time on the day of ``near``, in place (the log may run past midnight)."""
    midnight = datetime.fromtimestamp(near).replace(hour=0, minute=0, second=0, microsecond=0)
    day, prev = 0, None
    for a in range(0, len(t), sensors.CHUNK):
        seconds = t[a:a + sensors.CHUNK].tolist()
        for i, s in enumerate(seconds):
            if prev is not None and s < prev - 12 * 3600:  # past midnight
                day += 1
            prev = s
            seconds[i] = (midnight + timedelta(days=day, seconds=s)).timestamp()
        t[a:a + len(seconds)] = seconds
    # A log that ended just before midnight and a run just after (or the reverse): the nearer day.
    if len(t) and abs(float(t[0]) - near) > 12 * 3600:
        t += -86400.0 if float(t[0]) > near else 86400.0


def _in_order(t, w, line_of, where: str) -> sensors.PowerSeries:
    """The readings in time order; a step back longer than ``BACKSTEP_PERIODS`` median periods is refused."""
    import numpy as np

    chunk = sensors.CHUNK
    if not any(bool((t[a + 1:b + 1] < t[a:b]).any())
               for a, b in ((a, min(a + chunk, len(t) - 1)) for a in range(0, len(t) - 1, chunk))):
        return sensors.PowerSeries(t, w)  # in order already (most logs): no step is held
    d = np.diff(t)
    back = np.flatnonzero(d < 0)
    back_d = d[back]
    up = sum(int(np.count_nonzero(d[a:a + chunk] > 0)) for a in range(0, len(d), chunk))
    period = 0.0
    if up:  # the median of the forward steps: they sort after every step that is not one
        k = len(d) - up + up // 2
        d.partition(k)
        period = float(d[k])
    del d
    far = back[back_d < -(BACKSTEP_PERIODS * period)]
    if len(far):
        i = int(far[0])
        raise UsageError(f"the power log's timestamps go back {float(t[i]) - float(t[i + 1]):.3g} s at line "
                         f"{line_of(i + 1)}", f"{where}:{line_of(i + 1)}",
                         "give one recording, in the order it was recorded")
    order = np.argsort(t, kind="stable")
    t = t[order]
    w = w[order]
    return sensors.PowerSeries(t, w)


def read_power_log(path, near: float | None = None) -> sensors.PowerSeries:
    """A meter's log -> its readings in time order (``parse_power_log``); one-line UsageError for anything
    unreadable."""
    return parse_power_log(path, near)[0]


def _regular(path: Path) -> None:
    """A FIFO or a device is refused before it is opened: reading one blocks until a writer comes (a FIFO)
    or never ends (/dev/zero), and what the check before the run reads is gone when the run's end reads it."""
    try:
        mode = path.stat().st_mode
    except OSError:
        return  # not there (or not reachable): the read says which
    if not stat.S_ISREG(mode) and not stat.S_ISDIR(mode):
        raise UsageError("the power log is not a regular file (a FIFO, a device or a socket)", str(path),
                         "have the meter's program write its log to a file and give that file's path")


def check_power_log(path, voltage: float | None = None, start: float | None = None) -> PowerLog:
    """Before any work: a folder or an unreadable file is refused; a log that exists already is read in
    full now, so an unknown format or a unitless column is refused before the run, not after it. Returns the
    log with the supply voltage and start time given for it (``PowerLog``), what later reads take."""
    log = _checked(path, voltage, start)
    if log.path.exists():
        parse_power_log(log, partial=True)
    return log


def read_meter_export(path, voltage: float | None = None, start: float | None = None,
                      near: float | None = None) -> tuple[PowerLog, tuple[sensors.PowerSeries, dict]]:
    """A meter's finished export, checked as ``check_power_log`` checks a log and read once, whole: the
    ``PowerLog`` and its ``parse_power_log`` (what ``log_record`` takes as ``parsed``). ``near``: as there."""
    log = _checked(path, voltage, start)
    return log, parse_power_log(log, near=near)


def _checked(path, voltage: float | None, start: float | None) -> PowerLog:
    """``path`` as a ``PowerLog`` with the voltage and start given for it; a folder, a FIFO or device, or an
    unreadable file refused in one line."""
    log = as_log(path)
    if voltage is not None or start is not None:
        log = PowerLog(log.path, voltage if voltage is not None else log.voltage,
                       start if start is not None else log.start)
    p = log.path
    if p.is_dir():
        raise UsageError("the power log is a folder", str(p), "give the meter's log file")
    _regular(p)
    if p.exists() and not os.access(p, os.R_OK):
        raise UsageError("the power log is not readable", str(p), "check its permissions")
    return log


# A window's energy is read from the readings inside it: with fewer than MIN_WINDOW_READINGS there, or a stretch
# of more than MAX_GAP_FRACTION of the window without one, the figure is mostly the line drawn between readings
# outside the work (one reading per 25 s gave 3.3x the figure of a log with readings inside the window). A stretch
# of up to GAP_PERIODS of the log's own median interval is the meter's rhythm (a 100 Hz logger's packets, over a
# window of a few periods), not a gap.
MIN_WINDOW_READINGS = 5
MAX_GAP_FRACTION = 0.2
GAP_PERIODS = 2
# A log whose power over the work is outside the board's idle-to-busy figures by more than this factor is in
# another unit than its header says (mW under a W header reads 1000x): refused, naming the likely unit.
PLAUSIBLE_FACTOR = 10.0
_PREFIXES = {"power": ["nW", "µW", "mW", "W", "kW"], "current": ["nA", "µA", "mA", "A", "kA"],
             "voltage": ["nV", "µV", "mV", "V", "kV"]}


def window_coverage(readings, window: tuple[float, float], period: float = 0.0) -> dict:
    """How the log's readings cover ``window``: how many are inside it (its ends included), the longest
    stretch of it without one (from the window's start to the first, between two, from the last to its end) and
    the longest allowed (``period``: the log's median interval)."""
    import numpy as np

    t0, t1 = window
    t = readings.t
    lo, hi = int(np.searchsorted(t, t0, "left")), int(np.searchsorted(t, t1, "right"))
    inside = t[lo:hi]
    if len(inside):
        gaps = [float(inside[0]) - t0, t1 - float(inside[-1])]
        if len(inside) > 1:
            gaps.append(float(np.max(np.diff(inside))))
        longest = max(gaps)
    else:
        longest = t1 - t0
    return {"readings": hi - lo, "longest_gap_s": longest, "seconds": t1 - t0,
            "max_gap_s": max(MAX_GAP_FRACTION * (t1 - t0), GAP_PERIODS * period),
            "rule": f"at least {MIN_WINDOW_READINGS} readings inside the window and no stretch without one longer "
                    f"than {MAX_GAP_FRACTION:.0%} of it (or {GAP_PERIODS} of the log's median intervals)"}


def _check_coverage(readings, window: tuple[float, float], period: float, where: str) -> dict:
    cov = window_coverage(readings, window, period)
    n, gap, seconds = cov["readings"], cov["longest_gap_s"], cov["seconds"]
    if n >= MIN_WINDOW_READINGS and gap <= cov["max_gap_s"]:
        return cov
    why = (f"{n} reading(s) inside it" if n < MIN_WINDOW_READINGS else
           f"{gap:.3g} s of it ({gap / seconds:.0%}) without a reading")
    raise UsageError(f"the power log cannot measure the {seconds:.3g} s window {_clock(window[0])} to "
                     f"{_clock(window[1])}: {why} (a window needs {cov['rule']}; else its energy is mostly "
                     "interpolated between readings outside the work)", where,
                     f"log at least one reading every {cov['max_gap_s']:.3g} s without pauses during the run (a "
                     "faster meter rate), or measure a longer run")


def _units_of(headers: list[str]) -> list[tuple[str, float]]:
    """(quantity, factor to SI) of each power, voltage or current column ``parse_power_log`` read, from the headers
    it reports ('Power (W)', 'current_A', "Main power (W)", 'power' of a format whose units are SI)."""
    out = []
    for header in headers:
        low = header.strip().lower()
        m = _SPLIT_UNIT.match(low)
        unit = m.group(2).strip() if m else re.split(r"[\s_]+", low)[-1]
        known = _UNITS.get(unit.replace("μ", "µ").replace("u", "µ") if unit[:1] == "u" else unit)
        if known is None and low in _QUANTITIES:
            known = (_QUANTITIES[low], 1.0)
        if known is not None:
            out.append(known)
    return out


def _check_plausible(readings, window: tuple[float, float], board_w: tuple[float, float], info: dict,
                     where: str) -> None:
    """The work's median power within the board's idle-to-busy figures, give or take PLAUSIBLE_FACTOR."""
    import numpy as np

    t = readings.t
    lo, hi = int(np.searchsorted(t, window[0], "left")), int(np.searchsorted(t, window[1], "right"))
    if hi <= lo:
        return
    median = float(np.median(readings.w[lo:hi]))
    idle, busy = float(board_w[0]), float(board_w[1])
    low, high = idle / PLAUSIBLE_FACTOR, busy * PLAUSIBLE_FACTOR
    if low <= median <= high:
        return
    guess = "another unit than its header says, or not the board's supply"
    if median > 0:
        shift = round(math.log10(median / math.sqrt(idle * busy)) / 3) or (1 if median > high else -1)  # 1000^shift
        likely = []
        for quantity, factor in _units_of(info.get("columns") or []):
            names = _PREFIXES[quantity]
            said = 3 + round(math.log10(factor) / 3)  # its place in names: W, mW... (watts: W)
            if 0 <= said - shift < len(names):
                likely.append(f"{names[said - shift]} under a header saying {names[said]}")
        if likely:
            guess = " or ".join(likely)
    raise UsageError(f"the power log reads {median:.4g} W (median over the run's window), outside the board's "
                     f"{idle:g}-{busy:g} W (idle to busy) by more than {PLAUSIBLE_FACTOR:g}x: its figures look like "
                     f"{guess}", where,
                     "write the unit the meter logs in the log's header (e.g. 'power (mW)'), or check the "
                     "device profile (--device) is the board the meter measured")


def log_record(path, window: tuple[float, float], idle_window: tuple[float, float] | None = None,
               parsed: tuple[sensors.PowerSeries, dict] | None = None,
               board_w: tuple[float, float] | None = None) -> dict:
    """The measured record of ``window`` (and its idle) from a meter's log; UsageError if not covered, with too
    few readings inside it or a gap in it (``MIN_WINDOW_READINGS``, ``MAX_GAP_FRACTION``), or (``board_w``: the
    device's idle and busy watts) with figures no such board draws.
    ``parsed``: the log's ``parse_power_log`` when the caller has read it already (one read for many windows)."""
    import numpy as np

    readings, info = parsed if parsed is not None else parse_power_log(path, near=window[0])
    first, last = float(readings.t[0]), float(readings.t[-1])
    if first > window[0] or last < window[1]:
        raise UsageError(f"the power log covers {_clock(first)} to {_clock(last)} but the run's measured window was "
                         f"{_clock(window[0])} to {_clock(window[1])}", str(path),
                         "keep the meter logging from before the command starts until it ends, and check that "
                         "the meter's clock and this machine's agree")
    if idle_window and (first > idle_window[0] or last < idle_window[1]):
        idle_window = None
    intervals = np.diff(readings.t)
    median = 0.0
    if len(intervals):
        intervals.partition(len(intervals) // 2)
        median = float(intervals[len(intervals) // 2])
    del intervals
    coverage = _check_coverage(readings, window, median, str(path))
    if board_w is not None:
        _check_plausible(readings, window, board_w, info, str(path))
    rec = sensors.summarise(readings, idle_window, window, "power-log",
                            f"external power meter log {as_log(path).name} ({len(readings)} readings; {info['format']}, "
                            f"{' x '.join(info['columns'])}, {info['time']} times)", 1.0 / median if median > 0 else None,
                            resolution=log_resolution(readings.w))
    rec["log_format"] = info
    rec["coverage"] = coverage
    neg = info.get("negative_readings")
    if neg:
        rec["note"] = "; ".join(x for x in (rec.get("note"), (
            f"{neg['count']} of the log's {neg['of']} readings are below 0 W (down to {neg['lowest_w']:.3g} W): the "
            f"meter's offset noise, counted as read") ) if x)
    rec["instrument"] = f"meter log {as_log(path).name}"
    return rec


def log_resolution(watts) -> tuple[float | None, str]:
    """The log's step: the smallest difference between two of its power values (a meter's display and export
    round to a fixed step; a V x I log's products do not, and this is then a lower bound on the step)."""
    import numpy as np

    values = np.sort(np.asarray(watts, dtype=np.float64))
    step = None
    for a in range(0, len(values) - 1, sensors.CHUNK):
        b = min(a + sensors.CHUNK, len(values) - 1)
        d = values[a + 1:b + 1] - values[a:b]
        d = d[d > 1e-12]  # equal values (and 0 beside -0) are no step
        if len(d):
            step = float(d.min()) if step is None else min(step, float(d.min()))
    if step is None:
        return None, "every reading in the log is the same value: its step cannot be seen"
    return step, "the smallest step between the log's power values (the meter's resolution is not in the log)"


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
