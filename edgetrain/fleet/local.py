"""One device's share of a round, through edgetrain's own fine-tuning engine.

A round on a device is an ordinary ``edgetrain finetune`` job (frozen part in ONNX Runtime, features
cached, micro-batches within the memory budget, threads capped) whose trainable part starts from the
*global* weights the coordinator sent:

- ``--train-layers head`` or ``last:N``: the engine's NumPy job (``edgetrain.training._NumpyJob``: the
  trained part in NumPy, no mxnet in the round), or, for a trained part NumPy cannot run (an op it lacks),
  the engine's general job in MXNet (``_Job``), as ``edgetrain finetune`` does; ``all``: the general job.
- What travels is every array of the trained part: its trainable parameters (weights, biases, BatchNorm
  gamma/beta) and its BatchNorm running statistics (mean, variance), named as in the model's graph by
  either engine. The statistics are not trained by gradients: they travel as float32 whatever the codec
  (a variance must stay positive; they are two numbers per channel), are averaged weighted by samples like
  the rest, and get no SCAFFOLD control variate.

The engine is used as it is; the one hook is here: once the job has built the trainable part, it is
overwritten with the global arrays, and a global array whose name or shape does not match the device's
model is refused (``ShapeMismatch``), never silently reshaped.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import _lazy, runtime
from .. import training as ft
from ..errors import UsageError
from ..netsplit import parse_train_layers
from ..optimizers import SGD, NumpySGD
from ..options import FinetuneOptions


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


class _FleetNumpyJob(ft._NumpyJob):
    """``head`` / ``last:N`` trained in NumPy, starting from given arrays (``initial``); where NumPy cannot
    train the part, the job becomes a _FleetTailJob (MXNet) with the same arrays."""

    initial: dict[str, np.ndarray] | None = None
    mismatch_where = "global weights"

    @property
    def fallback(self) -> type:
        return _FleetTailJob

    def _load(self):
        super()._load()
        if self.initial is not None:
            check_shapes(self.trainable_arrays(), {k: v.shape for k, v in self.initial.items()}, self.mismatch_where,
                         "every device must fine-tune the same model for the same classes (same class_names)")
            for arrays in (self.weights, self.stats):
                for name in arrays:
                    arrays[name] = np.array(self.initial[name], dtype=np.float32)  # a copy: the engine trains in place

    correction: dict[str, np.ndarray] | None = None  # SCAFFOLD's (c - c_i), by parameter name

    def _make_training(self) -> None:
        super()._make_training()
        self.opt = _Corrected(self.opt, {k: self.correction[k] for k in self.weights} if self.correction else None)

    def _write_model(self, extra: dict) -> None:
        pass  # a round's result is its arrays (they travel); no PREFIX model is written per round

    def trainable_arrays(self) -> dict[str, np.ndarray]:
        """The part that travels: the trained arrays and the running statistics, by parameter name."""
        return {**self.weights, **self.stats}

    def statistics(self) -> set[str]:
        return set(self.stats)  # a linear output layer has none


class _FleetTailJob(ft._Job):
    """``last:N`` / ``all``: the engine's general job whose tail starts from given arrays (``initial``)."""

    initial: dict[str, np.ndarray] | None = None
    mismatch_where = "global weights"
    correction: dict[str, np.ndarray] | None = None  # SCAFFOLD's (c - c_i), by parameter name

    def _split(self):
        super()._split()
        if self.initial is not None:
            check_shapes(self.trainable_arrays(), {k: v.shape for k, v in self.initial.items()}, self.mismatch_where,
                         "every device must fine-tune the same model for the same classes (same class_names) "
                         "with the same --train-layers")
            mx = _lazy.mxnet()
            for p in self.split.trained.collect_params().values():
                p.set_data(mx.nd.array(self.initial[p.name], dtype="float32"))

    def _make_training(self) -> None:
        super()._make_training()
        self.opt = _Corrected(self.opt, self.correction or None)

    def _write_model(self, extra: dict) -> None:
        pass  # a round's result is its arrays (they travel); no PREFIX model is written per round

    def trainable_arrays(self) -> dict[str, np.ndarray]:
        """The part that travels: every array of the tail (running statistics included), by name."""
        return {p.name: p.data().asnumpy() for p in self.split.trained.collect_params().values()}

    def statistics(self) -> set[str]:
        """Names of the arrays no gradient trains (BatchNorm running mean and variance)."""
        return {p.name for p in self.split.trained.collect_params().values() if p.grad_req == "null"}


class _Corrected:
    """The engine's optimizer, with a drift correction added to every gradient it is given (SCAFFOLD,
    Karimireddy et al. 2020): devices that each see a few classes otherwise pull the shared trainable
    part towards their own classes. Counts the steps, which the new control variate needs. The NumPy
    head's optimizer is given its gradients; MXNet's finds them in the parameters (``step()``)."""

    def __init__(self, opt, correction: dict | None):
        self._opt, self._correction, self.steps = opt, correction, 0
        self._mx = None

    def step(self, grads: dict | None = None) -> None:
        self.steps += 1
        if grads is None:  # MXNet: the accumulated gradient of each parameter, corrected in place
            if self._correction:
                if self._mx is None:
                    mx = _lazy.mxnet()
                    self._mx = {p.name: mx.nd.array(self._correction[p.name], dtype="float32")
                                for p in self._opt.params if p.name in self._correction}
                for p in self._opt.params:
                    if p.name in self._mx:
                        p.grad()[:] += self._mx[p.name]
            self._opt.step()
            return
        if self._correction:
            grads = {k: g + self._correction[k] for k, g in grads.items()}
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


def _job(spec: LocalSpec, data: str, outdir: Path, epochs: int, initial) -> _FleetNumpyJob | _FleetTailJob:
    layers = parse_train_layers(spec.train_layers)
    cls = _FleetNumpyJob if layers.kind == "last" else _FleetTailJob
    # unchecked: internal values (epochs=0 evaluates only), not a user's input to validate
    opts = FinetuneOptions.unchecked(data=str(data), out=str(outdir), epochs=epochs, batch_size=spec.batch_size,
                                    lr=spec.lr, optimizer=spec.optimizer, seed=spec.seed, params=spec.params)
    job = cls(spec.model, opts, layers=layers, val_split=0.0, budget_mb=spec.budget_mb, threads=spec.threads,
              profile=spec.device, progress=lambda info: None)
    job.resume = False
    job.initial = initial
    return job


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
    job = _job(spec, spec.data, outdir, spec.epochs, global_arrays)
    job.mismatch_where = "global weights from the coordinator"
    job.correction = correction
    try:
        result = job.run(False)
        opt = job.opt._opt
        momentum = getattr(opt, "momentum", 0.0) if isinstance(opt, (NumpySGD, SGD)) else 0.0
        result.fleet_scale = displacement_per_gradient(job.opt.steps, float(job.lr), momentum)
        result.fleet_statistics = job.statistics()
        return {k: v.copy() for k, v in job.trainable_arrays().items()}, result
    finally:
        shutil.rmtree(outdir, ignore_errors=True)


class Evaluator:
    """The coordinator's held-out check: the frozen part's features computed once, then top-1 of any
    trainable arrays (in NumPy, or in MXNet where NumPy cannot run the part; BatchNorm in inference mode
    with the running statistics given). Also gives the starting global arrays (the engine's own initialisation)
    and ``statistics``, the names among them that no gradient trains."""

    def __init__(self, spec: LocalSpec, val: str):
        runtime.apply_threads(spec.threads, strict=False)
        self.job = job = _job(spec, val, Path(spec.workdir) / "eval", 0, None)
        job.outdir.mkdir(parents=True, exist_ok=True)
        try:
            job._load()
        except ft._NotNumpy as exc:  # as a device's round does: the part trains (and is evaluated) in MXNet
            job.become_fallback(exc)
            job._load()
        self.classes = list(job.classes)
        ds = job.train_ds
        batches = [np.arange(s, min(s + 256, len(ds))) for s in range(0, len(ds), 256)]
        if isinstance(job, _FleetNumpyJob):
            session = ft._ort_session(job.prep_dir / ft.FROZEN_ONNX, job.threads, True)
            name = session.get_inputs()[0].name
            feats = [session.run(None, {name: ds.batch(idx)})[0] for idx in batches]
        else:
            job._split()
            mx = _lazy.mxnet()
            frozen = job.split.frozen
            feats = [frozen(mx.nd.array(ds.batch(idx))).asnumpy() if frozen is not None else ds.batch(idx)
                     for idx in batches]
        self.initial = {k: v.copy() for k, v in job.trainable_arrays().items()}
        self.statistics = job.statistics()
        self.features = np.concatenate(feats)
        self.labels = np.asarray(ds.labels)

    def top1(self, arrays: dict[str, np.ndarray]) -> float:
        if isinstance(self.job, _FleetTailJob):
            return float(np.mean(self._tail_predictions(arrays) == self.labels))
        tail = self.job.tail
        out, _ = tail.forward({k: arrays[k] for k in tail.param_shapes}, {k: arrays[k] for k in tail.aux_shapes},
                              self.features, train=False)
        return float(np.mean(np.argmax(out.reshape(len(out), -1), axis=1) == self.labels))

    def _tail_predictions(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        mx = _lazy.mxnet()
        trained = self.job.split.trained
        for p in trained.collect_params().values():
            p.set_data(mx.nd.array(arrays[p.name], dtype="float32"))
        return np.concatenate([trained(mx.nd.array(self.features[s:s + 256])).asnumpy().argmax(axis=1)
                               for s in range(0, len(self.features), 256)])
