"""A Gluon model given to finetune: exported once to ONNX, the one representation every ``--train-layers``
choice trains, and the fine-tuned PREFIX written back for the host's next step.

mxnet is needed once per base model: a short child (``python -m edgetrain.training.prep``) loads the model,
writes its template (symbol + every weight) and the whole model's ONNX export with Gluon's outputs on real
samples; this process checks ONNX Runtime against them before the export is trusted. The child's output is
kept beside the run (a resume does not export again) and, for a base whose weights come from files, in the
per-user cache, so later fine-tunes of the same base import no mxnet.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .. import _lazy, child
from ..errors import RunFailed, UsageError
from ..fileio import atomic_path, atomic_write_text, cache_root
from ..models import is_factory_ref
from ..preprocess import sidecar_path, sidecar_text
from . import checkpoint as ckpt
from . import store
from .memplan import HEADROOM

BASE_ONNX = "base.onnx"  # a Gluon base model's ONNX export (the prep child's), what every mode trains
REFERENCE_FILE = "reference.npz"  # the prep child's Gluon outputs on real samples, for the check in the parent
VALIDATE_SAMPLES = 4  # real samples the ONNX export is checked on against Gluon
EXPORT_TOLERANCE = (1e-4, 1e-3)  # atol (relative to the outputs' magnitude), rtol
PREP_FORMAT = "edgetrain-finetune-prep/3"  # /3: the whole model as ONNX (/2 held a frozen part per --train-layers)


@dataclass
class Graph:
    """A Gluon model's symbol graph as JSON, its weights by name, and its output layer."""

    nodes: list[dict]
    doc: dict
    data_name: str
    arg_params: dict  # name -> NDArray or NumPy array
    aux_params: dict
    head: int = -1  # node id of the output layer (the last Convolution / FullyConnected)


def graph_of(block, data_name: str) -> Graph:
    """The symbol graph of a (hybridizable) block and its current weights."""
    mx = _lazy.mxnet()

    try:
        sym = block(mx.sym.var(data_name))
    except Exception as exc:  # a hybrid_forward that only works on NDArrays
        raise UsageError(f"cannot trace the model's graph: {str(exc).splitlines()[0][:200]}", "MODEL",
                         "use a HybridBlock whose hybrid_forward works with symbols (F.*), or export it as PREFIX") from None
    if isinstance(sym, (list, tuple)):
        sym = sym[0]
    doc = json.loads(sym.tojson())
    params = {p.name: p.data() for p in block.collect_params().values()}
    aux_names = set(sym.list_auxiliary_states())
    arg = {k: v for k, v in params.items() if k not in aux_names}
    aux = {k: v for k, v in params.items() if k in aux_names}
    weighted = [i for i, n in enumerate(doc["nodes"]) if n["op"] in ("Convolution", "FullyConnected")]
    if not weighted:
        raise UsageError("model has no Convolution or FullyConnected layer to train", "MODEL",
                         "use an image-classification network")
    return Graph(doc["nodes"], doc, data_name, arg, aux, head=weighted[-1])


def head_units(g: Graph) -> int:
    node = g.nodes[g.head]
    key = "num_hidden" if node["op"] == "FullyConnected" else "num_filter"
    return int(node["attrs"][key])


def replace_head(g: Graph, classes: int) -> list[str]:
    """Give the output layer ``classes`` outputs; its weights are dropped (initialised afresh later)."""
    node = g.nodes[g.head]
    key = "num_hidden" if node["op"] == "FullyConnected" else "num_filter"
    node["attrs"][key] = str(classes)
    dropped = []
    for inp in node["inputs"][1:]:
        var = g.nodes[inp[0]]
        var.get("attrs", {}).pop("__shape__", None)  # the old class count is baked into it
        name = var["name"]
        if g.arg_params.pop(name, None) is not None:
            dropped.append(name)
    return dropped


