"""Update compression: what a client sends up instead of float32 arrays.

Each tensor travels as ``(lo, scale)`` (two float32) followed by its codes:

- ``fp32``: the raw little-endian float32 values (no codes, no header): the baseline.
- ``int8``: per-tensor affine, ``x ~ lo + q * scale`` with ``q`` in 0..255; error <= scale / 2.
- ``2bit``: per-tensor affine with four levels, four codes per byte, and *error feedback*: what the
  quantizer dropped (``residual``) stays on the device and is added to the next round's update, so
  over rounds the sum of what was sent equals the sum of the true updates minus one residual.

The codec is pure NumPy; the wire object (Flower's ``Array``) is built from ``Encoded`` in ``apps``.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError

CODECS = ("fp32", "int8", "2bit")
_BITS = {"int8": 8, "2bit": 2}
_HEADER = struct.Struct("<ff")  # lo, scale


@dataclass
class Encoded:
    """One tensor on the wire: ``codec``, the tensor's ``shape`` and the payload bytes."""

    codec: str
    shape: tuple[int, ...]
    data: bytes

    @property
    def nbytes(self) -> int:
        return len(self.data)


def _affine(x: np.ndarray, levels: int) -> tuple[float, float, np.ndarray]:
    lo, hi = (float(x.min()), float(x.max())) if x.size else (0.0, 0.0)
    scale = (hi - lo) / (levels - 1)
    if not scale > 0:  # constant tensor (or empty): every code is 0 and decodes to lo exactly
        scale = 1.0
    q = np.clip(np.rint((x - np.float32(lo)) / np.float32(scale)), 0, levels - 1).astype(np.uint8)
    return np.float32(lo).item(), np.float32(scale).item(), q


def _pack2(q: np.ndarray) -> bytes:
    pad = (-q.size) % 4
    q = np.concatenate([q.ravel(), np.zeros(pad, np.uint8)]).reshape(-1, 4)
    return (q[:, 0] | (q[:, 1] << 2) | (q[:, 2] << 4) | (q[:, 3] << 6)).astype(np.uint8).tobytes()


def _unpack2(data: bytes, n: int) -> np.ndarray:
    b = np.frombuffer(data, np.uint8)
    q = np.stack([b & 3, (b >> 2) & 3, (b >> 4) & 3, (b >> 6) & 3], axis=1).ravel()
    return q[:n]


def payload_size(codec: str, n: int) -> int:
    """Bytes one tensor of ``n`` values takes on the wire with ``codec``."""
    if codec == "fp32":
        return 4 * n
    return _HEADER.size + (n if codec == "int8" else (n + 3) // 4)


def encode_tensor(x: np.ndarray, codec: str) -> tuple[Encoded, np.ndarray]:
    """``x`` on the wire and what the receiver will decode (so the sender can keep the difference)."""
    x = np.array(x, dtype=np.float32, order="C")  # keeps a 0-d tensor 0-d (ascontiguousarray would not)
    if codec == "fp32":
        return Encoded(codec, tuple(x.shape), x.astype("<f4").tobytes()), x.copy()
    if codec not in _BITS:
        raise UsageError(f"unknown update codec '{codec}'", "--codec", f"use one of {', '.join(CODECS)}")
    lo, scale, q = _affine(x, 1 << _BITS[codec])
    codes = q.tobytes() if codec == "int8" else _pack2(q)
    decoded = (np.float32(lo) + q.astype(np.float32) * np.float32(scale)).reshape(x.shape)
    return Encoded(codec, tuple(x.shape), _HEADER.pack(lo, scale) + codes), decoded


def decode_tensor(enc: Encoded) -> np.ndarray:
    """The float32 tensor ``enc`` stands for; a payload of the wrong length is refused."""
    n = int(np.prod(enc.shape)) if enc.shape else 1
    if enc.codec not in CODECS:
        raise ValueError(f"unknown codec '{enc.codec}'")
    if len(enc.data) != payload_size(enc.codec, n):
        raise ValueError(f"{enc.codec} payload of {len(enc.data)} bytes does not hold {n} values")
    if enc.codec == "fp32":
        return np.frombuffer(enc.data, "<f4").astype(np.float32).reshape(enc.shape)
    lo, scale = _HEADER.unpack_from(enc.data)
    body = enc.data[_HEADER.size:]
    q = np.frombuffer(body, np.uint8) if enc.codec == "int8" else _unpack2(body, n)
    return (np.float32(lo) + q.astype(np.float32) * np.float32(scale)).reshape(enc.shape)


def encode_update(update: dict[str, np.ndarray], codec: str, residual: dict[str, np.ndarray] | None = None,
                  exact=()) -> tuple[dict[str, Encoded], dict[str, np.ndarray]]:
    """Encode a whole update (name -> delta), tensor by tensor. With ``2bit`` the residual from earlier
    rounds is added first and the new residual (what this encoding dropped) is returned; other codecs
    return none. The tensors named in ``exact`` travel as fp32 whatever ``codec`` (nothing dropped)."""
    out: dict[str, Encoded] = {}
    new_residual: dict[str, np.ndarray] = {}
    for name, delta in update.items():
        value = np.asarray(delta, np.float32)
        mine = "fp32" if name in exact else codec
        if mine == "2bit" and residual and name in residual and residual[name].shape == value.shape:
            value = value + residual[name]
        enc, decoded = encode_tensor(value, mine)
        out[name] = enc
        if mine == "2bit":
            new_residual[name] = (value - decoded).astype(np.float32)
    return out, new_residual


def update_bytes(encoded: dict[str, Encoded]) -> int:
    return sum(e.nbytes for e in encoded.values())
