"""Which trials run how many epochs: successive halving over epochs (the default), the full grid, or a seeded
random sample of it.

Successive halving (Jamieson & Talwalkar 2016; Hyperband's inner loop, Li et al. 2018): every point trains to
the first rung's epochs, the best 1/ETA go on to the next rung, and so on; the last rung is --epochs. The
rungs are --epochs divided by ETA, ETA^2, ... in whole epochs down to one, then one rung of a fraction of an
epoch if it is at least MIN_RUNG (that share of an epoch's steps: the job stops at that step, checkpointed, and
the next rung resumes it there): 6 epochs -> 2/3, 2, 6; 10 -> 1, 3, 10. At rung k the best floor(n / ETA^k)
points (at least one) go on; 15 points at 6 epochs: 15 x 2/3, 5 to 2, 1 to 6 = 20.7 epochs where the grid
trains 90 (1, 2, 6 before: 24). A trial moves up a rung by resuming its own checkpoint, so nothing is trained
twice.

Into the last rung go the best floor(n / ETA^k) and, beside them, the best point of each trained part
(train_layers) that trains more weights than the leader does. A part with fewer weights learns faster at first
and stops sooner: the output layer alone at a high rate (digits 5-9 inverted, seed 8 of tools/bench_tune.py:
head at lr 0.1 led at 2 epochs, 59% against lite's 49.5%, and ended at 70% where lite reached 88%), so a larger
part is not left out on the strength of a smaller one's early epochs; the reverse does not happen there, and a
part that leads is not joined by smaller ones (on the 15-point grid, where lite leads at 2 epochs in most seeds,
one trial goes to 6 epochs, not three).

Shorter first rungs and harder cuts were measured and lose the best point: --eta 4 (rungs 1/2, 2, 6, keeping 3
of 15) picked lr 0.1 in two seeds of two (18.7 and 39.8 points below the grid's pick on the test set): after
half an epoch the highest rates lead, the best rate (0.01) is still at chance.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass

ETA = 3
MIN_RUNG = 1.0   # epochs: the smallest first rung by default (--min-rung; a fraction is that share of its steps)


@dataclass(frozen=True)
class Rung:
    epochs: int      # a trial at this rung has trained this many epochs (at most its own maximum)
    keep: int        # how many trials train at this rung


def rung_epochs(max_epochs: int, eta: int = ETA, min_rung: float = MIN_RUNG) -> list[float]:
    """The epochs of each rung, ascending, the last ``max_epochs``: each ``eta`` times fewer, whole epochs down to
    one, then one rung of a fraction of an epoch if it is at least ``min_rung``."""
    out: list[float] = [max_epochs]
    while True:
        top = out[0]
        if top < 1 or (top == 1 and min_rung >= 1):
            break
        smaller = top / eta
        if smaller >= 1:
            smaller = max(1, round(smaller))
        elif smaller >= min_rung:
            smaller = round(smaller, 4)
        elif top > 1:
            smaller = 1
        else:
            break
        if smaller >= top:
            break
        out.insert(0, smaller)
    return out


def halving(n: int, max_epochs: int, eta: int = ETA, min_rung: float = MIN_RUNG) -> list[Rung]:
    """Successive halving of ``n`` points up to ``max_epochs``."""
    epochs = rung_epochs(max_epochs, eta, min_rung)
    return [Rung(e, n if k == 0 else max(1, n // eta ** k)) for k, e in enumerate(epochs)]


def full(n: int, max_epochs: int) -> list[Rung]:
    """Every point trained to ``max_epochs`` (the grid; random search on its sample)."""
    return [Rung(max_epochs, n)]


def plan(strategy: str, n: int, max_epochs: int, eta: int = ETA, min_rung: float = MIN_RUNG) -> list[Rung]:
    return halving(n, max_epochs, eta, min_rung) if strategy == "halving" else full(n, max_epochs)


def sample(points: list[dict], count: int | None, strategy: str, seed: int) -> list[int]:
    """The indices of the points tried, in grid order: all (grid, halving without --trials), else a seeded
    sample of ``count`` (random: a quarter of the grid, rounded up, when not given)."""
    n = len(points)
    if count is None:
        count = math.ceil(n / 4) if strategy == "random" else n
    if count >= n:
        return list(range(n))
    return sorted(random.Random(seed).sample(range(n), count))


def planned_epochs(rungs: list[Rung], caps: list[int]) -> int:
    """Epochs the schedule trains if every trial runs (``caps``: each tried point's own maximum), counting a
    trial's epochs once however many rungs it climbs: the best case is the first ``keep`` of the list."""
    total, reached = 0, [0] * len(caps)
    for rung in rungs:
        for i in range(min(rung.keep, len(caps))):
            target = min(rung.epochs, caps[i])
            total += max(0, target - reached[i])
            reached[i] = max(reached[i], target)
    return total
