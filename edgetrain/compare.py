"""Compare a reference model's outputs with a converted model's, the way Polygraphy does.

An element mismatches when it is out of *both* tolerances: ``|a - e| > atol * scale`` and
``|a - e| / |e| > rtol`` (``e`` the expected, reference value), where ``scale = max(1, max |e|)`` over
that output. The absolute tolerance scales with the output's magnitude because fp32 round-off does:
logits of magnitude 20 computed in another order differ by ~20x more than logits of magnitude 1, and
an element near zero among them has no useful relative error (AlexNet: max abs 6e-4 on logits of 20
is round-off, not a wrong export). Outputs within [-1, 1] keep ``atol`` as given. Per output we report
max/mean/median absolute and relative error, where the worst element is, and the smallest tolerance
that would have passed (each one holding the other fixed), so a failure says how far off it was, not
just that it was.

Used by export (Gluon vs ONNX Runtime) and reusable by quantize and profile.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from .figures import Chance


@dataclass
class OutputComparison:
    name: str
    shape: list[int]
    passed: bool
    atol: float
    rtol: float
    elements: int = 0
    mismatches: int = 0
    max_abs: float = 0.0
    mean_abs: float = 0.0
    median_abs: float = 0.0
    max_rel: float = 0.0
    mean_rel: float = 0.0
    median_rel: float = 0.0
    worst_index: list[int] = field(default_factory=list)  # of the largest absolute error
    worst_expected: float = 0.0
    worst_actual: float = 0.0
    atol_needed: float = 0.0  # smallest atol that passes at this rtol (before scaling, comparable with atol)
    atol_scale: float = 1.0  # max(1, max |expected|): the atol in force is atol * atol_scale
    rtol_needed: float = 0.0  # smallest rtol that passes at this atol
    expected_max_abs: float = 0.0  # how big the reference values are: tiny outputs prove little
    error: str | None = None  # shape mismatch, missing output, NaN/Inf

    def summary(self) -> str:
        """One readable line: verdict, the figures, and what would have passed."""
        if self.error:
            return f"{self.name}: FAIL ({self.error})"
        verdict = "ok" if self.passed else f"FAIL ({self.mismatches}/{self.elements} elements out of tolerance)"
        idx = ",".join(map(str, self.worst_index))
        text = (f"{self.name}: {verdict}; max abs {_g(self.max_abs)} (mean {_g(self.mean_abs)}, median "
                f"{_g(self.median_abs)}) at [{idx}] expected {_g(self.worst_expected)} got {_g(self.worst_actual)}; "
                f"max rel {_g(self.max_rel)}")
        if self.atol_scale > 1.0:
            text += f"; atol scaled x{_g(self.atol_scale)} by the output's magnitude"
        if not self.passed:
            text += (f"; would pass with atol {g_up(self.atol_needed)} (at rtol {_g(self.rtol)}) or rtol "
                     f"{g_up(self.rtol_needed)} (at atol {_g(self.atol)})")
        return text

    def to_dict(self) -> dict:
        return {k: _json_float(v) for k, v in asdict(self).items()}


@dataclass
class Comparison:
    outputs: list[OutputComparison]
    atol: float
    rtol: float
    batches: int = 1

    @property
    def passed(self) -> bool:
        return bool(self.outputs) and all(o.passed for o in self.outputs)

    @property
    def failed(self) -> list[OutputComparison]:
        return [o for o in self.outputs if not o.passed]

    @property
    def max_abs(self) -> float:
        return max((o.max_abs for o in self.outputs), default=0.0)

    @property
    def max_rel(self) -> float:
        return max((o.max_rel for o in self.outputs), default=0.0)

    @property
    def atol_needed(self) -> float:
        """The smallest atol (at this rtol) under which every output passes; inf when one cannot pass at all."""
        if any(o.error for o in self.outputs):
            return math.inf
        return max((o.atol_needed for o in self.outputs), default=0.0)

    def summaries(self) -> list[str]:
        return [o.summary() for o in self.outputs]

    def to_dict(self) -> dict:
        return {"passed": self.passed, "atol": self.atol, "rtol": self.rtol, "batches": self.batches,
                "max_abs": _json_float(self.max_abs), "max_rel": _json_float(self.max_rel),
                "outputs": [o.to_dict() for o in self.outputs]}


def compare_outputs(expected, actual, atol: float = 1e-4, rtol: float = 1e-3) -> Comparison:
    """Compare outputs given as dicts name -> array (matched by name) or lists (matched by position).

    Several batches can be compared at once by concatenating them along axis 0 beforehand (see
    ``merge``): the statistics then cover every element of every batch.
    """
    atol, rtol = _tolerance(atol, "atol"), _tolerance(rtol, "rtol")
    exp, act = _named(expected), _named(actual)
    results = []
    for name, e in exp.items():
        if name not in act:
            results.append(OutputComparison(name, list(np.shape(e)), False, atol, rtol,
                                            error="missing from the compared outputs"))
            continue
        results.append(compare_arrays(name, e, act[name], atol, rtol))
    for name in act:
        if name not in exp:
            results.append(OutputComparison(name, list(np.shape(act[name])), False, atol, rtol,
                                            error="not among the reference outputs"))
    return Comparison(results, atol, rtol)


def compare_arrays(name: str, expected, actual, atol: float, rtol: float) -> OutputComparison:
    e = np.asarray(expected, dtype=np.float64)
    a = np.asarray(actual, dtype=np.float64)
    res = OutputComparison(name, list(e.shape), False, atol, rtol, elements=int(e.size))
    if e.shape != a.shape:
        res.error = f"shape {list(a.shape)} != expected {list(e.shape)}"
        return res
    if e.size == 0:
        res.passed = True
        return res
    bad_e, bad_a = ~np.isfinite(e), ~np.isfinite(a)
    if bad_a.any() and not np.array_equal(bad_a, bad_e):
        res.error = f"{int(bad_a.sum())} non-finite values (NaN/Inf) the reference does not have"
        return res
    finite = ~bad_e
    e, a = np.where(finite, e, 0.0), np.where(finite, a, 0.0)  # identical NaN/Inf positions agree
    absdiff = np.abs(a - e)
    mag = np.abs(e)
    with np.errstate(divide="ignore", invalid="ignore"):
        reldiff = np.where(absdiff == 0, 0.0, absdiff / mag)  # x/0 -> inf: only atol can cover it
    scale = max(1.0, float(mag.max()))
    res.atol_scale = scale
    atol_eff = atol * scale
    mism = (absdiff > atol_eff) & (reldiff > rtol)
    worst = np.unravel_index(int(np.argmax(absdiff)), e.shape)
    res.passed = not bool(mism.any())
    res.mismatches = int(mism.sum())
    res.max_abs, res.mean_abs, res.median_abs = (float(absdiff.max()), float(absdiff.mean()),
                                                 float(np.median(absdiff)))
    res.max_rel, res.mean_rel, res.median_rel = (float(reldiff.max()), float(reldiff.mean()),
                                                 float(np.median(reldiff)))
    res.worst_index = [int(i) for i in worst]
    res.worst_expected, res.worst_actual = float(e[worst]), float(a[worst])
    over_rel = reldiff > rtol
    over_abs = absdiff > atol_eff
    res.atol_needed = float(absdiff[over_rel].max()) / scale if over_rel.any() else 0.0
    res.rtol_needed = float(reldiff[over_abs].max()) if over_abs.any() else 0.0
    res.expected_max_abs = float(mag.max())
    return res


def merge(batches: list) -> dict | list:
    """Concatenate per-batch outputs (each a dict or list of arrays) along the batch axis."""
    first = batches[0]
    if isinstance(first, dict):
        return {k: np.concatenate([np.asarray(b[k]) for b in batches], axis=0) for k in first}
    return [np.concatenate([np.asarray(b[i]) for b in batches], axis=0) for i in range(len(first))]


def _named(outputs) -> dict:
    if isinstance(outputs, dict):
        return dict(outputs)
    if isinstance(outputs, np.ndarray):
        return {"output0": outputs}
    return {f"output{i}": o for i, o in enumerate(outputs)}


def _tolerance(value, what: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number, got {value!r}") from None
    if not math.isfinite(v) or v < 0:
        raise ValueError(f"{what} must be a finite number >= 0, got {value!r}")
    return v


def g_up(v: float) -> str:
    """A tolerance needed to pass, printed in 3 significant digits rounded *up*: the printed value passes
    (rounded to nearest, "would pass with 1.23e-05" could still fail by the last digit)."""
    if v == math.inf or v != v:
        return "inf"
    if v <= 0:
        return "0"
    text = f"{v:.3g}"
    if float(text) > v:
        return text
    step = 10.0 ** (math.floor(math.log10(v)) - 2)
    up = (math.floor(v / step) + 1) * step
    while float(f"{up:.3g}") <= v:
        up += step
    return f"{up:.3g}"


def _g(v: float) -> str:
    return "inf" if v == math.inf else f"{v:.3g}"


def _json_float(v):
    """JSON has no Infinity: a relative error against an exact zero is reported as null."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


# --- a model against chance: figures.Chance; these are its dict form, which the fine-tune result still holds

def chance_check(top1_pct: float, labels, num_classes: int) -> dict:
    """``figures.Chance.measure`` as a dict (its ``allowed`` False until the caller says otherwise)."""
    return Chance.measure(top1_pct, labels, num_classes).to_dict()


def chance_failure(check: dict | None, what: str) -> str | None:
    """The failed-check sentence for a ``chance_check`` dict (None: not at chance, not checked, or allowed)."""
    return next(iter(Chance(**check).failures(what)), None) if check else None
