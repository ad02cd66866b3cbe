"""Energy from time and a device's power figures (modelled), or from RAPL counters (measured).

Modelled energy is latency x the profile's cited board power: the total (the board drawing its
full-load power while busy) and the idle-subtracted share (what the work costs on top of the board
being on), as MLPerf Power reports it: mean latency x average power. The load figure in the bundled
profiles is all cores busy, so with fewer threads it is an upper bound; every figure says so in its
``source``.

RAPL (Linux powercap, /sys/class/powercap/intel-rapl*/energy_uj) measures this host's CPU package
energy; it says nothing about a Raspberry Pi, so it is reported apart, labelled measured, host only.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from .errors import UsageError

POWERCAP = Path("/sys/class/powercap")
SECONDS_PER_DAY = 86400.0
# One top-level package zone per socket: intel-rapl:0, intel-rapl:1 (sub-zones like intel-rapl:0:0 are
# parts of the package and would count twice).
_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*/\s*h(?:our)?\s*$", re.IGNORECASE)


def energy_for_duration(seconds: float, profile) -> dict:
    """Joules spent by ``profile``'s board running flat out for ``seconds``, labelled modelled.

    Total uses the full-load board power; the idle-subtracted figure is what the work itself costs
    on top of the board being on.
    """
    load = profile.power.load_w.value
    idle = profile.power.idle_w.value
    return {
        "joules": seconds * load,
        "joules_above_idle": seconds * (load - idle),
        "seconds": seconds,
        "power_w": load,
        "idle_w": idle,
        "provenance": "modelled",
        "source": f"time x {profile.name} full-load power {load} W ({profile.power.load_w.source})",
    }


# --- input checks -------------------------------------------------------------------------------------

def parse_rate(text) -> float:
    """'120/h' -> 120.0 inferences per hour."""
    if text is None:
        return None
    m = _RATE.match(str(text))
    if not m:
        raise UsageError(f"cannot read rate '{text}'", "--rate", "write inferences per hour as N/h, e.g. 120/h")
    rate = float(m.group(1))
    if rate <= 0:
        raise UsageError(f"rate must be more than zero, got '{text}'", "--rate", "give at least one inference per hour")
    return rate


def check_positive(value, where: str, unit: str):
    if value is None:
        return None
    if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
        raise UsageError(f"{where} must be more than zero, got {value}", where, f"give a positive number of {unit}")
    return float(value)


# --- modelled energy ----------------------------------------------------------------------------------

def energy_per_inference(latency_ms: float, profile, latency_label: str = "measured",
                         latency_source: str = "") -> dict:
    """Energy of one inference on ``profile``'s board: total and above idle, in mJ (modelled)."""
    load = profile.power.load_w
    idle = profile.power.idle_w
    seconds = latency_ms / 1000.0
    return {
        "total_mj": seconds * load.value * 1000.0,
        "above_idle_mj": seconds * (load.value - idle.value) * 1000.0,
        "latency_ms": latency_ms,
        "load_w": load.value,
        "idle_w": idle.value,
        "provenance": "modelled",
        "source": (f"mean latency {latency_ms:.3g} ms ({latency_label}{': ' + latency_source if latency_source else ''})"
                   f" x {profile.name} full-load power {load.value} W [{load.kind}: {_short(load.source)}]; "
                   f"idle {idle.value} W [{idle.kind}: {_short(idle.source)}]; full-load power is all cores "
                   "busy, so with fewer threads this is an upper bound"),
    }


def daily_budget(latency_ms: float, profile, rate_per_h: float, battery_wh: float | None = None) -> dict:
    """A day at ``rate_per_h`` inferences per hour: busy at load power, idle power in between."""
    load, idle = profile.power.load_w.value, profile.power.idle_w.value
    per_day = rate_per_h * 24.0
    busy_s = per_day * latency_ms / 1000.0
    keeps_up = busy_s <= SECONDS_PER_DAY
    busy_s = min(busy_s, SECONDS_PER_DAY)
    idle_s = SECONDS_PER_DAY - busy_s
    joules = busy_s * load + idle_s * idle
    wh = joules / 3600.0
    avg_w = joules / SECONDS_PER_DAY
    out = {
        "rate_per_h": rate_per_h,
        "inferences_per_day": per_day,
        "busy_s_per_day": busy_s,
        "idle_s_per_day": idle_s,
        "energy_wh_per_day": wh,
        "busy_wh_per_day": busy_s * load / 3600.0,
        "idle_wh_per_day": idle_s * idle / 3600.0,
        "average_power_w": avg_w,
        "inferences_per_wh": (per_day / wh) if keeps_up else None,
        "keeps_up": keeps_up,
        "hourly_wh": [wh / 24.0] * 24,
        "provenance": "modelled",
        "source": (f"{per_day:g} inferences/day x {latency_ms:.3g} ms at {load} W + the rest of the day idle "
                   f"at {idle} W ({profile.name})"),
    }
    if not keeps_up:
        out["note"] = (f"at {rate_per_h:g}/h the device would need {per_day * latency_ms / 1000 / 3600:.1f} h "
                       "of compute per day: it cannot keep up; the figures assume it runs flat out all day")
    if battery_wh is not None:
        hours = battery_wh / avg_w
        out["battery_wh"] = battery_wh
        out["battery_hours"] = hours
        out["battery_days"] = hours / 24.0
    return out


