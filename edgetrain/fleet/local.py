"""One device's share of a round, through edgetrain's own fine-tuning job.

A round on a device is an ordinary ``edgetrain finetune`` job (frozen part in ONNX Runtime, features
cached, micro-batches within the memory budget, threads capped) whose trainable part starts from the
*global* weights the coordinator sent (the job's ``initial``), with SCAFFOLD's correction added to its
gradients (``correction``) and no model written (``write_model=False``): a round's result is its arrays.

- The job trains the model's ONNX graph as ``edgetrain finetune`` does (a Gluon base exported once, in an
  mxnet child, then cached: no mxnet in a round).
- What travels is every array of the trained part: its trainable parameters (weights, biases, BatchNorm
  scale/shift), named as in the model's graph. With ``all``, ``last:N`` and ``lite`` BatchNorm trains in
  training mode, so its running statistics (of the trained part) change on the device too: they are in
  ``statistics()`` and travel as float32 whatever the codec, averaged weighted by samples, with no SCAFFOLD
  control variate; with ``head`` and ``bias`` they stay the graph's constants and do not travel.
- A global array whose name or shape does not match the device's model is refused (``ShapeMismatch``),
  never silently reshaped.
"""
from __future__ import annotations

import shutil
from dataclasses import dataclass, field, fields
from pathlib import Path

import numpy as np

from .. import runtime
from ..errors import EdgetrainError
from ..options import DEFAULT_TRAIN_LAYERS, FinetuneOptions, TrainLayers
from ..training import FinetuneJob, FinetuneResult, ShapeMismatch, check_shapes

__all__ = ["Evaluator", "LocalSpec", "RoundResult", "ShapeMismatch", "check_shapes", "class_view",
           "displacement_per_gradient", "initial_arrays", "same_start", "start_digests", "train_round"]


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
    train_layers: TrainLayers = DEFAULT_TRAIN_LAYERS   # text from the wire is read here, once

    def __post_init__(self):
        self.train_layers = TrainLayers(self.train_layers)


def _job(spec: LocalSpec, data: str, outdir: Path, epochs: int, **extension) -> FinetuneJob:
    # unchecked: internal values (epochs=0 evaluates only), not a user's input to validate
    opts = FinetuneOptions.unchecked(data=str(data), out=str(outdir), epochs=epochs, batch_size=spec.batch_size,
                                    lr=spec.lr, optimizer=spec.optimizer, seed=spec.seed, params=spec.params,
                                    train_layers=spec.train_layers)
    return FinetuneJob(spec.model, opts, val_split=0.0, budget_mb=spec.budget_mb,
                       threads=runtime.current_threads() if spec.threads is None else spec.threads, profile=spec.device,
                       progress=lambda info: None, write_model=False, **extension)


@dataclass
class RoundResult(FinetuneResult):
    """A device's round: the job's result, how far the weights moved per unit of constant gradient over its steps
    (``fleet_scale``: the new control variate is the displacement divided by it) and the names of the arrays no
    gradient trains (``fleet_statistics``)."""

    fleet_scale: float = 0.0
    fleet_statistics: set[str] = field(default_factory=set)


def train_round(spec: LocalSpec, global_arrays: dict[str, np.ndarray], round_no: int,
                correction: dict[str, np.ndarray] | None = None) -> tuple[dict[str, np.ndarray], RoundResult]:
    """Train from ``global_arrays`` on the device's data for ``spec.epochs``; returns (new arrays that travel, the
    job's result with the round's ``fleet_scale`` and ``fleet_statistics``: RoundResult). ``correction`` (SCAFFOLD's
    c - c_i, by name) is added to the gradient of each array it names. The round's folder is removed afterwards."""
    outdir = Path(spec.workdir) / f"round-{round_no:04d}"
    shutil.rmtree(outdir, ignore_errors=True)  # a round killed earlier left its scratch here
    job = _job(spec, spec.data, outdir, spec.epochs, initial=global_arrays,
               initial_where="global weights from the coordinator", correction=correction)
    try:
        result = job.run(False)
        assert job.lr is not None  # run() set the optimizer's default
        scale = displacement_per_gradient(job.opt.steps, float(job.lr), job.opt.momentum)
        return job.trainable_arrays(), RoundResult(**{f.name: getattr(result, f.name) for f in fields(result)},
                                                   fleet_scale=scale, fleet_statistics=job.statistics())
    finally:
        shutil.rmtree(outdir, ignore_errors=True)


def initial_arrays(spec: LocalSpec) -> dict[str, np.ndarray]:
    """The trainable part as the engine initialises it for ``spec``: what the coordinator's round 0 holds (its
    ``Evaluator.initial``) when the device fine-tunes the same model for the same classes."""
    outdir = Path(spec.workdir) / "initial"
    shutil.rmtree(outdir, ignore_errors=True)
    job = _job(spec, spec.data, outdir, 0)
    outdir.mkdir(parents=True, exist_ok=True)
    try:
        job.load()
        return job.trainable_arrays()
    finally:
        shutil.rmtree(outdir, ignore_errors=True)


def start_digests(model: str | None, params: str | None) -> dict[str, str]:
    """Where a trainable part's initial arrays come from, as digests a device (in its hello) and the coordinator
    compare before a device's first compact downlink, whose base is those arrays: ``model``, a built-in model's
    name or the sha256 of a PREFIX's or an .onnx file's files ("": none given, the device runs the coordinator's),
    and ``params``, the sha256 of a --params file (""). A file that cannot be read: "unreadable". The same digests
    give the same initial arrays for the same classes, --train-layers and seed."""
    import hashlib

    from ..fileio import file_digest
    from ..models import parse_model_ref

    def files(paths) -> str:
        try:
            return hashlib.sha256(" ".join(file_digest(p) for p in paths).encode()).hexdigest()
        except (OSError, EdgetrainError):
            return "unreadable"

    model_digest = ""
    if model:
        try:
            ref = parse_model_ref(model, accept_onnx=True)
        except EdgetrainError:
            ref = None
        paths = [] if ref is None else [p for p in (ref.symbol_file, ref.params_file, ref.onnx_file) if p]
        model_digest = "unreadable" if ref is None else files(paths) if paths else ref.text
    return {"model": model_digest, "params": files([params]) if params else ""}


