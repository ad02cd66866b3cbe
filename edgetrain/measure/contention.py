"""How far a busy host moved a paired timing: measured in the run, against the host's quiet figure.

The device's latency is the reference's published figure x the median model/reference CPU-time ratio of a
paired child (``child.paired``). Timing both in turns cancels what slows both alike, not what slows the
model more: measured here (2026-12-03, 2 shared cores, tools/energy_repeat.py), a neighbour's memory
traffic slowed the reference's CPU time from 4.2 to ~6 ms and raised the model's ratio ~25%, for whole
runs at a time, so the spread of the per-round ratios within a run did not see it. Two measures of it:

- in the run: the median ratio over the ratio of the two workloads' fastest runs (each at its least
  disturbed moment in this run): how far contention lifted this run's figure above its own quiet moments;
- across runs: the reference's median CPU time over the lowest median this host has given it (kept in the
  per-user cache, ``QUIET_FILE``, per CPU, reference and runtime): a whole run slowed, which the first
  measure cannot see. Medians, not the fastest runs: the lowest of many runs' fastest drifts down with every
  run (3.8 ms against a quiet run's 4.2 here) and then flags quiet runs. Until the host has been seen
  quiet it is not known (the first run counts as quiet).
  Where this model (by its file's digest) was timed here before, the median ratio over the lowest median
  ratio it has had here is taken when it is more: a neighbour may slow the model and not the reference.

Their product (or the model's own, when more), ``drift``, bounds how much the figure may read high: the
reference slowing by a factor moved the ratio by less than that factor in every run measured, so taking it
whole errs wide. The figure's interval reaches down to the figure / drift (its upper end, the p90 ratio x
the profile's full-load power, already lies far above: +90% or more on the quickstart), and a drift above
``1 + CONTENTION_LIMIT`` flags the figure unreliable (energy.reliability), with the figures in the reason.
"""
from __future__ import annotations

import json
import statistics

from ..fileio import atomic_write_text, cache_root

QUIET_FILE = "quiet-reference-p50.json"  # (a first version kept the fastest runs: not read)
# Above this the host's contention may have moved the figure by more than 10%: flagged unreliable.
CONTENTION_LIMIT = 0.10


def measure(model_cpu_ms: list[float], ref_cpu_ms: list[float], ratio_p50: float, key: str,
            model_key: str | None = None) -> dict:
    """The contention behind a paired timing (see the module's account); remembers the reference's median CPU
    time (and, with ``model_key``, the model's median ratio) on this host when it is the lowest yet."""
    model_fast, ref_fast = min(model_cpu_ms), min(ref_cpu_ms)
    quiet_ratio = model_fast / max(ref_fast, 1e-9)
    in_run = max(ratio_p50 / quiet_ratio, 1.0) if quiet_ratio > 0 else 1.0
    ref_p50 = statistics.median(ref_cpu_ms)
    quiet_ref, known = _quiet(key, ref_p50)
    shift = max(ref_p50 / quiet_ref, 1.0)
    drift = in_run * shift
    out = {"in_run": in_run, "reference_shift": shift, "quiet_ratio": quiet_ratio,
           "reference_fastest_cpu_ms": ref_fast, "model_fastest_cpu_ms": model_fast, "reference_cpu_p50_ms": ref_p50,
           "reference_quiet_cpu_ms": quiet_ref, "quiet_known": known, "limit": 1.0 + CONTENTION_LIMIT}
    how = ""
    if model_key is not None:
        # The same model timed here before: this run's median ratio over the lowest median ratio it has had on this
        # host. A neighbour that slows the model and not the reference (a cache-resident model, a memory-bound
        # neighbour) shows here only. Medians, not the fastest runs: the lowest of many runs' fastest would drift
        # down with every run and flag quiet ones.
        # Only a run its own measures call quiet is remembered: a reference slowed more than the model lowers the
        # ratio (measured: 1.27 and 1.31 mJ against ~1.43 on a quiet host), and the lowest would then flag the rest.
        quiet_ratio_ever, model_known = _quiet(f"{key}|model ratio {model_key}", ratio_p50,
                                               remember=drift <= 1.0 + CONTENTION_LIMIT / 2)
        out["model_quiet_ratio"] = quiet_ratio_ever
        if model_known:
            ever = ratio_p50 / quiet_ratio_ever
            out["against_quietest"] = ever
            if ever > drift:
                drift = ever
                how = (f"; this model's median ratio over its lowest on this host ({quiet_ratio_ever:.4g}) is more, "
                       f"{ever:.3f}, and is taken")
    out["drift"] = drift
    out["source"] = ("the median model/reference ratio over the ratio of their fastest runs in this run "
                     f"({in_run:.3f}) x the reference's median CPU time {ref_p50:.3g} ms over the lowest this host "
                     f"has given it, {quiet_ref:.3g} ms ({shift:.3f})" + how
                     + ("" if known else "; this host's quiet figure is this run's own (the first seen)"))
    return out


def _quiet(key: str, ref_fast: float, remember: bool = True) -> tuple[float, bool]:
    """(the lowest median this host has given ``key`` (a CPU time, or a model's ratio), whether it was known before this run)."""
    root = cache_root()
    path = root / QUIET_FILE if root is not None else None
    seen: dict = {}
    if path is not None and path.is_file():
        try:
            seen = json.loads(path.read_text())
            if not isinstance(seen, dict):
                seen = {}
        except (OSError, ValueError):
            seen = {}  # an unreadable memory is forgotten, not an error
    before = seen.get(key)
    before = float(before) if isinstance(before, (int, float)) and before > 0 else None
    if not remember:
        return (before if before is not None else ref_fast), before is not None
    if path is not None and (before is None or ref_fast < before):
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps({**seen, key: ref_fast}, indent=1), "quiet reference memory")
        except Exception:  # noqa: BLE001 - a read-only cache: the figure is not remembered, the run goes on
            pass
    return (min(before, ref_fast) if before is not None else ref_fast), before is not None
