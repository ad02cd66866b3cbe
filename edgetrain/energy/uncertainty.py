"""How far an energy figure may be off, and what it rests on.

Measured (a board sensor or a meter log), a combined standard uncertainty (1 sigma) of the joules over a
window of T seconds holding N samples, the samples' power varying with standard deviation s, the reading
stepping by q watts (the sensor's resolution) and sampled every dt seconds:

- resolution: T x q / sqrt(12). A reading is rounded to its step; a steady draw rounds the same way every
  time, so the rounding is not averaged away by more samples (the conservative case).
- sampling: T x s / sqrt(N), the standard error of the mean power: more samples, less of it.
- interval: dt x s / sqrt(2). Each end of the window falls between two samples and is interpolated; up to
  half a period at each end is not observed.

The three add in quadrature. A figure per inference divides by the inferences in the window.

Modelled (a device profile's power figures x time), an interval, not a standard deviation: the lower end
is the p10 latency (or the measured duration) x the power the straight line from idle to full load gives
for the busy cores (a lower bound on the busy share), the upper end the p90 latency x the profile's
full-load figure; where the full-load figure is a rated budget (``kind: rated``, a cap, not a draw) the
lower end goes down to the idle figure. ``plus``/``minus`` are the distances of the ends from the figure.

In the JSON a standard uncertainty is ``plus_minus_j`` (and ``relative``): one figure, as it is symmetric. An
interval is its ends, ``low_j``/``high_j`` and ``plus_j``/``minus_j``, and never one ``plus_minus`` figure.
"""
from __future__ import annotations

import math

SQRT12 = math.sqrt(12.0)


def measured(joules: float, seconds: float, samples: int, power_sd_w: float | None, period_s: float | None,
             resolution_w: float | None, resolution_how: str, instrument: str, samples_label: str = "samples") -> dict:
    """The standard uncertainty of ``joules`` measured over ``seconds`` (see the module's account)."""
    s = power_sd_w or 0.0
    n = max(int(samples or 0), 1)
    parts = {"resolution_j": seconds * resolution_w / SQRT12 if resolution_w else 0.0,
             "sampling_j": seconds * s / math.sqrt(n),
             "interval_j": (period_s or 0.0) * s / math.sqrt(2.0)}
    u = math.sqrt(sum(v * v for v in parts.values()))
    notes = []
    if not resolution_w:
        notes.append(f"resolution not known ({resolution_how}): not included")
    if power_sd_w is None:
        notes.append("fewer than two samples in the window: the power's variation is unknown and not included")
    return {"kind": "standard (1 sigma)", "plus_minus_j": u, "relative": u / joules if joules else None,
            "components": parts, "samples": samples, "seconds": seconds, "power_sd_w": power_sd_w,
            "period_s": period_s, "resolution_w": resolution_w, "resolution_source": resolution_how,
            "instrument": instrument, "notes": notes,
            "source": ("measured: resolution T x q/sqrt(12), sampling T x s/sqrt(N), interval dt x s/sqrt(2), added in "
                       f"quadrature; T={seconds:.3g} s, N={samples} {samples_label}, s={s:.3g} W, "
                       f"dt={(period_s or 0):.3g} s, q={_w(resolution_w)} ({resolution_how})")}


def per_unit(u: dict | None, n: float, unit_scale: float = 1000.0, suffix: str = "mj") -> dict | None:
    """``u`` divided over ``n`` units (inferences), in millijoules by default."""
    if u is None or not n:
        return None
    out = {k: v for k, v in u.items() if k not in ("plus_minus_j", "components", "low_j", "high_j", "plus_j",
                                                      "minus_j")}
    for k in ("plus_minus_j", "low_j", "high_j", "plus_j", "minus_j"):
        if u.get(k) is not None:
            out[k[:-1] + suffix] = u[k] / n * unit_scale
    out["components_" + suffix] = {k[:-1] + suffix: v / n * unit_scale for k, v in (u.get("components") or {}).items()}
    return out


def modelled(value_j: float, low_j: float, high_j: float, how: str) -> dict:
    low_j, high_j = min(low_j, value_j), max(high_j, value_j)
    # both ends, never one "±" figure (it read as the whole interval: ±6.26 for +6.26/−0.16)
    return {"kind": "interval", "low_j": low_j, "high_j": high_j, "plus_j": high_j - value_j,
            "minus_j": value_j - low_j, "source": how}


def text(value: float, u: dict | None, unit: str, provenance: str, detail: str = "") -> str:
    """'4.1 J ± 0.3 J (measured, hwmon ina3221, 120 samples)'; an interval whose ends differ '+a/−b'
    (``record.interval_text``, the one way it is written)."""
    from .record import EnergyRecord

    key = "total_mj" if unit == "mJ" else "joules"
    rec = EnergyRecord.of({key: value, "uncertainty": u, "provenance": provenance}, unit)
    return f"{rec.text(with_detail=False)} ({provenance}{', ' + detail if detail else ''})"


def _w(q) -> str:
    return "unknown" if not q else f"{q:.3g} W"
