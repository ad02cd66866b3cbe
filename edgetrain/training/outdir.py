"""OUTDIR, the run folder: what it holds, whether it can take a run, and the lock one run holds on it."""
from __future__ import annotations

import os
from pathlib import Path

from ..errors import UsageError
from . import checkpoint as ckpt

MODEL_NAME = "model"  # the PREFIX written: OUTDIR/model-symbol.json, model-0000.params
ONNX_MODEL = "model.onnx"  # what a fine-tune of an ONNX file writes
METRICS = "metrics.json"
FEATURES_FILE = "features.cache"
LOCK_FILE = ".finetune.lock"
RUN_FILES = (ckpt.FILENAME, METRICS, f"{MODEL_NAME}-symbol.json", ONNX_MODEL)  # an earlier run's, refused without --resume


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
    holder = lock_holder(outdir)
    if holder is not None:
        raise UsageError(f"OUTDIR is in use by another finetune run (PID {holder})", str(outdir),
                         "wait for that run to finish (or stop it), or choose another OUTDIR")
    held = [f for f in RUN_FILES if (outdir / f).exists()]
    if held and not resume:
        raise UsageError(f"OUTDIR holds an earlier run ({', '.join(held)})", str(outdir),
                         "pass --resume to continue it, or choose another (empty) OUTDIR")
    return (outdir / ckpt.FILENAME).exists()


def lock_holder(outdir: Path) -> str | None:
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


def take_lock(outdir: Path) -> int:
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