def same_start(device: dict | None, coordinator: dict[str, str]) -> bool:
    """Whether a device whose hello said ``device`` (start_digests; None: it said nothing) starts from the
    coordinator's initial arrays."""
    return (device is not None and device.get("model") in ("", coordinator["model"])
            and device.get("params") == coordinator["params"])


def class_view(data: str, classes: list[str] | None, workdir: Path) -> str:
    """DATA as the fleet sees it: the coordinator's class list is the fleet's, and a device may hold any
    subset of it. When this device's classes are not already the fleet's list (same names, same order),
    it trains on a view with the fleet's classes in the fleet's order: for an image folder, a folder of
    symbolic links (an empty folder for a class it lacks); for an .npz, a copy whose labels are renumbered
    by class name (the images are copied inside the zip, never loaded here). The view is remade only when
    DATA or the list changes. A class the fleet does not have is refused (``ShapeMismatch``): its samples
    would train the wrong output."""
    import hashlib
    import json
    import os
    import zipfile

    from ..data import BUILTIN_PREFIX, npy_header

    if not classes or data.startswith(BUILTIN_PREFIX):
        return data
    src = Path(data)
    fix = "a device's classes must be among the fleet's (the coordinator's --val classes)"

    def refuse_strays(names: list[str]) -> None:
        stray = [n for n in names if n not in classes]
        if stray:
            raise ShapeMismatch(f"model mismatch: class '{stray[0]}' is not among the fleet's {len(classes)} classes",
                                data, fix)
    if src.is_dir():
        mine = sorted(p.name for p in src.iterdir() if p.is_dir() and not p.name.startswith("."))
        if mine == list(classes):
            return data
        refuse_strays(mine)
        if sorted(classes) != list(classes):
            raise ShapeMismatch("model mismatch: the fleet's classes are not in name order, which an image folder "
                                "cannot express", data, "give this device its data as an .npz with class_names")
        view = Path(workdir) / "fleet-classes"
        want = {c: (str((src / c).resolve()) if c in mine else None) for c in classes}
        have = ({p.name: (os.readlink(p) if p.is_symlink() else None) for p in view.iterdir()}
                if view.is_dir() else None)
        if have != want:  # kept as it is otherwise: the engine's caches see the same folder every round
            shutil.rmtree(view, ignore_errors=True)
            view.mkdir(parents=True)
            for c, target in want.items():
                if target:
                    os.symlink(target, view / c)
                else:
                    (view / c).mkdir()
        return str(view)
    if src.suffix != ".npz" or not src.is_file():
        return data  # the engine says what is wrong with it
    with zipfile.ZipFile(src) as zf:
        members = {n[:-4]: n for n in zf.namelist() if n.endswith(".npy")}
        if "label" not in members:
            return data
        shape, dtype, _ = npy_header(zf, members["label"], data)
        if len(shape) != 1 or dtype.kind not in "iu" or shape[0] > 100_000_000:
            return data  # not plain class indices: the engine refuses it in its own words
        with zf.open(members["label"]) as fh:
            label = np.lib.format.read_array(fh, allow_pickle=False)
        if label.size and int(label.min()) < 0:
            return data
        names = None
        if "class_names" in members:
            with zf.open(members["class_names"]) as fh:
                names = [str(n) for n in np.lib.format.read_array(fh, allow_pickle=False).tolist()]
    top = int(label.max()) if label.size else -1
    if names is None:  # plain class indices: taken as indices into the fleet's list
        if top >= len(classes):
            raise ShapeMismatch(f"model mismatch: label {top} but the fleet has {len(classes)} classes", data, fix)
        if top + 1 == len(classes):
            return data
        names = list(classes[: top + 1])
    if names == list(classes):
        return data
    refuse_strays(names)
    st = src.stat()
    key = hashlib.sha256(json.dumps([str(src.resolve()), st.st_size, st.st_mtime_ns, list(classes)]).encode())
    view = Path(workdir) / f"fleet-classes-{key.hexdigest()[:16]}.npz"
    if view.exists():
        return str(view)
    for old in Path(workdir).glob("fleet-classes-*.npz"):
        old.unlink()
    index = np.array([classes.index(n) for n in names], np.int64)
    Path(workdir).mkdir(parents=True, exist_ok=True)
    tmp = view.with_suffix(".tmp")
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as zout:
        for name in zin.namelist():
            if name in (members.get("label"), members.get("class_names")):
                continue
            with zin.open(name) as a, zout.open(name, "w", force_zip64=True) as b:
                shutil.copyfileobj(a, b, 1 << 20)
        for name, arr in (("label.npy", index[label]), ("class_names.npy", np.array(list(classes)))):
            with zout.open(name, "w") as b:
                np.lib.format.write_array(b, arr, allow_pickle=False)
    os.replace(tmp, view)
    return str(view)


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

    def write_model(self, arrays: dict[str, np.ndarray], folder: Path, extra: dict) -> Path:
        """The base model with ``arrays`` as its trainable part, written into ``folder`` as ``edgetrain finetune``
        writes its model (model.onnx, and a PREFIX for a Gluon base), with the
        fleet's class names and preprocessing; returns its path."""
        self.job.engine.start_from(arrays)
        return self.job.write_model(Path(folder), extra)
