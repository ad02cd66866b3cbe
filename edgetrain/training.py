"""Fine-tune a model on the device: within its RAM budget and thread cap, resumable after a power cut.

The model's graph is split (netsplit) into a frozen part and a trained part. The frozen part runs in ONNX
Runtime: exported through edgetrain's Gluon->ONNX path, checked equal to Gluon on real samples before it
is trusted (MXNet stands in when it cannot be exported or differs), with the batch and arena the memory
plan picks, kept beside the run so a resume does not export again, and cached per user for base models
whose weights come from files. Its outputs are computed once and cached (featurecache); every epoch
trains on the cache. With ``head`` and ``last:N`` (_NumpyJob) the trained part trains in NumPy
(numpy_tail: the ops of common heads and tails, checked against MXNet once per base model) and no mxnet
is imported in the process at all (a short child exports the frozen part once per base model and
--train-layers); the PREFIX is written in mxnet's own file format. A trained part numpy_tail cannot run
trains in MXNet (_Job), as does ``all``, which freezes nothing. A diverging loss or non-finite weights fail the run (exit 1, no model);
one run at a time holds OUTDIR (a lock file names its PID).
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
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from . import _lazy, child, procmem, runtime
from . import checkpoint as ckpt
from .compat import mxnet_onnx
from .data import ParallelReader, load_data
from .energy import EnergyMeter
from .compare import chance_check, chance_failure
from .errors import EdgetrainError, RunFailed, UsageError
from .featurecache import FeatureCache
from .fileio import atomic_path, atomic_write_bytes, atomic_write_text, remembered_digest
from .memplan import FEATURE_BATCHES, MB, READ_AHEAD, Costs, MemoryPlan, choose, graph_costs, plan_job
from .models import is_factory_ref, load_gluon, with_norm
from .netsplit import Graph, _find_cuts, _output_name, cut_for, graph_of, head_units, parse_train_layers, replace_head, split
from .optimizers import default_lr, make_numpy_optimizer, make_optimizer
from .options import FinetuneOptions
from .preprocess import Preprocess, sidecar_path, sidecar_text
from .results import ProgressFn, Result, report

MODEL_NAME = "model"
METRICS = "metrics.json"
FEATURES_FILE = "features.cache"
RUN_FILES = (ckpt.FILENAME, METRICS, f"{MODEL_NAME}-symbol.json")
FROZEN_ONNX = "frozen.onnx"  # the frozen part, exported once per run (a resume reuses it)
PREP_DIR = ".finetune-prep"  # what the mxnet child of a NumPy-trained run leaves for the run (see _NumpyJob)
DIGEST_MEMO = "digests.json"  # in the cache folder: the SHA-256 of files hashed before (fileio.remembered_digest)
REFERENCE_FILE = "reference.npz"  # the prep child's Gluon outputs on real samples, for the check in the parent
VALIDATE_SAMPLES = 4  # real samples the ONNX Runtime frozen part is checked on against Gluon
FROZEN_TOLERANCE = (1e-4, 1e-3)  # atol (relative to the features' magnitude), rtol
DEFAULT_TRAIN_LAYERS = "head"
DEFAULT_EPOCHS = 10
DEFAULT_BATCH = 32
DEFAULT_VAL_SPLIT = 0.2


class Interrupted(EdgetrainError):
    """SIGINT/SIGTERM arrived: the checkpoint is written, the run can be resumed. Exit 128 + signal."""

    exit_code = 130


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

    def checks(self) -> list[str]:
        failed = []
        if self.budget_mb and self.peak_rss_mb and self.peak_rss_mb > self.budget_mb:
            failed.append(f"peak RSS {self.peak_rss_mb:.0f} MB went over the memory budget {self.budget_mb:.0f} MB "
                          "(lower --batch-size or train fewer layers)")
        return failed + [f for f in [chance_failure(self.chance, "fine-tuned")] if f]


@dataclass
class _Stop:
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
    holder = _lock_holder(outdir)
    if holder is not None:
        raise UsageError(f"OUTDIR is in use by another finetune run (PID {holder})", str(outdir),
                         "wait for that run to finish (or stop it), or choose another OUTDIR")
    held = [f for f in RUN_FILES if (outdir / f).exists()]
    if held and not resume:
        raise UsageError(f"OUTDIR holds an earlier run ({', '.join(held)})", str(outdir),
                         "pass --resume to continue it, or choose another (empty) OUTDIR")
    return (outdir / ckpt.FILENAME).exists()


def _data_fingerprint(ds) -> str:
    """What identifies the training data to a checkpoint: its name (not where it lies, so a run folder moved
    with its data resumes), its size and its labels."""
    h = hashlib.sha256(np.ascontiguousarray(ds.labels).tobytes()).hexdigest()[:12]
    return f"{Path(ds.source).name if os.sep in ds.source else ds.source} n={len(ds)} labels={h}"


def _params_digest(arrays: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(arrays[k].asnumpy().tobytes())
    return h.hexdigest()[:16]


LOCK_FILE = ".finetune.lock"


def _lock_holder(outdir: Path) -> str | None:
    """The PID of a live finetune run holding OUTDIR's lock, else None."""
    import fcntl

    try:
        fd = os.open(outdir / LOCK_FILE, os.O_RDONLY)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return None
    except OSError:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
    finally:
        os.close(fd)


