"""Writing outputs so that a failure never leaves a half-written file: temp file, fsync, rename."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from .errors import UsageError


def check_output_path(path: Path, what: str = "output") -> Path:
    """Fail early, before any work, if ``path`` cannot be written as a file."""
    path = Path(path)
    if path.is_dir():
        raise UsageError(f"{what} path is a directory", str(path), "give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise UsageError(f"{what} folder does not exist", str(parent), "create it first")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"{what} folder is not writable", str(parent), "choose another location")
    if path.exists() and not os.access(path, os.W_OK):
        raise UsageError(f"{what} file is not writable", str(path), "choose another location")
    return path


@contextlib.contextmanager
def atomic_path(path: Path, what: str = "output"):
    """Yield a temp path beside ``path``; on success it is fsynced and renamed onto ``path``."""
    path = check_output_path(Path(path), what)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    os.chmod(tmp_path, 0o666 & ~_umask())  # mkstemp makes it 0600; the output gets a normal file's mode
    try:
        yield tmp_path
        with open(tmp_path, "rb+") as fh:
            os.fsync(fh.fileno())
        os.replace(tmp_path, path)
        fsync_dir(path.parent)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_bytes(path: Path, data: bytes, what: str = "output") -> None:
    with atomic_path(path, what) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str, what: str = "output") -> None:
    atomic_write_bytes(path, text.encode("utf-8"), what)


def fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
