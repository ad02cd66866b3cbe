"""Calibration: a board's own sensor fitted to an external meter that logged the same stretch of time.

A board sensor misses what sits before it (the Pi 5 PMIC reads the rails after the converters: the 5 V input
and the conversion losses are not in its figure). A USB meter at the input sees them. Recorded together, the
meter's power against the sensor's at the meter's timestamps (the sensor's samples interpolated there) gives a
line, fitted by least squares over the overlapping samples:

    meter W = gain x sensor W + offset W      (residual: the RMS of what the line does not explain)

``calibrate`` (the CLI: ``edgetrain energy calibrate METER_LOG``) records it (the sensor sampled while this
process alternates idle and busy, so the fit has a spread of power to stand on) and writes it, atomically, to
the calibration file: ``default_path()`` ($XDG_CONFIG_HOME/edgetrain/power-calibration.json) unless the user
names another. Every later measurement by that sensor is read through the line from the file
``EDGETRAIN_POWER_CALIBRATION`` names (unset: the default file, if there is one; empty: none), says so in its
record (``calibration``, and "calibrated" in the instrument a human reads) and adds the fit's standard error
to its uncertainty.
"""
from __future__ import annotations

import json
import math
import time
from datetime import datetime, timezone
from pathlib import Path

from .. import envvars
from ..errors import UsageError
from ..fileio import atomic_write_text, parse_json
from . import sensors

ENV = "EDGETRAIN_POWER_CALIBRATION"
MIN_POINTS = 10
# A sensor reading a thousand times low (mW taken for W) is fitted with gain 1000; a million is an edited file.
MAX_GAIN = 1e6
FORMAT = "edgetrain-power-calibration/1"
_LOAD_FIX = (f"give a file written by `edgetrain energy calibrate`, or set {ENV}= (empty) to read the sensor "
             "uncalibrated")


def fit(sensor, meter) -> dict:
    """The least-squares line of the meter's watts against the sensor's, over the time both cover. Each is a
    sequence of (t, W) pairs in time order, or a ``sensors.PowerSeries`` (a meter's log as ``read_power_log``
    gives it: its readings are taken as arrays, not one by one)."""
    import numpy as np

    if len(sensor) < 2 or len(meter) < 2:
        raise UsageError("too few readings to fit the sensor to the meter", "calibration",
                         "record at least a few seconds with both the sensor and the meter")
    (st, sw), (mt, mw) = _columns(sensor), _columns(meter)
    t0, t1 = max(float(st[0]), float(mt[0])), min(float(st[-1]), float(mt[-1]))
    if t0 > t1:
        raise UsageError(f"the meter's log ({_clock(mt[0])} to {_clock(mt[-1])}) and the sensor's "
                         f"sampling ({_clock(st[0])} to {_clock(st[-1])}) do not overlap", "calibration",
                         "give the log the meter is writing while the calibration runs, its clock set to this "
                         "machine's")
    inside = (mt >= t0) & (mt <= t1)
    x, y = _at(st, sw, mt[inside]), mw[inside]
    if len(x) < MIN_POINTS:
        raise UsageError(f"the sensor and the meter overlap in {len(x)} meter readings (need {MIN_POINTS})",
                         "calibration", "keep the meter logging for the whole calibration, its clock set to this "
                         "machine's")
    n = len(x)
    mx, my = float(x.sum()) / n, float(y.sum()) / n
    sxx = float(np.sum((x - mx) ** 2))
    if sxx <= 0:
        raise UsageError("the sensor read the same power throughout: a line cannot be fitted", "calibration",
                         "calibrate while the load changes (calibrate() alternates idle and busy)")
    gain = float(np.sum((x - mx) * (y - my))) / sxx
    if not gain > 0:
        raise UsageError(f"the meter's watts fall as the sensor's rise (gain {gain:.3g}): they do not measure the same "
                         "supply", "calibration", "log the meter on the supply of the board whose sensor is calibrated")
    offset = my - gain * mx
    resid = math.sqrt(float(np.sum((y - gain * x - offset) ** 2)) / max(n - 2, 1))
    syy = float(np.sum((y - my) ** 2))
    return {"gain": gain, "offset_w": offset, "residual_w": resid, "points": n,
            "r2": 1 - resid ** 2 * max(n - 2, 1) / syy if syy > 0 else None,
            "sensor_range_w": [float(x.min()), float(x.max())], "window": [t0, t1]}


