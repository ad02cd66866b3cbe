"""What a tune run starts from: the grid's points checked as finetune checks them, the run's fingerprint (what
a resume must find unchanged), and DATA decoded once for every trial."""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from ..errors import UsageError
from ..fileio import atomic_path, file_digest, write_npz
from ..options import FinetuneOptions, TuneOptions
from .grid import Grid


def _source_fp(ref: str | None) -> str | None:
    """What identifies DATA to a resume: a built-in's name, a file's SHA-256, a folder's file names, sizes and
    modification times."""
    if ref is None or ref.startswith("builtin:"):
        return ref
    path = Path(ref)
    if path.is_file():
        return file_digest(path)
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.relative_to(path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _point_options(point: dict, opts: TuneOptions, **more) -> dict:
    return {"epochs": opts.epochs, "seed": opts.seed, **point, **more}


def check_points(points: list[dict], opts: TuneOptions) -> None:
    """Every point as finetune would read it (data and OUTDIR stand-ins): its first refusal is the grid's."""
    for point in points:
        try:
            FinetuneOptions.parse(_point_options(point, opts, data="DATA", out="OUTDIR"))
        except UsageError as exc:
            raise UsageError(f"finetune refuses the grid point {_text(point)}: {exc.what}", "--grid", exc.fix) from None


def _text(point: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())


def configs_of(points: list[dict], opts: TuneOptions) -> list[dict]:
    """Each point with finetune's defaults filled in; momentum and weight decay only where the grid searches
    them (a trial's label and table row say what was searched)."""
    return [{"lr": p.get("lr"), "optimizer": p.get("optimizer", "adam"),
             **{k: p[k] for k in ("momentum", "weight_decay") if k in p},
             "batch_size": p.get("batch_size", 32), "train_layers": p.get("train_layers", "head"),
             "epochs": p.get("epochs", opts.epochs)} for p in points]


def fingerprint(model: str, opts: TuneOptions, grid: Grid, objective: str) -> dict:
    val = _source_fp(opts.val) if opts.val is not None else f"split {opts.val_split or 0.2}"
    return {"model": file_digest(Path(model)), "data": _source_fp(opts.data), "val": val, "grid": grid.to_dict(),
            "epochs": opts.epochs, "strategy": opts.strategy, "eta": opts.eta, "min_rung": opts.min_rung,
            "trials": opts.trials, "seed": opts.seed,
            "objective": objective}


def decode_data(model: str, opts: TuneOptions, folder: Path, budget_mb: float | None) -> tuple[Path, Path, int]:
    """DATA and the held-out data decoded once, at the model's input size, into FOLDER/train.npz and val.npz:
    every trial reads these. Each sample is what finetune's preprocessing makes of it before the mean and std
    (resized, on the [0, 1] scale; as bytes where it is exactly 8-bit), so a trial computes the same bits from
    it as from DATA, without decoding or resizing again. Returns their paths and the class count."""
    from dataclasses import replace

    from ..data import load_data
    from ..models import load_onnx
    from ..training import DEFAULT_VAL_SPLIT

    pre = load_onnx(model).preprocess
    c = pre.input_shape[0]
    plain = replace(pre, mean=(0.0,) * c, std=(1.0,) * c)  # x - 0 and x / 1 change no bit
    max_bytes = int(budget_mb * 2**20) if budget_mb else None
    ds = load_data(opts.data, plain, max_bytes=max_bytes)
    if opts.val is not None:
        val = load_data(opts.val, plain, where="--val", max_bytes=max_bytes)
        if val.class_names != ds.class_names:
            raise UsageError(f"--val classes ({', '.join(val.class_names[:8])}) differ from the training data's "
                             f"({', '.join(ds.class_names[:8])})", opts.val,
                             "give held-out data with the same class folders / labels")
        train = ds
    else:
        train, val = ds.split(opts.val_split or DEFAULT_VAL_SPLIT, seed=opts.seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "train.npz", folder / "val.npz"
    for part, path in zip((train, val), paths):
        x = np.empty((len(part), *pre.input_shape), np.float32)
        for first in range(0, len(part), 256):
            idx = np.arange(first, min(first + 256, len(part)))
            part.batch(idx, out=x[first:first + len(idx)])
        x = x.transpose(0, 2, 3, 1)  # N, H, W, C: as an .npz of images is read
        as_bytes = np.round(x * 255.0)
        if np.array_equal((as_bytes.astype(np.uint8).astype(np.float32) / np.float32(255.0)), x):
            x = as_bytes.astype(np.uint8)
        with atomic_path(path, "tune data") as tmp:
            with open(tmp, "wb") as fh:
                write_npz(fh, {"data": np.ascontiguousarray(x), "label": np.asarray(part.labels),
                               "class_names": np.array(ds.class_names)})
    return paths[0], paths[1], len(ds.class_names)
