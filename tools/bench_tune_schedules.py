"""Halving schedules replayed on the grid's own histories (issue 35): which pick, at what cost, per seed.

A trial trains the same bits whatever the schedule (a rung resumes its checkpoint: tests/test_tune_kill.py), so
the held-out accuracy a schedule sees at epoch e is the grid's history at e, and a pick that ends at 6 epochs is
the grid's model of that trial, scored on the test set here. Runs kept by ``tools/bench_tune.py --keep DIR``
(``SEEDDIR/grid`` and ``SEEDDIR/halving-eta3``) are read; each run's CPU seconds are a line per trained part,
set-up + epochs x an epoch, fitted to every run recorded there (a SEEDDIR with the grid alone, e.g. one made by
a grid run of another seed, adds its trials but no runs to the fit). Ranking as the tuner's (held-out, then grid
order); into the last rung also the best of each part that trains more weights than the leader; the pick among
the trials trained to 6 epochs, as the tuner's. With ties Z (the rows marked `ties`), a point within Z standard
errors of the last one kept (the held-out difference of two readings on HELD_OUT rows) goes on too: a cut
inside the held-out figure's noise is not made on its noise.

    python tools/bench_tune_schedules.py SEEDDIR [SEEDDIR ...]
"""
from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_tune import test_top1  # noqa: E402

WEIGHTS = {"head": 165, "bias": 245, "lite": 7877}   # the digits CNN's trained weights per part (tune.json)
HELD_OUT = 200   # bench_tune's held-out rows
SCHEDULES = [([1, 2, 6], [15, 5, 1], 0), ([1, 2, 6], [15, 3, 1], 0), ([1, 2, 6], [15, 5, 2], 0),
             ([1, 2, 6], [15, 3, 2], 0), ([1, 2, 6], [15, 5, 3], 0), ([1, 3, 6], [15, 3, 1], 0),
             ([1, 3, 6], [15, 5, 1], 0), ([1, 6], [15, 1], 0), ([1, 6], [15, 2], 0), ([1, 6], [15, 3], 0),
             ([1, 2, 6], [15, 5, 1], 1), ([1, 2, 6], [15, 5, 1], 2), ([1, 3, 6], [15, 3, 1], 1),
             ([1, 3, 6], [15, 3, 1], 2), ([1, 6], [15, 1], 2)]


def read(seed_dir: Path) -> tuple[dict, list]:
    grid = json.loads((seed_dir / "grid" / "tune.json").read_text())
    runs, trials = [], []
    for name in ("grid", "halving-eta3"):
        if not (seed_dir / name / "tune.json").is_file():
            continue
        kind = {t["trial"]: t["train_layers"] for t in json.loads((seed_dir / name / "tune.json").read_text())["trials"]}
        for line in (seed_dir / name / "journal.jsonl").read_text().splitlines():
            rec = json.loads(line)
            if rec.get("kind") == "rung":
                runs.append((kind[rec["trial"]], rec["trained"], rec["cpu_seconds"]))
                if name == "grid":
                    model = seed_dir / "grid" / "trials" / f"{rec['trial']:03d}" / "model.onnx"
                    trials.append({"trial": rec["trial"], "layers": kind[rec["trial"]], "history": rec["history"],
                                   "test": test_top1(model, seed_dir / "test.npz")})
    return {"pick": grid["chosen"]["trial"], "trials": trials}, runs


def fit(runs: list) -> dict:
    out = {}
    for kind in WEIGHTS:
        pts = [(n, c) for k, n, c in runs if k == kind]
        nm, cm = statistics.mean(n for n, _ in pts), statistics.mean(c for _, c in pts)
        slope = sum((n - nm) * (c - cm) for n, c in pts) / sum((n - nm) ** 2 for n, _ in pts)
        out[kind] = (cm - slope * nm, slope)
    return out


def replay(trials: list, rungs: list, keeps: list, cost, ties: float = 0) -> tuple[dict, int, float]:
    by = {t["trial"]: t for t in trials}
    at = dict.fromkeys(by, 0)
    spent, alive = 0.0, list(by)
    acc = lambda n: by[n]["history"][at[n] - 1]  # noqa: E731
    for k, (epochs, keep) in enumerate(zip(rungs, keeps)):
        if k:
            ranked = sorted(alive, key=lambda n: (-acc(n), n))
            alive = ranked[:keep]
            last = acc(alive[-1])
            noise = ties * (2 * max(last * (1 - last), 0.0025) / HELD_OUT) ** 0.5
            alive += [n for n in ranked[keep:] if ties and last - acc(n) <= noise]
            if k == len(rungs) - 1:
                lead = WEIGHTS[by[alive[0]]["layers"]]
                alive += [n for n in ranked if WEIGHTS[by[n]["layers"]] > lead
                          and all(by[a]["layers"] != by[n]["layers"] for a in alive)]
        for n in alive:
            spent += cost(by[n]["layers"], epochs - at[n])
            at[n] = epochs
    pick = min((n for n in at if at[n] == 6), key=lambda n: (-acc(n), n))
    return by[pick], at[pick], spent


def main() -> None:
    seeds = [read(Path(d)) for d in sys.argv[1:]]
    line = fit([r for _, runs in seeds for r in runs])
    print("CPU seconds per run: " + ", ".join(f"{k} {a:.4f} + {b:.4f}/epoch" for k, (a, b) in line.items()))
    cost = lambda kind, n: line[kind][0] + line[kind][1] * n if n > 0 else 0.0  # noqa: E731
    for rungs, keeps, ties in SCHEDULES:
        drops, ratios = [], []
        for grid, _ in seeds:
            best = next(t for t in grid["trials"] if t["trial"] == grid["pick"])
            pick, epochs, spent = replay(grid["trials"], rungs, keeps, cost, ties)
            drops.append(best["test"] - pick["test"] if epochs == 6 else float("inf"))
            ratios.append(spent / sum(cost(t["layers"], 6) for t in grid["trials"]))
        ok = sum(d <= 1.0 for d in drops)
        print(f"rungs {str(rungs):10s} keep {str(keeps):12s} {f'ties {ties}' if ties else '':6s} within 1 point "
              f"{ok:2d} of {len(seeds)}  CPU / grid median {statistics.median(ratios):.3f} max {max(ratios):.3f}  "
              "misses " + " ".join(f"{d:+.1f}" for d in drops if d > 1.0))


if __name__ == "__main__":
    main()
