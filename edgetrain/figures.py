"""Figures more than one module writes into a result: the verdict of a top-1 accuracy against chance
(export, quantize; fine-tune still holds its dict form, ``compare.chance_check``), and what quantizing
changed (accuracy, calibration, size, latency: the ONNX Runtime and the MXNet backends both write them).

Each is a ``results.Figure``: typed fields that read as attributes, and the JSON keys they always had.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .results import Figure, optional


@dataclass(kw_only=True)
class Chance(Figure):
    """Is a top-1 accuracy (in %) at or near what guessing gets on these labels? ``checked`` False: too
    few labels or classes to tell. ``allowed``: the user accepts a model at chance (or it has random
    weights, at chance by construction: that run checks the tooling, not the model)."""

    checked: bool
    top1: float | None = optional()
    baseline: float | None = optional()    # % the better of uniform guessing and the commonest class gets
    margin: float | None = optional()      # points above the baseline still counted as chance
    samples: int | None = optional()
    classes: int | None = optional()       # distinct classes among the labels: one class shows no learning
    at_chance: bool | None = optional()
    allowed: bool = False

    @classmethod
    def measure(cls, top1_pct: float, labels, num_classes: int, allowed: bool = False) -> "Chance":
        """The baseline is the better of uniform guessing (100/K) and always answering the most common
        class; "near" is within two binomial standard errors of it on this many samples (at least 2
        points). A model that scores there has learned nothing these samples can show: a failed check
        unless the user opts out. The figures are kept to the 0.1 point they are printed with and the
        verdict is taken on those, so what it says never contradicts what it shows (issue 26)."""
        import numpy as np

        labels = np.asarray(labels, dtype=np.int64).reshape(-1)
        n = int(labels.size)
        if n == 0 or num_classes < 2:
            return cls(checked=False, allowed=allowed)
        counts = np.bincount(labels, minlength=num_classes)
        baseline = 100.0 * max(1.0 / num_classes, counts.max() / n)
        p = baseline / 100.0
        margin = max(2.0, 200.0 * math.sqrt(p * (1 - p) / n))
        top1, baseline, margin = (_tenth(v) for v in (top1_pct, baseline, margin))
        return cls(checked=True, top1=top1, baseline=baseline, margin=margin, samples=n,
                   classes=int(np.count_nonzero(counts)),
                   at_chance=bool(round(top1 * 10) <= round(baseline * 10) + round(margin * 10)), allowed=allowed)

    def failures(self, what: str) -> list[str]:
        """The failed check for ``what`` ("int8", "ONNX model"), or none: not at chance, not checked, allowed."""
        if not self.checked or not self.at_chance or self.allowed:
            return []
        if self.classes == 1:  # every label the same: always answering it scores 100%
            return [f"{what} top-1 {self.top1:.1f}% on {self.samples} held-out samples cannot be told from chance: "
                    "they are all of one class (answering it always gets 100.0%); give held-out samples of 2 or "
                    "more classes, or pass --allow-chance"]
        if self.baseline + self.margin >= 100.0:  # issue 26: no score on so few samples can show learning
            return [f"{what} top-1 {self.top1:.1f}% on {self.samples} held-out samples cannot be told from chance "
                    f"(guessing gets {self.baseline:.1f}%, +/- {self.margin:.1f}: too few samples); give more "
                    "held-out samples, or pass --allow-chance"]
        return [f"{what} top-1 {self.top1:.1f}% on {self.samples} held-out samples is at chance (guessing gets "
                f"{self.baseline:.1f}%, +/- {self.margin:.1f}); pass --allow-chance if that is expected"]


def _tenth(v: float) -> float:
    """``v`` as printed with one decimal (``f"{v:.1f}"``), the precision every chance figure is shown at."""
    return float(f"{float(v):.1f}")


@dataclass(kw_only=True)
class Int8Accuracy(Figure):
    """Top-1 of the int8 model against fp32 on ``--val`` (``checked`` False: no --val, only the budget)."""

    checked: bool
    fp32_top1: float | None = optional()
    int8_top1: float | None = optional()
    drop: float | None = optional()          # points: fp32 top-1 - int8 top-1
    max_drop: float
    samples: int | None = optional()
    source: str | None = optional()
    chance: Chance | None = optional()       # the int8 model against guessing (the ONNX Runtime backend)

    @property
    def over_budget(self) -> bool:
        return self.checked and self.drop is not None and self.drop > self.max_drop + 1e-9


@dataclass
class Calibration(Figure):
    method: str
    samples: int
    source: str


def compared(new: float, old: float, less: str, more: str, same: str = "the same") -> str:
    """``new`` against ``old`` in words that cannot be misread: "2.30x smaller", "1.40x larger", "0.1% smaller"
    or ``same``. A ratio is always >= 1 and the word says which way it goes; within 10% the change is given in
    percent ("1.00x smaller" hid 62,191 -> 62,101 B, and "0.35x smaller" a larger file: issue 37)."""
    if new == old:
        return same
    if new <= 0 or old <= 0:
        return f"{new:g} against {old:g}"
    word = less if new < old else more
    ratio = max(new, old) / min(new, old)
    if ratio < 1.1:
        pct = f"{abs(new - old) / old * 100:.1f}"
        return f"{'<0.1' if pct == '0.0' else pct}% {word}"
    return f"{ratio:.2f}x {word}"


@dataclass
class Int8Size(Figure):
    """The fp32 model's bytes and the written model's; ``ratio`` is fp32 / int8 (above 1: the int8 file is
    smaller), ``smaller`` says it in a word, and ``change`` as the terminal shows it."""

    fp32_bytes: int
    int8_bytes: int
    ratio: float
    smaller: bool = False
    change: str = ""

    @classmethod
    def of(cls, fp32_bytes: int, int8_bytes: int) -> "Int8Size":
        return cls(fp32_bytes, int8_bytes, fp32_bytes / max(int8_bytes, 1), int8_bytes < fp32_bytes,
                   compared(int8_bytes, fp32_bytes, "smaller", "larger", "the same size"))


@dataclass
class Int8Latency(Figure):
    """p50 of one batch, fp32 and int8, in one runtime at one thread cap; ``measured_on`` says where."""

    fp32_p50_ms: float
    int8_p50_ms: float
    speedup: float
    threads: int
    batch: int
    runtime: str
    measured_on: str

    @classmethod
    def of(cls, fp32_ms: float, int8_ms: float, threads: int, batch: int, runtime: str,
           measured_on: str) -> "Int8Latency":
        return cls(fp32_ms, int8_ms, fp32_ms / int8_ms, threads, batch, runtime, measured_on)

    @property
    def change(self) -> str:
        """The int8 model against fp32 in words: "1.35x faster", "1.20x slower"."""
        return compared(self.int8_p50_ms, self.fp32_p50_ms, "faster", "slower", "as fast")
