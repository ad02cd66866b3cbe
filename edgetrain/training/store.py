"""What fine-tuning keeps on disk besides the checkpoint, and the small helpers around it: the names of a run's
scratch files, the per-user cache's file digests, the frozen part's session, a new layer's initialisation."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from .. import _lazy
from ..fileio import cache_root, remembered_digest
from ..procmem import release_freed_memory  # noqa: F401  (the engines call it as store.release_freed_memory)

FROZEN_ONNX = "frozen.onnx"  # the frozen part, cut from the ONNX graph once per run (a resume reuses it)
PREP_DIR = ".finetune-prep"  # what the mxnet child of a Gluon model's run leaves for the run (gluon.py)
DIGEST_MEMO = "digests.json"  # in the cache folder: the SHA-256 of files hashed before (fileio.remembered_digest)


def file_sha(path: Path) -> str:
    root = cache_root()
    return remembered_digest(path, root / DIGEST_MEMO if root else None)






def xavier(shape: tuple, rng: np.random.RandomState) -> np.ndarray:
    """mx.init.Xavier(magnitude=2): uniform, fan average (what Gluon gives a new layer)."""
    fan_in = int(np.prod(shape[1:]))
    fan_out = int(shape[0] * np.prod(shape[2:]))
    scale = math.sqrt(2.0 / ((fan_in + fan_out) / 2.0))
    return rng.uniform(-scale, scale, size=shape).astype(np.float32)


def ort_session(path: Path, threads: int, arena: bool):
    """The frozen part's session for the feature pass: its workers spin within a run (its many small
    parallel sections), and stop when a run ends, so the decoding threads between runs have the cores."""
    return _lazy.ort_session(path, threads, spinning=True, stop_spinning_after_run=True, arena=arena)