def _columns(pairs):
    """(times, watts) float64 arrays of (t, W) pairs or of a ``PowerSeries``."""
    import numpy as np

    if isinstance(pairs, sensors.PowerSeries):
        return pairs.t, pairs.w
    a = np.asarray([(t, w) for t, w in pairs], dtype=np.float64).reshape(-1, 2)
    return a[:, 0], a[:, 1]


def _clock(t: float) -> str:
    return datetime.fromtimestamp(t).strftime("%H:%M:%S.%f")[:-3]


def default_path() -> Path:
    """Where ``edgetrain energy calibrate`` writes the fit and later runs look for it."""
    base = envvars.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "edgetrain" / "power-calibration.json"


def in_force() -> str | None:
    """The calibration file later measurements are read through: ``EDGETRAIN_POWER_CALIBRATION`` if set
    (empty: none), else the default file if it exists."""
    path = envvars.get(ENV)
    if path is not None:
        return path or None
    default = default_path()
    return str(default) if default.is_file() else None


def _at(times, watts, t):
    """The sensor's watts at the times ``t``, linearly between the samples either side."""
    import numpy as np

    i = np.clip(np.searchsorted(times, t, "left"), 1, len(times) - 1)
    ta, tb, wa, wb = times[i - 1], times[i], watts[i - 1], watts[i]
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(tb == ta, wa, wa + (wb - wa) * (t - ta) / (tb - ta))


def save(path, line: dict, source: sensors.Source, meter_log: str) -> dict:
    doc = {"format": FORMAT, "source": source.name, "instrument": source.label(), "meter_log": Path(meter_log).name,
           "fitted_at": datetime.now(timezone.utc).isoformat(timespec="seconds"), **line,
           "method": "least squares, meter W = gain x sensor W + offset W, over the overlapping meter readings"}
    atomic_write_text(Path(path), json.dumps(doc, indent=2) + "\n", "calibration")
    return {**doc, "file": str(path)}


def load(path) -> dict:
    p = Path(path)
    try:
        doc = parse_json(p.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read the power calibration ({exc.__class__.__name__})", str(p),
                         _LOAD_FIX) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not all(
            isinstance(doc.get(k), (int, float)) for k in ("gain", "offset_w", "residual_w", "points")):
        raise UsageError("not an edgetrain power calibration", str(p),
                         _LOAD_FIX)
    why = _unusable(doc)
    if why:
        raise UsageError(f"the power calibration {why} (edited?)", str(p), _LOAD_FIX)
    return doc


def _unusable(doc: dict) -> str | None:
    """Why a calibration's line cannot be read through (what ``fit`` never writes), or None."""
    from . import meterlog

    def number(k):
        v = doc.get(k)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None

    gain, offset, resid, points = (number(k) for k in ("gain", "offset_w", "residual_w", "points"))
    if gain is None or not 0 < gain <= MAX_GAIN:
        return f"has gain {doc.get('gain')!r}: a meter's watts rise with the sensor's, at most {MAX_GAIN:g} times"
    if offset is None or resid is None or resid < 0 or max(abs(offset), resid) > meterlog.MAX_WATTS:
        return (f"has offset {doc.get('offset_w')!r} W and residual {doc.get('residual_w')!r} W: each within "
                f"{meterlog.MAX_WATTS:g} W, the residual >= 0")
    if points is None or points != int(points) or not MIN_POINTS <= points <= 1e9:
        return f"was fitted over {doc.get('points')!r} readings: a whole number from {MIN_POINTS} to 10^9"
    if not all(isinstance(doc.get(k), str) for k in ("meter_log", "fitted_at")):
        return "does not name its meter log and when it was fitted"
    return None


