"""Issue 17's goal: quickstarts run back to back give modelled energy figures within 15% of each other.

Runs `edgetrain run -o DIR` N times in a row (default 2, the quickstart), then prints each run's energy per
inference, estimated p50 latency, the reference timing behind it, its interval, the contention measured, the
host's load and the largest difference between runs; then, per run, whether its interval holds every other
run's figure and whether a run off the batch median by more than 10% was flagged (issue 24's goal). A goal, not
a test: the figure depends on how busy the host is.

The paired timing (model and speed reference in turns, in one child) records each round's ratio; the estimate
takes their median. Each run's JSON also carries the ratio of the two medians (the way before), so the same
runs give the figure both ways: "median of ratios" (what edgetrain reports) and "ratio of medians" (the
modelled energy scales with the p50 latency, so that figure is the reported one x ratio_of_medians / median).

    python tools/energy_repeat.py [--runs 2] [RECIPE]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path


def one(recipe: str | None, out: Path) -> dict:
    load0 = os.getloadavg()[0]
    cmd = [sys.executable, "-m", "edgetrain", "run", *([recipe] if recipe else []), "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode not in (0, 3):
        sys.exit(f"{' '.join(cmd)} failed with exit {proc.returncode}:\n{proc.stderr[-2000:]}")
    result = json.loads((out / "result.json").read_text())
    profile = json.loads((out / "steps" / "profile.json").read_text())
    lat = profile["verdict"]["latency"]
    return {"energy_mj": result["summary"]["energy_per_inference_mj"], "provenance": result["summary"]["energy_provenance"],
            "p50_ms": lat.get("p50_ms"), "basis": lat.get("basis"), "factor": lat.get("factor"),
            "reference_ms": (lat.get("reference") or {}).get("host_cpu_ms") or (lat.get("reference") or {}).get("host_ms"),
            "spread": (profile["energy"]["per_inference"].get("spread") or {}),
            "unreliable": (profile["energy"].get("reliability") or {}).get("reasons"),
            "ratio": (lat.get("paired") or {}).get("ratio"),
            "interval": profile["energy"]["per_inference"].get("uncertainty") or {},
            "contention": (lat.get("paired") or {}).get("contention") or {},
            "load": (load0, os.getloadavg()[0])}


def why(reasons: list[str] | None) -> str:
    """'no', or 'yes (load, contention)': which of energy.reliability's reasons flagged the run."""
    if not reasons:
        return "no"
    kinds = ["load" if "load average" in r else "contention" if r.startswith("contention") else "p99/p50"
             for r in reasons]
    return f"yes ({', '.join(dict.fromkeys(kinds))})"


def holds(r: dict, value: float) -> bool:
    return r["interval"].get("low_mj", float("inf")) <= value <= r["interval"].get("high_mj", float("-inf"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", nargs="?")
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgetrain-energy-repeat-") as tmp:
        for i in range(args.runs):
            r = one(args.recipe, Path(tmp) / f"q{i + 1}")
            rows.append(r)
            u, c = r["interval"], r["contention"]
            print(f"run {i + 1}: {r['energy_mj']:.3f} mJ [{r['provenance']}]  p50 {r['p50_ms']:.3f} ms "
                  f"(basis {r['basis']}, factor {r['factor']:.3g}, reference {r['reference_ms']:.3g} ms)  "
                  f"interval {u.get('low_mj', float('nan')):.3f}-{u.get('high_mj', float('nan')):.3f} mJ  "
                  f"contention {c.get('drift', float('nan')):.3f} (in run {c.get('in_run', float('nan')):.3f} x "
                  f"shift {c.get('reference_shift', float('nan')):.3f})  load {r['load'][0]:.2f}->{r['load'][1]:.2f}"
                  f"{'  UNRELIABLE' if r['unreliable'] else ''}", flush=True)
    values = [r["energy_mj"] for r in rows]
    median = sorted(values)[len(values) // 2] if len(values) % 2 else \
        sum(sorted(values)[len(values) // 2 - 1:len(values) // 2 + 1]) / 2
    print(f"largest / smallest: {max(values) / min(values):.3f} (goal: at most 1.15)  [median of per-round ratios]")
    if all(r["ratio"] for r in rows):
        old = [r["energy_mj"] * r["ratio"]["ratio_of_medians"] / r["ratio"]["p50"] for r in rows]
        print("same runs, ratio of medians: " + "  ".join(f"{v:.3f}" for v in old) +
              f" mJ; largest / smallest: {max(old) / min(old):.3f}")
    # The goal (issue 24): each run's interval holds every other run's figure in >= 90% of the pairs, and every
    # run off the batch's median by more than 10% is flagged unreliable.
    print("run  figure  off median  interval holds (others)  low side / high side  flagged  off>10% & not flagged")
    pairs = held = missed = 0
    for i, r in enumerate(rows):
        others = [v for j, v in enumerate(values) if j != i]
        n = sum(holds(r, v) for v in others)
        pairs, held = pairs + len(others), held + n
        off = r["energy_mj"] / median - 1
        miss = abs(off) > 0.10 and not r["unreliable"]
        missed += miss
        u = r["interval"]
        print(f"{i + 1:>3}  {r['energy_mj']:.3f}  {off:+.1%}  {n}/{len(others)}  "
              f"-{u.get('minus_mj', 0) / r['energy_mj']:.1%} / +{u.get('plus_mj', 0) / r['energy_mj']:.1%}  "
              f"{why(r['unreliable'])}  {'MISSED' if miss else ''}")
    if pairs:
        print(f"interval holds the other run's figure: {held}/{pairs} pairs ({held / pairs:.0%}; goal >= 90%); runs off "
              f"the median by > 10% and not flagged: {missed} (goal 0); median low side "
              f"-{sorted(r['interval'].get('minus_mj', 0) / r['energy_mj'] for r in rows)[len(rows) // 2]:.1%}")

if __name__ == "__main__":
    main()