@dataclass(frozen=True)
class GluonBase:
    """The prep child's output for one base model: its ONNX export and its template, checked."""

    folder: Path
    record: dict
    child_peak_mb: float = 0.0   # the child's peak, when this run started it (0: reused)

    @property
    def onnx(self) -> Path:
        return self.folder / BASE_ONNX

    def weight_names(self) -> set[str]:
        """What a PREFIX can hold: the Gluon model's trained weights by name (the ONNX initializers of the same
        names are them; others, such as the ones a BatchNorm with fix_gamma reads, have no Gluon weight)."""
        return {k[4:] for k in ckpt.read_params(self.folder / "template-0000.params", mapped=True)
                if k.startswith("arg:")}

    def write_prefix(self, prefix: Path, arrays: dict[str, np.ndarray], classes: int, pre, extra: dict) -> None:
        """PREFIX-symbol.json and PREFIX-0000.params: the template with ``arrays`` (the trained weights, by name)
        in place of its own, the output layer resized to ``classes`` when the data has other classes."""
        g = template_graph(self.folder, self.record, lambda path: ckpt.read_params(path, mapped=True))
        order = [*g.arg_params, *g.aux_params]   # the template's order: the same bytes for the same weights
        if head_units(g) != classes:
            replace_head(g, classes)
        params = {}
        for name in order:
            held = g.arg_params.get(name, g.aux_params.get(name))
            value = arrays.get(name, held)
            if value is None:
                raise RunFailed(f"the fine-tuned model has no weight '{name}' for the Gluon files", str(prefix),
                                "report this with the model; OUTDIR/model.onnx holds the fine-tuned model")
            if held is not None and tuple(np.shape(value)) != tuple(np.shape(held)):
                raise RunFailed(f"'{name}' is {np.shape(value)} in the fine-tuned ONNX graph but {np.shape(held)} in "
                                "the Gluon model", str(prefix), "report this with the model; OUTDIR/model.onnx holds "
                                "the fine-tuned model")
            params[("aux:" if name in g.aux_params else "arg:") + name] = value
        write_prefix(prefix, g.doc, params, pre, extra)


def prepare(job) -> GluonBase:
    """The base model's export: beside the run (a resume), else from the per-user cache, else a child run now
    whose export ONNX Runtime is checked against Gluon's outputs on real samples."""
    key = prep_key(job.model, job.params, job.input_shape)
    here = job.outdir / store.PREP_DIR
    root = cache_root()
    cached = (root / "finetune-prep" / key) if root else None
    for folder in (here, cached):
        prep = intact_prep(folder, key) if folder is not None else None
        if folder is not None and prep is not None:
            if folder != here:
                job.notes.append("the model's ONNX export reused from the cache (no mxnet in this run)")
            return GluonBase(folder, prep)
    job.outdir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(here, ignore_errors=True)
    here.mkdir()
    spec = {"dir": str(here), "model": job.model, "params": job.params, "key": key,
            "input_shape": list(job.input_shape) if job.input_shape else None, "data": job.data,
            "threads": job.threads, "max_bytes": job.data_budget()}
    (here / "spec.json").write_text(json.dumps(spec))
    job.tick("prepare", force=True, done=0, total=1, message="exporting the Gluon model to ONNX (mxnet child)")
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
    peak = float(prep["peak_rss_mb"])
    _check(here, prep, job.threads)
    job.tick("prepare", force=True, done=1, total=1, message="the model's ONNX export is checked equal to Gluon")
    job.notes.append(f"model exported to ONNX and checked equal to Gluon on {prep['validated_on']} real samples "
                     f"(mxnet only in that step, peak {peak:.0f} MB)")
    if job.budget_mb and peak > job.budget_mb:
        raise UsageError(f"memory budget {job.budget_mb:.0f} MB is too small: preparing the model (mxnet, Gluon->ONNX) "
                         f"peaked at {peak:.0f} MB", "--memory-budget",
                         f"a budget below {peak / HEADROOM:.0f} MB is impossible for this model's first run here; raise "
                         "--memory-budget (later runs reuse the cached export), or export the model on the host "
                         "(edgetrain export MODEL model.onnx) and fine-tune model.onnx")
    if cached is not None and not prep["random_weights"]:
        _publish(here, cached, key, job.notes)
    return GluonBase(here, prep, peak)


def _check(folder: Path, prep: dict, threads: int) -> None:
    """ONNX Runtime's side of the child's check: the export, run on the samples the child ran through Gluon,
    must give Gluon's outputs; only then is it trusted (prep.json says so)."""
    ref = np.load(folder / REFERENCE_FILE)
    session = store.ort_session(folder / BASE_ONNX, threads, False)
    got = session.run(None, {session.get_inputs()[0].name: ref["x"]})[0]
    err = mismatch(got, ref["want"])
    del session
    if err:
        raise RunFailed(f"the model's ONNX export differs from Gluon ({err})", str(folder / BASE_ONNX),
                        "report this with the model; `edgetrain export MODEL model.onnx` shows where the outputs differ")
    prep["checked"] = True
    atomic_write_text(folder / "prep.json", json.dumps(prep), "template")


