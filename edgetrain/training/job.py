"""The fine-tune job: train MODEL on the device within its RAM budget and thread cap, resumable after a
power cut.

Every ``--train-layers`` choice trains one representation, the model's ONNX graph, through one engine
(engine_onnx): an ONNX file as it is; a Gluon model (PREFIX, zoo:NAME, factory) exported first, once, in an
mxnet child (gluon.py; cached per user, so later runs import no mxnet), and written back as PREFIX files
beside OUTDIR/model.onnx at the end. A frozen part runs in ONNX Runtime, its outputs computed once into the
feature cache (featurecache); every epoch trains on the cache. A diverging loss or non-finite weights fail
the run (exit 1, no model); one run at a time holds OUTDIR (outdir.py). Micro-batches with gradient
accumulation keep the effective batch size while capping activation memory (memplan picks the sizes). A
checkpoint after every epoch and on SIGINT/SIGTERM makes ``resume`` end with the same weights as an
uninterrupted run.

Extension is by constructor parameters, never by overriding: ``initial`` (the arrays the trainable part
starts from, refused unless they fit), ``correction`` (added to every gradient, by array name) and
``write_model`` (False: the run's result is its arrays). The fleet uses them, ``trainable_arrays()``,
``statistics()`` and ``evaluate(arrays)``. ``feature_store`` (a FeatureStore) shares the feature cache
with the other jobs of the process that have the same frozen part and data (a tune's trials); ``build_store`` (a
BuildStore) likewise the model loaded, its graphs, step session and memory plan with those that train the same part
the same way (buildstore.py: a job that takes one trains as it would have alone). ``stop_at_step``
ends the run after that many steps in all, inside an epoch (a tune's rung of a fraction of an epoch): the
checkpoint is written there, as a stop by a signal writes it, so a later run with more epochs resumes exactly
there, and the held-out accuracy at that step is the result's (``partial_epoch``). ``before_checkpoint`` is called
before each checkpoint is written (a tune waits there for its journal's last line to reach the disk).

Test hook (for the kill-at-phase tests, never set by users): ``EDGETRAIN_TEST_KILL_AT=PHASE:N`` makes
the process SIGKILL itself the N-th time it reaches PHASE: ``features`` (after a feature-pass batch is
written), ``step`` (after a training step), ``epoch`` (after an epoch's checkpoint and metrics), ``save``
(inside a checkpoint write, before the rename: see checkpoint.save).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import procmem, runtime
from ..compare import chance_check, chance_failure
from ..data import Dataset, ParallelReader, load_data
from ..energy import EnergyMeter
from ..errors import EdgetrainError, RunFailed, UsageError
from ..fileio import atomic_write_text
from ..models import with_norm
from ..preprocess import Preprocess
from ..options import FinetuneOptions, TrainLayers
from ..results import ProgressFn, Result, report
from . import checkpoint as ckpt
from . import store
from .engine import Engine, EngineContext
from .engine_onnx import OnnxEngine
from .buildstore import Build, BuildStore, PlannedBuild
from .featurecache import FeatureCache, FeatureStore
from .memplan import READ_AHEAD, Costs, MemoryPlan, same_run
from .optimizers import DEFAULT_MOMENTUM, DEFAULT_WEIGHT_DECAY, Corrected, default_lr
from .gluon import GluonBase, prepare
from .outdir import FEATURES_FILE, LOCK_FILE, METRICS, MODEL_NAME, ONNX_MODEL, take_lock

DEFAULT_VAL_SPLIT = 0.2


class Interrupted(EdgetrainError):
    """SIGINT/SIGTERM arrived: the checkpoint is written, the run can be resumed. Exit 128 + signal."""

    exit_code = 130


class ShapeMismatch(UsageError):
    """Given arrays do not fit this model's trainable part (exit 2 on the side that finds it)."""


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


@dataclass
class FinetuneResult(Result):
    model: str
    outdir: str
    classes: list[str]
    train_layers: str
    trained_parameters: int
    frozen_parameters: int
    replaced_head: bool
    epochs: list[dict]
    final_accuracy: float | None
    accuracy_on: str
    seconds: float
    feature_seconds: float
    samples_per_s: float
    peak_rss_mb: float | None
    budget_mb: float | None
    plan: dict
    energy: dict | None = None
    joules_per_epoch: float | None = None
    joules_per_sample: float | None = None
    resumed_from: dict | None = None
    threads: int = 1
    notes: list[str] = field(default_factory=list)
    chance: dict | None = None   # compare.chance_check on the held-out data
    partial_epoch: dict | None = None   # stop_at_step: where the run stopped inside an epoch (epoch, step, steps)

    def __post_init__(self) -> None:
        # how many of ``notes`` were known before training (and sent to ``progress`` then): a summary shown
        # after the progress lines says only the rest, so no note is said twice. Not a field: not in the JSON.
        self.notes_before_training = 0

    def checks(self) -> list[str]:
        failed = []
        if self.budget_mb and self.peak_rss_mb and self.peak_rss_mb > self.budget_mb:
            failed.append(f"peak RSS {self.peak_rss_mb:.0f} MB went over the memory budget {self.budget_mb:.0f} MB "
                          "(lower --batch-size or train fewer layers)")
        return failed + [f for f in [chance_failure(self.chance, "fine-tuned")] if f]


