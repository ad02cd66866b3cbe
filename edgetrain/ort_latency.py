"""Steady-state latency of an ONNX file in ONNX Runtime: load, warm up, then timed single-batch runs."""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class Latency:
    p50_ms: float
    p90_ms: float
    runs: int
    threads: int
    batch: int

    def to_dict(self) -> dict:
        return asdict(self)


def ort_latency(path, batch_shape: tuple[int, ...], threads: int, warmup: int = 3, min_runs: int = 10,
                max_runs: int = 200, budget_s: float = 2.0) -> Latency:
    """p50/p90 over at least ``min_runs`` timed runs, more while within ``budget_s`` seconds.

    Warm-up runs are excluded: the first run allocates buffers and picks kernels.
    """
    from .runtime import ort_session

    session = ort_session(path, threads)
    name = session.get_inputs()[0].name
    x = np.random.RandomState(0).standard_normal(batch_shape).astype(np.float32)
    for _ in range(warmup):
        session.run(None, {name: x})
    times = []
    deadline = time.perf_counter() + budget_s
    while len(times) < max_runs and (len(times) < min_runs or time.perf_counter() < deadline):
        t0 = time.perf_counter()
        session.run(None, {name: x})
        times.append(time.perf_counter() - t0)
    ms = np.asarray(times) * 1000.0
    return Latency(float(np.percentile(ms, 50)), float(np.percentile(ms, 90)), len(times), threads, batch_shape[0])
