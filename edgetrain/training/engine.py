"""What an engine is to the fine-tune job: the one interface it trains through. ``engine_onnx.OnnxEngine`` is the
engine; the job holds it as an ``Engine``, so mypy holds it to this protocol.

The job owns the run (data, plan, checkpoints, signals, progress); the engine owns the model: it loads the ONNX
graph, makes the trainable part, plans its memory, steps, and writes the model. The engine never holds the job:
what it reads of the run is an ``EngineContext`` the job makes, and what it learns later (the data's
preprocessing, the plan's arena) comes as arguments.
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

# a batch of inputs (the frozen part's outputs, or samples) by row index
Inputs = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class EngineContext:
    """What an engine reads of the run, made by the job."""

    model: str                    # MODEL as the user gave it: where a refusal points
    layers: TrainLayers           # --train-layers, parsed once
    outdir: Path                  # where the frozen part's file goes
    seed: int                     # a replaced output layer's and lite's modules' initialisation
    threads: int                  # every session's and BLAS's thread cap
    budget_mb: float | None       # --memory-budget (None: none)
    batch_size: int               # a step's samples (the micro-batch divides it)
    note: Callable[[str], None]   # says something about the run (the result's notes, in order)


@runtime_checkable
class Engine(Protocol):
    name: str                  # a checkpoint resumes only on the engine that wrote it
    model_fp: str              # identifies the graph trained (a checkpoint's fingerprint)
    random_weights: bool
    replaced_head: bool
    feature_shape: tuple       # one sample's input to the trained part at the cut (with a frozen part)
    cut_name: str | None       # where the frozen part ends (None: nothing is frozen whole)

    def open(self, source: Path) -> Preprocess: ...   # reads the ONNX file; returns its preprocessing

    def load(self, pre: Preprocess, within: set[str] | None = None) -> None: ...   # pre: the data's (its classes)

    @property
    def has_frozen(self) -> bool: ...

    def plan(self, rows: int, saved: dict | None) -> tuple[MemoryPlan, Costs]: ...

    def make_optimizer(self, name: str, lr: float, momentum: float | None,
                       weight_decay: float | None, correction: dict | None) -> Corrected: ...   # the one steps use

    def start_from(self, arrays: dict[str, np.ndarray]) -> None: ...

    def frozen_fn(self, arena: bool) -> tuple[Callable[[np.ndarray], np.ndarray], str]: ...   # and the file's sha256

    def features(self, x: np.ndarray) -> np.ndarray: ...

    def step(self, inputs: Inputs, idx: np.ndarray, labels: np.ndarray, micro: int) -> tuple[float, int]: ...

    def settle_statistics(self, inputs: Inputs, rows: int, micro: int) -> None: ...   # before an evaluation

    def evaluate(self, inputs: Inputs, labels: np.ndarray, micro: int) -> tuple[float, float]: ...

    def predict(self, arrays: dict[str, np.ndarray], features: np.ndarray) -> np.ndarray: ...

    def trainable_arrays(self) -> dict[str, np.ndarray]: ...

    def statistics(self) -> set[str]: ...

    def restore(self, arrays: dict[str, np.ndarray], where: str) -> None: ...

    def param_counts(self) -> tuple[int, int]: ...

    def write_model(self, path: Path, pre: Preprocess, extra: dict) -> None: ...

    # a build shared by the jobs of a process (buildstore.py)
    def loaded_state(self) -> dict[str, np.ndarray]: ...

    def shareable(self) -> bool: ...

    def reset(self, initial: dict[str, np.ndarray]) -> None: ...

    def attach(self, ctx: EngineContext) -> None: ...

    def detach(self) -> None: ...

    def release(self) -> None: ...