def budget_verdict(energy_mj: float, budget_mj: float, provenance: str) -> dict:
    return {"budget_mj": budget_mj, "energy_mj": energy_mj, "passed": energy_mj <= budget_mj,
            "margin_mj": budget_mj - energy_mj, "provenance": provenance,
            "source": "total energy per inference (modelled) compared with --budget-mj"}


def energy_report(latency_ms: float, profile, battery_wh: float | None = None, rate_per_h: float | None = None,
                  budget_mj: float | None = None, latency_label: str = "measured", latency_source: str = "") -> dict:
    """The energy-budget report for a model whose mean latency on ``profile``'s device is ``latency_ms``.

    Used by ``profile`` and at the end of ``export``. ``latency_label`` says how the latency was
    obtained (measured / estimated / emulated); it is carried into every figure's source. ``rate_per_h``
    may be a number or text like '120/h'. The result's ``budget.passed`` is False when over
    ``budget_mj``; the caller turns that into exit 3.
    """
    if isinstance(rate_per_h, str):
        rate_per_h = parse_rate(rate_per_h)
    battery_wh = check_positive(battery_wh, "--battery-wh", "watt-hours")
    budget_mj = check_positive(budget_mj, "--budget-mj", "millijoules")
    per_inf = energy_per_inference(latency_ms, profile, latency_label, latency_source)
    report = {"device": profile.name, "latency_ms": latency_ms, "latency_provenance": latency_label,
              "per_inference": per_inf,
              "inferences_per_wh_busy": 3600.0 / (per_inf["total_mj"] / 1000.0) if per_inf["total_mj"] else None}
    if rate_per_h is not None:
        report["daily"] = daily_budget(latency_ms, profile, rate_per_h, battery_wh)
    elif battery_wh is not None:
        # Without a rate the only honest battery figure is flat-out inference.
        hours = battery_wh / profile.power.load_w.value
        report["continuous"] = {"battery_wh": battery_wh, "battery_hours": hours,
                                "inferences": hours * 3600.0 * 1000.0 / latency_ms,
                                "provenance": "modelled",
                                "source": f"battery {battery_wh} Wh / full-load power {profile.power.load_w.value} W"}
    if budget_mj is not None:
        report["budget"] = budget_verdict(per_inf["total_mj"], budget_mj, "modelled")
    return report


def _short(text: str, n: int = 110) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


# --- RAPL (measured, this host only) ------------------------------------------------------------------

def read_rapl(root: Path = POWERCAP) -> dict | None:
    """Package energy counters in microjoules, or None where RAPL is absent or not readable."""
    try:
        zones = sorted(p for p in Path(root).iterdir() if _PACKAGE_ZONE.match(p.name))
    except OSError:
        return None
    domains, ranges = {}, {}
    for zone in zones:
        try:
            domains[zone.name] = int((zone / "energy_uj").read_text().strip())
        except (OSError, ValueError):
            return None  # unreadable (since Linux 5.10 root-only): no partial measurement
        try:
            ranges[zone.name] = int((zone / "max_energy_range_uj").read_text().strip())
        except (OSError, ValueError):
            ranges[zone.name] = None
    if not domains:
        return None
    return {"domains": domains, "max_range_uj": ranges}


def rapl_delta_j(start: dict, end: dict) -> float | None:
    """Joules between two ``read_rapl`` readings, allowing for one counter wrap-around per zone."""
    total = 0
    for name, a in start["domains"].items():
        b = end["domains"].get(name)
        if b is None:
            return None
        if b < a:
            span = start["max_range_uj"].get(name)
            if not span:
                return None
            b += span
        total += b - a
    return total / 1e6


def rapl_per_inference(rapl: dict, runs: int, idle_w: float | None = None) -> dict:
    """Measured host energy per inference from a child's RAPL reading over its timed runs."""
    joules = rapl["joules"] / runs
    out = {"total_mj": joules * 1000.0, "average_power_w": rapl["joules"] / rapl["seconds"] if rapl["seconds"] else None,
           "provenance": "measured",
           "source": f"RAPL package energy ({', '.join(rapl['domains'])}) over {runs} timed runs on this host; "
                     "host CPU package only, not the target device"}
    return out
