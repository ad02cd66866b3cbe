"""Fine-tune a model on the device: within its RAM budget and thread cap, resumable after a power cut.

The model's graph is split (netsplit) into a frozen part, run outside autograd in a hybridized block
with static allocation at one fixed batch shape, and a trained part. With head / last:N training the
frozen part's outputs are computed once and cached (featurecache); every epoch then trains on the cache.
Micro-batches with gradient accumulation keep the effective batch size while capping activation memory
(memplan picks the sizes). A checkpoint after every epoch and on SIGINT/SIGTERM makes ``resume`` end
with the same weights as an uninterrupted run.

Test hook (for the kill-at-phase tests, never set by users): ``EDGETRAIN_TEST_KILL_AT=PHASE:N`` makes
the process SIGKILL itself the N-th time it reaches PHASE: ``features`` (after a feature-pass batch is
written), ``step`` (after a training step), ``epoch`` (after an epoch's checkpoint and metrics), ``save``
(inside a checkpoint write, before the rename: see checkpoint.save).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from . import checkpoint as ckpt
from .errors import EdgetrainError, UsageError

MODEL_NAME = "model"
METRICS = "metrics.json"
FEATURES_FILE = "features.cache"
RUN_FILES = (ckpt.FILENAME, METRICS, f"{MODEL_NAME}-symbol.json")
DEFAULT_TRAIN_LAYERS = "head"
DEFAULT_EPOCHS = 10
DEFAULT_BATCH = 32
DEFAULT_VAL_SPLIT = 0.2


class Interrupted(EdgetrainError):
    """SIGINT/SIGTERM arrived: the checkpoint is written, the run can be resumed. Exit 128 + signal."""

    exit_code = 130


@dataclass
class FinetuneResult:
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
    within_budget: bool | None
    plan: dict
    energy: dict | None = None
    joules_per_epoch: float | None = None
    joules_per_sample: float | None = None
    resumed_from: dict | None = None
    threads: int = 1
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Stop:
    signum: int | None = None

    def __call__(self, signum, frame):
        self.signum = signum


def parse_budget(text, profile=None) -> float | None:
    """--memory-budget as MiB; default: the device profile's; None: no budget."""
    if text is None or text == "":
        return float(profile.memory_budget_mb) if profile is not None else None
    if isinstance(text, (int, float)):
        return float(text) / (1024 * 1024)
    from .devices import parse_size

    return parse_size(str(text), "--memory-budget") / (1024 * 1024)