def _publish(here: Path, dest: Path, key: str, notes: list[str]) -> None:
    """Copy the checked export to the per-user cache atomically: a half-copied entry is never seen."""
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=dest.parent))
        for name in ("prep.json", BASE_ONNX, "template-0000.params", "template-symbol.json"):
            shutil.copyfile(here / name, tmp / name)
        if dest.exists() and intact_prep(dest, key) is None:
            shutil.rmtree(dest, ignore_errors=True)  # a damaged entry is replaced, not kept forever
        os.replace(tmp, dest) if not dest.exists() else shutil.rmtree(tmp, ignore_errors=True)
    except OSError as exc:
        notes.append(f"the export could not be cached ({type(exc).__name__}); the next run exports again")


# --- the template and the cache entry ---------------------------------------------------------------

def prep_key(model: str, params, input_shape) -> str:
    """What the child's output depends on: the model reference and the bytes of every file it reads."""
    files = []
    if params:
        files.append(Path(params))
    if not model.startswith("zoo:") and not is_factory_ref(model):
        files += [Path(f"{model}-symbol.json"), *sorted(Path(model).parent.glob(f"{Path(model).name}-*.params"))]
        files.append(Path(f"{model}-edgetrain.json"))
    digests = [(str(f.resolve()), store.file_sha(f)) for f in files if f.exists()]
    return hashlib.sha256(json.dumps([PREP_FORMAT, model, digests, list(input_shape or [])]).encode()).hexdigest()[:20]


def intact_prep(folder: Path, key: str) -> dict | None:
    """The child's record in ``folder`` if it is for this key, checked, and its files are intact (else: export
    again)."""
    try:
        prep = json.loads((folder / "prep.json").read_text())
        if (prep.get("key") == key and prep.get("format") == PREP_FORMAT and prep.get("checked")
                and store.file_sha(folder / BASE_ONNX) == prep.get("onnx_sha256")
                and store.file_sha(folder / "template-0000.params") == prep.get("template_sha256")
                and store.file_sha(folder / "template-symbol.json") == prep.get("symbol_sha256")):
            return prep
    except (OSError, ValueError, AttributeError):
        pass
    return None


def write_template(out: Path, g: Graph) -> dict:
    """The base model as files in ``out``: its graph (template-symbol.json) and every weight under mxnet's
    arg:/aux: names (template-0000.params); returns their digests for the record that vouches for them."""
    arrays = {("aux:" if k in g.aux_params else "arg:") + k: v for k, v in {**g.arg_params, **g.aux_params}.items()}
    atomic_write_text(out / "template-symbol.json", json.dumps(g.doc), "template")
    write_params(out / "template-0000.params", arrays, "template")
    return {"template_sha256": store.file_sha(out / "template-0000.params"),
            "symbol_sha256": store.file_sha(out / "template-symbol.json")}


def template_graph(folder: Path, record: dict, read=ckpt.read_params) -> Graph:
    """The Graph written by write_template (weights as NumPy arrays, or as ``read`` gives them)."""
    template = read(folder / "template-0000.params")
    doc = json.loads((folder / "template-symbol.json").read_text())
    arg = {k[4:]: v for k, v in template.items() if k.startswith("arg:")}
    aux = {k[4:]: v for k, v in template.items() if k.startswith("aux:")}
    return Graph(doc["nodes"], doc, record["data_name"], arg, aux, head=record["head"])


def write_prefix(prefix: Path, doc: dict, arrays: dict, pre, extra: dict) -> None:
    """PREFIX-symbol.json, PREFIX-0000.params (mxnet's format, byte for byte) and the preprocessing record."""
    atomic_write_text(Path(f"{prefix}-symbol.json"), json.dumps(doc, indent=2), "model")
    write_params(Path(f"{prefix}-0000.params"), arrays, "model")
    atomic_write_text(sidecar_path(prefix), sidecar_text(pre, extra), "model")


def write_params(path: Path, arrays: dict, what: str) -> None:
    """``arrays`` (NumPy or mxnet NDArrays) as an mx.nd.save file, atomically, one array in memory at a time."""
    with atomic_path(path, what) as tmp, open(tmp, "wb") as fh:
        for chunk in ckpt.params_chunks(arrays, lambda a: a.asnumpy() if hasattr(a, "asnumpy") else a):
            fh.write(chunk)


def mismatch(got: np.ndarray, want: np.ndarray) -> str | None:
    """None when ONNX Runtime's outputs equal Gluon's within tolerance, else what differs."""
    atol, rtol = EXPORT_TOLERANCE
    scale = max(1.0, float(np.abs(want).max()) if want.size else 1.0)
    if got.shape != want.shape:
        return f"shape {got.shape} vs {want.shape}"
    err = np.abs(got - want)
    if np.all(np.isfinite(got)) and np.all(err <= atol * scale + rtol * np.abs(want)):
        return None
    return f"max abs error {float(np.nanmax(err)):.3g} on outputs of magnitude {scale:.3g}"
