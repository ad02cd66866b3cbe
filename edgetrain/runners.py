"""Runners: load a model once, infer, and time it (Polygraphy's BaseRunner idea).

``OrtRunner`` runs an ONNX file (or bytes) in an ONNX Runtime CPU session with the thread cap applied;
``FunctionRunner`` wraps any ``predict(x)`` (a Gluon model, MXNet's int8 net). ``time_runs`` is the one
steady-state timing loop: warm-up runs excluded (the first run allocates buffers and picks kernels), then at
least ``min_runs`` timed runs, more while within ``budget_s``.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Callable

import numpy as np

from ._lazy import ort_session
from .runtime import current_threads


@dataclass
class Latency:
    p50_ms: float
    p90_ms: float
    runs: int
    threads: int
    batch: int

    def to_dict(self) -> dict:
        return asdict(self)


def time_runs(run: Callable[[np.ndarray], object], x: np.ndarray, threads: int | None = None, warmup: int = 3,
              min_runs: int = 10, max_runs: int = 200, budget_s: float = 2.0) -> Latency:
    for _ in range(warmup):
        run(x)
    times: list[float] = []
    deadline = time.perf_counter() + budget_s
    while len(times) < max_runs and (len(times) < min_runs or time.perf_counter() < deadline):
        t0 = time.perf_counter()
        run(x)
        times.append(time.perf_counter() - t0)
    ms = np.asarray(times) * 1000.0
    return Latency(float(np.percentile(ms, 50)), float(np.percentile(ms, 90)), len(times),
                   threads or current_threads(), int(x.shape[0]))


class FunctionRunner:
    """Any ``predict(x) -> scores`` as a runner."""

    def __init__(self, predict: Callable[[np.ndarray], np.ndarray], threads: int | None = None):
        self.infer, self.threads = predict, threads

    def time(self, x: np.ndarray, **kw) -> Latency:
        return time_runs(self.infer, x, self.threads, **kw)


class OrtRunner:
    """An ONNX model in an ONNX Runtime session; ``infer`` returns the first output. A model exported with
    a fixed batch size runs that many samples at a time."""

    def __init__(self, model, threads: int | None = None, optimize: bool = True):
        self.threads = threads or current_threads()
        self.session = ort_session(model, self.threads, optimize)
        inp = self.session.get_inputs()[0]
        self.input_name = inp.name
        self.fixed_batch = inp.shape[0] if isinstance(inp.shape[0], int) and inp.shape[0] > 0 else None

    def run(self, x: np.ndarray, names: list[str] | None = None) -> list[np.ndarray]:
        return self.session.run(names, {self.input_name: x})

    def infer(self, x: np.ndarray) -> np.ndarray:
        n = self.fixed_batch
        if n is None or len(x) == n:
            return self.run(x)[0]
        return np.concatenate([self.run(x[i:i + n])[0] for i in range(0, len(x), n)])

    def time(self, x: np.ndarray | None = None, batch_shape: tuple[int, ...] | None = None, **kw) -> Latency:
        if x is None:
            x = np.random.RandomState(0).standard_normal(batch_shape).astype(np.float32)
        return time_runs(self.infer, x, self.threads, **kw)
