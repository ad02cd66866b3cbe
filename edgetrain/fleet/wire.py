"""Updates and weights as Flower records: every tensor is one ``Array`` holding exactly the codec's
payload (no per-array .npy header), so the bytes reported are the bytes that travel in the records."""
from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord

from .codec import WIRE, Encoded, decode_tensor, encode_tensor

STYPE = "edgetrain.fleet/1"


def to_record(encoded: dict[str, Encoded]) -> ArrayRecord:
    return ArrayRecord({k: Array(dtype=e.codec, shape=tuple(e.shape), stype=STYPE, data=e.data)
                        for k, e in encoded.items()})


def from_record(record: ArrayRecord) -> dict[str, Encoded]:
    out = {}
    for k, a in record.items():
        if a.stype != STYPE or a.dtype not in WIRE:
            raise ValueError(f"array '{k}' is not an edgetrain fleet tensor ({a.stype}, {a.dtype})")
        out[k] = Encoded(a.dtype, tuple(int(d) for d in a.shape), bytes(a.data))
    return out


def weights_record(arrays: dict[str, np.ndarray]) -> ArrayRecord:
    """Global weights go down as float32 (the downlink is not compressed)."""
    return to_record({k: encode_tensor(v, "fp32")[0] for k, v in arrays.items()})


def weights_from(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {k: decode_tensor(e) for k, e in from_record(record).items()}


def record_bytes(record: ArrayRecord) -> int:
    return sum(len(a.data) for a in record.values())
