"""Resident memory of this process, read from /proc (Linux): current RSS and its peak (VmHWM), and giving
what was freed back to the system."""
from __future__ import annotations

from pathlib import Path

_STATUS = Path("/proc/self/status")


def _status_kb(field: str, status: Path = _STATUS) -> int | None:
    try:
        for line in status.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_mb(pid: int | None = None) -> float | None:
    """Current resident set size in MiB (None where /proc is not available)."""
    kb = _status_kb("VmRSS", Path(f"/proc/{pid}/status") if pid else _STATUS)
    return kb / 1024 if kb is not None else None


def peak_rss_mb(pid: int | None = None) -> float | None:
    """Peak resident set size (VmHWM) in MiB since the process started. This process's own is known even
    without /proc (getrusage's ru_maxrss, the same high-water mark, in KiB on Linux); another's is None."""
    kb = _status_kb("VmHWM", Path(f"/proc/{pid}/status") if pid else _STATUS)
    if kb is None and not pid:
        import resource

        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss or None
    return kb / 1024 if kb is not None else None


def release_freed_memory() -> None:
    """Give the heap glibc keeps after large frees back to the system (peak RSS is what a board feels): a
    phase's peak then does not stay resident under the next phase's."""
    import ctypes
    import gc

    gc.collect()  # a Gluon block is a web of reference cycles: its weights go only when the cycles do
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to do
        pass
