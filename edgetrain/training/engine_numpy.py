"""``head`` / ``last:N`` without mxnet in the process: the frozen part in ONNX Runtime, the trained part in
NumPy (numpy_tail).

mxnet is needed once per base model and --train-layers: a short child (``python -m edgetrain.training.prep``)
exports the frozen part, checks numpy_tail against MXNet for the trained part and writes the template;
this process checks the export in ONNX Runtime against Gluon's outputs on real samples, decodes images,
runs the frozen part, trains the rest in NumPy and writes the PREFIX params in mxnet's own file format.
The child's output is kept beside the run (a resume does not export again) and, for models whose
weights come from files, in the per-user cache, so later fine-tunes of the same base import no mxnet.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from .. import child, procmem, runtime
from ..errors import RunFailed, UsageError
from ..fileio import atomic_write_text
from ..preprocess import Preprocess
from . import checkpoint as ckpt
from . import store
from .outdir import MODEL_NAME
from .memplan import HEADROOM, MB, Costs, plan_for
from .netsplit import head_units, replace_head
from .optimizers import make_numpy_optimizer


class NotNumpy(Exception):
    """The trained part cannot train in NumPy (an op or attribute numpy_tail lacks, or an export that
    differs from Gluon): it trains in MXNet (the general engine). str(exc) says why."""


class NumpyEngine:
    def __init__(self, job):
        self.job = job
        self.name = "numpy-head" if job.layers.n == 1 else "numpy-tail"  # a checkpoint resumes on the same
        self.random_weights = False
        self.replaced_head = False
        self.model_fp = ""
        self.child_peak_mb = 0.0
        self.prep_dir: Path | None = None
        self.prep: dict = {}
        self.graph = None
        self.tail = None
        self.weights: dict[str, np.ndarray] = {}
        self.stats: dict[str, np.ndarray] = {}
        self.frozen_n = 0
        self.opt = None
        self.drop_rng = None
        self.has_frozen = True
        self.eval_session = None  # features(): the fleet evaluator's session, made once

    # --- set-up ------------------------------------------------------------------------------------

    def load(self) -> None:
        from .numpy_tail import Tail

        job = self.job
        prep_dir, prep = self._prepare()
        if not prep.get("tail"):
            raise NotNumpy(prep.get("tail_refused") or "the whole network trains")
        self.prep_dir = prep_dir
        job.notes += prep["notes"]
        self.random_weights = bool(prep["random_weights"])
        job.load_data(Preprocess.from_dict(prep["preprocess"]))
        # the weights mapped, not read: the frozen layers' are only written out again at the end (the session
        # has its own copy), so they take no memory while the session does
        g = store.template_graph(prep_dir, prep, lambda path: ckpt.read_params(path, mapped=True))
        outputs = head_units(g)
        if outputs != len(job.classes):
            replace_head(g, len(job.classes))  # the graph now says len(classes); the old weights are dropped
            self.replaced_head = True
            job.notes.append(f"output layer replaced: the model has {outputs} outputs, the data {len(job.classes)} "
                             f"classes; the new layer starts from random weights")
        self.tail = Tail(g.doc, prep["cut_name"], g.data_name, tuple(prep["feature_shape"]))
        rng = np.random.RandomState(job.seed)
        for name, shape in self.tail.param_shapes.items():  # a new output layer: netsplit's initialisation
            if name not in g.arg_params:
                g.arg_params[name] = (np.zeros(shape, np.float32) if name.endswith(("_bias", "_beta"))
                                      else store.xavier(tuple(shape), rng))
            elif tuple(g.arg_params[name].shape) != tuple(shape):
                raise NotNumpy(f"{name} is {g.arg_params[name].shape} in the model, {shape} in its graph")
        self.weights = {k: np.array(g.arg_params[k], dtype=np.float32) for k in self.tail.param_shapes}
        self.stats = {k: np.array(g.aux_params[k], dtype=np.float32) for k in self.tail.aux_shapes}
        self.frozen_n = sum(int(v.size) for k, v in {**g.arg_params, **g.aux_params}.items() if k not in self.weights)
        self.model_fp = f"{g.fingerprint()}:{prep['source_digest']}"
        self.graph = g
        self.prep = prep

    def _prepare(self) -> tuple[Path, dict]:
        """The child's output: beside the run (resume), else from the per-user cache, else a child run now."""
        import shutil
        import tempfile

        job = self.job
        # not --seed: a new output layer is initialised here, not in the child
        key = store.prep_key(job.model, job.params, job.input_shape, job.layers.text)
        here = job.outdir / store.PREP_DIR
        root = store.cache_root()
        for folder in (here, (root / "finetune-prep" / key) if root else None):
            prep = store.intact_prep(folder, key) if folder is not None else None
            if prep is not None:
                if folder != here and prep.get("tail"):
                    job.notes.append("frozen part and template reused from the cache (no mxnet in this run)")
                return folder, prep
        job.outdir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(here, ignore_errors=True)
        here.mkdir()
        spec = {"dir": str(here), "model": job.model, "params": job.params, "key": key,
                "input_shape": list(job.input_shape) if job.input_shape else None, "data": job.data,
                "threads": job.threads, "max_bytes": job.data_budget(), "train_layers": job.layers.text}
        (here / "spec.json").write_text(json.dumps(spec))
        job.tick("prepare", force=True, done=0, total=1)
        # the project's launcher: its own process group, dies with this process, killed on SIGTERM/Ctrl-C
        proc = child.run(child.python_argv("edgetrain.training.prep", here / "spec.json"), what="preparing the model",
                         threads=job.threads, where="export child")
        err_doc = here / "error.json"
        if err_doc.exists():
            e = json.loads(err_doc.read_text())
            raise {"UsageError": UsageError}.get(e["type"], RunFailed)(e["what"], e.get("where"), e.get("fix"))
        if proc.code != 0 or not (here / "prep.json").exists():
            raise RunFailed(f"preparing the model {child.death(proc.code)}{child.last_line(proc.err)}", job.model,
                            "EDGETRAIN_DEBUG=1 shows the details")
        prep = json.loads((here / "prep.json").read_text())
        self.child_peak_mb = float(prep["peak_rss_mb"])
        if prep.get("frozen_sha256"):
            self._check_prepared(here, prep)
            job.notes.append(f"frozen part exported to ONNX and checked equal to Gluon on {prep['validated_on']} real "
                             f"samples (mxnet only in that step, peak {self.child_peak_mb:.0f} MB)")
        if job.budget_mb and self.child_peak_mb > job.budget_mb:
            raise UsageError(f"memory budget {job.budget_mb:.0f} MB is too small: preparing the model "
                             f"(mxnet, Gluon->ONNX) peaked at {self.child_peak_mb:.0f} MB", "--memory-budget",
                             f"a budget below {self.child_peak_mb / HEADROOM:.0f} MB is impossible for this model's "
                             "first run here; raise --memory-budget (later runs reuse the cached export)")
        if root is not None and prep.get("checked") and not prep["random_weights"]:
            try:  # publish atomically: a half-copied entry is never seen; a refused tail is cached too (the
                dest = root / "finetune-prep" / key  # next run goes straight to MXNet, with no child)
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=dest.parent))
                for name in ("prep.json", store.FROZEN_ONNX, "template-0000.params", "template-symbol.json"):
                    if name != store.FROZEN_ONNX or prep.get("frozen_sha256"):
                        shutil.copyfile(here / name, tmp / name)
                if dest.exists() and store.intact_prep(dest, key) is None:
                    shutil.rmtree(dest, ignore_errors=True)  # a damaged entry is replaced, not kept forever
                os.replace(tmp, dest) if not dest.exists() else shutil.rmtree(tmp, ignore_errors=True)
            except OSError as exc:
                job.notes.append(f"the export could not be cached ({type(exc).__name__}); the next run exports again")
        return here, prep

    def _check_prepared(self, folder: Path, prep: dict) -> None:
        """ONNX Runtime's side of the child's check: the exported frozen part, run on the samples the child
        ran through Gluon, must give Gluon's outputs; only then is the export trusted (prep.json says so).
        If it differs, the general engine exports and checks again and, finding the same, runs MXNet there."""
        ref = np.load(folder / store.REFERENCE_FILE)
        session = store.ort_session(folder / store.FROZEN_ONNX, self.job.threads, False)
        got = session.run(None, {session.get_inputs()[0].name: ref["x"]})[0]
        err = store.mismatch(got, ref["want"])
        del session
        if err:
            raise NotNumpy(f"the frozen part's ONNX export differs from Gluon ({err})")
        prep["checked"] = True
        atomic_write_text(folder / "prep.json", json.dumps(prep), "template")

    @property
    def feature_shape(self) -> tuple:
        return tuple(self.prep["feature_shape"])

    @property
    def cut_name(self) -> str:
        return self.prep["cut_name"]

    def plan(self, rows: int, saved: dict | None):
        job = self.job
        feat = int(np.prod(self.feature_shape))
        n_weights = sum(int(v.size) for v in self.weights.values())
        # the session (weights as constants + pre-packed convolution weights, ~2.65x the file: memory_model's
        # onnxruntime coefficients) is not loaded yet; activations as the graph's every output (an upper bound)
        session_mb = 2.65 * (self.prep_dir / store.FROZEN_ONNX).stat().st_size / MB + 30.0
        costs = Costs((procmem.rss_mb() or 0.0) + session_mb, self.prep["frozen_per_sample_mb"],
                      self.tail.activation_bytes(train=True) / MB, 4 * n_weights * 4 / MB,
                      int(np.prod(job.pre.input_shape)) * 4 / MB, rows, feat * 4, job.batch_size, True)
        return plan_for(costs, job.budget_mb, saved), costs

    def start_from(self, arrays: dict[str, np.ndarray]) -> None:
        for held in (self.weights, self.stats):
            for name in held:
                held[name] = np.array(arrays[name], dtype=np.float32)  # a copy: the engine trains in place

    def make_optimizer(self, name: str, lr: float):
        # a lone output layer's matmuls (batch x features x classes) are too small to share out; deeper
        # tails (a 1x1 convolution over every position) are not
        runtime.cap_loaded_blas(1 if self.job.layers.n == 1 else self.job.threads)
        return make_numpy_optimizer(name, self.weights, lr)

    # --- the frozen part ---------------------------------------------------------------------------

    def frozen_fn(self):
        session = store.ort_session(self.prep_dir / store.FROZEN_ONNX, self.job.threads, self.job.plan.arena)
        name = session.get_inputs()[0].name
        record = {"fingerprint": self.job.cache_fp, "sha256": self.prep["frozen_sha256"]}
        return (lambda x: session.run(None, {name: x})[0]), record

    def features(self, x: np.ndarray) -> np.ndarray:
        """The frozen part's outputs for a batch (the fleet's evaluator: computed once)."""
        if self.eval_session is None:
            self.eval_session = store.ort_session(self.prep_dir / store.FROZEN_ONNX, self.job.threads, True)
        return self.eval_session.run(None, {self.eval_session.get_inputs()[0].name: x})[0]

    # --- training ----------------------------------------------------------------------------------

    def step(self, inputs, idx: np.ndarray, labels: np.ndarray, micro: int) -> tuple[float, int]:
        with np.errstate(over="ignore", invalid="ignore"):  # a diverged loss is reported by the job, once
            return self._step(inputs, idx, labels, micro)

    def _step(self, inputs, idx: np.ndarray, labels: np.ndarray, micro: int) -> tuple[float, int]:
        """One effective batch: micro-batches accumulate gradients (softmax cross-entropy), one update."""
        m = micro
        real = len(idx)
        grads = {k: np.zeros_like(v) for k, v in self.weights.items()}
        loss_sum, correct = 0.0, 0
        for start in range(0, real, m):
            part = idx[start:start + m]
            y = labels[part]
            out, tape = self.tail.forward(self.weights, self.stats, inputs(part), train=True, rng=self.drop_rng)
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

    def evaluate(self, inputs, labels: np.ndarray, micro: int) -> tuple[float, float]:
        correct, loss_sum = 0, 0.0
        m = micro
        for start in range(0, len(labels), m):
            idx = np.arange(start, min(start + m, len(labels)))
            out, _ = self.tail.forward(self.weights, self.stats, inputs(idx), train=False)
            z = out.reshape(len(idx), -1)
            z = z - z.max(axis=1, keepdims=True)
            y = labels[idx]
            loss_sum += float(np.sum(np.log(np.exp(z).sum(axis=1)) - z[np.arange(len(idx)), y]))
            correct += int((np.argmax(z, axis=1) == y).sum())
        return correct / len(labels), loss_sum / len(labels)

    def predict(self, arrays: dict[str, np.ndarray], features: np.ndarray) -> np.ndarray:
        """The classes the trained part gives ``features`` with ``arrays`` as its weights (inference mode)."""
        tail = self.tail
        out, _ = tail.forward({k: arrays[k] for k in tail.param_shapes}, {k: arrays[k] for k in tail.aux_shapes},
                              features, train=False)
        return np.argmax(out.reshape(len(out), -1), axis=1)

    def reseed(self, seed: int, global_step: int) -> None:  # the same dropout masks after a resume
        self.drop_rng = np.random.RandomState((seed * 7919 + global_step) % 2 ** 32)

    # --- arrays ------------------------------------------------------------------------------------

    def trainable_arrays(self) -> dict[str, np.ndarray]:
        """The trained arrays and the running statistics, by parameter name."""
        return {**self.weights, **self.stats}

    def statistics(self) -> set[str]:
        return set(self.stats)  # a linear output layer has none

    def restore(self, arrays: dict[str, np.ndarray], where: str) -> None:
        ckpt.restore_arrays({**self.weights, **self.stats}, arrays, where)

    def param_counts(self) -> tuple[int, int]:
        return sum(int(v.size) for v in self.weights.values()), self.frozen_n

    def model_path(self, outdir: Path) -> Path:
        return outdir / MODEL_NAME  # a PREFIX

    def write_model(self, prefix: Path, pre, extra: dict) -> None:
        """PREFIX-symbol.json, PREFIX-0000.params (mxnet's format, written here), the preprocessing record."""
        g = self.graph
        params = {f"arg:{k}": self.weights.get(k, v) for k, v in g.arg_params.items()}
        params.update({f"aux:{k}": self.stats.get(k, v) for k, v in g.aux_params.items()})
        store.write_prefix(prefix, g.doc, params, pre, extra)
