"""Training checkpoints: one ``.npz`` of named arrays plus a JSON record, written atomically, checked on load.

A checkpoint holds what an interrupted run needs to end with the same weights as an uninterrupted one:
the trained weights (and BatchNorm statistics), optimizer state, epoch and step, the numpy RNG state,
the epoch's data order, and whether the feature cache is still valid. MXNet 1.x cannot read its RNG
state back, so training reseeds it before every step from (seed, global step), both recorded here. It is refused, never loaded,
when it is corrupt (bad zip, CRC or our own checksum) or belongs to another run (model, classes, data
or settings differ). Nothing is unpickled (``allow_pickle=False``).
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import zipfile
from pathlib import Path

import numpy as np

from .. import envvars
from ..errors import UsageError
from ..fileio import atomic_path, write_npz

FORMAT = "edgetrain-checkpoint/2"  # /2: the checksum covers the JSON record too
KILL_ENV = "EDGETRAIN_TEST_KILL_AT"  # test hook, see kill_point
FILENAME = "checkpoint.npz"

# fingerprint keys whose change makes a checkpoint another run's, with how to say it
_WHAT = {
    "classes": "data classes",
    "model": "model",
    "model_ref": "MODEL reference",
    "engine": "training engine",
    "input_shape": "input shape",
    "normalisation": "normalisation (--mean/--std)",
    "train_layers": "--train-layers",
    "batch_size": "--batch-size",
    "optimizer": "--optimizer",
    "lr": "--lr",
    "momentum": "--momentum",
    "weight_decay": "--weight-decay",
    "seed": "--seed",
    "data": "training data",
    "val": "validation data",
}


def kill_point(phase: str, _counts: dict = {}) -> None:  # noqa: B006 (the counter lives for the process)
    """Test hook: ``EDGETRAIN_TEST_KILL_AT=PHASE:N`` SIGKILLs this process the N-th time it reaches PHASE.

    The kill-at-phase tests use it to cut the power at an exact point (a feature batch, a step, an epoch
    boundary, the middle of a checkpoint write) instead of racing a timer.
    """
    spec = envvars.get(KILL_ENV)
    if not spec:
        return
    name, _, count = spec.partition(":")
    if name != phase:
        return
    _counts[phase] = _counts.get(phase, 0) + 1
    if _counts[phase] >= int(count or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def _record_text(meta: dict) -> str:
    return json.dumps({k: v for k, v in meta.items() if k != "sha256"}, sort_keys=True)


def _digest(arrays: dict[str, np.ndarray], meta: dict | None = None) -> str:
    h = hashlib.sha256()
    if meta is not None:
        h.update(_record_text(meta).encode("utf-8"))
    for key in sorted(arrays):
        a = np.ascontiguousarray(arrays[key])
        h.update(key.encode())
        h.update(str(a.dtype).encode() + str(a.shape).encode())
        h.update(a.tobytes())
    return h.hexdigest()


def save(path: Path, meta: dict, arrays: dict[str, np.ndarray]) -> None:
    """Write ``meta`` (JSON-able) and ``arrays`` atomically: temp file, fsync, rename."""
    arrays = {k: np.asarray(v) for k, v in arrays.items()}
    record = {**meta, "format": FORMAT}
    record = json.loads(json.dumps(record))  # the record as it will read back (tuples become lists)
    record["sha256"] = _digest(arrays, record)
    payload = {"meta": np.frombuffer(json.dumps(record).encode("utf-8"), dtype=np.uint8), **arrays}
    with atomic_path(Path(path), "checkpoint") as tmp:
        with open(tmp, "wb") as fh:
            write_npz(fh, payload)
        kill_point("save")


def load(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """Read and verify a checkpoint; a damaged one is a UsageError naming the file."""
    path = Path(path)
    fix = "delete it (and start over) or restore it from a backup"
    try:
        with np.load(path, allow_pickle=False) as npz:
            arrays = {k: npz[k] for k in npz.files}
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError) as exc:
        raise UsageError(f"checkpoint is corrupt or truncated ({type(exc).__name__})", str(path), fix) from None
    try:
        meta = json.loads(arrays.pop("meta").tobytes().decode("utf-8"))
    except (KeyError, ValueError, UnicodeDecodeError):
        raise UsageError("checkpoint has no readable record", str(path), fix) from None
    if meta.get("format") != FORMAT:
        raise UsageError(f"not a checkpoint this edgetrain reads (format {meta.get('format')!r}, expected {FORMAT})",
                         str(path), fix)
    if meta.get("sha256") != _digest(arrays, meta):
        raise UsageError("checkpoint contents do not match their checksum", str(path), fix)
    return meta, arrays


def peek(path: Path) -> dict:
    """A checkpoint's record, unverified (``load`` verifies it), without its arrays; {} where it cannot be read."""
    try:
        with np.load(Path(path), allow_pickle=False) as npz:
            return dict(json.loads(npz["meta"].tobytes().decode("utf-8")))
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, KeyError, UnicodeDecodeError, TypeError):
        return {}


def check_matches(meta: dict, fingerprint: dict, path: Path) -> None:
    """Refuse a checkpoint from another run, saying what differs."""
    saved = meta.get("fingerprint", {})
    for key, what in _WHAT.items():
        if saved.get(key) == fingerprint.get(key):
            continue
        if key == "classes":
            was, now = saved.get(key) or [], fingerprint.get(key) or []
            detail = f"checkpoint has {len(was)} ({_short(was)}), data has {len(now)} ({_short(now)})"
        else:
            # a fingerprint keeps an optimizer option only when it is not the default (None): said so, not 'None'
            shown = [("the default" if v is None and key in ("momentum", "weight_decay") else _short(v))
                     for v in (saved.get(key), fingerprint.get(key))]
            detail = f"checkpoint: {shown[0]}, now: {shown[1]}"
        raise UsageError(f"{what} differ from the checkpoint's: {detail}", str(path),
                         "resume with the same model, data and settings, or use another OUTDIR to start a new run")