def prepare_outdir(outdir: Path, resume: bool) -> bool:
    """Check OUTDIR can take this run; True if it holds a checkpoint to resume. Creates nothing yet."""
    if outdir.exists() and not outdir.is_dir():
        raise UsageError("OUTDIR is a file", str(outdir), "give a folder (it is created if missing)")
    probe = outdir
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UsageError(f"OUTDIR cannot be created: {probe} is a file", str(outdir), "choose another folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError("OUTDIR is not writable", str(outdir), "choose a folder you can write to")
    if not outdir.exists():
        return False
    held = [f for f in RUN_FILES if (outdir / f).exists()]
    if held and not resume:
        raise UsageError(f"OUTDIR holds an earlier run ({', '.join(held)})", str(outdir),
                         "pass --resume to continue it, or choose another (empty) OUTDIR")
    return (outdir / ckpt.FILENAME).exists()


def _data_fingerprint(ds) -> str:
    h = hashlib.sha256(np.ascontiguousarray(ds.labels).tobytes()).hexdigest()[:12]
    return f"{ds.source} n={len(ds)} labels={h}"


def _params_digest(arrays: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(arrays[k].asnumpy().tobytes())
    return h.hexdigest()[:16]


def finetune(model: str, data: str, outdir: str | Path, *, val: str | None = None,
             val_split: float | None = None, epochs: int = DEFAULT_EPOCHS, batch_size: int = DEFAULT_BATCH,
             lr: float | None = None, optimizer: str = "adam", train_layers: str = DEFAULT_TRAIN_LAYERS,
             memory_budget=None, seed: int = 0, resume: bool = False, params: str | None = None,
             input_shape=None, threads: int | None = None, profile=None, progress=None) -> FinetuneResult:
    """Train MODEL on DATA into OUTDIR (PREFIX ``OUTDIR/model`` + metrics.json + checkpoint.npz)."""
    from . import runtime
    from .netsplit import parse_train_layers
    from .optimizers import OPTIMIZERS

    threads = runtime.apply_threads(threads)
    if epochs < 1:
        raise UsageError(f"--epochs must be at least 1, got {epochs}", "--epochs", "pass a positive count")
    if batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, got {batch_size}", "--batch-size", "pass e.g. 32")
    if lr is not None and not (lr > 0 and math.isfinite(lr)):
        raise UsageError(f"--lr must be a positive number, got {lr}", "--lr", "pass e.g. 0.003")
    if optimizer not in OPTIMIZERS:
        raise UsageError(f"unknown optimizer '{optimizer}'", "--optimizer", f"use one of: {', '.join(OPTIMIZERS)}")
    if val is not None and val_split is not None:
        raise UsageError("--val and --val-split both given", "--val", "give held-out data or a split fraction, not both")
    layers = parse_train_layers(train_layers)
    budget_mb = parse_budget(memory_budget, profile)
    outdir = Path(outdir)
    has_checkpoint = prepare_outdir(outdir, resume)
    job = _Job(model, data, outdir, val, DEFAULT_VAL_SPLIT if val is None and val_split is None else val_split,
               epochs, batch_size, lr, optimizer, layers, budget_mb, seed, params, input_shape, threads, profile,
               progress or (lambda info: None))
    job.resume = resume
    return job.run(has_checkpoint)


class _Job:
    def __init__(self, model, data, outdir, val, val_split, epochs, batch_size, lr, optimizer, layers, budget_mb,
                 seed, params, input_shape, threads, profile, progress):
        self.__dict__.update(locals())
        del self.__dict__["self"]
        self.cache = None
        self.cache_complete = False
        self.notes: list[str] = []
        self.stop = _Stop()

    # --- set-up ------------------------------------------------------------------------------------

    def _load(self):
        from .data import load_data
        from .models import load_gluon
        from .netsplit import graph_of, head_units, replace_head

        self.model_obj = load_gluon(self.model, params=self.params, input_shape=self.input_shape)
        self.notes += self.model_obj.notes
        pre = self.model_obj.preprocess
        ds = load_data(self.data, pre)
        self.notes += ds.notes
        if self.val is not None:
            val = load_data(self.val, pre, where="--val")
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
        g = graph_of(self.model_obj.block, pre.input_name)
        self.source_digest = _params_digest({**g.arg_params, **g.aux_params})
        self.replaced_head = False
        outputs = head_units(g)
        if outputs != len(self.classes):
            replace_head(g, len(self.classes))
            self.replaced_head = True
            self.notes.append(f"output layer replaced: the model has {outputs} outputs, the data {len(self.classes)} "
                              f"classes; the new layer starts from random weights")
        self.graph = g
        self.pre = pre.with_classes(self.classes)

    def _split(self):
        from .netsplit import cut_for, split

        cut = cut_for(self.graph, self.layers)
        self.split = split(self.graph, cut, self.pre.input_shape, init_seed=self.seed)
        # the split parts hold their own copies of the weights: let the loaded model's go (a board with
        # 512 MB feels every megabyte)
        self.model_fp = f"{self.graph.fingerprint()}:{self.source_digest}"
        self.graph.arg_params, self.graph.aux_params = {}, {}
        self.model_obj.block = None
        self.trainable = self.split.trainable()
        for p in self.trainable:
            p.grad_req = "add"  # micro-batches accumulate into one effective-batch gradient
        self.split.trained.hybridize()
        if self.split.frozen is not None:
            self.split.frozen.hybridize(static_alloc=True, static_shape=True)

    def _advise(self) -> None:
        """Say what would make this run learn less than the user expects."""
        if self.model_obj.random_weights and self.split.frozen is not None:
            self.notes.append("the model has random weights, so its frozen layers compute nothing learned; "
                              "pass --params with trained weights, or --train-layers all")
        has_bn = any(p.grad_req == "null" for p in self.split.trained.collect_params().values())
        if has_bn and self.plan.micro_batch < min(self.batch_size, 8):
            self.notes.append(f"BatchNorm in the trained layers sees micro-batches of {self.plan.micro_batch} "
                              "(memory budget); its statistics will be noisy: train fewer layers or raise the budget")

    def _fingerprint(self) -> dict:
        def val_fp():
            if self.val_ds is None:
                return "none"
            return (f"split {self.val_split} seed {self.seed}" if self.val is None else "") + _data_fingerprint(self.val_ds)

        return {"model": self.model_fp, "model_ref": self.model,
                "classes": self.classes, "input_shape": list(self.pre.input_shape),
                "train_layers": self.layers.text, "batch_size": self.batch_size, "optimizer": self.optimizer,
                "lr": self.lr, "seed": self.seed, "data": _data_fingerprint(self.train_ds), "val": val_fp()}

    # --- features ----------------------------------------------------------------------------------

    def _features(self, meta_cache: dict | None) -> float:
        """Fill the feature cache (train rows, then validation rows); returns the seconds it took."""
        import mxnet as mx

        from .featurecache import FeatureCache

        s = self.split
        if s.frozen is None:
            return 0.0
        rows = self.costs.cache_rows
        fp = hashlib.sha256(json.dumps([self._fingerprint(), s.cut_name, self.plan.feature_batch]).encode()).hexdigest()[:16]
        self.cache_fp = fp
        path = self.outdir / FEATURES_FILE
        reuse = (self.plan.cache == "disk" and meta_cache is not None and meta_cache.get("fingerprint") == fp
                 and meta_cache.get("complete") and path.exists())
        self.cache = FeatureCache(rows, s.feature_shape, self.plan.cache, path, reuse=reuse)
        if reuse and self.cache.reusable():
            self.notes.append("feature cache on disk reused from the interrupted run")
            self.cache_complete = True
            return 0.0
        if reuse:
            self.cache.close()
            self.cache = FeatureCache(rows, s.feature_shape, self.plan.cache, path)
        t0 = time.monotonic()
        fb = self.plan.feature_batch
        sources = [(self.train_ds, 0)] + ([(self.val_ds, len(self.train_ds))] if self.val_ds is not None else [])
        done = 0
        for ds, offset in sources:
            for start in range(0, len(ds), fb):
                idx = np.arange(start, min(start + fb, len(ds)))
                x = ds.batch(idx)
                if len(idx) < fb:  # same shape every pass: pad, never retrace
                    x = np.concatenate([x, np.repeat(x[-1:], fb - len(idx), axis=0)])
                feats = s.frozen(mx.nd.array(x)).asnumpy()[: len(idx)]
                self.cache.write(offset + start, feats)
                ckpt.kill_point("features")
                done += len(idx)
                self._tick("features", done=done, total=rows, t0=t0)
                if self.stop.signum:
                    return time.monotonic() - t0
        self.cache.flush()
        self.cache_complete = True  # only now may a checkpoint vouch for it
        return time.monotonic() - t0

    # --- training ----------------------------------------------------------------------------------

    def _inputs(self, ds_kind: str, idx: np.ndarray) -> np.ndarray:
        if self.cache is not None:
            offset = 0 if ds_kind == "train" else len(self.train_ds)
            return self.cache.read(idx + offset)
        return (self.train_ds if ds_kind == "train" else self.val_ds).batch(idx)

    def _step(self, idx: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
        """One effective batch: micro-batches accumulate gradients, then one optimizer update."""
        import mxnet as mx
        from mxnet import autograd

        m = self.plan.micro_batch
        real = len(idx)
        loss_sum, correct = 0.0, 0
        for start in range(0, real, m):
            part = idx[start:start + m]
            y = labels[part]
            n = len(part)
            x = self._inputs("train", part)
            if n < m:  # pad to the fixed shape; the padding is masked out of the loss
                x = np.concatenate([x, np.repeat(x[-1:], m - n, axis=0)])
                y = np.concatenate([y, np.repeat(y[-1:], m - n)])
            mask = mx.nd.array((np.arange(m) < n).astype(np.float32))
            with autograd.record():
                out = self.split.trained(mx.nd.array(x))
                per = self.loss_fn(out, mx.nd.array(y.astype(np.float32))) * mask
                total = per.sum() / real
            total.backward()
            loss_sum += float(per.sum().asscalar())
            correct += int((out.argmax(axis=1).asnumpy()[:n] == y[:n]).sum())
        self.opt.step()
        for p in self.trainable:
            p.zero_grad()
        return loss_sum, correct

    def _evaluate(self) -> tuple[float | None, float | None]:
        import mxnet as mx

        if self.val_ds is None:
            return None, None
        m = self.plan.micro_batch
        labels = self.val_ds.labels
        correct, loss_sum = 0, 0.0
        for start in range(0, len(labels), m):
            idx = np.arange(start, min(start + m, len(labels)))
            x = self._inputs("val", idx)
            n = len(idx)
            if n < m:
                x = np.concatenate([x, np.repeat(x[-1:], m - n, axis=0)])
            out = self.split.trained(mx.nd.array(x))
            y = labels[idx]
            loss_sum += float(self.loss_fn(out[:n], mx.nd.array(y.astype(np.float32))).sum().asscalar())
            correct += int((out.argmax(axis=1).asnumpy()[:n] == y).sum())
        return correct / len(labels), loss_sum / len(labels)

    def _tick(self, phase: str, **info) -> None:
        now = time.monotonic()
        if now - getattr(self, "_last_tick", 0.0) < 0.5 and not info.get("force"):
            return
        self._last_tick = now
        from . import procmem

        info.pop("force", None)
        t0 = info.pop("t0", now)
        rss = procmem.rss_mb()
        if self.budget_mb and rss and rss > self.budget_mb and not getattr(self, "_over_noted", False):
            self._over_noted = True
            self.notes.append(f"RSS reached {rss:.0f} MB during {phase}, over the {self.budget_mb:.0f} MB budget")
        done, total = info.get("done", 0), info.get("total", 0)
        rate = done / max(now - t0, 1e-9)
        eta = (total - done) / rate if rate > 0 else None
        self.progress({"phase": phase, "samples_per_s": rate, "eta_s": eta, **info, "rss_mb": rss,
                       "budget_mb": self.budget_mb})

    # --- checkpoints -------------------------------------------------------------------------------

    def _save_checkpoint(self, epoch: int, step: int, order: np.ndarray, partial: dict) -> None:
        rng_meta, rng_arrays = ckpt.rng_to_arrays(self.rng)
        arrays = {f"param/{p.name}": p.data().asnumpy() for p in self.split.trained.collect_params().values()}
        arrays.update({f"opt/{k}": v.asnumpy() for k, v in self.opt.state_arrays().items()})
        arrays.update(rng_arrays)
        arrays["order"] = np.asarray(order, dtype=np.int64)
        cache = None
        if self.cache is not None:
            cache = {"placement": self.plan.cache, "fingerprint": self.cache_fp, "complete": self.cache_complete}
        meta = {"fingerprint": self._fingerprint(), "epoch": epoch, "step": step, "global_step": self.global_step,
                "optimizer_t": self.opt.t, "rng": rng_meta, "history": self.history, "partial": partial,
                "plan": self.plan.to_dict(), "feature_cache": cache, "epochs_requested": self.epochs}
        ckpt.save(self.outdir / ckpt.FILENAME, meta, arrays)

    def _restore(self, meta: dict, arrays: dict) -> None:
        import mxnet as mx

        for p in self.split.trained.collect_params().values():
            key = f"param/{p.name}"
            # p.shape is None on a SymbolBlock whose weights were loaded but never run: ask the data
            if key not in arrays or arrays[key].shape != p.data().shape:
                raise UsageError(f"checkpoint does not hold weights for {p.name}", str(self.outdir / ckpt.FILENAME),
                                 "delete it and start over, or use another OUTDIR")
            p.set_data(mx.nd.array(arrays[key]))
        self.opt.load_state_arrays({k[4:]: v for k, v in arrays.items() if k.startswith("opt/")},
                                   int(meta["optimizer_t"]))
        self.rng = ckpt.rng_from(meta["rng"], arrays["rng_keys"])
        self.global_step = int(meta["global_step"])
        self.history = list(meta["history"])

    # --- the run -----------------------------------------------------------------------------------

    def run(self, has_checkpoint: bool) -> FinetuneResult:
        from mxnet import gluon

        from .optimizers import default_lr, make_optimizer

        t_start = time.monotonic()
        from .energy import EnergyMeter

        self.energy_meter = EnergyMeter(self.profile, self.threads).start()  # measured where a sensor is
        self._load()
        self._split()
        if self.lr is None:
            self.lr = default_lr(self.optimizer, head_only=self.layers.kind == "last" and self.layers.n == 1)
        meta = arrays = None
        ckpt_path = self.outdir / ckpt.FILENAME
        if has_checkpoint:
            meta, arrays = ckpt.load(ckpt_path)
            ckpt.check_matches(meta, self._fingerprint(), ckpt_path)
            if self.epochs <= int(meta["epoch"]):
                self.notes.append(f"the checkpoint already holds {meta['epoch']} epoch(s) (--epochs {self.epochs}); "
                                  "nothing to train, the model is written again from it")
        elif self.resume:
            self.notes.append("--resume: no checkpoint in OUTDIR, starting from the beginning")
        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        self.opt = make_optimizer(self.optimizer, self.trainable, self.lr)
        self.rng = np.random.RandomState(self.seed)
        self.global_step = 0
        self.history: list[dict] = []
        start_epoch, start_step, order, partial = 0, 0, None, {}
        if meta is not None:
            self._restore(meta, arrays)
            start_epoch, start_step = int(meta["epoch"]), int(meta["step"])
            order = arrays["order"] if start_step > 0 else None
            partial = meta.get("partial") or {}
            self.resumed_from = {"epoch": start_epoch, "step": start_step}
            self.notes.append(f"resumed from the checkpoint at epoch {start_epoch}, step {start_step}")
        else:
            self.resumed_from = None
        from .memplan import plan_job

        rows = len(self.train_ds) + (len(self.val_ds) if self.val_ds is not None else 0)
        self.plan, self.costs = plan_job(self.split, self.pre, rows, self.batch_size, self.budget_mb,
                                         meta["plan"] if meta is not None else None)
        self._advise()

        import shutil
        import threading

        created = not self.outdir.exists()
        self.outdir.mkdir(parents=True, exist_ok=True)
        old = {}
        if threading.current_thread() is threading.main_thread():  # signals can only be caught there
            old = {s: signal.signal(s, self.stop) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            done = start_epoch >= self.epochs
            feature_seconds = 0.0 if done else self._features(meta.get("feature_cache") if meta else None)
            if self.stop.signum:
                self._save_checkpoint(start_epoch, start_step, order if order is not None else np.zeros(0),
                                      partial)
                self._interrupted(start_epoch, start_step)
            self._train(start_epoch, start_step, order, partial)
        except BaseException:
            if created and not ckpt_path.exists():  # nothing to resume from: leave nothing behind
                if self.cache is not None:
                    self.cache.close()
                shutil.rmtree(self.outdir, ignore_errors=True)
            raise
        finally:
            for s, h in old.items():
                signal.signal(s, h)
        total = time.monotonic() - t_start
        return self._finish(total, feature_seconds)

    def _interrupted(self, epoch: int, step: int):
        name = signal.Signals(self.stop.signum).name
        if self.cache is not None:
            self.cache.close()
        exc = Interrupted(f"training interrupted by {name} at epoch {epoch + 1}, step {step}; checkpoint saved",
                          str(self.outdir / ckpt.FILENAME), "run the same command with --resume to continue")
        exc.exit_code = 128 + self.stop.signum  # what a shell reports for a process ended by that signal
        raise exc

    def _train(self, start_epoch: int, start_step: int, order, partial: dict) -> None:
        import mxnet as mx

        from . import procmem

        labels = self.train_ds.labels
        n = len(labels)
        b = self.batch_size
        steps = math.ceil(n / b)
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
                mx.random.seed(self.seed * 7919 + self.global_step)  # same dropout masks after a resume
                idx = order[step * b:(step + 1) * b]
                l, c = self._step(idx, labels)
                self.global_step += 1
                ckpt.kill_point("step")
                loss_sum, correct, seen = loss_sum + l, correct + c, seen + len(idx)
                elapsed = seconds + time.monotonic() - t0
                rate = seen / max(elapsed, 1e-9)
                self._tick("train", epoch=epoch + 1, epochs=self.epochs, step=step + 1, steps=steps,
                           loss=loss_sum / seen, acc=correct / seen, done=seen, total=n,
                           t0=time.monotonic() - elapsed, eta_s=((n - seen) + (self.epochs - epoch - 1) * n) / rate)
                if self.stop.signum:
                    part = {"loss_sum": loss_sum, "correct": correct, "seen": seen, "seconds": elapsed}
                    self._save_checkpoint(epoch, step + 1, order, part)
                    self._interrupted(epoch, step + 1)
            start_step = 0
            seconds += time.monotonic() - t0
            val_acc, val_loss = self._evaluate()
            record = {"epoch": epoch + 1, "loss": loss_sum / max(seen, 1), "train_accuracy": correct / max(seen, 1),
                      "val_accuracy": val_acc, "val_loss": val_loss, "samples": seen, "seconds": round(seconds, 4),
                      "samples_per_s": seen / max(seconds, 1e-9), "rss_mb": procmem.rss_mb(),
                      "peak_rss_mb": procmem.peak_rss_mb()}
            self.history.append(record)
            self._tick("epoch", force=True, **record)
            self._save_checkpoint(epoch + 1, 0, order, {})
            self._write_metrics(final=False)
            ckpt.kill_point("epoch")
            if self.stop.signum:
                self._interrupted(epoch + 1, 0)

    def _write_metrics(self, final: bool, summary: dict | None = None) -> None:
        from .fileio import atomic_write_text

        doc = {"format": "edgetrain-finetune-metrics/1", "complete": final, "model": self.model, "data": self.data,
               "classes": self.classes, "train_layers": self.layers.text, "plan": self.plan.to_dict(),
               "budget_mb": self.budget_mb, "epochs": self.history, "summary": summary}
        atomic_write_text(self.outdir / METRICS, json.dumps(doc, indent=2) + "\n", "metrics")

    def _finish(self, total: float, feature_seconds: float) -> FinetuneResult:
        from . import procmem
        from .models import GluonModel, save_prefix
        from .netsplit import full_block

        block = full_block(self.split)
        n_classes = len(self.classes)
        last = self.history[-1] if self.history else {}
        acc_on = "held-out" if self.val_ds is not None else "training"
        final_acc = last.get("val_accuracy") if self.val_ds is not None else last.get("train_accuracy")
        gm = GluonModel(block, self.model_obj.ref, self.pre, n_classes)
        save_prefix(gm, self.outdir / MODEL_NAME, extra={
            "finetuned_from": self.model, "data": self.data, "train_layers": self.layers.text,
            "epochs": len(self.history), "accuracy": final_acc, "accuracy_on": acc_on})
        if self.cache is not None:
            self.cache.close(delete=True)
        peak = procmem.peak_rss_mb()
        trained_n = sum(int(p.data().size) for p in self.trainable)
        frozen_n = sum(int(a.size) for a in self.split.all_params().values()) - trained_n
        train_seconds = sum(r["seconds"] for r in self.history)
        samples = len(self.train_ds) * len(self.history)
        result = FinetuneResult(
            model=str(self.outdir / MODEL_NAME), outdir=str(self.outdir), classes=self.classes,
            train_layers=self.layers.text, trained_parameters=trained_n, frozen_parameters=frozen_n,
            replaced_head=self.replaced_head, epochs=self.history, final_accuracy=final_acc, accuracy_on=acc_on,
            seconds=round(total, 3), feature_seconds=round(feature_seconds, 3),
            samples_per_s=samples / max(train_seconds + feature_seconds, 1e-9), peak_rss_mb=peak,
            budget_mb=self.budget_mb, within_budget=(peak <= self.budget_mb) if self.budget_mb and peak else None,
            plan=self.plan.to_dict(), resumed_from=self.resumed_from, threads=self.threads, notes=self.notes)
        result.energy = self.energy_meter.stop(max(len(self.history), 1), max(samples, 1))
        if result.energy is not None:
            result.joules_per_epoch = result.energy["joules_per_epoch"]
            result.joules_per_sample = result.energy["joules_per_sample"]
        self._write_metrics(final=True, summary={k: v for k, v in result.to_dict().items() if k != "epochs"})
        return result


# the public name (edgetrain.finetune is this module, so the function is exported as finetune_model)
finetune_model = finetune
