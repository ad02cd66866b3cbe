"""The general engine: the trained part trains in MXNet (autograd), for ``all`` and for any part the NumPy
engine cannot run. The frozen part still runs in ONNX Runtime once its export is proven equal to Gluon
on real samples (MXNet stands in when it cannot be exported or differs)."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np

from .. import _lazy
from ..errors import EdgetrainError, UsageError
from ..fileio import atomic_write_bytes, atomic_write_text
from ..models import load_gluon
from ..preprocess import Preprocess
from . import store
from .outdir import MODEL_NAME
from .memplan import plan_job
from .netsplit import Graph, cut_for, find_cuts, graph_of, head_units, replace_head, split
from .optimizers import make_optimizer


class MXNetEngine:
    name = "mxnet"  # what trains: a checkpoint is resumed only by the same engine

    def __init__(self, job):
        self.job = job
        self.random_weights = False
        self.replaced_head = False
        self.model_fp = ""
        self.template_key: str | None = None
        self.source_digest = ""
        self.model_notes: list[str] = []
        self.graph: Graph | None = None
        self.split = None
        self.trainable: list = []
        self.loss_fn = None
        self.opt = None
        self.child_peak_mb = 0.0

    # --- set-up ------------------------------------------------------------------------------------

    def load(self) -> None:
        job = self.job
        # a base model whose weights come from files is built and checked once per user: later runs take
        # its graph and weights from the template cache (no zoo build, no full forward check)
        root = store.cache_root()
        self.template_key = store.prep_key(job.model, job.params, job.input_shape) if root is not None else None
        folder = root / "finetune-template" / self.template_key if root is not None else None
        record = store.intact_template(folder, self.template_key) if folder is not None else None
        if record is not None:
            job.notes += record["notes"]
            job.load_data(Preprocess.from_dict(record["preprocess"]))
            g = store.template_graph(folder, record, _lazy.mxnet().nd.load)  # as NDArrays: no NumPy copy held
            find_cuts(g)
            self.source_digest = record["source_digest"]
            job.notes.append("base model's graph and weights reused from the cache (not rebuilt and checked again)")
        else:
            model = load_gluon(job.model, params=job.params, input_shape=job.input_shape)
            self.model_notes = list(model.notes)
            job.notes += model.notes
            self.random_weights = bool(model.random_weights)
            job.load_data(model.preprocess)
            g = graph_of(model.block, model.preprocess.input_name)
            self.source_digest = store.params_digest({**g.arg_params, **g.aux_params})
            if folder is not None and not model.random_weights:
                self._publish_template(folder, g, model.preprocess)
            del model  # the split parts will hold their own copies of the weights: the block goes
        outputs = head_units(g)
        if outputs != len(job.classes):
            replace_head(g, len(job.classes))
            self.replaced_head = True
            job.notes.append(f"output layer replaced: the model has {outputs} outputs, the data {len(job.classes)} "
                             f"classes; the new layer starts from random weights")
        self.graph = g
        self._split()

    def _publish_template(self, folder: Path, g: Graph, pre) -> None:
        """The loaded base model's graph and weights into the per-user cache (atomically: a half-written
        entry is never seen); a failure only costs the next run the full load."""
        import shutil
        import tempfile

        tmp = None
        try:
            folder.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
            record = {"format": store.TEMPLATE_FORMAT, "key": self.template_key, "preprocess": pre.to_dict(),
                      "data_name": g.data_name, "head": g.head, "source_digest": self.source_digest,
                      "notes": self.model_notes, **store.write_template(tmp, g)}
            atomic_write_text(tmp / "template.json", json.dumps(record), "template")
            if folder.exists():
                shutil.rmtree(folder, ignore_errors=True)  # damaged (an intact one would have been used)
            os.replace(tmp, folder)
        except (OSError, EdgetrainError) as exc:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            self.job.notes.append(f"the model could not be cached ({type(exc).__name__}); the next run loads it again")

    def _split(self) -> None:
        job = self.job
        cut = cut_for(self.graph, job.layers)
        self.split = split(self.graph, cut, job.pre.input_shape, init_seed=job.seed)
        # the split parts hold their own copies of the weights: let the loaded model's go (a board with
        # 512 MB feels every megabyte)
        self.model_fp = f"{self.graph.fingerprint()}:{self.source_digest}"
        self.graph.arg_params, self.graph.aux_params = {}, {}
        store.release_freed_memory()
        self.trainable = self.split.trainable()
        for p in self.trainable:
            p.grad_req = "add"  # micro-batches accumulate into one effective-batch gradient
        self.split.trained.hybridize()
        if self.split.frozen is not None:
            self.split.frozen.hybridize()  # runs in ONNX Runtime; MXNet only checks it (or stands in)

    @property
    def has_frozen(self) -> bool:
        return self.split.frozen is not None

    @property
    def feature_shape(self) -> tuple:
        return tuple(self.split.feature_shape)

    @property
    def cut_name(self) -> str | None:
        return self.split.cut_name

    def plan(self, rows: int, saved: dict | None):
        job = self.job
        return plan_job(self.split, job.pre, rows, job.batch_size, job.budget_mb, saved,
                        frozen_in_ort=self.split.frozen is not None)

    def start_from(self, arrays: dict[str, np.ndarray]) -> None:
        mx = _lazy.mxnet()
        for p in self.split.trained.collect_params().values():
            p.set_data(mx.nd.array(arrays[p.name], dtype="float32"))

    def make_optimizer(self, name: str, lr: float):
        gluon = _lazy.from_import("mxnet", "gluon")

        self.loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        return make_optimizer(name, self.trainable, lr)

    # --- the frozen part ---------------------------------------------------------------------------

    def frozen_fn(self):
        """The frozen part as a function of a preprocessed batch, and the record that vouches for its ONNX
        export (None: MXNet runs it); ONNX Runtime once it is proven equal to Gluon."""
        job = self.job
        mx = _lazy.mxnet()
        s = self.split
        mxnet_fn = lambda x: s.frozen(mx.nd.array(x)).asnumpy()  # noqa: E731
        # a base model whose weights come from files: its frozen part is exported once per user (the cache)
        root = store.cache_root() if not self.random_weights else None
        key = hashlib.sha256(f"{self.template_key}:{s.cut_name}:{list(job.pre.input_shape)}".encode()).hexdigest()[:20]
        cached = root / "finetune-frozen" / f"{key}.onnx" if root is not None else None
        cached_sha = cached.with_suffix(".sha256") if cached is not None else None
        if (cached is not None and cached.exists() and cached_sha.exists()
                and store.file_sha(cached) == cached_sha.read_text()):
            job.notes.append("frozen part's ONNX export reused from the cache")
            path, reused = cached, True
        else:
            try:
                path, reused = self._frozen_onnx(job.outdir, job.cache_fp, job.frozen_record)
            except UsageError as exc:  # an operator the exporter cannot translate: MXNet does it, slower
                job.notes.append(f"frozen part runs in MXNet: {exc.what}")
                return mxnet_fn, None
        session = store.ort_session(path, job.threads, job.plan.arena)
        if not reused:
            x, _ = job.train_ds.arrays(store.VALIDATE_SAMPLES)
            want = np.concatenate([mxnet_fn(x[i:i + 1]) for i in range(len(x))])  # one sample's activations at a time
            err = store.mismatch(session.run(None, {session.get_inputs()[0].name: x})[0], want)
            if err:
                path.unlink()
                job.notes.append(f"frozen part runs in MXNet: its ONNX Runtime export differs from Gluon ({err})")
                return mxnet_fn, None
            if cached is not None:
                try:
                    cached.parent.mkdir(parents=True, exist_ok=True)
                    atomic_write_bytes(cached, path.read_bytes(), "frozen part cache")
                    atomic_write_text(cached_sha, store.file_sha(cached), "frozen part cache")
                except (OSError, EdgetrainError) as exc:
                    job.notes.append(f"the export could not be cached ({type(exc).__name__})")
        record = {"fingerprint": job.cache_fp, "sha256": store.file_sha(path)}
        name = session.get_inputs()[0].name
        return (lambda x: session.run(None, {name: x})[0]), record

    def _frozen_onnx(self, outdir: Path, fingerprint: str, record: dict | None) -> tuple[Path, bool]:
        """OUTDIR/frozen.onnx for this run: reused when the checkpoint vouches for it, else exported now."""
        path = outdir / store.FROZEN_ONNX
        if (record and record.get("fingerprint") == fingerprint and path.exists()
                and store.file_sha(path) == record.get("sha256")):
            return path, True
        atomic_write_bytes(path, store.export_frozen_bytes(self.split, self.job.pre), "frozen part")
        return path, False

    def features(self, x: np.ndarray) -> np.ndarray:
        """The frozen part's outputs for a batch, in MXNet (the fleet's evaluator: computed once)."""
        if self.split.frozen is None:
            return x
        return self.split.frozen(_lazy.mxnet().nd.array(x)).asnumpy()

    # --- training ----------------------------------------------------------------------------------

    def step(self, inputs, idx: np.ndarray, labels: np.ndarray, micro: int) -> tuple[float, int]:
        """One effective batch: micro-batches accumulate gradients, then one optimizer update."""
        mx = _lazy.mxnet()
        autograd = _lazy.from_import("mxnet", "autograd")

        m = micro
        real = len(idx)
        loss_sum, correct = 0.0, 0
        for start in range(0, real, m):
            part = idx[start:start + m]
            y = labels[part]
            n = len(part)
            x = inputs(part)
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

    def evaluate(self, inputs, labels: np.ndarray, micro: int) -> tuple[float, float]:
        mx = _lazy.mxnet()

        m = micro
        correct, loss_sum = 0, 0.0
        for start in range(0, len(labels), m):
            idx = np.arange(start, min(start + m, len(labels)))
            x = inputs(idx)
            n = len(idx)
            if n < m:
                x = np.concatenate([x, np.repeat(x[-1:], m - n, axis=0)])
            out = self.split.trained(mx.nd.array(x))
            y = labels[idx]
            loss_sum += float(self.loss_fn(out[:n], mx.nd.array(y.astype(np.float32))).sum().asscalar())
            correct += int((out.argmax(axis=1).asnumpy()[:n] == y).sum())
        return correct / len(labels), loss_sum / len(labels)

    def predict(self, arrays: dict[str, np.ndarray], features: np.ndarray) -> np.ndarray:
        """The classes the trained part gives ``features`` with ``arrays`` as its weights (inference mode)."""
        mx = _lazy.mxnet()
        self.start_from(arrays)
        return np.concatenate([self.split.trained(mx.nd.array(features[s:s + 256])).asnumpy().argmax(axis=1)
                               for s in range(0, len(features), 256)])

    def reseed(self, seed: int, global_step: int) -> None:
        _lazy.mxnet().random.seed(seed * 7919 + global_step)  # same dropout masks after a resume

    # --- arrays ------------------------------------------------------------------------------------

    def trainable_arrays(self) -> dict[str, np.ndarray]:
        """Every array of the trained part (running statistics included), by name."""
        return {p.name: p.data().asnumpy() for p in self.split.trained.collect_params().values()}

    def statistics(self) -> set[str]:
        """Names of the arrays no gradient trains (BatchNorm running mean and variance)."""
        return {p.name for p in self.split.trained.collect_params().values() if p.grad_req == "null"}

    def restore(self, arrays: dict[str, np.ndarray], where: str) -> None:
        mx = _lazy.mxnet()

        for p in self.split.trained.collect_params().values():
            # p.shape is None on a SymbolBlock whose weights were loaded but never run: ask the data
            if p.name not in arrays or arrays[p.name].shape != p.data().shape:
                raise UsageError(f"checkpoint does not hold weights for {p.name}", where,
                                 "delete it and start over, or use another OUTDIR")
            p.set_data(mx.nd.array(arrays[p.name]))

    def param_counts(self) -> tuple[int, int]:
        trained_n = sum(int(p.data().size) for p in self.trainable)
        return trained_n, sum(int(a.size) for a in self.split.all_params().values()) - trained_n

    def model_path(self, outdir: Path) -> Path:
        return outdir / MODEL_NAME  # a PREFIX

    def write_model(self, prefix: Path, pre, extra: dict) -> None:
        aux = set(self.graph.symbol().list_auxiliary_states())
        arrays = {("aux:" if k in aux else "arg:") + k: v for k, v in self.split.all_params().items()}
        store.write_prefix(prefix, self.graph.doc, arrays, pre, extra)
