"""One device's share of a round, through edgetrain's own fine-tuning job.

A round on a device is an ordinary ``edgetrain finetune`` job (frozen part in ONNX Runtime, features
cached, micro-batches within the memory budget, threads capped) whose trainable part starts from the
*global* weights the coordinator sent (the job's ``initial``), with SCAFFOLD's correction added to its
gradients (``correction``) and no model written (``write_model=False``): a round's result is its arrays.

- The job's engine is the one ``edgetrain finetune`` picks: ``head`` / ``last:N`` in NumPy (no mxnet in the
  round), in MXNet where NumPy cannot run the part, ``all`` in MXNet.
- What travels is every array of the trained part: its trainable parameters (weights, biases, BatchNorm
  gamma/beta) and its BatchNorm running statistics (mean, variance), named as in the model's graph by
  either engine. The statistics are not trained by gradients: they travel as float32 whatever the codec
  (a variance must stay positive; they are two numbers per channel), are averaged weighted by samples like
  the rest, and get no SCAFFOLD control variate.
- A global array whose name or shape does not match the device's model is refused (``ShapeMismatch``),
  never silently reshaped.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import runtime
from ..options import FinetuneOptions, parse_train_layers
from ..training import FinetuneJob, ShapeMismatch, check_shapes

__all__ = ["Evaluator", "LocalSpec", "ShapeMismatch", "check_shapes", "displacement_per_gradient", "train_round"]


def displacement_per_gradient(steps: int, lr: float, momentum: float) -> float:
    """How far ``steps`` SGD steps with momentum move the weights per unit of a constant gradient."""
    return lr * sum((1 - momentum ** t) / (1 - momentum) for t in range(1, steps + 1)) if momentum else lr * steps


@dataclass
class LocalSpec:
    """What one device's round needs (the coordinator's round settings + the device's own options)."""

    model: str
    data: str
    workdir: str
    epochs: int = 1
    batch_size: int = 32
    lr: float | None = None
    optimizer: str = "sgd"
    seed: int = 0
    threads: int | None = None
    budget_mb: float | None = None
    device: object = None  # a DeviceProfile or None
    params: str | None = None
    train_layers: str = "head"


def _job(spec: LocalSpec, data: str, outdir: Path, epochs: int, **extension) -> FinetuneJob:
    # unchecked: internal values (epochs=0 evaluates only), not a user's input to validate
    opts = FinetuneOptions.unchecked(data=str(data), out=str(outdir), epochs=epochs, batch_size=spec.batch_size,
                                    lr=spec.lr, optimizer=spec.optimizer, seed=spec.seed, params=spec.params)
    return FinetuneJob(spec.model, opts, layers=parse_train_layers(spec.train_layers), val_split=0.0,
                       budget_mb=spec.budget_mb, threads=spec.threads, profile=spec.device,
                       progress=lambda info: None, write_model=False, **extension)


def train_round(spec: LocalSpec, global_arrays: dict[str, np.ndarray], round_no: int,
                correction: dict[str, np.ndarray] | None = None):
    """Train from ``global_arrays`` on the device's data for ``spec.epochs``; returns
    (new arrays that travel, the engine's FinetuneResult). ``correction`` (SCAFFOLD's c - c_i, by name) is
    added to the gradient of each array it names. The result also carries ``fleet_scale``: how far the
    weights move per unit of constant gradient over this round's steps (the new control variate is the
    displacement divided by it), and ``fleet_statistics``: the names of the arrays no gradient trains.
    The round's folder is removed afterwards."""
    outdir = Path(spec.workdir) / f"round-{round_no:04d}"
    shutil.rmtree(outdir, ignore_errors=True)  # a round killed earlier left its scratch here
    job = _job(spec, spec.data, outdir, spec.epochs, initial=global_arrays,
               initial_where="global weights from the coordinator", correction=correction)
    try:
        result = job.run(False)
        result.fleet_scale = displacement_per_gradient(job.opt.steps, float(job.lr), job.opt.momentum)
        result.fleet_statistics = job.statistics()
        return job.trainable_arrays(), result
    finally:
        shutil.rmtree(outdir, ignore_errors=True)


class Evaluator:
    """The coordinator's held-out check: the frozen part's features computed once, then top-1 of any
    trainable arrays (the job's ``evaluate``: BatchNorm in inference mode with the running statistics
    given). Also gives the starting global arrays (the engine's own initialisation) and ``statistics``,
    the names among them that no gradient trains."""

    def __init__(self, spec: LocalSpec, val: str):
        runtime.apply_threads(spec.threads, strict=False)
        self.job = job = _job(spec, val, Path(spec.workdir) / "eval", 0)
        job.outdir.mkdir(parents=True, exist_ok=True)
        job.load()
        self.classes = list(job.classes)
        self.initial = job.trainable_arrays()
        self.statistics = job.statistics()

    def top1(self, arrays: dict[str, np.ndarray]) -> float:
        return self.job.evaluate(arrays)
