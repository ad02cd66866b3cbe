"""What fine-tuning keeps on disk besides the checkpoint: the per-user cache of base models (their graph
and weights, the exported frozen part), the written PREFIX, and the checks that vouch for them.

Importing mxnet costs ~140 MB of RSS and ~1.8 CPU-s here, more than a whole ONNX Runtime fine-tune, so a
base model whose weights come from files is loaded, exported and checked once per user: its template
(symbol + every weight) and its frozen part's ONNX export are kept in EDGETRAIN_CACHE_DIR (default
~/.cache/edgetrain; empty turns the cache off), each entry vouched for by the SHA-256 of its files.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from .. import _lazy
from ..compat import mxnet_onnx
from ..errors import UsageError
from ..fileio import atomic_path, atomic_write_text, cache_root, remembered_digest
from ..models import is_factory_ref
from ..preprocess import sidecar_path, sidecar_text
from . import checkpoint as ckpt
from .netsplit import Graph, output_name

FROZEN_ONNX = "frozen.onnx"  # the frozen part, exported once per run (a resume reuses it)
PREP_DIR = ".finetune-prep"  # what the mxnet child of a NumPy-trained run leaves for the run (engine_numpy)
DIGEST_MEMO = "digests.json"  # in the cache folder: the SHA-256 of files hashed before (fileio.remembered_digest)
REFERENCE_FILE = "reference.npz"  # the prep child's Gluon outputs on real samples, for the check in the parent
VALIDATE_SAMPLES = 4  # real samples the ONNX Runtime frozen part is checked on against Gluon
FROZEN_TOLERANCE = (1e-4, 1e-3)  # atol (relative to the features' magnitude), rtol
PREP_FORMAT = "edgetrain-finetune-prep/2"
TEMPLATE_FORMAT = "edgetrain-finetune-template/1"


def file_sha(path: Path) -> str:
    root = cache_root()
    return remembered_digest(path, root / DIGEST_MEMO if root else None)


def params_digest(arrays: dict) -> str:
    h = hashlib.sha256()
    for k in sorted(arrays):
        h.update(k.encode())
        h.update(arrays[k].asnumpy().tobytes())
    return h.hexdigest()[:16]


def prep_key(model: str, params, input_shape, layers: str = "") -> str:
    """What the child's output depends on: the model reference and the bytes of every file it reads."""
    files = []
    if params:
        files.append(Path(params))
    if not model.startswith("zoo:") and not is_factory_ref(model):
        files += [Path(f"{model}-symbol.json"), *sorted(Path(model).parent.glob(f"{Path(model).name}-*.params"))]
        files.append(Path(f"{model}-edgetrain.json"))
    digests = [(str(f.resolve()), file_sha(f)) for f in files if f.exists()]
    return hashlib.sha256(json.dumps([PREP_FORMAT, model, digests, list(input_shape or []), layers]).encode()).hexdigest()[:20]


def xavier(shape: tuple, rng: np.random.RandomState) -> np.ndarray:
    """mx.init.Xavier(magnitude=2): uniform, fan average (what netsplit gives a new layer in MXNet)."""
    fan_in = int(np.prod(shape[1:]))
    fan_out = int(shape[0] * np.prod(shape[2:]))
    scale = math.sqrt(2.0 / ((fan_in + fan_out) / 2.0))
    return rng.uniform(-scale, scale, size=shape).astype(np.float32)


def intact_prep(folder: Path, key: str) -> dict | None:
    """The child's record in ``folder`` if it is for this key and its files are intact (else: export again)."""
    try:
        prep = json.loads((folder / "prep.json").read_text())
        frozen = prep.get("frozen_sha256")  # None: nothing is frozen (the record only says so)
        if (prep.get("key") == key and prep.get("format") == PREP_FORMAT and prep.get("checked")
                and (frozen is None and not prep.get("tail") or file_sha(folder / FROZEN_ONNX) == frozen)
                and file_sha(folder / "template-0000.params") == prep.get("template_sha256")):
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
    return {"template_sha256": file_sha(out / "template-0000.params"),
            "symbol_sha256": file_sha(out / "template-symbol.json")}


def template_graph(folder: Path, record: dict, read=ckpt.read_params) -> Graph:
    """The Graph written by write_template (weights as NumPy arrays, or as ``read`` gives them)."""
    template = read(str(folder / "template-0000.params"))
    doc = json.loads((folder / "template-symbol.json").read_text())
    arg = {k[4:]: v for k, v in template.items() if k.startswith("arg:")}
    aux = {k[4:]: v for k, v in template.items() if k.startswith("aux:")}
    return Graph(doc["nodes"], doc, record["data_name"], arg, aux, head=record["head"])


def intact_template(folder: Path, key: str) -> dict | None:
    """The cached base model's record in ``folder`` if it is for this key and its files are intact."""
    try:
        record = json.loads((folder / "template.json").read_text())
        if (record.get("key") == key and record.get("format") == TEMPLATE_FORMAT
                and file_sha(folder / "template-0000.params") == record.get("template_sha256")
                and file_sha(folder / "template-symbol.json") == record.get("symbol_sha256")):
            return record
    except (OSError, ValueError, AttributeError):
        pass
    return None


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


def export_frozen_bytes(split, pre) -> bytes:
    """The frozen part through edgetrain's Gluon->ONNX path (opset 13, dynamic batch, weights as constants)."""
    internals = split.graph.symbol().get_internals()
    sym = internals[output_name(internals, split.cut_name)]
    params = {p.name: p.data() for p in split.frozen.collect_params().values()}
    try:
        # the exporter's own checker pass is skipped (it would double the peak): ONNX Runtime runs the
        # result against Gluon's outputs before it is trusted
        proto = mxnet_onnx.translate(sym, params, split.graph.data_name, pre.batch_shape(1), dynamic_batch=True,
                                     check=False)
    except mxnet_onnx.TranslationError as exc:
        raise UsageError(f"operator '{exc.op}' cannot be exported ({exc.reason})", f"layer {exc.layer}") from None
    return proto.SerializeToString()


def ort_session(path: Path, threads: int, arena: bool):
    """The frozen part's session for the feature pass: its workers spin within a run (its many small
    parallel sections), and stop when a run ends, so the decoding threads between runs have the cores."""
    return _lazy.ort_session(path, threads, spinning=True, stop_spinning_after_run=True, arena=arena)


def mismatch(got: np.ndarray, want: np.ndarray) -> str | None:
    """None when ONNX Runtime's frozen outputs equal Gluon's within tolerance, else what differs."""
    atol, rtol = FROZEN_TOLERANCE
    scale = max(1.0, float(np.abs(want).max()) if want.size else 1.0)
    if got.shape != want.shape:
        return f"shape {got.shape} vs {want.shape}"
    err = np.abs(got - want)
    if np.all(np.isfinite(got)) and np.all(err <= atol * scale + rtol * np.abs(want)):
        return None
    return f"max abs error {float(np.nanmax(err)):.3g} on features of magnitude {scale:.3g}"


def release_freed_memory() -> None:
    """Give the heap glibc keeps after large frees back to the system (peak RSS is what a board feels)."""
    import ctypes
    import gc

    gc.collect()  # a Gluon block is a web of reference cycles: its weights go only when the cycles do
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass
