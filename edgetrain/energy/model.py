"""Energy: measured on the board where a sensor or a meter log exists (``sensors``), RAPL on an x86 host,
and modelled from a device profile's cited power figures where nothing measures.

Modelled energy per inference is the p50 latency (the median: one stalled run out of a hundred does not
move it, where it moves the mean) x the board's power at the number of cores the run kept busy:

    P(threads) = idle + (load - idle) x min(threads, cores) / cores

a straight line from the profile's idle figure (no core busy) to its full-load figure (every core busy,
``stress --cpu N`` in the cited measurements). CPU dynamic power grows roughly with the number of busy
cores at a fixed clock; the line ignores the uncore and memory share that a first busy core switches on,
so with few threads it is a lower bound on the busy share and the full-load figure an upper bound. The
spread shows the same figure at the p10 and p90 latency. When the host was busy while it was measured
(1-minute load average above its usable cores, or p99/p50 above ``UNSTEADY_SPREAD``), the latency and
so the modelled energy are flagged unreliable.

Measured figures (``measured_per_inference``) come from a ``power`` record: joules over a window that
holds the timed runs (extended with untimed inferences until it spans enough sample periods), divided
by the inferences in it, with the idle draw measured just before.

RAPL (Linux powercap, /sys/class/powercap/intel-rapl*/energy_uj) measures this host's CPU package
energy; it says nothing about a Raspberry Pi, so it is reported apart, labelled measured, host only.
"""
from __future__ import annotations

import math
import re
import time
from contextlib import contextmanager
from pathlib import Path

from . import calibration, meterlog, sensors, uncertainty
from .record import DEVICE, HOST, EnergyRecord
from ..cputime import cpu_seconds
from ..errors import UsageError
from ..host import detect_host

POWERCAP = Path("/sys/class/powercap")
SECONDS_PER_DAY = 86400.0
# One top-level package zone per socket: intel-rapl:0, intel-rapl:1 (sub-zones like intel-rapl:0:0 are
# parts of the package and would count twice).
_PACKAGE_ZONE = re.compile(r"^intel-rapl:\d+$")
_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*/\s*h(?:our)?\s*$", re.IGNORECASE)


UNSTEADY_SPREAD = 3.0  # p99/p50 above this: runs were interrupted (a quiet host measures 1.1-2)


def busy_power(profile, threads: int | None = None) -> tuple[float, str]:
    """The board's power with ``threads`` cores busy: idle -> full load, in proportion to the busy cores.

    ``threads`` None (or at least the core count) is the full-load figure. Returns (watts, how).
    """
    load, idle, cores = profile.power.load_w.value, profile.power.idle_w.value, max(int(profile.cores), 1)
    if threads is None or threads >= cores:
        return load, f"full-load power {load} W (all {cores} cores busy)"
    busy = max(int(threads), 1)
    watts = idle + (load - idle) * busy / cores
    return watts, (f"power with {busy} of {cores} cores busy {watts:.3g} W = idle {idle} W + (full load {load} W "
                   f"- idle) x {busy}/{cores}")


def power_range(profile, threads: int | None) -> tuple[float, float, str]:
    """(low W, high W, how): the power a busy run may draw, from the profile's cited figures."""
    line, _ = busy_power(profile, threads)
    load, idle = profile.power.load_w, profile.power.idle_w
    high = load.value
    low = line
    how = (f"from the idle-to-full-load line for the busy cores ({line:.3g} W) to full load ({high:g} W, "
           f"{load.kind})")
    if load.kind == "rated":
        low = idle.value
        how = (f"from idle ({idle.value:g} W, {idle.kind}) to the rated {high:g} W budget (a cap, not a draw)")
    elif low >= high:
        how = (f"full load {high:g} W ({load.kind}); the profile cites one figure, not a range: its own error is not "
               "in the interval")
    return low, high, how


def energy_for_duration(seconds: float, profile, threads: int | None = None, speed: dict | None = None,
                        cpu_seconds: float | None = None) -> dict:
    """Joules spent by ``profile``'s board busy on ``threads`` cores for ``seconds``, labelled modelled.

    ``speed``: the device's speed against the host that timed the work (``measure.device_speed``: its ``factor``,
    how profile scales a latency). With ``cpu_seconds`` (the work's CPU time on this host, every thread's) and a
    factor in CPU time, the device takes ``cpu_seconds`` x factor, spread over its busy threads: from that / the
    threads (all of them busy all the time) to that (one at a time), the figure at the middle of the two; else
    ``seconds`` x factor. Total uses the busy power (``busy_power``); the idle-subtracted figure is what the work
    itself costs on top of the board being on.
    """
    watts, how = busy_power(profile, threads)
    idle = profile.power.idle_w.value
    low_w, high_w, range_how = power_range(profile, threads)
    factor = (speed or {}).get("factor") or 1.0
    on_cpu = speed is not None and speed.get("basis") == "cpu" and cpu_seconds is not None
    busy = max(min(int(threads or 1), int(profile.cores)), 1)
    if on_cpu:
        most = cpu_seconds * factor
        least = most / busy
        device_s = (most + least) / 2.0
        timed = (f"the device's {device_s:.3g} s (this host's {cpu_seconds:.3g} CPU s x its speed factor "
                 f"{factor:.3g}, over {busy} busy thread(s): {least:.3g}-{most:.3g} s)")
    else:
        least = most = device_s = seconds * factor
        timed = (f"the device's {device_s:.3g} s (this host's {seconds:.3g} s x its speed factor {factor:.3g})"
                 if speed else f"the measured {seconds:.3g} s")
    out = {
        "uncertainty": uncertainty.modelled(device_s * watts, least * low_w, most * high_w,
                                            f"{timed} x the power {range_how}"
                                            + ("; the speed factor's own error is not in the interval" if speed
                                               else "")),
        "joules": device_s * watts,
        "joules_above_idle": device_s * (watts - idle),
        "seconds": device_s,
        "power_w": watts,
        "idle_w": idle,
        "threads": threads,
        "provenance": "modelled",
        "source": (f"{'device time' if speed else 'time'} x {profile.name} {how} "
                   f"({_short(profile.power.load_w.source)})"),
    }
    if speed:
        out["host_seconds"], out["speed_factor"], out["speed"] = seconds, factor, speed
        if on_cpu:
            out["host_cpu_seconds"], out["device_seconds_range"] = cpu_seconds, [least, most]
        out["source"] = f"{timed} x {profile.name} {how}; speed: {speed['source']}"
    return out


def measured_per_inference(rec: dict | None) -> dict | None:
    """Per-inference figures from a ``power`` record of a window of inferences; None if not measured."""
    if not rec or not rec.get("available") or not rec.get("inferences"):
        return None
    n = rec["inferences"]
    out = {"total_mj": rec["joules"] / n * 1000.0, "average_w": rec.get("average_w"), "idle_w": rec.get("idle_w"),
           "samples": rec.get("samples"), "inferences": n, "seconds": rec["window"]["seconds"],
           "rate_hz": rec.get("rate_hz"), "meter": rec.get("source"), "provenance": "measured",
           "instrument": rec.get("instrument") or rec.get("source"),
           "measured_by": _instrument(rec), **_parts(rec),
           "rails_mj": {k: v["joules"] / n * 1000.0 for k, v in (rec.get("rails") or {}).items()}}
    if rec.get("joules_above_idle") is not None:
        out["above_idle_mj"] = rec["joules_above_idle"] / n * 1000.0
    out["uncertainty"] = uncertainty.per_unit(rec.get("uncertainty"), n)
    for key in ("sampler", "calibration"):
        if rec.get(key):
            out[key] = rec[key]
    extra = rec.get("extra_runs") or 0
    rate = f" at {rec['rate_hz']:.3g} Hz" if rec.get("rate_hz") else ""
    idle = rec.get("idle")
    out["source"] = (f"measured by {rec['source']}: {rec.get('detail', '')}; {rec.get('samples')} samples{rate} over "
                     f"{rec['window']['seconds']:.3g} s and {n} inferences"
                     + (f" ({rec.get('timed_runs')} timed + {extra} untimed to fill the window)" if extra else "")
                     + (f"; idle {idle['average_w']:.3g} W from {idle['samples']} samples over {idle['seconds']:.3g} s "
                        "just before" if idle else "; no idle measurement")
                     + (f"; {rec['note']}" if rec.get("note") else ""))
    return out


def figure_text(value: float, fig, unit: str) -> str:
    """One energy figure as a user reads it: '4.1 J ± 0.3 J (measured, hwmon ina3221, 120 samples)' or
    '3.2 mJ +1.1/−0.4 mJ (modelled, p10-p90 latency x the profile's power range)' (``EnergyRecord.text``)."""
    return EnergyRecord.of(fig, unit).text(value)


def _instrument(rec: dict) -> str:
    """What measured a record: an external meter's log, or a sensor on the board."""
    return "meter log" if rec.get("source") == "power-log" else "board sensor"


def _parts(rec: dict) -> dict:
    """The rails whose sum is the figure, and the rails that are parts of them (shown, not added)."""
    return {k: rec[k] for k in ("total_of", "parts") if rec.get(k) is not None}


def measured_run(rec: dict | None, epochs: int = 0, samples: int = 0) -> dict | None:
    """A measured fine-tuning record: joules, per epoch and per sample."""
    if not rec or not rec.get("available"):
        return None
    idle = rec.get("idle")
    rate = f" at {rec['rate_hz']:.3g} Hz" if rec.get("rate_hz") else ""
    return {"joules": rec["joules"], "joules_above_idle": rec.get("joules_above_idle"),
            "seconds": rec["window"]["seconds"], "power_w": rec.get("average_w"), "idle_w": rec.get("idle_w"),
            "samples": rec.get("samples"), "rate_hz": rec.get("rate_hz"), "meter": rec.get("source"),
            "instrument": rec.get("instrument") or rec.get("source"), "provenance": "measured",
            "measured_by": _instrument(rec), **_parts(rec),
            "uncertainty": rec.get("uncertainty"), **{k: rec[k] for k in ("sampler", "calibration") if rec.get(k)},
            "source": (f"measured by {rec['source']}: {rec.get('detail', '')}; {rec.get('samples')} samples{rate} over "
                       f"{rec['window']['seconds']:.3g} s"
                       + (f"; idle {idle['average_w']:.3g} W from {idle['samples']} samples just before" if idle else "")
                       + (f"; {rec['note']}" if rec.get("note") else ""))}


def reliability(spread_p99_p50: float | None, loadavg: float | None, cores: int | None,
                reference_spread: float | None = None, contention: dict | None = None) -> dict:
    """Whether the latency behind a modelled figure was timed on a quiet host. ``contention``: what the paired
    timing measured of it (``measure.contention``); a drift above its limit is a reason."""
    reasons = []
    from ..host import oversubscribed

    if cores and oversubscribed(loadavg, cores):
        reasons.append(f"the host's 1-minute load average was {loadavg:.2f}, above its {cores} usable cores: other "
                       "work shared the CPU while the model was timed")
    if spread_p99_p50 is not None and spread_p99_p50 > UNSTEADY_SPREAD:
        reasons.append(f"p99/p50 was {spread_p99_p50:.2f} (a quiet host gives under {UNSTEADY_SPREAD:g}): runs were "
                       "interrupted")
    if reference_spread is not None and reference_spread > UNSTEADY_SPREAD:
        reasons.append(f"the speed reference's p99/p50 was {reference_spread:.2f}: its timing was interrupted")
    if contention and contention.get("drift", 1.0) > contention.get("limit", math.inf):
        reasons.append(f"contention on the host may have raised the figure up to {contention['drift']:.2f}x (limit "
                       f"{contention['limit']:.2f}x): {contention['source']}; the interval reaches down to the figure / "
                       f"{contention['drift']:.2f}")
    return {"reliable": not reasons, "contention": contention, "reasons": reasons, "loadavg": loadavg, "cores": cores,
            "spread_p99_p50": spread_p99_p50, "threshold_spread": UNSTEADY_SPREAD}


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
                         latency_source: str = "", threads: int | None = None, p10_ms: float | None = None,
                         p90_ms: float | None = None, p50_range_ms: list[float] | None = None) -> dict:
    """Energy of one inference on ``profile``'s board from its p50 latency: total and above idle, in mJ.

    ``p50_range_ms``: where the p50 estimate itself may fall (the measured spread of the timing it rests on,
    e.g. the per-round ratios of a paired timing); the interval then reaches it too."""
    watts, how = busy_power(profile, threads)
    load, idle = profile.power.load_w, profile.power.idle_w

    def mj(ms):
        return {"total_mj": ms / 1000.0 * watts * 1000.0, "above_idle_mj": ms / 1000.0 * (watts - idle.value) * 1000.0,
                "latency_ms": ms}

    out = {**mj(latency_ms),
           "latency_statistic": "p50",
           "power_w": watts, "threads": threads, "cores": profile.cores,
           "load_w": load.value, "idle_w": idle.value,
           "provenance": "modelled",
           "source": (f"p50 latency {latency_ms:.3g} ms ({latency_label}{': ' + latency_source if latency_source else ''})"
                      f" x {profile.name} {how}; full load {load.value} W [{load.kind}: {_short(load.source)}]; "
                      f"idle {idle.value} W [{idle.kind}: {_short(idle.source)}]; the power between idle and full "
                      "load is interpolated by busy cores")}
    low_w, high_w, range_how = power_range(profile, threads)
    lo_ms, hi_ms = (p10_ms, p90_ms) if p10_ms is not None and p90_ms is not None else (latency_ms, latency_ms)
    timing = "the p10-p90 latency" if p10_ms is not None and p90_ms is not None else "the p50 latency (no spread)"
    if p50_range_ms:
        lo_ms, hi_ms = min(lo_ms, p50_range_ms[0]), max(hi_ms, p50_range_ms[1])
        timing += " widened to the p10-p90 of the timing's per-round ratios and the contention measured"
    u = uncertainty.modelled(latency_ms * watts / 1000.0, lo_ms * low_w / 1000.0, hi_ms * high_w / 1000.0,
                             f"{timing} x the power {range_how}")
    out["uncertainty"] = uncertainty.per_unit(u, 1)
    if p10_ms is not None and p90_ms is not None:
        out["spread"] = {"p10": {**mj(p10_ms), "provenance": "modelled"}, "p90": {**mj(p90_ms), "provenance": "modelled"},
                         "source": "the same power x the p10 and p90 latency: how much the figure moves run to run"}
    return out


def daily_budget(latency_ms: float, profile, rate_per_h: float, battery_wh: float | None = None,
                 threads: int | None = None, per_inference_j: float | None = None, idle_w: float | None = None,
                 provenance: str = "modelled", source: str | None = None) -> dict:
    """A day at ``rate_per_h`` inferences per hour: busy for each inference, idle power in between.

    Modelled by default (busy at ``busy_power``); a measured ``per_inference_j`` and ``idle_w`` replace
    the profile's figures.
    """
    busy_w, how = busy_power(profile, threads)
    idle = profile.power.idle_w.value if idle_w is None else idle_w
    per_day = rate_per_h * 24.0
    busy_s = per_day * latency_ms / 1000.0
    keeps_up = busy_s <= SECONDS_PER_DAY
    per_inf_j = per_inference_j if per_inference_j is not None else latency_ms / 1000.0 * busy_w
    if not keeps_up:
        per_day_served = SECONDS_PER_DAY / (latency_ms / 1000.0)
        busy_j = per_day_served * per_inf_j
        busy_s = SECONDS_PER_DAY
    else:
        busy_j = per_day * per_inf_j
    idle_s = SECONDS_PER_DAY - busy_s
    joules = busy_j + idle_s * idle
    wh = joules / 3600.0
    avg_w = joules / SECONDS_PER_DAY
    out = {
        "rate_per_h": rate_per_h,
        "inferences_per_day": per_day,
        "busy_s_per_day": busy_s,
        "idle_s_per_day": idle_s,
        "energy_wh_per_day": wh,
        "busy_wh_per_day": busy_j / 3600.0,
        "idle_wh_per_day": idle_s * idle / 3600.0,
        "average_power_w": avg_w,
        "idle_w": idle,
        "inferences_per_wh": (per_day / wh) if keeps_up else None,
        "keeps_up": keeps_up,
        "hourly_wh": [wh / 24.0] * 24,
        "provenance": provenance,
        "source": source or (f"{per_day:g} inferences/day x {latency_ms:.3g} ms (p50) at {busy_w:.3g} W ({how}) + "
                             f"the rest of the day idle at {idle} W ({profile.name})"),
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
            "source": f"total energy per inference ({provenance}) compared with --budget-mj"}


def energy_report(latency_ms: float, profile, battery_wh: float | None = None, rate_per_h: float | None = None,
                  budget_mj: float | None = None, latency_label: str = "measured", latency_source: str = "",
                  threads: int | None = None, p10_ms: float | None = None, p90_ms: float | None = None,
                  reliable: dict | None = None, measured: dict | None = None,
                  p50_range_ms: list[float] | None = None) -> dict:
    """The energy-budget report for a model whose p50 latency on ``profile``'s device is ``latency_ms``.

    Used by ``profile`` and at the end of ``export``. ``latency_label`` says how the latency was
    obtained (measured / estimated / emulated); it is carried into every figure's source. ``rate_per_h``
    may be a number or text like '120/h'. ``measured`` (from ``measured_per_inference``, taken on the
    device itself) becomes the headline per-inference figure, the modelled one staying beside it as
    ``modelled_per_inference``. The result's ``budget.passed`` is False when over ``budget_mj``; the
    caller turns that into exit 3.
    """
    if isinstance(rate_per_h, str):
        rate_per_h = parse_rate(rate_per_h)
    battery_wh = check_positive(battery_wh, "--battery-wh", "watt-hours")
    budget_mj = check_positive(budget_mj, "--budget-mj", "millijoules")
    modelled = energy_per_inference(latency_ms, profile, latency_label, latency_source, threads, p10_ms, p90_ms,
                                    p50_range_ms)
    if reliable is not None:
        modelled["reliability"] = reliable
    modelled = EnergyRecord.of(modelled, "mJ", DEVICE)
    measured = EnergyRecord.of(measured, "mJ", DEVICE)  # taken on the device itself (the caller's word)
    per_inf = measured if measured is not None else modelled
    report = {"device": profile.name, "latency_ms": latency_ms, "latency_statistic": "p50",
              "latency_provenance": latency_label, "per_inference": per_inf,
              "inferences_per_wh_busy": 3600.0 / (per_inf["total_mj"] / 1000.0) if per_inf["total_mj"] else None}
    if measured is not None:
        report["modelled_per_inference"] = modelled
    if rate_per_h is not None:
        if measured is not None and measured.get("idle_w") is not None:
            src = (f"{rate_per_h * 24:g} inferences/day x {measured['total_mj']:.3g} mJ measured + the rest of the day "
                   f"idle at the measured {measured['idle_w']:.3g} W ({measured['meter']})")
            report["daily"] = daily_budget(latency_ms, profile, rate_per_h, battery_wh, threads,
                                           measured["total_mj"] / 1000.0, measured["idle_w"], "measured", src)
        else:
            report["daily"] = daily_budget(latency_ms, profile, rate_per_h, battery_wh, threads)
    elif battery_wh is not None:
        # Without a rate the only honest battery figure is flat-out inference.
        watts = per_inf["total_mj"] / latency_ms
        hours = battery_wh / watts
        report["continuous"] = {"battery_wh": battery_wh, "battery_hours": hours,
                                "inferences": hours * 3600.0 * 1000.0 / latency_ms,
                                "provenance": per_inf["provenance"],
                                "source": f"battery {battery_wh} Wh / busy power {watts:.3g} W"}
    if budget_mj is not None:
        report["budget"] = budget_verdict(per_inf["total_mj"], budget_mj, per_inf["provenance"])
    return report


def _short(text: str, n: int = 110) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


# --- RAPL (measured, this host only) ------------------------------------------------------------------

def read_rapl(root: Path = POWERCAP) -> dict | None:
    """Package energy counters in microjoules, or None where RAPL is absent or not readable.

    A top-level zone is a package (its ``name`` file reads ``package-N`` or ``package-N-die-D``) or, on
    many laptops, ``psys``: the platform, which already includes the package. Only packages are summed;
    ``psys`` is kept apart (``platform``), never added to them. A zone without a ``name`` file (old
    kernels) is a package, as the zone numbering was then.
    """
    try:
        zones = sorted(p for p in Path(root).iterdir() if _PACKAGE_ZONE.match(p.name))
    except OSError:
        return None
    domains, ranges, names, platform = {}, {}, {}, {}
    for zone in zones:
        try:
            name = (zone / "name").read_text().strip()
        except OSError:
            name = None
        try:
            value = int((zone / "energy_uj").read_text().strip())
        except (OSError, ValueError):
            return None  # unreadable (since Linux 5.10 root-only): no partial measurement
        try:
            span = int((zone / "max_energy_range_uj").read_text().strip())
        except (OSError, ValueError):
            span = None
        if name is not None and not name.startswith("package"):
            platform[zone.name] = {"name": name, "energy_uj": value, "max_range_uj": span}
            continue
        domains[zone.name], ranges[zone.name] = value, span
        names[zone.name] = name or zone.name
    if not domains:
        return None
    out = {"domains": domains, "max_range_uj": ranges, "names": names}
    if platform:
        out["platform"] = platform
    return out


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
           "provenance": "measured", "measured_by": "RAPL counter",
           "source": f"RAPL package energy ({', '.join(rapl['domains'])}) over {runs} timed runs on this host; "
                     "host CPU package only, not the target device",
           # the counter's step (the CPU's energy status unit) is not exposed by powercap, and RAPL itself is a
           # model of the package inside the CPU: its error is not quantified here, and it says so
           "uncertainty": {"kind": "not quantified", "plus_minus_mj": None,
                           "notes": ["RAPL's energy status unit is not exposed by powercap and RAPL is the CPU's own "
                                     "model of its package energy, not a meter: no uncertainty is given"]}}
    return out


# --- a measured (or modelled) stretch of work: fine-tuning ----------------------------------------------

class EnergyMeter:
    """Energy of a stretch of work, measured where this machine can, modelled from ``profile`` otherwise.

    ``start()`` measures the idle board first (about a second, only where a power source exists) and
    starts the sampling thread; ``stop(epochs, samples)`` returns the record: ``joules``, ``seconds``,
    per epoch and per sample, labelled measured (with the source and sample count) or modelled. A
    measurement of this machine is the headline figure only when this machine is the profile's device
    (or no profile is given); otherwise the modelled figure leads and the measurement sits beside it.
    """

    def __init__(self, profile=None, threads: int | None = None, power_log=None, source="auto",
                 meter_export: bool = False, speed=None):
        # ``speed``: called once the work has ended, where the figure is modelled for a device this machine is not:
        # the device's speed against this host (``measure.device_speed``), which the host's seconds are scaled by
        self.profile, self.threads, self.speed = profile, threads, speed
        self._work = None  # when the work proper began (``work_begins``): one-time host work before it is left out
        self.power_log = meterlog.check_power_log(power_log) if power_log else None
        # a meter logs now (its log given, or exported after the run): hold an idle stretch for it
        self.held = self.power_log is not None or meter_export
        self.source = calibration.detect() if source == "auto" else source
        self.meter = sensors.PowerMeter(self.source) if self.source is not None else None
        self.window = self.idle_window = None
        self.result: dict | None = None

    def start(self) -> "EnergyMeter":
        if self.meter is not None:
            self.meter.start()
            self.meter.idle()
            self.idle_window = self.meter.idle_window
            self._t0 = self.meter.begin()
        else:
            if self.held:
                t = time.time()
                time.sleep(sensors.DEFAULT_IDLE_S)
                self.idle_window = (t, time.time())
            self._t0 = time.time()
        self._cpu0 = cpu_seconds(children=True)
        return self

    def work_begins(self, what: str = "one-time host work") -> None:
        """The work proper begins now: what ran since ``start`` (``what``: loading the model, the ONNX export or
        prep child, a first run's cache) is one-time host work, left out of the figure and named beside it."""
        self._work = (time.time(), what, cpu_seconds(children=True))

    def stop(self, epochs: int = 0, samples: int = 0) -> dict | None:
        if self.result is not None:  # stopped already (the context manager): add the per-unit figures
            return self._per_unit(self.result, epochs, samples)
        t1, cpu1 = time.time(), cpu_seconds(children=True)
        t0 = self._work[0] if self._work else self._t0
        self.window = (t0, t1)
        seconds = t1 - t0
        cpu = cpu1 - (self._work[2] if self._work else self._cpu0)
        measured = None
        if self.meter is not None:
            self.meter.window = self.window
            measured = measured_run(self.meter.finish())
        elif self.power_log is not None:
            measured = measured_run(meterlog.log_record(self.power_log, self.window, self.idle_window,
                                                        board_w=board_watts(self.profile)))
        on_device = self.profile is None or _on_device(self.profile)
        modelled = None
        if self.profile is not None:
            speed = self.speed() if self.speed is not None and not on_device else None
            modelled = energy_for_duration(seconds, self.profile, self.threads,
                                           speed if speed and speed.get("factor") else None, cpu)
            if speed and not speed.get("factor"):  # nothing gives the device's speed: said, not hidden
                modelled["source"] += (f"; this host's time taken as the device's, unscaled: {speed['source']}")
                modelled["speed"] = speed
        out = run_record(measured, modelled, on_device)
        if out is not None:
            out["wall"] = list(self.window)
            out.fields.setdefault("host_cpu_seconds", cpu)  # this process's (and its children's) CPU time, every thread's
            if self._work:
                out["one_time"] = {"seconds": self._work[0] - self._t0, "what": self._work[1], "in_figure": False,
                                   "source": "wall time on this host from the run's start to its work proper"}
            from .. import __version__

            # where a meter's export made after the run is read (`edgetrain energy attribute`)
            out["meter_windows"] = {"command": "finetune", "edgetrain_version": __version__,
                                    "clock": "Unix seconds on this machine's clock", "held_for_a_meter": self.held,
                                    "on_device": on_device, "timed": list(self.window),
                                    "board_w": board_watts(self.profile),
                                    "idle": list(self.idle_window) if self.idle_window else None}
        self.result = out
        return self._per_unit(out, epochs, samples)

    @staticmethod
    def _per_unit(out, epochs: int, samples: int):
        return per_unit_of_run(out, epochs, samples)


def board_watts(profile) -> list[float] | None:
    """The device's idle and busy watts (its profile's figures), what a meter's log on it must be near; None
    without a device."""
    if profile is None:
        return None
    return [float(profile.power.idle_w.value), float(profile.power.load_w.value)]


def run_record(measured: dict | None, modelled: dict | None, on_device: bool) -> EnergyRecord | None:
    """A stretch of work's energy record: measured leads on the device (the modelled beside it), else the modelled
    figure leads with this machine's measurement beside it, labelled as of the host ("host, measured"): an
    off-device measurement never takes the device's place."""
    modelled = EnergyRecord.of(modelled, "J", DEVICE)
    if measured is not None and on_device:
        out = EnergyRecord.of(measured, "J", DEVICE)
        out["modelled"] = modelled
        return out
    if modelled is not None:
        if measured is not None:
            here = EnergyRecord.of(measured, "J", HOST)
            here["note"] = "measured on this machine, which is not the profile's device"
            modelled["measured_here"] = here
        return modelled
    return None


def per_unit_of_run(out, epochs: int, samples: int):
    """``out`` with its joules per epoch and per sample trained."""
    if out is not None:
        if epochs:
            out["epochs"], out["joules_per_epoch"] = epochs, out["joules"] / epochs
        if samples:
            out["samples_trained"], out["joules_per_sample"] = samples, out["joules"] / samples
    return out


@contextmanager
def measure_energy(profile=None, threads: int | None = None, power_log=None):
    """``with measure_energy(profile, threads) as m: work()``; then ``m.result`` (see ``EnergyMeter``)."""
    meter = EnergyMeter(profile, threads, power_log).start()
    try:
        yield meter
    finally:
        meter.stop()


def _on_device(profile) -> bool:
    try:
        return detect_host().matches(profile)
    except Exception:  # noqa: BLE001 - a host we cannot describe is not known to be the device
        return False