def _short(value, limit: int = 60) -> str:
    text = ", ".join(map(str, value)) if isinstance(value, list) else str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def rng_to_arrays(rng: np.random.RandomState) -> tuple[dict, dict]:
    kind, keys, pos, has_gauss, cached = rng.get_state()
    return ({"kind": kind, "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            {"rng_keys": np.asarray(keys, dtype=np.uint32)})


def rng_from(meta_rng: dict, keys: np.ndarray) -> np.random.RandomState:
    rng = np.random.RandomState()
    rng.set_state((meta_rng["kind"], keys.astype(np.uint32), meta_rng["pos"], meta_rng["has_gauss"],
                   meta_rng["cached_gaussian"]))
    return rng


# --- MXNet's NDArray file format (PREFIX-NNNN.params), read and written without importing mxnet ----------
# What mx.nd.save writes (src/ndarray/ndarray.cc, mxnet 1.x): uint64 list magic 0x112, uint64 0, uint64
# count, then per array: uint32 magic 0xF993FAC9, int32 storage type (0 dense), uint32 ndim, int64 dims,
# int32 dev_type, int32 dev_id, int32 dtype flag, raw little-endian data; then uint64 count and per name
# uint64 length + bytes. Writing it directly lets a head-only fine-tune emit its PREFIX without the
# ~150 MB that importing mxnet costs (tests check the bytes equal mx.nd.save's).
_LIST_MAGIC, _ARRAY_MAGIC = 0x112, 0xF993FAC9
_DTYPES = {0: np.float32, 1: np.float64, 2: np.float16, 3: np.uint8, 4: np.int32, 5: np.int8, 6: np.int64}
_FLAGS = {np.dtype(v): k for k, v in _DTYPES.items()}


def read_params(path: Path, mapped: bool = False) -> dict[str, np.ndarray]:
    """The named dense arrays of an mx.nd.save file (a PREFIX-NNNN.params). ``mapped``: read-only views of
    the file mapped into memory, not copies: an array's pages are read only when it is used, so weights that
    are only written out again (a fine-tune's frozen layers) take no memory while the job runs. Only for a
    file nobody rewrites in place (the export cache, published by rename)."""
    raw = np.memmap(path, dtype=np.uint8, mode="r") if mapped else memoryview(Path(path).read_bytes())
    pos = 0

    def take(fmt: str):
        nonlocal pos
        value = np.frombuffer(raw, dtype=fmt, count=1, offset=pos)[0]
        pos += np.dtype(fmt).itemsize
        return int(value)

    if take("<u8") != _LIST_MAGIC:
        raise ValueError("not an MXNet NDArray file")
    take("<u8")
    arrays = []
    for _ in range(take("<u8")):
        if take("<u4") != _ARRAY_MAGIC or take("<i4") != 0:
            raise ValueError("unsupported NDArray record (only dense arrays, format V2)")
        shape = tuple(take("<i8") for _ in range(take("<u4")))
        take("<i4"), take("<i4")
        dtype = np.dtype(_DTYPES[take("<i4")]).newbyteorder("<")
        n = int(np.prod(shape)) if shape else 0
        a = np.frombuffer(raw, dtype=dtype, count=n, offset=pos).reshape(shape)
        arrays.append(a if mapped else a.copy())
        pos += n * dtype.itemsize
    names = []
    for _ in range(take("<u8")):
        length = take("<u8")
        names.append(bytes(raw[pos:pos + length]).decode("utf-8"))
        pos += length
    return dict(zip(names, arrays))


def params_chunks(arrays: dict, convert=np.asarray):
    """``arrays`` in mx.nd.save's format, byte for byte (CPU context, dense), one piece at a time: each
    array is passed through ``convert`` (e.g. NDArray.asnumpy) only when its turn comes, so writing a
    model holds one array's copy at a time, not the whole file."""
    yield np.array([_LIST_MAGIC, 0, len(arrays)], "<u8").tobytes()
    for a in arrays.values():
        a = np.ascontiguousarray(convert(a))
        yield (np.array([_ARRAY_MAGIC], "<u4").tobytes() + np.array([0], "<i4").tobytes()
               + np.array([a.ndim], "<u4").tobytes() + np.array(a.shape, "<i8").tobytes()
               + np.array([1, 0, _FLAGS[a.dtype]], "<i4").tobytes())
        yield a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
    yield np.array([len(arrays)], "<u8").tobytes()
    for name in arrays:
        b = name.encode("utf-8")
        yield np.array([len(b)], "<u8").tobytes() + b


def params_bytes(arrays: dict[str, np.ndarray]) -> bytes:
    """``arrays`` in mx.nd.save's format, byte for byte (CPU context, dense)."""
    return b"".join(params_chunks(arrays))


def restore_arrays(held: dict, arrays: dict, where: str) -> None:
    """Copy a checkpoint's ``arrays`` into the engine's own ``held`` arrays (in place: the optimizer holds
    them), refusing a checkpoint that lacks one or has another shape."""
    for k, v in held.items():
        if k not in arrays or arrays[k].shape != v.shape:
            raise UsageError(f"checkpoint does not hold weights for {k}", where,
                             "delete it and start over, or use another OUTDIR")
        v[...] = arrays[k]
