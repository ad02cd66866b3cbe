"""One energy figure as every renderer reads it: ``EnergyRecord``, and ``interval_text``, the one way an
energy figure and its interval are written.

The sampler or log (``sensors``, ``meterlog``) and the model (``model``) make the record; the result carries it,
and the human output, the HTML report, ``energy attribute`` and a run's report read it: its value and unit, how
it was obtained (measured / modelled), what machine it is of (the ``device`` asked about, or this ``host`` when
it is not that device: "host, measured"), its interval, and what measured it. ``to_dict`` is the result
contract's JSON (the keys as before, with ``machine``); ``EnergyRecord.of`` reads that JSON back (a result
file), so a renderer never reads an energy figure's keys itself.

An interval is written +a/−b wherever its ends are not the same distance from the figure (a modelled p10-p90 x
power range, an attributed measurement widened by contention), ± only when they are.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator

DEVICE, HOST = "device", "host"
_MINUS = "\u2212"  # −: a minus sign, not a hyphen


def energy_digits(x: float | None) -> str:
    """An energy figure's digits: 2 significant below 1, 3 up to 1000, whole above."""
    if x is None:
        return "?"
    if x == 0:
        return "0"
    return f"{x:.2g}" if abs(x) < 1 else f"{x:.3g}" if abs(x) < 1000 else f"{x:.0f}"


def interval_text(value: float, plus: float | None, minus: float | None, unit: str, digits=energy_digits,
                  ends=None) -> str:
    """'1.117 mJ +1.77/−0.063 mJ' (ends at different distances), '4.1 J ± 0.3 J' (the same distance, as
    written), '4.1 J' (no interval). ``digits``: how the figure is written, ``ends``: how the distances are
    (default: as the figure); grams write their own unit (then ``unit`` is '')."""
    ends = ends or digits
    unit_s = f" {unit}" if unit else ""
    head = f"{digits(value)}{unit_s}"
    if plus is None and minus is None:
        return head
    if plus is None or minus is None:
        one = plus if plus is not None else minus
        return f"{head} ± {ends(one)}{unit_s}"
    if ends(plus) == ends(minus):
        return f"{head} ± {ends(plus)}{unit_s}"
    return f"{head} +{ends(plus)}/{_MINUS}{ends(minus)}{unit_s}"


@dataclass
class EnergyRecord:
    """One energy figure: per inference (``unit`` mJ, JSON key ``total_mj``) or of a stretch of work (``unit``
    J, ``joules``). ``plus``/``minus``: the distances of the interval's ends from ``value`` (the same for a
    standard uncertainty), None where it is not quantified. ``fields``: the rest of the record as the result
    contract writes it (its power, threads, samples, windows...), key for key."""

    value: float
    unit: str
    provenance: str
    machine: str = DEVICE
    plus: float | None = None
    minus: float | None = None
    interval_kind: str | None = None
    instrument: str | None = None
    samples: int | None = None
    source: str = ""
    fields: dict = field(default_factory=dict)

    # --- made by the sampler, the log and the model -------------------------------------------------------

    @classmethod
    def of(cls, d, unit: str | None = None, machine: str | None = None) -> "EnergyRecord | None":
        """The record ``d`` is: itself, or a record's JSON (as ``to_dict`` wrote it, or as the producers in
        ``energy.model`` build it); None for None. ``unit``: mJ for a per-inference figure, J for a run (read
        from the keys when not given). ``machine``: what it is of, where the JSON does not say."""
        if d is None or isinstance(d, EnergyRecord):
            if d is not None and machine is not None:
                d.machine = machine
            return d
        d = dict(d)
        unit = unit or ("mJ" if "total_mj" in d else "J")
        key = "total_mj" if unit == "mJ" else "joules"
        u = d.get("uncertainty") or {}
        suffix = "mj" if unit == "mJ" else "j"
        plus, minus = u.get("plus_" + suffix), u.get("minus_" + suffix)
        if plus is None and minus is None and u.get("plus_minus_" + suffix) is not None:
            plus = minus = u["plus_minus_" + suffix]
        value = d.pop(key)
        rec = cls(value=value, unit=unit, provenance=d.pop("provenance", "?"),
                  machine=machine or d.pop("machine", DEVICE), plus=plus, minus=minus,
                  interval_kind=u.get("kind"), instrument=d.get("instrument") or d.get("meter"),
                  samples=d.get("samples"), source=d.pop("source", ""), fields=d)
        d.pop("machine", None)
        for name in ("modelled", "measured_here", "modelled_per_inference"):
            if isinstance(d.get(name), dict) and (d[name].get("joules") is not None
                                                  or d[name].get("total_mj") is not None):
                d[name] = cls.of(d[name], machine=HOST if name == "measured_here" else None)
        return rec

    # --- the result contract ----------------------------------------------------------------------------

    @property
    def key(self) -> str:
        return "total_mj" if self.unit == "mJ" else "joules"

    def to_dict(self) -> dict:
        out = {self.key: self.value, **{k: (v.to_dict() if isinstance(v, EnergyRecord) else v)
                                        for k, v in self.fields.items()},
               "provenance": self.provenance, "machine": self.machine, "source": self.source}
        return out

    # where code that built the record as a dict still reads and adds its keys (per-unit figures, carbon)
    def __getitem__(self, k: str) -> Any:
        if k == self.key:
            return self.value
        if k in ("provenance", "machine", "source"):
            return getattr(self, k)
        return self.fields[k]

    def get(self, k: str, default=None):
        try:
            return self[k]
        except KeyError:
            return default

    def __setitem__(self, k: str, v) -> None:
        if k == self.key:
            self.value = v
        elif k in ("provenance", "machine", "source"):
            setattr(self, k, v)
        else:
            self.fields[k] = v

    def __contains__(self, k) -> bool:
        return k in (self.key, "provenance", "machine", "source") or k in self.fields

    def keys(self):
        return [self.key, *self.fields, "provenance", "machine", "source"]

    def items(self):
        return [(k, self[k]) for k in self.keys()]

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    # --- what renderers show ----------------------------------------------------------------------------

    @property
    def label(self) -> str:
        """'measured', 'modelled', or 'host, measured' for a figure of this machine that is not the device."""
        return f"host, {self.provenance}" if self.machine == HOST else self.provenance

    def detail(self) -> str:
        """What the figure rests on, in a few words."""
        if self.provenance == "measured":
            if self.samples is None:
                return self.instrument or ""
            return f"{self.instrument}, {self.samples} samples"
        if self.unit == "mJ":
            return "p10-p90 latency x the profile's power range"
        if self.fields.get("speed_factor") is not None:
            return "this host's time x the device's speed factor x the profile's power range"
        return "time x the profile's power range"

    def text(self, value: float | None = None, with_detail: bool = True) -> str:
        """'4.1 J ± 0.3 J (measured, hwmon ina3221, 120 samples)', '3.2 mJ +1.1/−0.4 mJ (modelled, ...)';
        ``value``: another figure of the same record (a part of it), scaled with the same interval."""
        v = self.value if value is None else value
        scale = (v / self.value) if value is not None and self.value else 1.0
        plus = self.plus * scale if self.plus is not None else None
        minus = self.minus * scale if self.minus is not None else None
        head = interval_text(v, plus, minus, self.unit)
        if not with_detail:
            return head
        detail = self.detail()
        return f"{head} ({self.label}{', ' + detail if detail else ''})"
