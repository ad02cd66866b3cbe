"""The frozen part's outputs, computed once and read back every epoch: in memory, or in a file on disk.

The disk variant reads rows with ``pread`` instead of mapping the file: pages of a mapped file that
have been read count toward the process's RSS until unmapped, which is exactly what a memory budget
forbids; a read into a small buffer does not.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np


class FeatureCache:
    def __init__(self, rows: int, shape: tuple, placement: str, path: Path | None = None, reuse: bool = False):
        self.rows = rows
        self.shape = tuple(shape)
        self.placement = placement
        self.row_bytes = int(np.prod(self.shape)) * 4
        self.path = Path(path) if path else None
        self._mem = None
        self._fd = None
        if placement == "memory":
            self._mem = np.empty((rows, *self.shape), dtype=np.float32)
        else:
            assert self.path is not None
            if not reuse:  # the file is sparse until written: check the disk can hold it before any work
                from ..fileio import ensure_free_space

                ensure_free_space(self.path.parent, rows * self.row_bytes, "disk feature cache", margin=16 << 20)
            flags = os.O_RDWR | (0 if reuse else os.O_CREAT | os.O_TRUNC)
            self._fd = os.open(self.path, flags, 0o644)
            if not reuse:
                os.ftruncate(self._fd, rows * self.row_bytes)

    @property
    def nbytes(self) -> int:
        return self.rows * self.row_bytes

    def reusable(self) -> bool:
        """A disk cache left by an earlier run of the same job has the right size."""
        return self._fd is not None and os.fstat(self._fd).st_size == self.nbytes

    def write(self, start: int, values: np.ndarray) -> None:
        values = np.ascontiguousarray(values, dtype=np.float32)
        if self._mem is not None:
            self._mem[start:start + len(values)] = values
        else:
            assert self._fd is not None, "a disk cache holds its file open"
            try:
                os.pwrite(self._fd, values.tobytes(), start * self.row_bytes)
            except OSError as exc:  # the disk filled up meanwhile (another writer): one line, not a traceback
                from ..fileio import disk_full_error, is_disk_full

                if is_disk_full(exc):
                    raise disk_full_error(exc, self.path, "disk feature cache") from None
                raise

    def read(self, idx) -> np.ndarray:
        idx = np.asarray(idx, dtype=np.int64)
        if self._mem is not None:
            return self._mem[idx]
        assert self._fd is not None, "a disk cache holds its file open"
        out = np.empty((len(idx), *self.shape), dtype=np.float32)
        flat = out.reshape(len(idx), -1)
        for i, j in enumerate(idx):
            flat[i] = np.frombuffer(os.pread(self._fd, self.row_bytes, int(j) * self.row_bytes), dtype=np.float32)
        return out

    def flush(self) -> None:
        if self._fd is not None:
            os.fsync(self._fd)

    def close(self, delete: bool = False) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            if delete and self.path and self.path.exists():
                self.path.unlink()
        self._mem = None


class FeatureStore:
    """Frozen-part outputs shared by the jobs of one process (a tune's trials): a job whose frozen part, data
    and feature batch are another's takes that job's complete cache instead of computing it again. The store
    owns what it holds (a job never closes a shared cache); ``close()`` releases all of it."""

    def __init__(self):
        self._caches: dict[str, FeatureCache] = {}
        self.computed = 0   # caches filled by a job's feature pass
        self.shared = 0     # feature passes saved

    def get(self, key: str) -> FeatureCache | None:
        cache = self._caches.get(key)
        if cache is not None:
            self.shared += 1
        return cache

    def __contains__(self, key: object) -> bool:
        return key in self._caches

    def put(self, key: str, cache: FeatureCache) -> None:
        self._caches[key] = cache
        self.computed += 1

    def holds(self, cache: FeatureCache | None) -> bool:
        return cache is not None and any(c is cache for c in self._caches.values())

    def close(self) -> None:
        for cache in self._caches.values():
            cache.close(delete=True)
        self._caches.clear()