def _take_lock(outdir: Path) -> int:
    """Hold OUTDIR for this run (released by the kernel if the process dies): an flock'ed file with our PID."""
    import fcntl

    fd = os.open(outdir / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        pid = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
        os.close(fd)
        raise UsageError(f"OUTDIR is in use by another finetune run (PID {pid})", str(outdir),
                         "wait for that run to finish (or stop it), or choose another OUTDIR") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def _data_budget(budget_mb) -> int | None:
    """The most an .npz's arrays may take once read: the whole --memory-budget at most (checked from the
    file's headers before anything is read, so a compressed bomb never expands)."""
    return int(budget_mb * 2**20) if budget_mb else None


def _file_sha(path: Path) -> str:
    root = _cache_root()
    return remembered_digest(path, root / DIGEST_MEMO if root else None)


def _remove_scratch(outdir: Path) -> None:
    import shutil

    shutil.rmtree(outdir / PREP_DIR, ignore_errors=True)
    (outdir / FROZEN_ONNX).unlink(missing_ok=True)


def _export_frozen_bytes(split, pre) -> bytes:
    """The frozen part through edgetrain's Gluon->ONNX path (opset 13, dynamic batch, weights as constants)."""
    internals = split.graph.symbol().get_internals()
    sym = internals[_output_name(internals, split.cut_name)]
    params = {p.name: p.data() for p in split.frozen.collect_params().values()}
    try:
        # the exporter's own checker pass is skipped (it would double the peak): ONNX Runtime runs the
        # result against Gluon's outputs before it is trusted
        proto = mxnet_onnx.translate(sym, params, split.graph.data_name, pre.batch_shape(1), dynamic_batch=True,
                                     check=False)
    except mxnet_onnx.TranslationError as exc:
        raise UsageError(f"operator '{exc.op}' cannot be exported ({exc.reason})", f"layer {exc.layer}") from None
    return proto.SerializeToString()


def _frozen_onnx(outdir: Path, fingerprint: str, record: dict | None, export) -> tuple[Path, bool]:
    """OUTDIR/frozen.onnx for this run: reused when the checkpoint vouches for it, else exported now."""
    path = outdir / FROZEN_ONNX
    if (record and record.get("fingerprint") == fingerprint and path.exists()
            and _file_sha(path) == record.get("sha256")):
        return path, True
    atomic_write_bytes(path, export(), "frozen part")
    return path, False


def _ort_session(path: Path, threads: int, arena: bool):
    """The frozen part's session for the feature pass: its workers spin within a run (its many small
    parallel sections), and stop when a run ends, so the decoding threads between runs have the cores."""
    return _lazy.ort_session(path, threads, spinning=True, stop_spinning_after_run=True, arena=arena)


def _mismatch(got: np.ndarray, want: np.ndarray) -> str | None:
    """None when ONNX Runtime's frozen outputs equal Gluon's within tolerance, else what differs."""
    atol, rtol = FROZEN_TOLERANCE
    scale = max(1.0, float(np.abs(want).max()) if want.size else 1.0)
    if got.shape != want.shape:
        return f"shape {got.shape} vs {want.shape}"
    err = np.abs(got - want)
    if np.all(np.isfinite(got)) and np.all(err <= atol * scale + rtol * np.abs(want)):
        return None
    return f"max abs error {float(np.nanmax(err)):.3g} on features of magnitude {scale:.3g}"


class _Job:
    engine = "mxnet"  # what trains: a checkpoint is resumed only by the same engine
    frozen_in_ort = False  # the feature pass runs the frozen part in ONNX Runtime (else in MXNet)

    def __init__(self, model: str, opts: FinetuneOptions, *, layers, val_split: float | None, budget_mb, threads: int,
                 profile, progress):
        self.model, self.opts, self.layers, self.val_split = model, opts, layers, val_split
        self.budget_mb, self.threads, self.profile, self.progress = budget_mb, threads, profile, progress
        self.data, self.outdir, self.val = opts.data, Path(opts.out), opts.val
        self.epochs, self.batch_size, self.lr, self.optimizer = opts.epochs, opts.batch_size, opts.lr, opts.optimizer
        self.seed, self.params, self.input_shape = opts.seed, opts.params, opts.input_shape
        self.cache = None
        self.cache_complete = False
        self.notes: list[str] = []
        self.stop = _Stop()

    # --- set-up ------------------------------------------------------------------------------------

    def _load_data(self, pre):
        """DATA (and --val, or the split of DATA) read for ``pre`` (the model's preprocessing, with --mean/--std
        when given: the data is normalised with them and the written model records them); the classes come
        from the data."""
        given = with_norm(pre, self.opts.mean, self.opts.std)
        self.own_norm = (given.mean, given.std) == (pre.mean, pre.std)
        if not self.own_norm:
            self.notes.append(f"normalisation from --mean/--std: mean {list(given.mean)} std {list(given.std)} "
                              f"(the model's: mean {list(pre.mean)} std {list(pre.std)}); the model written "
                              "records them")
        pre = given
        ds = load_data(self.data, pre, max_bytes=_data_budget(self.budget_mb))  # refused from headers if over
        self.notes += ds.notes
        if self.val is not None:
            val = load_data(self.val, pre, where="--val", max_bytes=_data_budget(self.budget_mb))
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

    def _load(self):
        # a base model whose weights come from files is built and checked once per user: later runs take
        # its graph and weights from the template cache (no zoo build, no full forward check)
        root = _cache_root()
        self.template_key = _prep_key(self.model, self.params, self.input_shape) if root is not None else None
        folder = root / "finetune-template" / self.template_key if root is not None else None
        record = _intact_template(folder, self.template_key) if folder is not None else None
        if record is not None:
            self.model_obj = SimpleNamespace(random_weights=False, block=None)
            self.notes += record["notes"]
            pre = Preprocess.from_dict(record["preprocess"])
            self._load_data(pre)
            g = _template_graph(folder, record, _lazy.mxnet().nd.load)  # as NDArrays: no NumPy copy held
            _find_cuts(g)
            self.source_digest = record["source_digest"]
            self.notes.append("base model's graph and weights reused from the cache (not rebuilt and checked again)")
        else:
            self.model_obj = load_gluon(self.model, params=self.params, input_shape=self.input_shape)
            self.notes += self.model_obj.notes
            pre = self.model_obj.preprocess
            self._load_data(pre)
            g = graph_of(self.model_obj.block, pre.input_name)
            self.source_digest = _params_digest({**g.arg_params, **g.aux_params})
            if folder is not None and not self.model_obj.random_weights:
                self._publish_template(folder, g, pre)
        self.replaced_head = False
        outputs = head_units(g)
        if outputs != len(self.classes):
            replace_head(g, len(self.classes))
            self.replaced_head = True
            self.notes.append(f"output layer replaced: the model has {outputs} outputs, the data {len(self.classes)} "
                              f"classes; the new layer starts from random weights")
        self.graph = g

    def _publish_template(self, folder: Path, g: Graph, pre) -> None:
        """The loaded base model's graph and weights into the per-user cache (atomically: a half-written
        entry is never seen); a failure only costs the next run the full load."""
        import shutil
        import tempfile

        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
            record = {"format": TEMPLATE_FORMAT, "key": self.template_key, "preprocess": pre.to_dict(),
                      "data_name": g.data_name, "head": g.head, "source_digest": self.source_digest,
                      "notes": list(self.model_obj.notes), **_write_template(tmp, g)}
            atomic_write_text(tmp / "template.json", json.dumps(record), "template")
            if folder.exists():
                shutil.rmtree(folder, ignore_errors=True)  # damaged (an intact one would have been used)
            os.replace(tmp, folder)
        except (OSError, EdgetrainError) as exc:
            shutil.rmtree(locals().get("tmp", folder.parent / ".none"), ignore_errors=True)
            self.notes.append(f"the model could not be cached ({type(exc).__name__}); the next run loads it again")

    def _split(self):
        cut = cut_for(self.graph, self.layers)
        self.split = split(self.graph, cut, self.pre.input_shape, init_seed=self.seed)
        # the split parts hold their own copies of the weights: let the loaded model's go (a board with
        # 512 MB feels every megabyte)
        self.model_fp = f"{self.graph.fingerprint()}:{self.source_digest}"
        self.graph.arg_params, self.graph.aux_params = {}, {}
        self.model_obj.block = None
        _release_freed_memory()
        self.trainable = self.split.trainable()
        for p in self.trainable:
            p.grad_req = "add"  # micro-batches accumulate into one effective-batch gradient
        self.split.trained.hybridize()
        if self.split.frozen is not None:
            self.split.frozen.hybridize()  # runs in ONNX Runtime; MXNet only checks it (or stands in)

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

        return {"model": self.model_fp, "model_ref": self.model, "engine": self.engine,
                "classes": self.classes, "input_shape": list(self.pre.input_shape),
                # only other than the model's own: a checkpoint written before --mean/--std existed resumes
                "normalisation": None if self.own_norm else [list(self.pre.mean), list(self.pre.std)],
                "train_layers": self.layers.text, "batch_size": self.batch_size, "optimizer": self.optimizer,
                "lr": self.lr, "seed": self.seed, "data": _data_fingerprint(self.train_ds), "val": val_fp()}

    # --- features ----------------------------------------------------------------------------------

    def _features(self, meta_cache: dict | None) -> float:
        """Fill the feature cache (train rows, then validation rows); returns the seconds it took."""
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
        run_frozen = self._frozen_fn()
        decode_s = frozen_s = 0.0
        sources = [(self.train_ds, 0)] + ([(self.val_ds, len(self.train_ds))] if self.val_ds is not None else [])
        done = 0
        # decoded READ_AHEAD samples at a time on the thread cap's threads (in turn with the frozen part,
        # never beside it); in MXNet (an export that failed) on this thread alone: its OpenMP workers spin
        reader = ParallelReader((self.threads or runtime.current_threads()) if self.frozen_in_ort else 1)
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
                        self._tick("features", done=done, total=rows, t0=t0)
                        if self.stop.signum:
                            return time.monotonic() - t0
        finally:
            reader.close()
        self.cache.flush()
        self.notes.append(f"feature pass: {decode_s:.2f}s decoding and preprocessing {rows} samples, "
                          f"{frozen_s:.2f}s in the frozen part")
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
        mx = _lazy.mxnet()
        autograd = _lazy.from_import("mxnet", "autograd")

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
        mx = _lazy.mxnet()

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
        arrays = self._param_arrays()
        arrays.update({f"opt/{k}": np.asarray(v.asnumpy() if hasattr(v, "asnumpy") else v)
                       for k, v in self.opt.state_arrays().items()})
        arrays.update(rng_arrays)
        arrays["order"] = np.asarray(order, dtype=np.int64)
        cache = None
        if self.cache is not None:
            cache = {"placement": self.plan.cache, "fingerprint": self.cache_fp, "complete": self.cache_complete}
        meta = {"fingerprint": self._fingerprint(), "epoch": epoch, "step": step, "global_step": self.global_step,
                "optimizer_t": self.opt.t, "rng": rng_meta, "history": self.history, "partial": partial,
                "plan": self.plan.to_dict(), "feature_cache": cache, "epochs_requested": self.epochs,
                "frozen_onnx": getattr(self, "frozen_record", None)}
        ckpt.save(self.outdir / ckpt.FILENAME, meta, arrays)

    def _param_arrays(self) -> dict:
        return {f"param/{p.name}": p.data().asnumpy() for p in self.split.trained.collect_params().values()}

    def _restore(self, meta: dict, arrays: dict) -> None:
        self._restore_params(arrays)
        self.opt.load_state_arrays({k[4:]: v for k, v in arrays.items() if k.startswith("opt/")},
                                   int(meta["optimizer_t"]))
        self.rng = ckpt.rng_from(meta["rng"], arrays["rng_keys"])
        self.global_step = int(meta["global_step"])
        self.history = list(meta["history"])

    def _restore_params(self, arrays: dict) -> None:
        mx = _lazy.mxnet()

        for p in self.split.trained.collect_params().values():
            key = f"param/{p.name}"
            # p.shape is None on a SymbolBlock whose weights were loaded but never run: ask the data
            if key not in arrays or arrays[key].shape != p.data().shape:
                raise UsageError(f"checkpoint does not hold weights for {p.name}", str(self.outdir / ckpt.FILENAME),
                                 "delete it and start over, or use another OUTDIR")
            p.set_data(mx.nd.array(arrays[key]))

    # --- the run -----------------------------------------------------------------------------------

    def _make_training(self) -> None:
        gluon = _lazy.from_import("mxnet", "gluon")

        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        self.opt = make_optimizer(self.optimizer, self.trainable, self.lr)

    def _plan(self, saved: dict | None):
        rows = len(self.train_ds) + (len(self.val_ds) if self.val_ds is not None else 0)
        return plan_job(self.split, self.pre, rows, self.batch_size, self.budget_mb, saved,
                        frozen_in_ort=self.split.frozen is not None)

    def run(self, has_checkpoint: bool) -> FinetuneResult:
        t_start = time.monotonic()
        created = not self.outdir.exists()
        had_prep = (self.outdir / PREP_DIR).exists()
        self.outdir.mkdir(parents=True, exist_ok=True)
        lock = _take_lock(self.outdir)  # a second run into this OUTDIR refuses, naming this one's PID
        try:
            return self._run(has_checkpoint, t_start, created)
        except BaseException as exc:
            import shutil

            if created and not (self.outdir / ckpt.FILENAME).exists():  # nothing to resume: leave nothing behind
                if self.cache is not None:
                    self.cache.close()
                shutil.rmtree(self.outdir, ignore_errors=True)
            elif isinstance(exc, UsageError) and not had_prep:  # a refused run (other data, a budget too
                shutil.rmtree(self.outdir / PREP_DIR, ignore_errors=True)  # small...) leaves OUTDIR as it was
            raise
        finally:
            (self.outdir / LOCK_FILE).unlink(missing_ok=True)
            os.close(lock)

    def _run(self, has_checkpoint: bool, t_start: float, created: bool) -> FinetuneResult:
        self.energy_meter = EnergyMeter(self.profile, self.threads, self.opts.power_log).start()  # measured where a sensor is
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
        self._make_training()
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
        self.plan, self.costs = self._plan(meta["plan"] if meta is not None else None)
        self.frozen_record = (meta or {}).get("frozen_onnx")
        self._advise()
        for note in self.notes:  # what is known before training is said before it (BatchNorm on micro-batches...)
            self.progress({"phase": "note", "message": note})

        import threading

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

    def _reseed(self) -> None:
        _lazy.mxnet().random.seed(self.seed * 7919 + self.global_step)  # same dropout masks after a resume

    def _train(self, start_epoch: int, start_step: int, order, partial: dict) -> None:
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
                self._reseed()
                idx = order[step * b:(step + 1) * b]
                l, c = self._step(idx, labels)
                if not math.isfinite(l):
                    raise RunFailed(f"training diverged: the loss is {l} at epoch {epoch + 1}, step {step + 1}",
                                    str(self.outdir), "lower --lr, check the data for NaN/inf values; "
                                    "no model was written")
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
        doc = {"format": "edgetrain-finetune-metrics/1", "complete": final, "model": self.model, "data": self.data,
               "classes": self.classes, "train_layers": self.layers.text, "plan": self.plan.to_dict(),
               "budget_mb": self.budget_mb, "epochs": self.history, "summary": summary}
        atomic_write_text(self.outdir / METRICS, json.dumps(doc, indent=2) + "\n", "metrics")

    def _write_model(self, extra: dict) -> None:
        aux = set(self.graph.symbol().list_auxiliary_states())
        arrays = {("aux:" if k in aux else "arg:") + k: v for k, v in self.split.all_params().items()}
        _write_prefix(self.outdir / MODEL_NAME, self.graph.doc, arrays, self.pre, extra)

    def _param_counts(self) -> tuple[int, int]:
        trained_n = sum(int(p.data().size) for p in self.trainable)
        return trained_n, sum(int(a.size) for a in self.split.all_params().values()) - trained_n

    def _check_finite(self) -> None:
        """Never write a model full of NaN: a diverged run is a failed run (exit 1), nothing final written."""
        bad = [k for k, v in self._param_arrays().items() if not np.all(np.isfinite(v))]
        if bad:
            raise RunFailed(f"training diverged: non-finite weights in {', '.join(k[6:] for k in bad[:3])}",
                            str(self.outdir), "lower --lr, check the data for NaN/inf values; no model was written")

    def _frozen_fn(self):
        """The frozen part as a function of a preprocessed batch: ONNX Runtime once it is proven equal."""
        mx = _lazy.mxnet()
        s = self.split
        mxnet_fn = lambda x: s.frozen(mx.nd.array(x)).asnumpy()  # noqa: E731
        # a base model whose weights come from files: its frozen part is exported once per user (the cache)
        root = _cache_root() if not self.model_obj.random_weights else None
        key = hashlib.sha256(f"{self.template_key}:{s.cut_name}:{list(self.pre.input_shape)}".encode()).hexdigest()[:20]
        cached = root / "finetune-frozen" / f"{key}.onnx" if root is not None else None
        cached_sha = cached.with_suffix(".sha256") if cached is not None else None
        if cached is not None and cached.exists() and cached_sha.exists() and _file_sha(cached) == cached_sha.read_text():
            self.notes.append("frozen part's ONNX export reused from the cache")
            path, reused = cached, True
        else:
            try:
                path, reused = _frozen_onnx(self.outdir, self.cache_fp, getattr(self, "frozen_record", None),
                                            lambda: _export_frozen_bytes(s, self.pre))
            except UsageError as exc:  # an operator the exporter cannot translate: MXNet does it, slower
                self.notes.append(f"frozen part runs in MXNet: {exc.what}")
                return mxnet_fn
        session = _ort_session(path, self.threads, self.plan.arena)
        if not reused:
            x = self.train_ds.batch(np.arange(min(VALIDATE_SAMPLES, len(self.train_ds))))
            want = np.concatenate([mxnet_fn(x[i:i + 1]) for i in range(len(x))])  # one sample's activations at a time
            err = _mismatch(session.run(None, {session.get_inputs()[0].name: x})[0], want)
            if err:
                path.unlink()
                self.notes.append(f"frozen part runs in MXNet: its ONNX Runtime export differs from Gluon ({err})")
                return mxnet_fn
            if cached is not None:
                try:
                    from .fileio import atomic_write_bytes, atomic_write_text

                    cached.parent.mkdir(parents=True, exist_ok=True)
                    atomic_write_bytes(cached, path.read_bytes(), "frozen part cache")
                    atomic_write_text(cached_sha, _file_sha(cached), "frozen part cache")
                except (OSError, EdgetrainError) as exc:
                    self.notes.append(f"the export could not be cached ({type(exc).__name__})")
        self.frozen_record = {"fingerprint": self.cache_fp, "sha256": _file_sha(path)}
        name = session.get_inputs()[0].name
        self.frozen_in_ort = True
        return lambda x: session.run(None, {name: x})[0]

    def _finish(self, total: float, feature_seconds: float) -> FinetuneResult:
        last = self.history[-1] if self.history else {}
        acc_on = "held-out" if self.val_ds is not None else "training"
        final_acc = last.get("val_accuracy") if self.val_ds is not None else last.get("train_accuracy")
        self._check_finite()
        self._write_model({"finetuned_from": self.model, "data": self.data, "train_layers": self.layers.text,
                           "epochs": len(self.history), "accuracy": final_acc, "accuracy_on": acc_on})
        if self.cache is not None:
            self.cache.close(delete=True)
        _remove_scratch(self.outdir)
        peak = max(procmem.peak_rss_mb() or 0.0, getattr(self, "child_peak_mb", 0.0)) or None
        trained_n, frozen_n = self._param_counts()
        train_seconds = sum(r["seconds"] for r in self.history)
        samples = len(self.train_ds) * len(self.history)
        result = FinetuneResult(
            model=str(self.outdir / MODEL_NAME), outdir=str(self.outdir), classes=self.classes,
            train_layers=self.layers.text, trained_parameters=trained_n, frozen_parameters=frozen_n,
            replaced_head=self.replaced_head, epochs=self.history, final_accuracy=final_acc, accuracy_on=acc_on,
            seconds=round(total, 3), feature_seconds=round(feature_seconds, 3),
            samples_per_s=samples / max(train_seconds + feature_seconds, 1e-9), peak_rss_mb=peak,
            budget_mb=self.budget_mb,
            plan=self.plan.to_dict(), resumed_from=self.resumed_from, threads=self.threads, notes=self.notes)
        if self.val_ds is not None and final_acc is not None:
            # a model at chance on held-out data learned nothing: a failed check (exit 3), the model is kept;
            # a base with random weights is at chance by construction (such a run checks the tooling)
            result.chance = {**chance_check(100.0 * final_acc, self.val_ds.labels, len(self.classes)),
                             "allowed": bool(self.opts.allow_chance) or bool(self.model_obj.random_weights)}
        result.energy = self.energy_meter.stop(max(len(self.history), 1), max(samples, 1))
        if result.energy is not None:
            result.joules_per_epoch = result.energy["joules_per_epoch"]
            result.joules_per_sample = result.energy["joules_per_sample"]
        self._write_metrics(final=True, summary={k: v for k, v in result.to_dict().items() if k != "epochs"})
        return result


# --- head / last:N training without mxnet in the process ------------------------------------------------
# Importing mxnet costs ~140 MB of RSS and ~1.8 CPU-s here, more than a whole ONNX Runtime fine-tune. When
# part of the network is frozen, mxnet is needed just once per base model and --train-layers: a short child
# process loads the Gluon model, exports its frozen part through edgetrain's validated Gluon->ONNX path,
# checks it against Gluon on real samples, checks that numpy_tail computes what MXNet computes for the
# trained part (outputs, gradients, BatchNorm statistics) and writes the PREFIX template (symbol + every
# weight). The run itself then decodes images, runs the frozen part in ONNX Runtime, trains the rest in
# NumPy and writes the PREFIX params directly in mxnet's file format.
# The child's output is kept beside the run (a resume does not export again) and, for models whose
# weights come from files, in a per-user cache (EDGETRAIN_CACHE_DIR, default ~/.cache/edgetrain; set it
# empty to turn the cache off), so later fine-tunes of the same base import no mxnet at all.
PREP_FORMAT = "edgetrain-finetune-prep/2"


def _cache_root() -> Path | None:
    env = os.environ.get("EDGETRAIN_CACHE_DIR")
    if env is not None:
        return Path(env) if env.strip() else None
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgetrain"


def _prep_key(model: str, params, input_shape, layers: str = "") -> str:
    """What the child's output depends on: the model reference and the bytes of every file it reads."""
    files = []
    if params:
        files.append(Path(params))
    if not model.startswith("zoo:") and not is_factory_ref(model):
        files += [Path(f"{model}-symbol.json"), *sorted(Path(model).parent.glob(f"{Path(model).name}-*.params"))]
        files.append(Path(f"{model}-edgetrain.json"))
    digests = [(str(f.resolve()), _file_sha(f)) for f in files if f.exists()]
    return hashlib.sha256(json.dumps([PREP_FORMAT, model, digests, list(input_shape or []), layers]).encode()).hexdigest()[:20]


def _xavier(shape: tuple, rng: np.random.RandomState) -> np.ndarray:
    """mx.init.Xavier(magnitude=2): uniform, fan average (what netsplit gives a new layer in MXNet)."""
    fan_in = int(np.prod(shape[1:]))
    fan_out = int(shape[0] * np.prod(shape[2:]))
    scale = math.sqrt(2.0 / ((fan_in + fan_out) / 2.0))
    return rng.uniform(-scale, scale, size=shape).astype(np.float32)


def _intact_prep(folder: Path, key: str) -> dict | None:
    """The child's record in ``folder`` if it is for this key and its files are intact (else: export again)."""
    try:
        prep = json.loads((folder / "prep.json").read_text())
        frozen = prep.get("frozen_sha256")  # None: nothing is frozen (the record only says so)
        if (prep.get("key") == key and prep.get("format") == PREP_FORMAT and prep.get("checked")
                and (frozen is None and not prep.get("tail") or _file_sha(folder / FROZEN_ONNX) == frozen)
                and _file_sha(folder / "template-0000.params") == prep.get("template_sha256")):
            return prep
    except (OSError, ValueError, AttributeError):
        pass
    return None


TEMPLATE_FORMAT = "edgetrain-finetune-template/1"


def _write_template(out: Path, g: Graph) -> dict:
    """The base model as files in ``out``: its graph (template-symbol.json) and every weight under mxnet's
    arg:/aux: names (template-0000.params); returns their digests for the record that vouches for them."""
    arrays = {("aux:" if k in g.aux_params else "arg:") + k: v for k, v in {**g.arg_params, **g.aux_params}.items()}
    atomic_write_text(out / "template-symbol.json", json.dumps(g.doc), "template")
    _write_params(out / "template-0000.params", arrays, "template")
    return {"template_sha256": _file_sha(out / "template-0000.params"),
            "symbol_sha256": _file_sha(out / "template-symbol.json")}


def _template_graph(folder: Path, record: dict, read=ckpt.read_params) -> Graph:
    """The Graph written by _write_template (weights as NumPy arrays, or as ``read`` gives them)."""
    template = read(str(folder / "template-0000.params"))
    doc = json.loads((folder / "template-symbol.json").read_text())
    arg = {k[4:]: v for k, v in template.items() if k.startswith("arg:")}
    aux = {k[4:]: v for k, v in template.items() if k.startswith("aux:")}
    return Graph(doc["nodes"], doc, record["data_name"], arg, aux, head=record["head"])


def _intact_template(folder: Path, key: str) -> dict | None:
    """The cached base model's record in ``folder`` if it is for this key and its files are intact."""
    try:
        record = json.loads((folder / "template.json").read_text())
        if (record.get("key") == key and record.get("format") == TEMPLATE_FORMAT
                and _file_sha(folder / "template-0000.params") == record.get("template_sha256")
                and _file_sha(folder / "template-symbol.json") == record.get("symbol_sha256")):
            return record
    except (OSError, ValueError, AttributeError):
        pass
    return None


def _write_prefix(prefix: Path, doc: dict, arrays: dict, pre, extra: dict) -> None:
    """PREFIX-symbol.json, PREFIX-0000.params (mxnet's format, byte for byte) and the preprocessing record."""
    atomic_write_text(Path(f"{prefix}-symbol.json"), json.dumps(doc, indent=2), "model")
    _write_params(Path(f"{prefix}-0000.params"), arrays, "model")
    atomic_write_text(sidecar_path(prefix), sidecar_text(pre, extra), "model")


def _write_params(path: Path, arrays: dict, what: str) -> None:
    """``arrays`` (NumPy or mxnet NDArrays) as an mx.nd.save file, atomically, one array in memory at a time."""
    with atomic_path(path, what) as tmp, open(tmp, "wb") as fh:
        for chunk in ckpt.params_chunks(arrays, lambda a: a.asnumpy() if hasattr(a, "asnumpy") else a):
            fh.write(chunk)


class _NotNumpy(Exception):
    """The trained part cannot train in NumPy (an op or attribute numpy_tail lacks, or an export that
    differs from Gluon): it trains in MXNet (the general path). str(exc) says why."""


class _NumpyJob(_Job):
    """``head`` / ``last:N``: the frozen part in ONNX Runtime, the trained part in NumPy (numpy_tail), no
    mxnet in the process; the mxnet child (_prepare) exported the frozen part and checked that NumPy
    computes Gluon's outputs, gradients and BatchNorm statistics for the trained part."""

    @property
    def engine(self) -> str:  # a checkpoint is resumed only by the same engine
        return "numpy-head" if self.layers.n == 1 else "numpy-tail"

    @property
    def fallback(self) -> type:
        """The job this one becomes when NumPy cannot train the part (_NotNumpy): the general MXNet job."""
        return _Job

    def _load(self):
        from .numpy_tail import Tail

        prep_dir, prep = self._prepare()
        if not prep.get("tail"):
            raise _NotNumpy(prep.get("tail_refused") or "the whole network trains")
        self.prep_dir = prep_dir
        self.notes += prep["notes"]
        self.model_obj = SimpleNamespace(random_weights=prep["random_weights"], ref=None)
        self._load_data(Preprocess.from_dict(prep["preprocess"]))
        # the weights mapped, not read: the frozen layers' are only written out again at the end (the session
        # has its own copy), so they take no memory while the session does
        g = _template_graph(prep_dir, prep, lambda path: ckpt.read_params(path, mapped=True))
        self.replaced_head = False
        outputs = head_units(g)
        if outputs != len(self.classes):
            replace_head(g, len(self.classes))  # the graph now says len(classes); the old weights are dropped
            self.replaced_head = True
            self.notes.append(f"output layer replaced: the model has {outputs} outputs, the data {len(self.classes)} "
                              f"classes; the new layer starts from random weights")
        self.tail = Tail(g.doc, prep["cut_name"], g.data_name, tuple(prep["feature_shape"]))
        rng = np.random.RandomState(self.seed)
        for name, shape in self.tail.param_shapes.items():  # a new output layer: netsplit's initialisation
            if name not in g.arg_params:
                g.arg_params[name] = (np.zeros(shape, np.float32) if name.endswith(("_bias", "_beta"))
                                      else _xavier(tuple(shape), rng))
            elif tuple(g.arg_params[name].shape) != tuple(shape):
                raise _NotNumpy(f"{name} is {g.arg_params[name].shape} in the model, {shape} in its graph")
        self.weights = {k: np.array(g.arg_params[k], dtype=np.float32) for k in self.tail.param_shapes}
        self.stats = {k: np.array(g.aux_params[k], dtype=np.float32) for k in self.tail.aux_shapes}
        self.frozen_n = sum(int(v.size) for k, v in {**g.arg_params, **g.aux_params}.items() if k not in self.weights)
        self.model_fp = f"{g.fingerprint()}:{prep['source_digest']}"
        self.graph = g
        self.split = SimpleNamespace(frozen=True, feature_shape=tuple(prep["feature_shape"]), cut_name=prep["cut_name"],
                                     trained_input=None)
        self.prep = prep

    def _prepare(self) -> tuple[Path, dict]:
        """The child's output: beside the run (resume), else from the per-user cache, else a child run now."""
        import shutil
        import sys
        import tempfile

        # not --seed: a new output layer is initialised here, not in the child
        key = _prep_key(self.model, self.params, self.input_shape, self.layers.text)
        here = self.outdir / PREP_DIR
        for folder in (here, (_cache_root() / "finetune-prep" / key) if _cache_root() else None):
            prep = _intact_prep(folder, key) if folder is not None else None
            if prep is not None:
                if folder != here and prep.get("tail"):
                    self.notes.append("frozen part and template reused from the cache (no mxnet in this run)")
                return folder, prep
        self.outdir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(here, ignore_errors=True)
        here.mkdir()
        spec = {"dir": str(here), "model": self.model, "params": self.params, "key": key,
                "input_shape": list(self.input_shape) if self.input_shape else None, "data": self.data,
                "threads": self.threads, "max_bytes": _data_budget(self.budget_mb), "train_layers": self.layers.text}
        (here / "spec.json").write_text(json.dumps(spec))
        self._tick("prepare", force=True, done=0, total=1)
        # the project's launcher: its own process group, dies with this process, killed on SIGTERM/Ctrl-C
        proc = child.run([sys.executable, "-P", "-c", "from edgetrain.training import _prepare_main; _prepare_main()",
                          str(here / "spec.json")], what="preparing the model", threads=self.threads,
                         where="export child")
        err_doc = here / "error.json"
        if err_doc.exists():
            e = json.loads(err_doc.read_text())
            exc = {"UsageError": UsageError}.get(e["type"], RunFailed)(e["what"], e.get("where"), e.get("fix"))
            raise exc
        if proc.code != 0 or not (here / "prep.json").exists():
            raise RunFailed(f"preparing the model {child.death(proc.code)}{child.last_line(proc.err)}", self.model,
                            "EDGETRAIN_DEBUG=1 shows the details")
        prep = json.loads((here / "prep.json").read_text())
        self.child_peak_mb = float(prep["peak_rss_mb"])
        if prep.get("frozen_sha256"):
            _check_prepared(here, prep, self.threads)
            self.notes.append(f"frozen part exported to ONNX and checked equal to Gluon on {prep['validated_on']} real "
                              f"samples (mxnet only in that step, peak {self.child_peak_mb:.0f} MB)")
        if self.budget_mb and self.child_peak_mb > self.budget_mb:
            from .memplan import HEADROOM

            raise UsageError(f"memory budget {self.budget_mb:.0f} MB is too small: preparing the model "
                             f"(mxnet, Gluon->ONNX) peaked at {self.child_peak_mb:.0f} MB", "--memory-budget",
                             f"a budget below {self.child_peak_mb / HEADROOM:.0f} MB is impossible for this model's "
                             "first run here; raise --memory-budget (later runs reuse the cached export)")
        root = _cache_root()
        if root is not None and prep.get("checked") and not prep["random_weights"]:
            try:  # publish atomically: a half-copied entry is never seen; a refused tail is cached too (the
                dest = root / "finetune-prep" / key  # next run goes straight to MXNet, with no child)
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=dest.parent))
                for name in ("prep.json", FROZEN_ONNX, "template-0000.params", "template-symbol.json"):
                    if name != FROZEN_ONNX or prep.get("frozen_sha256"):
                        shutil.copyfile(here / name, tmp / name)
                if dest.exists() and _intact_prep(dest, key) is None:
                    shutil.rmtree(dest, ignore_errors=True)  # a damaged entry is replaced, not kept forever
                os.replace(tmp, dest) if not dest.exists() else shutil.rmtree(tmp, ignore_errors=True)
            except OSError as exc:
                self.notes.append(f"the export could not be cached ({type(exc).__name__}); the next run exports again")
        return here, prep

    def _split(self):
        self.trainable = list(self.weights)

    def _run(self, has_checkpoint: bool, t_start: float, created: bool) -> FinetuneResult:
        try:
            return super()._run(has_checkpoint, t_start, created)
        except _NotNumpy as exc:
            self.become_fallback(exc)
            return self._run(has_checkpoint, t_start, created)

    def become_fallback(self, why: _NotNumpy) -> None:
        """Turn into ``fallback`` (the trained part trains in MXNet), saying why; the export goes."""
        import shutil

        shutil.rmtree(self.outdir / PREP_DIR, ignore_errors=True)
        self.__class__ = self.fallback
        self.notes.append(f"the trained part trains in MXNet: {why}")

    def _make_training(self) -> None:
        # a lone output layer's matmuls (batch x features x classes) are too small to share out; deeper
        # tails (a 1x1 convolution over every position) are not
        runtime.cap_loaded_blas(1 if self.layers.n == 1 else self.threads)
        self.opt = make_numpy_optimizer(self.optimizer, self.weights, self.lr)

    def _plan(self, saved: dict | None):
        rows = len(self.train_ds) + (len(self.val_ds) if self.val_ds is not None else 0)
        feat = int(np.prod(self.split.feature_shape))
        n_weights = sum(int(v.size) for v in self.weights.values())
        # the session (weights as constants + pre-packed convolution weights, ~2.65x the file: memory_model's
        # onnxruntime coefficients) is not loaded yet; activations as the graph's every output (an upper bound)
        session_mb = 2.65 * (self.prep_dir / FROZEN_ONNX).stat().st_size / MB + 30.0
        costs = Costs((procmem.rss_mb() or 0.0) + session_mb, self.prep["frozen_per_sample_mb"],
                      self.tail.activation_bytes(train=True) / MB, 4 * n_weights * 4 / MB,
                      int(np.prod(self.pre.input_shape)) * 4 / MB, rows, feat * 4, self.batch_size, True)
        plan = MemoryPlan(**saved) if saved is not None else choose(costs, self.budget_mb)
        plan.feature_batch = min(plan.feature_batch, max(FEATURE_BATCHES))
        return plan, costs

    def _advise(self) -> None:
        if self.model_obj.random_weights:
            self.notes.append("the model has random weights, so its frozen layers compute nothing learned; "
                              "pass --params with trained weights, or --train-layers all")
        if self.stats and self.plan.micro_batch < min(self.batch_size, 8):
            self.notes.append(f"BatchNorm in the trained layers sees micro-batches of {self.plan.micro_batch} "
                              "(memory budget); its statistics will be noisy: train fewer layers or raise the budget")

    def _frozen_fn(self):
        path = self.prep_dir / FROZEN_ONNX
        session = _ort_session(path, self.threads, self.plan.arena)
        name = session.get_inputs()[0].name
        self.frozen_record = {"fingerprint": self.cache_fp, "sha256": self.prep["frozen_sha256"]}
        self.frozen_in_ort = True
        return lambda x: session.run(None, {name: x})[0]

    def _step(self, idx: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
        with np.errstate(over="ignore", invalid="ignore"):  # a diverged loss is reported by _train, once
            return self._numpy_step(idx, labels)

    def _numpy_step(self, idx: np.ndarray, labels: np.ndarray) -> tuple[float, int]:
        """One effective batch: micro-batches accumulate gradients (softmax cross-entropy), one update."""
        m = self.plan.micro_batch
        real = len(idx)
        grads = {k: np.zeros_like(v) for k, v in self.weights.items()}
        loss_sum, correct = 0.0, 0
        for start in range(0, real, m):
            part = idx[start:start + m]
            y = labels[part]
            out, tape = self.tail.forward(self.weights, self.stats, self._inputs("train", part), train=True,
                                          rng=self.drop_rng)
            z = out.reshape(len(part), -1)
            z = z - z.max(axis=1, keepdims=True)
            e = np.exp(z)
            total = e.sum(axis=1, keepdims=True)
            loss_sum += float(np.sum(np.log(total[:, 0]) - z[np.arange(len(part)), y]))
            correct += int((np.argmax(z, axis=1) == y).sum())
            d = e / total
            d[np.arange(len(part)), y] -= 1.0
            d /= np.float32(real)
            for k, g in self.tail.backward(self.weights, tape, d.reshape(out.shape)).items():
                grads[k] += g
        self.opt.step(grads)
        return loss_sum, correct

    def _evaluate(self):
        if self.val_ds is None:
            return None, None
        labels = self.val_ds.labels
        correct, loss_sum = 0, 0.0
        m = self.plan.micro_batch
        for start in range(0, len(labels), m):
            idx = np.arange(start, min(start + m, len(labels)))
            out, _ = self.tail.forward(self.weights, self.stats, self._inputs("val", idx), train=False)
            z = out.reshape(len(idx), -1)
            z = z - z.max(axis=1, keepdims=True)
            y = labels[idx]
            loss_sum += float(np.sum(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(idx)), y]))
            correct += int((np.argmax(z, axis=1) == y).sum())
        return correct / len(labels), loss_sum / len(labels)

    def _reseed(self) -> None:  # the same dropout masks after a resume
        self.drop_rng = np.random.RandomState((self.seed * 7919 + self.global_step) % 2 ** 32)

    def _param_arrays(self) -> dict:
        return {f"param/{k}": v for k, v in {**self.weights, **self.stats}.items()}

    def _restore_params(self, arrays: dict) -> None:
        for k, v in {**self.weights, **self.stats}.items():
            if f"param/{k}" not in arrays or arrays[f"param/{k}"].shape != v.shape:
                raise UsageError(f"checkpoint does not hold weights for {k}", str(self.outdir / ckpt.FILENAME),
                                 "delete it and start over, or use another OUTDIR")
            v[...] = arrays[f"param/{k}"]

    def _param_counts(self) -> tuple[int, int]:
        return sum(int(v.size) for v in self.weights.values()), self.frozen_n

    def _write_model(self, extra: dict) -> None:
        """PREFIX-symbol.json, PREFIX-0000.params (mxnet's format, written here), the preprocessing record."""
        g = self.graph
        params = {f"arg:{k}": self.weights.get(k, v) for k, v in g.arg_params.items()}
        params.update({f"aux:{k}": self.stats.get(k, v) for k, v in g.aux_params.items()})
        _write_prefix(self.outdir / MODEL_NAME, g.doc, params, self.pre, extra)


