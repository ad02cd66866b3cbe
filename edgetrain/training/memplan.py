"""How much memory a fine-tuning job needs, and the plan that keeps it inside a budget.

Two steps. An analytic estimate from the graph (every internal output of one sample, float32) picks
the largest feature-pass batch, training micro-batch and cache placement that fit. Then a probe runs
the real blocks once at exactly those shapes and measures the process's peak RSS; the buffers it
allocated are the ones training reuses (fixed shapes, static allocation), so the probe costs nothing
extra. If the measured peak plus the cache would break the budget, the plan shrinks by the measured
ratio and is probed again; if nothing fits, the job is refused before any training.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field


from ..errors import UsageError

MB = 1024 * 1024
FEATURE_BATCHES = (32, 16, 8, 4, 2, 1)
# the feature pass decodes this many samples at a time (at least one feature batch), split between its
# threads, then runs them through the frozen part batch by batch (data.ParallelReader)
READ_AHEAD = 8
# The frozen part's time per sample is flat in its batch (MobileNetV2-1.0 at 160x160 in ONNX Runtime, 2 threads:
# 8.7, 8.1, 8.6, 7.8 ms of CPU per image at batch 1, 4, 8, 16) while its memory grows with it (127, 146, 166, 220 MB
# peak; the whole head run on 409 images: 130 MB at batch 1, 137 at 2): a feature pass holds at most this much of
# activations, budget or not (one sample at least)
FROZEN_PASS_MB = 12.0
# without a budget: keep one pass's activations moderate
UNBUDGETED_TRAIN_MB = 768.0
UNBUDGETED_CACHE_MB = 1024.0
HEADROOM = 0.92  # of the budget the plan may use; allocator slack and Python objects take the rest
FIXED_OVERHEAD_MB = 16.0
# How much higher another run may measure what the probe measured (a frozen part's session and its first pass,
# read off RSS): the refusal's "at least N MB" leaves room for it, so a re-run with N is not refused again.
# MobileNetV2 layouts built in code, 80x80, last:2 and head, 10 runs each: 151-157 MB; 32x32: 152-156 MB.
MEASURED_SPREAD_MB = 8.0
# The same for the process's own RSS before its first pass (base_mb, read in every mode): --train-layers all on
# that layout read 73 MB and "needs about 132" in five runs, 133 in a sixth, whose "at least" was 1 MB higher.
BASE_SPREAD_MB = 3.0


@dataclass
class Costs:
    """Per-sample and fixed memory of one job, in MiB."""

    base_mb: float            # RSS before any pass: interpreter, mxnet, model, data index
    frozen_per_sample: float  # feature pass (inference, static allocation)
    train_per_sample: float   # trained part forward + backward
    params_mb: float          # trained weights + gradients + optimizer state
    input_per_sample: float   # one decoded input sample
    cache_rows: int
    feature_bytes: int        # one row of the feature cache
    effective_batch: int
    has_frozen: bool
    # how much higher base_mb may read in another run of the same job (MEASURED_SPREAD_MB where part of it was
    # measured rather than reckoned)
    spread_mb: float = 0.0
    # the smallest micro-batch that trains: 2 where BatchNorm normalises by the micro-batch's own statistics (one
    # sample's are its own: MobileNetV2-1.0 lite at 96x96 under 200 MB stepped 1 sample at a time and ended at
    # chance, 0.14-0.21 top-1 over 5 classes)
    min_micro: int = 1

    @property
    def least_micro(self) -> int:
        """The smallest micro-batch a plan may take: min_micro, or the whole batch when that is smaller."""
        return min(self.min_micro, self.effective_batch)

    @property
    def cache_mb(self) -> float:
        return self.cache_rows * self.feature_bytes / MB if self.has_frozen else 0.0


@dataclass
class MemoryPlan:
    feature_batch: int
    micro_batch: int
    cache: str  # "memory" | "disk" | "none"
    estimate_mb: float
    budget_mb: float | None
    cache_mb: float
    method: str = "analytic"
    probe_peak_mb: float | None = None
    # ONNX Runtime's CPU arena for the frozen part. On, budget or not: the feature pass's shapes never change,
    # so the arena grows once, in the first batch. With it off every activation goes through malloc and
    # glibc's heap creeps: MobileNetV2 under --memory-budget 200MB peaked at 109-168 MB over 6 runs, against
    # 109-125 MB with the arena. A plan saved (in a checkpoint) with it off keeps it off.
    arena: bool = True
    # --train-layers bias/lite: the forward (and each Conv's input gradient) in ONNX Runtime sessions, when
    # they fit the budget and ort_step is not used; else NumPy's. A resumed run keeps the choice (the two round differently).
    ort_forward: bool = False
    # --train-layers bias/lite: the whole step (forward, loss gradient, backward) as one ONNX Runtime graph
    # (ort_train), when its backward can be written in ONNX and the sessions fit; kept on resume as above
    ort_step: bool = False
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def divisors_desc(n: int) -> list[int]:
    return [d for d in range(n, 0, -1) if n % d == 0]


def estimate(c: Costs, fb: int, m: int, cache: str, scale: float = 1.0) -> float:
    frozen = c.frozen_per_sample * fb * scale if c.has_frozen else 0.0
    inputs = c.input_per_sample * (max(fb, READ_AHEAD) if c.has_frozen else m) * 2
    train = c.train_per_sample * m * scale
    cache_mb = c.cache_mb if cache == "memory" else 0.0
    return c.base_mb + c.params_mb + frozen + train + inputs + cache_mb + FIXED_OVERHEAD_MB


def choose(c: Costs, budget_mb: float | None, scale: float = 1.0) -> MemoryPlan:
    """The best (feature batch, micro-batch, cache placement) that fits ``budget_mb`` (None: no budget)."""
    fbs = [b for b in FEATURE_BATCHES if b <= max(c.effective_batch, 1)
           and (b == 1 or c.frozen_per_sample * b * scale <= FROZEN_PASS_MB)] or [1]
    if not c.has_frozen:
        fbs = [1]
    ms = [d for d in divisors_desc(c.effective_batch) if d >= c.least_micro]
    caches = ("memory", "disk") if c.has_frozen else ("none",)
    if budget_mb is None:
        fb = fbs[0]
        m = next((d for d in ms if c.train_per_sample * d * scale <= UNBUDGETED_TRAIN_MB), ms[-1])
        cache = caches[0] if c.cache_mb <= UNBUDGETED_CACHE_MB or not c.has_frozen else "disk"
        return MemoryPlan(fb, m, cache, estimate(c, fb, m, cache, scale), None, c.cache_mb)
    best = None
    for cache in caches:
        for m in ms:
            for fb in fbs:
                need = estimate(c, fb, m, cache, scale)
                if need > budget_mb * HEADROOM:
                    continue
                score = (min(m, 32), min(fb, 16), cache == "memory", fb)
                if best is None or score > best[0]:
                    best = (score, MemoryPlan(fb, m, cache, need, budget_mb, c.cache_mb))
    if best is None:
        raise refusal(c, budget_mb, scale)
    return best[1]


def plan_for(c: Costs, budget_mb: float | None, saved: dict | None) -> MemoryPlan:
    """A resumed run's ``saved`` plan (kept: other shapes would change its arithmetic), else ``choose``'s;
    the feature batch within FEATURE_BATCHES either way."""
    plan = MemoryPlan(**saved) if saved is not None else choose(c, budget_mb)
    plan.feature_batch = min(plan.feature_batch, max(FEATURE_BATCHES))
    return plan


RUN_FIELDS = ("feature_batch", "micro_batch", "cache", "arena", "ort_forward", "ort_step")


def same_run(saved: dict, plan: dict) -> bool:
    """A checkpoint's plan (``to_dict``'s) trains as ``plan`` does: the same batches, cache and runtimes (the
    estimates may differ); its feature batch as plan_for reads it."""
    saved = {**saved, "feature_batch": min(saved.get("feature_batch", 0), max(FEATURE_BATCHES))}
    return all(k in saved and saved[k] == plan[k] for k in RUN_FIELDS)


def refusal(c: Costs, budget_mb: float, scale: float = 1.0) -> UsageError:
    least_m = c.least_micro
    least = estimate(c, 1, least_m, "disk" if c.has_frozen else "none", scale)
    # in whole MB, above what the plan may use of it (never the budget given), with room for what another run
    # measures (so that the re-run it advises is not refused in turn)
    need = math.floor((least + max(c.spread_mb, BASE_SPREAD_MB)) / HEADROOM) + 1
    parts = (f"{c.base_mb:.0f} MB for the process before its first pass (Python, the runtimes loaded, the model, "
             "the data index), "
             f"{(c.frozen_per_sample if c.has_frozen else c.train_per_sample) * scale:.1f} MB per sample in a pass")
    if c.base_mb + FIXED_OVERHEAD_MB >= budget_mb * HEADROOM:
        fix = (f"a budget below {need:.0f} MB is impossible for this model here; raise --memory-budget, "
               "or use a smaller model")
    else:
        fix = (f"raise --memory-budget to at least {need:.0f} MB, or train fewer layers (--train-layers head), "
               "or use a smaller --input-shape")
    why = " (BatchNorm trains on each micro-batch's own statistics: 1 sample has none to normalise by)" \
        if least_m > 1 else ""
    disk = " with the feature cache on disk" if c.has_frozen else ""
    return UsageError(f"memory budget {budget_mb:.0f} MB is too small: even micro-batch {least_m}{why}{disk} "
                      f"needs about {least:.0f} MB ({parts}), and the plan may use "
                      f"{budget_mb * HEADROOM:.0f} MB of it ({1 - HEADROOM:.0%} is kept for the allocator's slack)",
                      "--memory-budget", fix)
