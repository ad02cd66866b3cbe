"""What an engine is to the fine-tune job: the one interface it trains through (``engine_onnx.OnnxEngine`` is
the engine; a test holds it to this protocol), and the small frozen context it is given instead of the job.

The job owns the run (data, plan, checkpoints, signals, progress); the engine owns the model: it loads the ONNX
graph, asks the job's data for the preprocessing the file records (``read_data``), makes the trainable part,
plans its memory, steps, and writes the model. It never calls back into the job.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from ..options import TrainLayers
from ..preprocess import Preprocess
from .memplan import Costs, MemoryPlan
from .optimizers import Corrected

# reads the data for a model's preprocessing (the file's, with --mean/--std) and returns the preprocessing the
# run uses, its class names the data's
ReadData = Callable[[Preprocess], Preprocess]
# a batch of inputs (the frozen part's outputs, or samples) by row index
Inputs = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class EngineContext:
    """What an engine is given: fixed for the whole run."""

    model: str                 # MODEL as the user gave it (what errors name)
    layers: TrainLayers        # what trains, parsed once at the declaration
    seed: int
    threads: int | None
    budget_mb: float | None
    batch_size: int            # the effective batch a step accumulates to
    outdir: Path
    notes: list[str]           # the run's notes: the engine appends what the user should know


@runtime_checkable
class Engine(Protocol):
    name: str                  # a checkpoint resumes only on the engine that wrote it
    model_fp: str              # identifies the graph trained (a checkpoint's fingerprint)
    random_weights: bool
    replaced_head: bool
    opt: Corrected | None      # made by make_optimizer

    def load(self, source: Path, read_data: ReadData, within: set[str] | None = None) -> None: ...

    @property
    def has_frozen(self) -> bool: ...

    @property
    def feature_shape(self) -> tuple: ...

    @property
    def cut_name(self) -> str | None: ...

    def plan(self, rows: int, saved: dict | None) -> tuple[MemoryPlan, Costs]: ...

    def make_optimizer(self, name: str, lr: float, correction: dict[str, np.ndarray] | None) -> Corrected: ...

    def start_from(self, arrays: dict[str, np.ndarray]) -> None: ...

    def frozen_fn(self, arena: bool, fingerprint: str) -> tuple[Callable[[np.ndarray], np.ndarray], dict | None]: ...

    def features(self, x: np.ndarray) -> np.ndarray: ...

    def step(self, inputs: Inputs, idx: np.ndarray, labels: np.ndarray, micro: int) -> tuple[float, int]: ...

    def evaluate(self, inputs: Inputs, labels: np.ndarray, micro: int) -> tuple[float, float]: ...

    def predict(self, arrays: dict[str, np.ndarray], features: np.ndarray) -> np.ndarray: ...

    def reseed(self, seed: int, global_step: int) -> None: ...

    def trainable_arrays(self) -> dict[str, np.ndarray]: ...

    def statistics(self) -> set[str]: ...

    def restore(self, arrays: dict[str, np.ndarray], where: str) -> None: ...

    def param_counts(self) -> tuple[int, int]: ...

    def write_model(self, path: Path, pre: Preprocess, extra: dict) -> None: ...