def job_class(layers):
    return _NumpyJob if layers.kind == "last" else _Job


def _prepare_main() -> None:
    """The mxnet child of a NumPy-trained run (see _NumpyJob): argv[1] is its spec.json."""
    import sys

    spec_path = Path(sys.argv[1])
    spec = json.loads(spec_path.read_text())
    out = Path(spec["dir"])
    try:
        _prepare(spec, out)
    except EdgetrainError as exc:
        if os.environ.get("EDGETRAIN_DEBUG"):
            raise
        (out / "error.json").write_text(json.dumps({"type": type(exc).__name__, "what": exc.what,
                                                    "where": exc.where, "fix": exc.fix}))
        sys.exit(exc.exit_code)


def _prepare(spec: dict, out: Path) -> None:
    """Load the base model, write its template, export the frozen part and Gluon's reference outputs for it.

    Ordered for the lowest peak (mxnet's import alone is ~140 MB): the references are computed one sample
    at a time, the loaded model's own weights are let go once the split holds its copies, freed heap is
    returned to the system before the export, and the ONNX Runtime side of the check runs in the parent
    (which has ONNX Runtime loaded anyway), so this process never holds a session."""
    runtime.apply_threads(spec["threads"])
    mx = _lazy.mxnet()
    model = load_gluon(spec["model"], params=spec["params"],
                       input_shape=tuple(spec["input_shape"]) if spec["input_shape"] else None)
    pre = model.preprocess
    g = graph_of(model.block, pre.input_name)
    source_digest = _params_digest({**g.arg_params, **g.aux_params})
    template = _write_template(out, g)
    doc = json.loads(json.dumps(g.doc))
    cut = cut_for(g, parse_train_layers(spec["train_layers"]))
    prep = {"format": PREP_FORMAT, "key": spec["key"], "preprocess": pre.to_dict(), "data_name": g.data_name,
            "head": g.head, "source_digest": source_digest, "notes": list(model.notes),
            "random_weights": bool(model.random_weights), "tail": False, "checked": cut is None, **template}
    if cut is None:
        prep["tail_refused"] = "nothing is frozen (the whole network trains)"
    else:
        ds = load_data(spec["data"], pre, max_bytes=spec.get("max_bytes"))  # the budget holds in the child too
        x = ds.batch(np.arange(min(VALIDATE_SAMPLES, len(ds))))
        del ds
        s = split(g, cut, pre.input_shape)  # the base model's own weights: nothing to initialise
        model.block, g.arg_params, g.aux_params = None, {}, {}  # the split parts hold their own copies
        _release_freed_memory()
        want = np.concatenate([s.frozen(mx.nd.array(x[i:i + 1])).asnumpy() for i in range(len(x))])
        refused = _numpy_tail_refusal(s, doc, g.data_name, want)
        prep["tail"], prep["tail_refused"] = refused is None, refused
        s.trained = None  # only the frozen part is exported
        internals = g.symbol().get_internals()
        frozen_sym = internals[_output_name(internals, s.cut_name)]
        prep.update({"feature_shape": list(s.feature_shape), "cut_name": s.cut_name, "validated_on": len(x),
                     "frozen_per_sample_mb": graph_costs(frozen_sym, g.data_name, pre.input_shape)})
        del internals, frozen_sym
        _release_freed_memory()
        blob = _export_frozen_bytes(s, pre)
        atomic_write_bytes(out / FROZEN_ONNX, blob, "frozen part")
        del blob
        with atomic_path(out / REFERENCE_FILE, "reference outputs") as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, x=x, want=want)
        prep["frozen_sha256"] = _file_sha(out / FROZEN_ONNX)
    prep["peak_rss_mb"] = procmem.peak_rss_mb() or 0.0
    atomic_write_text(out / "prep.json", json.dumps(prep), "template")


def _release_freed_memory() -> None:
    """Give the heap glibc keeps after large frees back to the system (peak RSS is what a board feels)."""
    import ctypes
    import gc

    gc.collect()  # a Gluon block is a web of reference cycles: its weights go only when the cycles do
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass


def _check_prepared(folder: Path, prep: dict, threads: int) -> None:
    """ONNX Runtime's side of the child's check: the exported frozen part, run on the samples the child
    ran through Gluon, must give Gluon's outputs; only then is the export trusted (prep.json says so).
    If it differs, the general path exports and checks again and, finding the same, runs MXNet there."""
    ref = np.load(folder / REFERENCE_FILE)
    session = _ort_session(folder / FROZEN_ONNX, threads, False)
    got = session.run(None, {session.get_inputs()[0].name: ref["x"]})[0]
    err = _mismatch(got, ref["want"])
    del session
    if err:
        raise _NotNumpy(f"the frozen part's ONNX export differs from Gluon ({err})")
    prep["checked"] = True
    atomic_write_text(folder / "prep.json", json.dumps(prep), "template")


def _numpy_tail_refusal(s, doc: dict, data_name: str, feats: np.ndarray) -> str | None:
    """None when numpy_tail computes what MXNet computes for the trained part ``s.trained`` on ``feats``
    (the frozen part's outputs on real samples): its outputs, and, in training mode, its gradients and
    BatchNorm statistics; else why not, in a few words."""
    from .numpy_tail import Tail, Unsupported

    mx = _lazy.mxnet()
    autograd = _lazy.from_import("mxnet", "autograd")
    try:
        tail = Tail(doc, s.cut_name, data_name, tuple(s.feature_shape))
    except Unsupported as exc:
        return str(exc)
    params = {p.name: p for p in s.trained.collect_params().values()}
    if set(params) != set(tail.param_shapes) | set(tail.aux_shapes):
        return "its weights are not the graph's"
    weights = {k: params[k].data().asnumpy() for k in tail.param_shapes}
    stats = {k: params[k].data().asnumpy() for k in tail.aux_shapes}
    got, _ = tail.forward(weights, {k: v.copy() for k, v in stats.items()}, feats, train=False)
    err = _mismatch(got, s.trained(mx.nd.array(feats)).asnumpy())
    if err or tail.has_dropout:  # dropout's masks differ between the two: the inference check stands alone
        return f"NumPy's outputs differ from MXNet's ({err})" if err else None
    dout = np.random.RandomState(0).standard_normal(got.shape).astype(np.float32)
    with autograd.record(train_mode=True):
        want = s.trained(mx.nd.array(feats))
    want.backward(mx.nd.array(dout))
    got, tape = tail.forward(weights, stats, feats, train=True)
    grads = tail.backward(weights, tape, dout)
    checks = [("outputs in training mode", got, want.asnumpy())]
    checks += [(f"the gradient of {k}", grads[k], params[k].grad().asnumpy()) for k in tail.param_shapes]
    checks += [(f"the statistics {k}", stats[k], params[k].data().asnumpy()) for k in tail.aux_shapes]
    for what, mine, theirs in checks:
        err = _mismatch(mine, theirs)
        if err:
            return f"NumPy's {what} differ from MXNet's ({err})"
    return None