class Calibrated(sensors.Source):
    """A source read through a calibration line: the total is the meter's figure the line predicts."""

    def __init__(self, source: sensors.Source, cal: dict, path: str):
        self.source, self.cal, self.path = source, cal, path
        self.name, self.rate_hz = source.name, source.rate_hz
        self.inputs = getattr(source, "inputs", None)

    @property
    def covers(self) -> str:
        c = self.cal
        return (f"{self.source.covers}; CALIBRATED against {c['meter_log']} ({self.path}, fitted {c['fitted_at']}): "
                f"W = {c['gain']:.4g} x sensor + {c['offset_w']:.3g} W, residual {c['residual_w']:.3g} W over "
                f"{c['points']} readings")

    def read(self) -> sensors.Reading:
        r = self.source.read()
        return sensors.Reading(self.cal["gain"] * r.total_w + self.cal["offset_w"], r.rails)

    def label(self) -> str:
        return self.source.label() + " calibrated"

    def close(self) -> None:
        self.source.close()

    def resolution(self):
        q, how = self.source.resolution()
        return (None if q is None else abs(self.cal["gain"]) * q), how

    def record(self) -> dict:
        """What a measured record says about the calibration it was read through."""
        return {"file": self.path, **{k: self.cal[k] for k in ("gain", "offset_w", "residual_w", "points",
                                                                "meter_log", "fitted_at")},
                "standard_error_w": self.cal["residual_w"] / math.sqrt(max(self.cal["points"], 1))}


def apply(source: sensors.Source | None) -> sensors.Source | None:
    """``source`` read through the calibration in force (``in_force``), if any."""
    path = in_force() if source is not None else None
    if not path:
        return source
    cal = load(path)
    if cal.get("source") != source.name:
        raise UsageError(f"the power calibration is for the {cal.get('source')} sensor but this board's is "
                         f"{source.name}", path, f"calibrate this board's sensor (`edgetrain energy calibrate`), "
                         f"or set {ENV}= (empty) to read it uncalibrated")
    return Calibrated(source, cal, path)


def detect(root=None, vcgencmd: str | None = None) -> sensors.Source | None:
    """The board's power source, read through the user's calibration if ``EDGETRAIN_POWER_CALIBRATION`` names
    one: what every measurement uses (the fit itself samples the raw ``sensors.detect``)."""
    return apply(sensors.detect(root, vcgencmd))


def calibrate(power_log, out=None, seconds: float = 30.0, source: sensors.Source | None = None,
              phase_s: float = 2.0) -> dict:
    """Sample the board's sensor for ``seconds`` while this process alternates idle and busy ``phase_s`` each,
    then fit it to the meter's log of the same time (``power_log``, still being written is fine) and write the
    calibration to ``out`` (default: ``default_path()``, where later runs find it). Returns the calibration."""
    from . import meterlog

    meterlog.check_power_log(power_log)  # an unreadable log is refused before the sampling, not after it
    src = source or sensors.detect()
    if src is None:
        raise UsageError("no board power sensor to calibrate", "calibrate",
                         "run on the board (Pi 5 PMIC, Jetson INA3221, hwmon power sensor)")
    if isinstance(src, Calibrated):
        src = src.source
    sampler = sensors.Sampler(src).start()
    end = time.time() + seconds
    while time.time() < end:
        phase_end = min(end, time.time() + phase_s)
        if int(time.time() / phase_s) % 2:
            while time.time() < phase_end:  # busy: one core spinning
                pass
        else:
            time.sleep(max(0.0, phase_end - time.time()))
    samples = sampler.stop()
    meter = meterlog.read_power_log(power_log, near=samples[0][0])
    line = fit([(t, w) for t, w, _ in samples], meter)
    if out is None:  # where later runs read it: the file EDGETRAIN_POWER_CALIBRATION names, else the default
        out = Path(envvars.get(ENV) or default_path())
        out.parent.mkdir(parents=True, exist_ok=True)
    return save(out, line, src, str(power_log))
