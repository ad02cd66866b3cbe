"""Faults: kill a run at a phase, fill the disk, bound a child's memory, find stray processes."""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import pytest

SIGNALS = {"SIGINT": signal.SIGINT, "SIGTERM": signal.SIGTERM, "SIGKILL": signal.SIGKILL}


def marked_env(extra: dict | None = None) -> tuple[dict, str]:
    """An environment carrying a unique marker: every descendant inherits it, so strays can be found."""
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != "EDGETRAIN_DEBUG"}
    env["EDGETRAIN_HOSTILE_MARK"] = mark
    env.update(extra or {})
    return env, mark


def processes_with(mark: str) -> list[int]:
    """PIDs of live (not zombie) processes whose environment holds ``mark``."""
    found = []
    needle = f"EDGETRAIN_HOSTILE_MARK={mark}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle not in fh.read():
                    continue
            with open(f"/proc/{entry}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state != b"Z":
            found.append(int(entry))
    return found


def wait_for(predicate, timeout: float = 60.0, step: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    return predicate()


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def kill_marked(mark: str) -> None:
    """Clean-up after a failing test: nothing the test started outlives it."""
    for pid in processes_with(mark):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def start_cli(*args, env: dict, cwd=None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "edgetrain", *map(str, args)], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


# --- memory -------------------------------------------------------------------------------------------

def limit_memory(nbytes: int):
    """A preexec_fn bounding the child's address space (RLIMIT_AS): a read-it-all bug dies with MemoryError."""
    def preexec():
        resource.setrlimit(resource.RLIMIT_AS, (nbytes, nbytes))
    return preexec


def run_python_limited(code: str, nbytes: int, timeout: float = 120, env: dict | None = None):
    """Run ``python -c code`` with its address space bounded to ``nbytes``."""
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout,
                          preexec_fn=limit_memory(nbytes), env=env)


# --- disk -------------------------------------------------------------------------------------------------

@contextlib.contextmanager
def tiny_disk(size: str = "1m"):
    """A folder on a file system of ``size``: a tmpfs when this process may mount (root), else skip."""
    folder = Path(tempfile.mkdtemp(prefix="hostile-disk-"))
    if os.geteuid() != 0:
        os.rmdir(folder)
        pytest.skip("filling a disk needs a tmpfs mount (root)")
    res = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True)
    if res.returncode != 0:
        os.rmdir(folder)
        pytest.skip(f"cannot mount a tmpfs here: {res.stderr.decode().strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], capture_output=True)
        with contextlib.suppress(OSError):
            os.rmdir(folder)


def fill(folder: Path, leave: int = 0) -> None:
    """Fill ``folder``'s file system, leaving about ``leave`` bytes free."""
    import shutil

    free = shutil.disk_usage(folder).free - leave
    with open(folder / "filler", "wb") as fh:
        chunk = bytes(65536)
        while free > 0:
            try:
                fh.write(chunk[: min(len(chunk), free)])
                fh.flush()
            except OSError:
                break
            free -= len(chunk)


def temp_leftovers(folder: Path) -> list[str]:
    """Names an edgetrain writer would leave behind if killed: its hidden temp files and temp folders."""
    return sorted(p.name for p in Path(folder).iterdir() if "edgetrain-tmp" in p.name or p.name.endswith(".tmp"))