@dataclass
class Stop:
    """What a SIGINT/SIGTERM handler leaves for the loop: the signal that arrived (None: none yet)."""

    signum: int | None = None

    def __call__(self, signum, frame):
        self.signum = signum


def progress_events(progress: ProgressFn | None):
    """The job's progress dicts as Progress events (an epoch's line stays on screen)."""
    def send(info: dict) -> None:
        info = dict(info)
        phase = info.pop("phase")
        report(progress, phase, info.pop("done", None), info.pop("total", None), message=info.pop("message", ""),
               final=phase in ("epoch", "note"), **info)
    return send


def data_fingerprint(ds) -> str:
    """What identifies the training data to a checkpoint: its name (not where it lies, so a run folder moved
    with its data resumes), its size and its labels."""
    h = hashlib.sha256(np.ascontiguousarray(ds.labels).tobytes()).hexdigest()[:12]
    return f"{Path(ds.source).name if os.sep in ds.source else ds.source} n={len(ds)} labels={h}"


class FinetuneJob:
    """One fine-tune run. ``run(has_checkpoint)`` trains and returns a FinetuneResult; ``load()`` alone
    builds the model and data (the fleet's evaluator), after which ``evaluate(arrays)`` gives top-1."""

    def __init__(self, model: str, opts: FinetuneOptions, *, val_split: float | None,
                 budget_mb, threads: int, profile, progress, resume: bool = False,
                 initial: dict[str, np.ndarray] | None = None, initial_where: str = "initial arrays",
                 correction: dict[str, np.ndarray] | None = None, write_model: bool = True,
                 feature_store: FeatureStore | None = None, stop_at_step: int | None = None,
                 data_store: dict | None = None, build_store: BuildStore | None = None,
                 before_checkpoint: Callable[[], None] | None = None):
        self.model, self.opts, self.val_split = model, opts, val_split
        # parsed once, at the declaration (options edgetrain makes itself, unchecked, may hold its text)
        self.layers = TrainLayers(opts.train_layers)
        self.budget_mb, self.threads, self.profile, self.progress = budget_mb, threads, profile, progress
        self.data, self.outdir, self.val = opts.data, Path(opts.out), opts.val
        self.epochs, self.batch_size, self.lr, self.optimizer = opts.epochs, opts.batch_size, opts.lr, opts.optimizer
        self.momentum, self.weight_decay = opts.momentum, opts.weight_decay
        self.seed, self.params, self.input_shape = opts.seed, opts.params, opts.input_shape
        self.resume, self.initial, self.initial_where = resume, initial, initial_where
        self.correction, self.writes_model = correction, write_model
        self.feature_store = feature_store  # frozen-part outputs shared with other jobs of this process (a tune)
        self.stop_at_step = stop_at_step    # the run ends after this many steps in all (None: after --epochs)
        self.data_store = data_store        # DATA/--val read once for the jobs of a process that share it (a tune)
        self.build_store = build_store      # the model's build shared with the jobs that train the same part (a tune)
        self.before_checkpoint = before_checkpoint  # called before each checkpoint is written (a tune's journal sync)
        self.build: Build | None = None     # the build this job took from the store, or made and may keep there
        self.taken: PlannedBuild | None = None   # the build taken from the store (planned: the store keeps no other)
        self.partial: dict | None = None     # where it ended inside an epoch, with the held-out accuracy there
        self.notes: list[str] = []
        # what the engine reads of the run (a build taken from the store is attached to it)
        self.context = EngineContext(model, self.layers, self.outdir, self.seed, threads, budget_mb, self.batch_size,
                                     self.notes.append)
        self.engine: Engine = OnnxEngine(self.context)
        self.gluon: GluonBase | None = None   # a Gluon model's export (None: MODEL is an ONNX file)
        self.notes_before_training = 0
        self.stop = Stop()
        # the data, read by load_data (pre and train_ds exist from then on)
        self.pre: Preprocess
        self.train_ds: Dataset
        self.own_norm = True
        self.model_pre: Preprocess   # the model's own preprocessing (before --mean/--std and the data's classes)
        self.data_notes_end = 0      # where the notes of the data end (a build's own notes follow)
        self.val_ds: Dataset | None = None
        self.classes: list[str] = []
        # the run's state (plan, costs, opt, rng and energy_meter exist once run() has made them)
        self.plan: MemoryPlan
        self.costs: Costs
        self.opt: Corrected
        self.rng: np.random.RandomState
        self.energy_meter: EnergyMeter
        self.cache: FeatureCache | None = None
        self.cache_fp = ""
        self.cache_complete = False
        self.frozen_record: dict | None = None
        self.global_step = 0
        self.history: list[dict] = []
        self.resumed_from: dict | None = None
        self.eval_features: np.ndarray | None = None
        self._last_tick = 0.0
        self._over_noted = False

    # --- set-up ------------------------------------------------------------------------------------

    def data_budget(self) -> int | None:
        """The most an .npz's arrays may take once read: the whole --memory-budget at most (checked from the
        file's headers before anything is read, so a compressed bomb never expands)."""
        return int(self.budget_mb * 2**20) if self.budget_mb else None

    def load_data(self, pre) -> None:
        """DATA (and --val, or the split of DATA) read for ``pre`` (the model's preprocessing, with --mean/--std
        when given: the data is normalised with them and the written model records them); the classes come
        from the data."""
        model_pre = pre
        given = with_norm(pre, self.opts.mean, self.opts.std)
        self.own_norm = (given.mean, given.std) == (pre.mean, pre.std)
        if not self.own_norm:
            self.notes.append(f"normalisation from --mean/--std: mean {list(given.mean)} std {list(given.std)} "
                              f"(the model's: mean {list(pre.mean)} std {list(pre.std)}); the model written "
                              "records them")
        pre = given
        ds = self._read(self.data, pre, "--data")  # refused from headers if over
        self.notes += ds.notes
        if self.val is not None:
            val = self._read(self.val, pre, "--val")
            if val.class_names != ds.class_names:
                raise UsageError(f"--val classes ({', '.join(val.class_names[:8])}) differ from the training "
                                 f"data's ({', '.join(ds.class_names[:8])})", self.val,
                                 "give held-out data with the same class folders / labels")
            self.train_ds, self.val_ds = ds, val
        elif self.val_split:
            self.train_ds, self.val_ds = ds.split(self.val_split, seed=self.seed)
        else:
            self.train_ds, self.val_ds = ds, None
        self.classes = list(ds.class_names)
        self.pre = pre.with_classes(self.classes)
        self.model_pre, self.data_notes_end = model_pre, len(self.notes)

    def _read(self, ref: str, pre: Preprocess, where: str) -> Dataset:
        """DATA or --val read for ``pre``; with a data store, once for every job of the process (its arrays are
        only read, never written)."""
        key = (str(ref), repr(pre), where)
        if self.data_store is not None and key in self.data_store:
            return self.data_store[key]
        ds = load_data(ref, pre, where=where, max_bytes=self.data_budget())
        if self.data_store is not None:
            self.data_store[key] = ds
        return ds

    def build_key(self) -> str | None:
        """What a build depends on (buildstore): None where none is shared (no store; a Gluon model, whose export
        the build does not hold)."""
        model = Path(self.model)
        if self.build_store is None or model.suffix.lower() != ".onnx" or not model.is_file():
            return None
        st, o = model.stat(), self.opts
        return json.dumps([str(model.resolve()), st.st_size, st.st_mtime_ns, self.layers.text, self.batch_size,
                           self.seed, str(self.data), str(self.val), self.val_split, o.mean, o.std, o.params,
                           o.input_shape, self.budget_mb, self.threads], default=str)

    def load(self, saved_plan: dict | None = None) -> None:
        """The model, its data and the trainable part, ready to train (a Gluon model exported to ONNX first), or
        the build store's build of them when it has one for this job (and ``saved_plan``, a checkpoint's, is its
        plan). ``initial`` is applied here."""
        key = self.build_key()
        build = self.build_store.get(key) if self.build_store is not None and key is not None else None
        if build is not None and (saved_plan is None or same_run(saved_plan, build.plan.to_dict())) and \
                (not build.engine.has_frozen or (self.feature_store is not None and build.features in self.feature_store)):
            self._take(build)
        else:
            if self.build_store is not None:
                self.build_store.release()   # the process holds one build: the last one goes before this one is made
            source, within = Path(self.model), None
            if not str(self.model).lower().endswith(".onnx"):
                self.gluon = prepare(self)
                source, within = self.gluon.onnx, self.gluon.weight_names()
                self.notes += self.gluon.record["notes"]
            self.load_data(self.engine.open(source))
            self.engine.load(self.pre, within)
            if key is not None:
                self.build = Build(self.engine, self.model_pre, self.notes[self.data_notes_end:],
                                   self.engine.loaded_state())
        if self.initial is not None:
            check_shapes(self.engine.trainable_arrays(), {k: v.shape for k, v in self.initial.items()},
                         self.initial_where, "every device must fine-tune the same model for the same classes "
                         "(same class_names) with the same --train-layers")
            self.engine.start_from(self.initial)

    def _take(self, build: PlannedBuild) -> None:
        """The store's build as this job's: bound to it, its data read, its trained arrays as loaded."""
        assert self.build_store is not None, "a build is taken from a store"
        self.engine = build.engine
        self.engine.attach(self.context)
        self.load_data(build.preprocess)
        self.notes += build.notes
        self.engine.reset(build.initial)
        self.build = self.taken = build
        self.build_store.reused += 1

    def _keep_build(self) -> None:
        """This job's build kept for the next job with its key, once another job can take it: its step is the ONNX
        Runtime step graph and, with a frozen part, the part's features are in the feature store (the part's file
        goes with this job's OUTDIR, so a job taking the build never runs it)."""
        build = self.build
        if build is None or self.taken is not None or not self.engine.shareable():
            return
        if self.engine.has_frozen and not self._cache_shared():
            return
        assert self.build_store is not None and (key := self.build_key()) is not None, "made for a store"
        self.build = build.planned(self.plan, self.costs, self.features_key())
        self.build_store.put(key, self.build)

    def write_model(self, folder: Path, extra: dict) -> Path:
        """The fine-tuned model in ``folder``: model.onnx, and for a Gluon model its PREFIX files too (what the
        host's next step reads), unless lite's modules, which Gluon's graph lacks, were added. Returns the path
        a result names: the PREFIX where one was written."""
        onnx_path = folder / ONNX_MODEL
        self.engine.write_model(onnx_path, self.pre, extra)
        if self.gluon is None:
            return onnx_path
        if self.layers.kind == "lite":
            if not any("no Gluon form" in n for n in self.notes):
                self.notes.append(f"lite's residual modules have no Gluon form: the fine-tuned model is {onnx_path} "
                                  "(no PREFIX files written)")
            return onnx_path
        prefix = folder / MODEL_NAME
        self.gluon.write_prefix(prefix, self.engine.trainable_arrays(), len(self.classes), self.pre, extra)
        return prefix

    def trainable_arrays(self) -> dict[str, np.ndarray]:
        """The part that travels: the trained arrays and the running statistics, by parameter name (copies)."""
        return {k: np.array(v, copy=True) for k, v in self.engine.trainable_arrays().items()}

    def statistics(self) -> set[str]:
        """Names among trainable_arrays() that no gradient trains (BatchNorm running mean and variance)."""
        return self.engine.statistics()

    def evaluate(self, arrays: dict[str, np.ndarray]) -> float:
        """Top-1 of the trainable part with ``arrays`` as its weights, on all of DATA (after ``load()``); the
        frozen part's outputs are computed once, on the first call."""
        ds = self.train_ds
        if self.eval_features is None:
            batches = [np.arange(s, min(s + 256, len(ds))) for s in range(0, len(ds), 256)]
            self.eval_features = np.concatenate([self.engine.features(ds.batch(idx)) for idx in batches])
        return float(np.mean(self.engine.predict(arrays, self.eval_features) == np.asarray(ds.labels)))

    def advise(self) -> None:
        """Say what would make this run learn less than the user expects."""
        if self.engine.random_weights and self.engine.has_frozen:
            self.notes.append("the model has random weights, so its frozen layers compute nothing learned; "
                              "pass --params with trained weights, or --train-layers all")
        if self.engine.statistics() and self.plan.micro_batch < 8:
            # a small --batch-size as well as a tight budget (batch 1 with all: 0.32 top-1 where 32 gave 0.94, unsaid)
            if self.plan.micro_batch < self.batch_size:
                self.notes.append(f"BatchNorm in the trained layers sees micro-batches of {self.plan.micro_batch} "
                                  "(memory budget); its statistics will be noisy: train fewer layers or raise the "
                                  "budget")
            else:
                self.notes.append(f"BatchNorm in the trained layers trains on batches of {self.batch_size} "
                                  "(--batch-size); its statistics will be noisy: give --batch-size 8 or more, or "
                                  "train fewer layers (bias, head)")

    def fingerprint(self) -> dict:
        def val_fp():
            if self.val_ds is None:
                return "none"
            return (f"split {self.val_split} seed {self.seed}" if self.val is None else "") + data_fingerprint(self.val_ds)

        return {"model": self.engine.model_fp, "model_ref": self.model, "engine": self.engine.name,
                "classes": self.classes, "input_shape": list(self.pre.input_shape),
                # only other than the model's own: a checkpoint written before --mean/--std existed resumes
                "normalisation": None if self.own_norm else [list(self.pre.mean), list(self.pre.std)],
                "train_layers": self.layers.text, "batch_size": self.batch_size, "optimizer": self.optimizer,
                "lr": self.lr, "seed": self.seed, "data": data_fingerprint(self.train_ds), "val": val_fp(),
                # only when given other than the defaults: a checkpoint written before the options existed resumes
                "momentum": None if self.momentum in (None, DEFAULT_MOMENTUM) else self.momentum,
                "weight_decay": None if self.weight_decay in (None, DEFAULT_WEIGHT_DECAY) else self.weight_decay}

    # --- features ----------------------------------------------------------------------------------

    def features_key(self) -> str:
        """What the frozen part's outputs depend on (a FeatureStore's key): not the trained part's optimizer
        settings, batch or seed."""
        same = {k: v for k, v in self.fingerprint().items()
                if k not in ("lr", "optimizer", "momentum", "weight_decay", "batch_size", "seed")}
        return hashlib.sha256(json.dumps([same, self.engine.cut_name, self.plan.feature_batch, self.costs.cache_rows,
                                          list(self.engine.feature_shape)]).encode()).hexdigest()

    def features(self, meta_cache: dict | None) -> float:
        """Fill the feature cache (train rows, then validation rows); returns the seconds it took."""
        if not self.engine.has_frozen:
            return 0.0
        rows = self.costs.cache_rows
        feature_shape = self.engine.feature_shape
        fp = hashlib.sha256(json.dumps([self.fingerprint(), self.engine.cut_name,
                                        self.plan.feature_batch]).encode()).hexdigest()[:16]
        self.cache_fp = fp
        shared_key = None
        if self.feature_store is not None:
            shared_key = self.features_key()
            shared = self.feature_store.get(shared_key)
            if shared is not None:
                self.cache, self.cache_complete = shared, True
                self.notes.append("frozen features computed once by an earlier run with the same frozen part, reused")
                return 0.0
        path = self.outdir / FEATURES_FILE
        reuse = bool(self.plan.cache == "disk" and meta_cache is not None and meta_cache.get("fingerprint") == fp
                     and meta_cache.get("complete") and path.exists())
        self.cache = FeatureCache(rows, feature_shape, self.plan.cache, path, reuse=reuse)
        if reuse and self.cache.reusable():
            self.notes.append("feature cache on disk reused from the interrupted run")
            self.cache_complete = True
            return 0.0
        if reuse:
            self.cache.close()
            self.cache = FeatureCache(rows, feature_shape, self.plan.cache, path)
        t0 = time.monotonic()
        fb = self.plan.feature_batch
        run_frozen, sha = self.engine.frozen_fn(self.plan.arena)
        self.frozen_record = {"fingerprint": fp, "sha256": sha}
        decode_s = frozen_s = 0.0
        sources = [(self.train_ds, 0)] + ([(self.val_ds, len(self.train_ds))] if self.val_ds is not None else [])
        done = 0
        # decoded READ_AHEAD samples at a time on the thread cap's threads (in turn with the frozen part,
        # never beside it)
        reader = ParallelReader(self.threads or runtime.current_threads())
        chunk = max(fb, READ_AHEAD)  # a multiple of fb: both are powers of two
        try:
            for ds, offset in sources:
                for first in range(0, len(ds), chunk):
                    t1 = time.monotonic()
                    xs = reader.batch(ds, np.arange(first, min(first + chunk, len(ds))))
                    decode_s += time.monotonic() - t1
                    for start in range(0, len(xs), fb):
                        x = xs[start:start + fb]
                        n = len(x)
                        if n < fb:  # same shape every pass: pad, never retrace
                            x = np.concatenate([x, np.repeat(x[-1:], fb - n, axis=0)])
                        t2 = time.monotonic()
                        feats = run_frozen(x)[:n]
                        frozen_s += time.monotonic() - t2
                        self.cache.write(offset + first + start, feats)
                        ckpt.kill_point("features")
                        done += n
                        self.tick("features", done=done, total=rows, t0=t0)
                        if self.stop.signum:
                            return time.monotonic() - t0
        finally:
            reader.close()
        self.cache.flush()
        self.notes.append(f"feature pass: {decode_s:.2f}s decoding and preprocessing {rows} samples, "
                          f"{frozen_s:.2f}s in the frozen part")
        self.cache_complete = True  # only now may a checkpoint vouch for it
        if shared_key is not None and self.feature_store is not None:
            self.feature_store.put(shared_key, self.cache)
        return time.monotonic() - t0

    # --- training ----------------------------------------------------------------------------------

    def inputs(self, ds_kind: str, idx: np.ndarray) -> np.ndarray:
        if self.cache is not None:
            offset = 0 if ds_kind == "train" else len(self.train_ds)
            return self.cache.read(idx + offset)
        ds = self.train_ds if ds_kind == "train" else self.val_ds
        assert ds is not None, "held-out inputs asked for without held-out data"
        return ds.batch(idx)

    def settle_statistics(self) -> None:
        """BatchNorm's running statistics from the weights as they are (the engine's settle pass), before they are
        evaluated, checkpointed or written."""
        self.engine.settle_statistics(lambda idx: self.inputs("train", idx), len(self.train_ds.labels),
                                      self.plan.micro_batch)

    def evaluate_held_out(self) -> tuple[float | None, float | None]:
        if self.val_ds is None:
            return None, None
        return self.engine.evaluate(lambda idx: self.inputs("val", idx), self.val_ds.labels, self.plan.micro_batch)

    def tick(self, phase: str, **info) -> None:
        now = time.monotonic()
        last = info.get("done") is not None and info.get("done") == info.get("total")  # a phase's end always goes
        if now - self._last_tick < 0.5 and not (info.get("force") or last):
            return
        self._last_tick = now

        info.pop("force", None)
        t0 = info.pop("t0", now)
        rss = procmem.rss_mb()
        if self.budget_mb and rss and rss > self.budget_mb and not self._over_noted:
            self._over_noted = True
            self.notes.append(f"RSS reached {rss:.0f} MB during {phase}, over the {self.budget_mb:.0f} MB budget")
        done, total = info.get("done", 0), info.get("total", 0)
        rate = done / max(now - t0, 1e-9)
        eta = (total - done) / rate if rate > 0 else None
        self.progress({"phase": phase, "samples_per_s": rate, "eta_s": eta, **info, "rss_mb": rss,
                       "budget_mb": self.budget_mb})

    # --- checkpoints -------------------------------------------------------------------------------

    def save_checkpoint(self, epoch: int, step: int, order: np.ndarray, partial: dict) -> None:
        if self.before_checkpoint is not None:
            self.before_checkpoint()
        rng_meta, rng_arrays = ckpt.rng_to_arrays(self.rng)
        arrays = self.param_arrays()
        arrays.update({f"opt/{k}": np.asarray(v)
                       for k, v in self.opt.state_arrays().items()})
        arrays.update(rng_arrays)
        arrays["order"] = np.asarray(order, dtype=np.int64)
        cache = None
        if self.cache is not None:
            cache = {"placement": self.plan.cache, "fingerprint": self.cache_fp, "complete": self.cache_complete}
        meta = {"fingerprint": self.fingerprint(), "epoch": epoch, "step": step, "global_step": self.global_step,
                "optimizer_t": self.opt.t, "rng": rng_meta, "history": self.history, "partial": partial,
                "plan": self.plan.to_dict(), "feature_cache": cache, "epochs_requested": self.epochs,
                "frozen_onnx": self.frozen_record}
        ckpt.save(self.outdir / ckpt.FILENAME, meta, arrays)

    def param_arrays(self) -> dict:
        """The arrays a checkpoint holds for the model (``param/NAME``)."""
        return {f"param/{k}": np.asarray(v) for k, v in self.engine.trainable_arrays().items()}

    def restore(self, meta: dict, arrays: dict) -> None:
        self.engine.restore({k[6:]: v for k, v in arrays.items() if k.startswith("param/")},
                            str(self.outdir / ckpt.FILENAME))
        self.opt.load_state_arrays({k[4:]: v for k, v in arrays.items() if k.startswith("opt/")},
                                   int(meta["optimizer_t"]))
        self.rng = ckpt.rng_from(meta["rng"], arrays["rng_keys"])
        self.global_step = int(meta["global_step"])
        self.history = list(meta["history"])

    # --- the run -----------------------------------------------------------------------------------

    def run(self, has_checkpoint: bool) -> FinetuneResult:
        t_start = time.monotonic()
        created = not self.outdir.exists()
        had_prep = (self.outdir / store.PREP_DIR).exists()
        self.outdir.mkdir(parents=True, exist_ok=True)
        lock = take_lock(self.outdir)  # a second run into this OUTDIR refuses, naming this one's PID
        try:
            return self._run(has_checkpoint, t_start)
        except BaseException as exc:
            import shutil

            if created and not (self.outdir / ckpt.FILENAME).exists():  # nothing to resume: leave nothing behind
                if self.cache is not None and not self._cache_shared():
                    self.cache.close()
                shutil.rmtree(self.outdir, ignore_errors=True)
            elif isinstance(exc, UsageError) and not had_prep:  # a refused run (other data, a budget too
                shutil.rmtree(self.outdir / store.PREP_DIR, ignore_errors=True)  # small...) leaves OUTDIR as it was
            raise
        finally:
            if self.build is not None and self.build_store is not None and self.build_store.build is self.build:
                self.engine.detach()   # a kept build holds nothing of this job (its optimizer, a probe session)
            (self.outdir / LOCK_FILE).unlink(missing_ok=True)
            os.close(lock)

    def _run(self, has_checkpoint: bool, t_start: float) -> FinetuneResult:
        # measured where a sensor is (or from the meter's log, with what was given for it)
        self.energy_meter = EnergyMeter(self.profile, self.threads, self.opts.power_log_spec(),
                                        meter_export=bool(getattr(self.opts, "meter_export", False)),
                                        speed=self._device_speed).start()
        ckpt_path = self.outdir / ckpt.FILENAME
        # (a build store's build is taken only with the plan the checkpoint holds: its record read, unverified)
        self.load((ckpt.peek(ckpt_path).get("plan") or {}) if has_checkpoint and self.build_store is not None else None)
        # loading the model, its ONNX export or prep child and a first run's cache are host work done once: the
        # energy is of the training (feature pass, epochs, writing the model), what the device does every run
        self.energy_meter.work_begins("loading the model: its ONNX export or prep child and the first run's cache")
        if self.lr is None:
            self.lr = default_lr(self.optimizer, head_only=self.layers.head_only, every_weight=self.layers.kind == "all")
        meta: dict | None = None
        arrays: dict[str, np.ndarray] = {}
        if has_checkpoint:
            meta, arrays = ckpt.load(ckpt_path)
            refuse_old_engine(meta, ckpt_path)
            ckpt.check_matches(meta, self.fingerprint(), ckpt_path)
            if self.epochs <= int(meta["epoch"]):
                self.notes.append(f"the checkpoint already holds {meta['epoch']} epoch(s) (--epochs {self.epochs}); "
                                  "nothing to train, the model is written again from it")
        elif self.resume:
            self.notes.append("--resume: no checkpoint in OUTDIR, starting from the beginning")
        self.opt = self.engine.make_optimizer(self.optimizer, self.lr, self.momentum, self.weight_decay, self.correction)
        self.rng = np.random.RandomState(self.seed)
        start_epoch, start_step, order = 0, 0, None
        partial: dict = {}
        if meta is not None:
            self.restore(meta, arrays)
            start_epoch, start_step = int(meta["epoch"]), int(meta["step"])
            order = arrays["order"] if start_step > 0 else None
            partial = meta.get("partial") or {}
            self.resumed_from = {"epoch": start_epoch, "step": start_step}
            self.notes.append(f"resumed from the checkpoint at epoch {start_epoch}, step {start_step}")
        rows = len(self.train_ds) + (len(self.val_ds) if self.val_ds is not None else 0)
        if self.taken is not None:
            self.plan, self.costs = dataclasses.replace(self.taken.plan, notes=list(self.taken.plan.notes)), \
                self.taken.costs
        else:
            self.plan, self.costs = self.engine.plan(rows, meta["plan"] if meta is not None else None)
        self.frozen_record = (meta or {}).get("frozen_onnx")
        self.advise()
        for note in self.notes:  # what is known before training is said before it (BatchNorm on micro-batches...)
            self.progress({"phase": "note", "message": note})
        self.notes_before_training = len(self.notes)

        old = {}
        if threading.current_thread() is threading.main_thread():  # signals can only be caught there
            old = {s: signal.signal(s, self.stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            done = start_epoch >= self.epochs
            feature_seconds = 0.0 if done else self.features(meta.get("feature_cache") if meta else None)
            self._keep_build()
            if self.stop.signum:
                self.save_checkpoint(start_epoch, start_step, order if order is not None else np.zeros(0), partial)
                self._interrupted(start_epoch, start_step)
            self._train(start_epoch, start_step, order, partial)
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        total = time.monotonic() - t_start
        return self._finish(total, feature_seconds)

    def _interrupted(self, epoch: int, step: int):
        signum = self.stop.signum
        assert signum is not None, "called only once a signal arrived"
        name = signal.Signals(signum).name
        if self.cache is not None and not self._cache_shared():
            self.cache.close()
        exc = Interrupted(f"training interrupted by {name} at epoch {epoch + 1}, step {step}; checkpoint saved",
                          str(self.outdir / ckpt.FILENAME), "run the same command with --resume to continue")
        exc.exit_code = 128 + signum  # what a shell reports for a process ended by that signal
        raise exc

    def _train(self, start_epoch: int, start_step: int, order, partial: dict) -> None:
        labels = self.train_ds.labels
        n = len(labels)
        b = self.batch_size
        steps = math.ceil(n / b)
        train_inputs = lambda idx: self.inputs("train", idx)  # noqa: E731
        for epoch in range(start_epoch, self.epochs):
            if order is None or start_step == 0:
                order = self.rng.permutation(n)
                partial = {}
            loss_sum = partial.get("loss_sum", 0.0)
            correct = partial.get("correct", 0)
            seen = partial.get("seen", 0)
            seconds = partial.get("seconds", 0.0)
            t0 = time.monotonic()
            for step in range(start_step, steps):
                if self.stop_at_step is not None and self.global_step >= self.stop_at_step:
                    self._stop_inside(epoch, step, steps, order, {"loss_sum": loss_sum, "correct": correct,
                                                                  "seen": seen,
                                                                  "seconds": seconds + time.monotonic() - t0})
                    return
                idx = order[step * b:(step + 1) * b]
                loss, c = self.engine.step(train_inputs, idx, labels, self.plan.micro_batch)
                if not math.isfinite(loss):
                    raise RunFailed(f"training diverged: the loss is {loss} at epoch {epoch + 1}, step {step + 1}",
                                    str(self.outdir), "lower --lr, check the data for NaN/inf values; "
                                    "no model was written")
                self.global_step += 1
                ckpt.kill_point("step")
                loss_sum, correct, seen = loss_sum + loss, correct + c, seen + len(idx)
                elapsed = seconds + time.monotonic() - t0
                rate = seen / max(elapsed, 1e-9)
                # done/total count the samples of every epoch of the run: one bar that only goes up
                self.tick("train", epoch=epoch + 1, epochs=self.epochs, step=step + 1, steps=steps,
                          loss=loss_sum / seen, acc=correct / seen, done=epoch * n + seen, total=self.epochs * n,
                          samples_per_s=rate, eta_s=((n - seen) + (self.epochs - epoch - 1) * n) / rate)
                if self.stop.signum:
                    part = {"loss_sum": loss_sum, "correct": correct, "seen": seen, "seconds": elapsed}
                    self.save_checkpoint(epoch, step + 1, order, part)
                    self._interrupted(epoch, step + 1)
            start_step = 0
            self.settle_statistics()
            seconds += time.monotonic() - t0
            val_acc, val_loss = self.evaluate_held_out()
            record = {"epoch": epoch + 1, "loss": loss_sum / max(seen, 1), "train_accuracy": correct / max(seen, 1),
                      "val_accuracy": val_acc, "val_loss": val_loss, "samples": seen, "seconds": round(seconds, 4),
                      "samples_per_s": seen / max(seconds, 1e-9), "rss_mb": procmem.rss_mb(),
                      "peak_rss_mb": procmem.peak_rss_mb()}
            self.history.append(record)
            self.tick("epoch", force=True, done=epoch + 1, total=self.epochs,
                      eta_s=(self.epochs - epoch - 1) * seconds, **record)
            self.save_checkpoint(epoch + 1, 0, order, {})
            self._write_metrics(final=False)
            ckpt.kill_point("epoch")
            if self.stop.signum:
                self._interrupted(epoch + 1, 0)

    def _stop_inside(self, epoch: int, step: int, steps: int, order, part: dict) -> None:
        """stop_at_step reached inside an epoch: checkpointed there (a later run resumes at this step) and the
        held-out accuracy measured; the epoch's record is left to the run that finishes it."""
        self.settle_statistics()
        self.save_checkpoint(epoch, step, order, part)
        val_acc, val_loss = self.evaluate_held_out()
        self.partial = {"epoch": epoch, "step": step, "steps": steps, "val_accuracy": val_acc, "val_loss": val_loss,
                        "seconds": round(part["seconds"], 4), "samples": part["seen"]}

    def _cache_shared(self) -> bool:
        return self.feature_store is not None and self.feature_store.holds(self.cache)

    def _write_metrics(self, final: bool, summary: dict | None = None) -> None:
        doc = {"format": "edgetrain-finetune-metrics/1", "complete": final, "model": self.model, "data": self.data,
               "classes": self.classes, "train_layers": self.layers.text, "plan": self.plan.to_dict(),
               "budget_mb": self.budget_mb, "epochs": self.history, "summary": summary}
        atomic_write_text(self.outdir / METRICS, json.dumps(doc, indent=2) + "\n", "metrics")

    def _check_finite(self) -> None:
        """Never write a model full of NaN: a diverged run is a failed run (exit 1), nothing final written."""
        bad = [k for k, v in self.param_arrays().items() if not np.all(np.isfinite(v))]
        if bad:
            raise RunFailed(f"training diverged: non-finite weights in {', '.join(k[6:] for k in bad[:3])}",
                            str(self.outdir), "lower --lr, check the data for NaN/inf values; no model was written")

    def _device_speed(self) -> dict:
        """The device's speed against this host (``measure.device_speed``), for the modelled energy: timed after
        the training, so that it is not in the run's window."""
        from ..measure import device_speed

        self.progress({"phase": "note", "message": f"timing the speed reference on this host, to scale the run's time "
                                                   f"to {self.profile.name}'s"})
        return device_speed(self.profile)

    def _finish(self, total: float, feature_seconds: float) -> FinetuneResult:
        last = self.history[-1] if self.history else {}
        acc_on = "held-out" if self.val_ds is not None else "training"
        final_acc = last.get("val_accuracy") if self.val_ds is not None else last.get("train_accuracy")
        if self.partial is not None and self.val_ds is not None:
            final_acc = self.partial["val_accuracy"]
        self._check_finite()
        model_path = self.outdir / (MODEL_NAME if self.gluon is not None and self.layers.kind != "lite" else ONNX_MODEL)
        if self.writes_model:
            model_path = self.write_model(self.outdir, {
                "finetuned_from": self.model, "data": self.data, "train_layers": self.layers.text,
                "epochs": len(self.history), "accuracy": final_acc, "accuracy_on": acc_on})
        if self.cache is not None and not self._cache_shared():
            self.cache.close(delete=True)
        _remove_scratch(self.outdir)
        peak = max(procmem.peak_rss_mb() or 0.0, self.gluon.child_peak_mb if self.gluon else 0.0) or None
        trained_n, frozen_n = self.engine.param_counts()
        train_seconds = sum(r["seconds"] for r in self.history)
        samples = len(self.train_ds) * len(self.history)
        result = FinetuneResult(
            model=str(model_path), outdir=str(self.outdir), classes=self.classes,
            train_layers=self.layers.text, trained_parameters=trained_n, frozen_parameters=frozen_n,
            replaced_head=self.engine.replaced_head, epochs=self.history, final_accuracy=final_acc, accuracy_on=acc_on,
            seconds=round(total, 3), feature_seconds=round(feature_seconds, 3),
            samples_per_s=samples / max(train_seconds + feature_seconds, 1e-9), peak_rss_mb=peak,
            budget_mb=self.budget_mb,
            plan=self.plan.to_dict(), resumed_from=self.resumed_from, threads=self.threads, notes=self.notes,
            partial_epoch=self.partial)
        result.notes_before_training = self.notes_before_training
        if self.val_ds is not None and final_acc is not None:
            # a model at chance on held-out data learned nothing: a failed check (exit 3), the model is kept;
            # a base with random weights is at chance by construction (such a run checks the tooling)
            result.chance = {**chance_check(100.0 * final_acc, self.val_ds.labels, len(self.classes)),
                             "allowed": bool(self.opts.allow_chance) or bool(self.engine.random_weights)}
        result.energy = self.energy_meter.stop(max(len(self.history), 1), max(samples, 1))
        if result.energy is not None:
            result.joules_per_epoch = result.energy["joules_per_epoch"]
            result.joules_per_sample = result.energy["joules_per_sample"]
        self._write_metrics(final=True, summary={k: v for k, v in result.to_dict().items() if k != "epochs"})
        return result


def refuse_old_engine(meta: dict, path: Path) -> None:
    """A checkpoint of the engines one-engine training replaced (``numpy-head``/``numpy-tail``: NumPy's
    interpreter of Gluon graphs, ``mxnet``: MXNet's autograd) holds weights and optimizer state under another
    graph's names and another BatchNorm (trained statistics): refused, saying why, rather than resumed wrong."""
    engine = str((meta.get("fingerprint") or {}).get("engine", ""))
    if not engine.startswith("onnx-"):
        raise UsageError(f"the checkpoint was written by the '{engine}' engine of an earlier edgetrain, which no longer "
                         "exists (every --train-layers choice now trains the model's ONNX graph)", str(path),
                         "start the run again in a new OUTDIR, or remove this checkpoint")


def _remove_scratch(outdir: Path) -> None:
    import shutil

    shutil.rmtree(outdir / store.PREP_DIR, ignore_errors=True)
    (outdir / store.FROZEN_ONNX).unlink(missing_ok=True)
