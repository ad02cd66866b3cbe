"""One device's share of a round, through edgetrain's own fine-tuning engine.

A round on a device is an ordinary head-only ``edgetrain finetune`` job (frozen part in ONNX Runtime,
features cached, the linear output layer trained in NumPy, micro-batches within the memory budget,
threads capped) whose output layer starts from the *global* weights the coordinator sent. The engine
is used as it is (``edgetrain.training._HeadJob``); the one hook is here: after the job has loaded the
model, its output layer is overwritten with the global arrays, and a global array whose name or shape
does not match the device's model is refused (``ShapeMismatch``), never silently reshaped.
"""
from __future__ import annotations

import importlib
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import runtime
from ..errors import UsageError
from ..netsplit import parse_train_layers
from ..optimizers import NumpySGD
from ..options import FinetuneOptions

ft = importlib.import_module("edgetrain.training")  # the module (edgetrain.training is also the API function)


class ShapeMismatch(UsageError):
    """The global trainable arrays do not fit this device's model (exit 2 on the side that finds it)."""


def check_shapes(mine: dict[str, np.ndarray], theirs: dict[str, tuple], where: str, fix: str) -> None:
    """Refuse ``theirs`` (name -> shape) unless it names exactly ``mine``'s arrays with their shapes."""
    want = {k: tuple(v.shape) for k, v in mine.items()}
    got = {k: tuple(v) for k, v in theirs.items()}
    if want == got:
        return
    missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
    if missing or extra:
        what = f"model mismatch: arrays {', '.join(extra) or '-'} not in this model, {', '.join(missing) or '-'} missing"
    else:
        k = next(k for k in sorted(want) if want[k] != got[k])
        what = f"model mismatch: '{k}' is {'x'.join(map(str, got[k]))} there but {'x'.join(map(str, want[k]))} here"
    raise ShapeMismatch(what, where, fix)


class _FleetHeadJob(ft._HeadJob):
    """A head-only fine-tune whose output layer starts from given arrays (``initial``)."""

    initial: dict[str, np.ndarray] | None = None
    mismatch_where = "global weights"

    def _load(self):
        try:
            super()._load()
        except ft._NotLinear:
            raise UsageError("the model's output layer is not a plain linear layer", self.model,
                             "fleet trains the output layer only; give a model ending in a Dense layer") from None
        if self.initial is not None:
            check_shapes(self.trainable_arrays(), {k: v.shape for k, v in self.initial.items()}, self.mismatch_where,
                         "every device must fine-tune the same model for the same classes (same class_names)")
            for key, name in self.head_names.items():
                if name is not None:
                    self.head[key] = np.array(self.initial[name], dtype=np.float32)  # a copy: the engine trains in place

    correction: dict[str, np.ndarray] | None = None  # SCAFFOLD's (c - c_i), by parameter name

    def _make_training(self) -> None:
        super()._make_training()
        by_key = {k: self.correction[n] for k, n in self.head_names.items() if n and self.correction} or None
        self.opt = _Corrected(self.opt, by_key)

    def trainable_arrays(self) -> dict[str, np.ndarray]:
        """The part that travels: the output layer, by its parameter names."""
        return {self.head_names[k]: v for k, v in self.head.items() if self.head_names.get(k)}


class _Corrected:
    """The engine's optimizer, with a drift correction added to every gradient it is given (SCAFFOLD,
    Karimireddy et al. 2020): devices that each see a few classes otherwise pull the shared output layer
    towards their own classes. Counts the steps, which the new control variate needs."""

    def __init__(self, opt, correction: dict | None):
        self._opt, self._correction, self.steps = opt, correction, 0

    def step(self, grads: dict) -> None:
        if self._correction:
            grads = {k: g + self._correction[k] for k, g in grads.items()}
        self.steps += 1
        self._opt.step(grads)

    def __getattr__(self, name):
        return getattr(self._opt, name)


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


def _job(spec: LocalSpec, data: str, outdir: Path, epochs: int, initial) -> _FleetHeadJob:
    layers = parse_train_layers(spec.train_layers)
    if not (layers.kind == "last" and layers.n == 1):
        raise UsageError(f"fleet trains the output layer only (got --train-layers {spec.train_layers})",
                         "--train-layers", "use --train-layers head")
    # model_construct: internal values (epochs=0 evaluates only), not a user's input to validate
    opts = FinetuneOptions.model_construct(data=str(data), out=str(outdir), epochs=epochs, batch_size=spec.batch_size,
                                           lr=spec.lr, optimizer=spec.optimizer, seed=spec.seed, params=spec.params)
    job = _FleetHeadJob(spec.model, opts, layers=layers, val_split=0.0, budget_mb=spec.budget_mb, threads=spec.threads,
                        profile=spec.device, progress=lambda info: None)
    job.resume = False
    job.initial = initial
    return job


def train_round(spec: LocalSpec, global_arrays: dict[str, np.ndarray], round_no: int,
                correction: dict[str, np.ndarray] | None = None):
    """Train from ``global_arrays`` on the device's data for ``spec.epochs``; returns
    (new trainable arrays, the engine's FinetuneResult). ``correction`` (SCAFFOLD's c - c_i) is added to
    every gradient. The result also carries ``fleet_scale``: how far the weights move per unit of constant
    gradient over this round's steps (the new control variate is the displacement divided by it).
    The round's folder is removed afterwards."""
    outdir = Path(spec.workdir) / f"round-{round_no:04d}"
    shutil.rmtree(outdir, ignore_errors=True)  # a round killed earlier left its scratch here
    job = _job(spec, spec.data, outdir, spec.epochs, global_arrays)
    job.mismatch_where = "global weights from the coordinator"
    job.correction = correction
    try:
        result = job.run(False)
        opt = job.opt._opt
        momentum = getattr(opt, "momentum", 0.0) if isinstance(opt, NumpySGD) else 0.0
        result.fleet_scale = displacement_per_gradient(job.opt.steps, float(job.lr), momentum)
        return {k: v.copy() for k, v in job.trainable_arrays().items()}, result
    finally:
        shutil.rmtree(outdir, ignore_errors=True)


class Evaluator:
    """The coordinator's held-out check: the frozen part's features computed once, then top-1 of any
    output layer in NumPy. Also gives the starting global arrays (the engine's own initialisation)."""

    def __init__(self, spec: LocalSpec, val: str):
        runtime.apply_threads(spec.threads, strict=False)
        self.job = job = _job(spec, val, Path(spec.workdir) / "eval", 0, None)
        job.outdir.mkdir(parents=True, exist_ok=True)
        job._load()
        self.initial = {k: v.copy() for k, v in job.trainable_arrays().items()}
        self.classes = list(job.classes)
        ds = job.train_ds
        session = ft._ort_session(job.prep_dir / ft.FROZEN_ONNX, job.threads, True)
        name = session.get_inputs()[0].name
        feats = [session.run(None, {name: ds.batch(np.arange(s, min(s + 256, len(ds))))})[0]
                 for s in range(0, len(ds), 256)]
        self.features = np.concatenate(feats).reshape(len(ds), -1)
        self.labels = np.asarray(ds.labels)
        self.head_names = dict(job.head_names)

    def top1(self, arrays: dict[str, np.ndarray]) -> float:
        w = arrays[self.head_names["weight"]].reshape(len(self.classes), -1)
        z = self.features @ w.T
        if self.head_names.get("bias"):
            z = z + arrays[self.head_names["bias"]]
        return float(np.mean(np.argmax(z, axis=1) == self.labels))
