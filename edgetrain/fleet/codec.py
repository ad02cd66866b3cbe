"""Update compression: what a client sends up instead of float32 arrays.

Each tensor travels as ``(lo, scale)`` (two float32) followed by its codes:

- ``fp32``: the raw little-endian float32 values (no codes, no header): the baseline.
- ``int8``: per-tensor affine, ``x ~ lo + q * scale`` with ``q`` in 0..255; error <= scale / 2.
- ``2bit``: per-tensor affine with four levels, four codes per byte, and *error feedback*: what the
  quantizer dropped (``residual``) stays on the device and is added to the next round's update, so
  over rounds the sum of what was sent equals the sum of the true updates minus one residual.
- ``ternary``: sparse ternary compression (STC, Sattler et al. 2019): of each tensor only the
  ``k = max(ceil(n * density), MIN_KEEP)`` (``--ternary-density``, ``--ternary-min-keep``) largest magnitudes
  travel, each as ``+-scale`` with one shared scale (the mean magnitude of the kept entries, rounded to
  bfloat16: what the receiver decodes is what the sender subtracts). The rest stays in an error-feedback
  residual, of which the next round's update gets ``RESIDUAL_DECAY`` (0.5; ``decay`` in ``encode_update``; 1,
  all of it, was the codec before). Payload: ``k`` as a
  LEB128 varint, then (when ``k > 0``) the scale's two bfloat16 bytes, then a bit stream of ``k`` entries in
  position order, each the gap to the previous kept position Golomb-Rice coded (parameter
  ``floor(log2(n / k))``, derived, not sent) followed by its sign bit, zero-padded to a byte. For the
  digits head's 320 weights at one entry in 80 that is 8 bytes against 1,280 in float32. (zlib or lzma over the
  gap stream was measured larger: their headers alone exceed these payloads; tools/bench_fleet.py.)

With ``ternary`` SCAFFOLD's control deltas do not travel: both sides derive them from the decoded weight
delta (``derived_control``), so the coordinator's control variate stays the mean of the devices' exactly.

With ``ternary`` the tensors no gradient trains (BatchNorm's running statistics, ``exact`` in
``encode_update``) go up as ``int8s`` deltas (symmetric int8, see below) with error feedback, not as
float32 (as float32 those two numbers a channel were 256 of a 647-byte message on the digits model's last
two layers); what rounding drops arrives next round.

The downlink (with ``ternary``) is the global arrays as a delta against what each device last received,
``int8s`` per tensor or sized as the uplink is to ``--downlink-ratio`` times fewer bytes than float32, with
error feedback per device: see ``downlink_delta``.

The codec is pure NumPy; the wire object (Flower's ``Array``) is built from ``Encoded`` in ``apps``.
"""
from __future__ import annotations

import hashlib
import math
import struct
import zlib
from dataclasses import dataclass

import numpy as np

from ..errors import UsageError

CODECS = ("fp32", "int8", "2bit", "ternary")
DOWN = "int8s"  # symmetric int8: ternary's codec for BatchNorm's statistics, both ways
WIRE = CODECS + (DOWN,)
FEEDBACK = ("2bit", "ternary", DOWN)  # the codecs that keep what they dropped on the device (a residual)
# ternary: the default fraction of each weight tensor's entries sent each round, and how far a control
# variate moves towards its derived value each round (measured across seeds with tools/fleet_codec_sim.py:
# see the README's fleet section)
DENSITY = 0.09
CONTROL_STEP = 0.4
# ternary: at least this many entries of a tensor (all of a smaller one): a small tensor (a head, a bias) costs
# a few bytes more, and a few of its entries a round move nothing (measured: tools/fleet_codec_sim.py)
MIN_KEEP = 48
# ternary: the uplink's default bytes target, as a ratio to the message's float32 bytes (--uplink-ratio); 0:
# the fixed --ternary-density / --ternary-min-keep. 0 by default: sized to 100x, the head ended 14.7 points and
# bias 40.5 points below the fp32 fleet over 16 seeds, against 5.8 and 2.7 at the fixed density, both with the whole
# residual (README, "Sizing"; with RESIDUAL_DECAY 0.5 the sized head is 6.7 below on its 3-device split)
UPLINK_RATIO = 0.0
# ternary: the downlink's default bytes target, as a ratio to the message's float32 bytes (--downlink-ratio); 0:
# int8 deltas. 0 by default: sized to 16x (issue 38's goal), the head fleet on a uniform split ended 10.1 points
# below fp32 over 4 seeds, against 3.2 with int8 deltas (README, "Sizing")
DOWNLINK_RATIO = 0.0
# ternary: how much of the trained tensors' error-feedback residual is added to the next update (the statistics'
# always whole); 1: all of it (the codec before), 0: none. At 100x a device's residual holds many rounds of what
# it did not send (about n / k rounds' worth), so its top-k picks old, large entries and delivers them against a
# model that has moved since (with 30% of the devices asked a round, 3 rounds later on average). Measured with
# tools/fleet_codec_sim.py, head, 100x, 16 seeds, points below the fp32 fleet (README, "Error feedback"):
# Dirichlet 0.1 split 10.7 (1), 5.0 (0.5), 3.4 (0); IID 6.5 (1), 6.0 (0.5), 7.9 (0)
RESIDUAL_DECAY = 0.5
DOWNLINK_WHERE = "fleet downlink"  # where a device's error says it could not rebuild the arrays it was sent
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
    """Bytes one tensor of ``n`` values takes on the wire with ``codec`` (a fixed-size codec: not ternary)."""
    if codec == "ternary":
        raise ValueError("a ternary payload's size depends on its positions")
    if codec == "fp32":
        return 4 * n
    return _HEADER.size + (n if codec == "int8" else (n + 3) // 4)


def encode_tensor(x: np.ndarray, codec: str, density: float = DENSITY,
                  floor: int = MIN_KEEP) -> tuple[Encoded, np.ndarray]:
    """``x`` on the wire and what the receiver will decode (so the sender can keep the difference)."""
    x = np.array(x, dtype=np.float32, order="C")  # keeps a 0-d tensor 0-d (ascontiguousarray would not)
    if codec == "fp32":
        return Encoded(codec, tuple(x.shape), x.astype("<f4").tobytes()), x.copy()
    if codec == "ternary":
        return _ternary(x, density, floor)
    if codec == DOWN:
        return _sym8(x)
    if codec not in _BITS:
        raise UsageError(f"unknown update codec '{codec}'", "--codec", f"use one of {', '.join(CODECS)}")
    lo, scale, q = _affine(x, 1 << _BITS[codec])
    codes = q.tobytes() if codec == "int8" else _pack2(q)
    decoded = (np.float32(lo) + q.astype(np.float32) * np.float32(scale)).reshape(x.shape)
    return Encoded(codec, tuple(x.shape), _HEADER.pack(lo, scale) + codes), decoded


def decode_tensor(enc: Encoded) -> np.ndarray:
    """The float32 tensor ``enc`` stands for; a payload of the wrong length is refused."""
    n = int(np.prod(enc.shape)) if enc.shape else 1
    if enc.codec not in WIRE:
        raise ValueError(f"unknown codec '{enc.codec}'")
    if enc.codec == DOWN:
        return _unsym8(enc.data, n).reshape(enc.shape)
    if enc.codec == "ternary":
        return _unternary(enc.data, n).reshape(enc.shape)
    if len(enc.data) != payload_size(enc.codec, n):
        raise ValueError(f"{enc.codec} payload of {len(enc.data)} bytes does not hold {n} values")
    if enc.codec == "fp32":
        return np.frombuffer(enc.data, "<f4").astype(np.float32).reshape(enc.shape)
    lo, scale = _HEADER.unpack_from(enc.data)
    body = enc.data[_HEADER.size:]
    q = np.frombuffer(body, np.uint8) if enc.codec == "int8" else _unpack2(body, n)
    return (np.float32(lo) + q.astype(np.float32) * np.float32(scale)).reshape(enc.shape)


def encode_update(update: dict[str, np.ndarray], codec: str, residual: dict[str, np.ndarray] | None = None,
                  exact=(), density: float = DENSITY, floor: int = MIN_KEEP,
                  target: int | None = None,
                  decay: float | None = None) -> tuple[dict[str, Encoded], dict[str, np.ndarray]]:
    """Encode a whole update (name -> delta), tensor by tensor. With ``2bit`` or ``ternary`` the residual
    from earlier rounds is added first and the new residual (what this encoding dropped) is returned; other
    codecs return none. The tensors named in ``exact`` (no gradient trains them) travel as fp32 (nothing
    dropped), with ``ternary`` as ``int8s`` with error feedback (``stats_codec``).

    ``decay`` (with ``ternary``; None: ``RESIDUAL_DECAY``): the trained tensors' residual is multiplied by it
    before it is added (1: all of it; 0: none, and none is kept); the ``exact`` tensors' residual is added whole.

    ``target`` (with ``ternary``): the message's bytes budget; ``density`` and ``floor`` are then ignored and the
    codec sizes itself (``sized``): the trained tensors take what the statistics leave."""
    f = RESIDUAL_DECAY if decay is None else float(decay)
    if codec == "ternary" and f != 1:   # the trained tensors' residual scaled (none with 0), the statistics' whole
        residual = {k: v if k in exact else (v * np.float32(f)).astype(np.float32)
                    for k, v in (residual or {}).items() if f or k in exact}
    if codec == "ternary" and target is not None:
        out, new_residual = _encode_sized(update, residual, exact, int(target))
    else:
        out, new_residual = {}, {}
        for name in update:
            mine = stats_codec(codec) if name in exact else codec
            value = _with_residual(update, residual if mine in FEEDBACK else None, name)
            enc, decoded = encode_tensor(value, mine, density, floor)
            out[name] = enc
            if mine in FEEDBACK:
                new_residual[name] = (value - decoded).astype(np.float32)
    if codec == "ternary" and not f:
        new_residual = {k: v for k, v in new_residual.items() if k in exact}
    return out, new_residual


def _with_residual(update, residual, name: str) -> np.ndarray:
    value = np.asarray(update[name], np.float32)
    if residual and name in residual and residual[name].shape == value.shape:
        value = value + residual[name]
    return value


def _encode_sized(update: dict[str, np.ndarray], residual: dict[str, np.ndarray] | None, exact,
                  target: int) -> tuple[dict[str, Encoded], dict[str, np.ndarray]]:
    out: dict[str, Encoded] = {}
    new_residual: dict[str, np.ndarray] = {}
    for name in update:
        if name in exact:
            value = _with_residual(update, residual, name)
            out[name], decoded = encode_tensor(value, DOWN)
            new_residual[name] = (value - decoded).astype(np.float32)
    left = target - update_bytes(out)
    values = {k: _with_residual(update, residual, k) for k in update if k not in exact}
    enc = sized(values, left)
    for k, (e, decoded) in enc.items():
        out[k] = e
        if e.codec in FEEDBACK:
            new_residual[k] = (values[k] - decoded).astype(np.float32)
    return {k: out[k] for k in update}, new_residual


def sized(values: dict[str, np.ndarray], budget: int) -> dict[str, tuple[Encoded, np.ndarray]]:
    """``values`` (name -> tensor, residual included) in at most ``budget`` bytes, as exactly as fits: every
    tensor ``int8`` when that fits, else ``2bit``, else ternary with the one density shared by all tensors that
    is the largest to fit (found by bisection on the real encodings: the positions' bytes depend on where they
    fall); a tensor smaller than ``MIN_KEEP / DENSITY`` values gets the entries of one that size (the fixed
    defaults' floor, scaled with the density: a 320-value head is not starved by a large layer beside it);
    at least one entry a tensor (so a budget below one entry's bytes a tensor is exceeded by those).
    The receiver needs nothing of this: each payload names its codec, and a ternary one its entry count."""
    sizes = {k: int(v.size) for k, v in values.items()}
    for dense in ("int8", "2bit"):
        if sum(payload_size(dense, n) for n in sizes.values()) <= budget:
            return {k: encode_tensor(v, dense) for k, v in values.items()}
    total = sum(sizes.values())
    if not total:
        return {k: encode_tensor(v, "ternary", 0.0, 0) for k, v in values.items()}

    def at(d: float):  # a small tensor counts as MIN_KEEP / DENSITY values: the fixed defaults' floor, scaled
        enc = {k: _ternary(v, d, max(1, math.ceil(d * MIN_KEEP / DENSITY))) for k, v in values.items()}
        return enc, sum(e.nbytes for e, _ in enc.values())

    lo, hi = 0.0, 1.0
    best, _ = at(lo)  # one entry a tensor: the least this codec sends
    for _ in range(14):
        mid = (lo + hi) / 2
        enc, nbytes = at(mid)
        if nbytes <= budget:
            lo, best = mid, enc
        else:
            hi = mid
    return best


def derived_control(c_global: dict[str, np.ndarray], decoded: dict[str, np.ndarray], scale: float,
                    step: float = CONTROL_STEP) -> dict[str, np.ndarray]:
    """SCAFFOLD's control deltas with ternary, derived instead of sent: ``step * (-c - decoded / scale)``.

    SCAFFOLD moves a device's control variate to ``c_i - c + (x - y_i) / scale`` (``scale``: how far the
    weights move per unit of constant gradient over the round, ``fleet_scale``). Here ``y_i - x`` is the
    *decoded* weight delta, what the coordinator received (error feedback included), and ``c`` the control
    variate as the devices rebuilt it from the downlink: the device and the coordinator compute the same
    float32 delta from what both hold, so no control delta travels and the coordinator's ``c`` stays the
    mean of the devices' ``c_i`` exactly. One decoded ternary delta is sparse and carries earlier rounds'
    residual: moving ``step`` of the way each round averages it over rounds.
    """
    s, f = np.float32(scale), np.float32(step)
    return {k: (f * (-c_global[k] - decoded[k] / s)).astype(np.float32) for k in c_global}


def stats_codec(codec: str) -> str:
    """How the tensors no gradient trains (BatchNorm's running statistics) travel up with ``codec``."""
    return DOWN if codec == "ternary" else "fp32"


def update_bytes(encoded: dict[str, Encoded]) -> int:
    return sum(e.nbytes for e in encoded.values())


# --- ternary ---------------------------------------------------------------------------------------------

def keep_count(n: int, density: float = DENSITY, floor: int = MIN_KEEP) -> int:
    """How many entries of an ``n``-value tensor a ternary update sends: ``ceil(n * density)``, at least
    ``floor`` (and one), at most ``n``."""
    return min(n, max(1, floor, math.ceil(n * density))) if n else 0


def _bf16(value: float) -> tuple[bytes, np.float32]:
    """``value`` rounded to bfloat16 (nearest, ties to even): its two bytes and the float32 it decodes to."""
    u = int(np.array([value], "<f4").view("<u4")[0])
    if (u & 0x7F800000) != 0x7F800000:  # finite: round; inf/NaN: truncate (a NaN stays a NaN)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFFFFFF
    hi = u >> 16
    return struct.pack("<H", hi), np.array([hi << 16], "<u4").view("<f4")[0]


def _rice_param(n: int, k: int) -> int:
    return max(0, int(math.floor(math.log2(n / k)))) if k else 0


def _varint(v: int) -> bytes:
    out = bytearray()
    while True:
        out.append((v & 0x7F) | (0x80 if v > 0x7F else 0))
        v >>= 7
        if not v:
            return bytes(out)


def _ternary(x: np.ndarray, density: float, floor: int = MIN_KEEP) -> tuple[Encoded, np.ndarray]:
    flat = x.ravel()
    n = flat.size
    k = keep_count(n, density, floor)
    mag = np.abs(flat)
    # the k largest magnitudes, ties to the lower position (stable: the same update, the same bytes)
    kept = np.sort(np.argsort(-mag, kind="stable")[:k]) if k else np.zeros(0, np.int64)
    kept = kept[mag[kept] > 0]  # a zero is not sent (an all-zero tensor is one byte)
    k = kept.size
    decoded = np.zeros(n, np.float32)
    if not k:
        return Encoded("ternary", tuple(x.shape), _varint(0)), decoded.reshape(x.shape)
    raw, scale = _bf16(float(np.mean(mag[kept], dtype=np.float64)))
    b = _rice_param(n, k)
    bits, nbits, prev = 0, 0, -1
    for pos in kept.tolist():
        gap = pos - prev - 1
        prev = pos
        q, r = gap >> b, gap & ((1 << b) - 1)
        code = (((1 << q) - 1) << 1)  # q ones, then a zero
        code = (code << b) | r
        code = (code << 1) | int(flat[pos] < 0)
        width = q + 1 + b + 1
        bits = (bits << width) | code
        nbits += width
    pad = (-nbits) % 8
    stream = (bits << pad).to_bytes((nbits + pad) // 8, "big")
    signs = np.where(flat[kept] < 0, -scale, scale).astype(np.float32)
    decoded[kept] = signs
    return Encoded("ternary", tuple(x.shape), _varint(k) + raw + stream), decoded.reshape(x.shape)


def _unternary(data: bytes, n: int) -> np.ndarray:
    k, shift, i = 0, 0, 0
    while True:
        if i >= len(data) or i >= 5:
            raise ValueError(f"ternary payload of {len(data)} bytes has no entry count")
        k |= (data[i] & 0x7F) << shift
        shift += 7
        i += 1
        if not data[i - 1] & 0x80:
            break
    if k > n:
        raise ValueError(f"ternary payload names {k} entries of a tensor of {n} values")
    out = np.zeros(n, np.float32)
    if not k:
        if len(data) != i:
            raise ValueError(f"ternary payload of {len(data)} bytes does not hold 0 entries")
        return out
    if len(data) < i + 2:
        raise ValueError(f"ternary payload of {len(data)} bytes is truncated before its scale")
    (hi,) = struct.unpack_from("<H", data, i)
    scale = np.array([hi << 16], "<u4").view("<f4")[0]
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"ternary scale {float(scale)} is not a positive finite number")
    body = data[i + 2:]
    total = len(body) * 8
    bits = int.from_bytes(body, "big")
    b = _rice_param(n, k)
    at, prev = 0, -1  # `at`: bits read from the top

    def take(width: int) -> int:
        nonlocal at
        if at + width > total:
            raise ValueError(f"ternary payload of {len(data)} bytes is truncated: it does not hold {k} entries")
        at += width
        return (bits >> (total - at)) & ((1 << width) - 1)

    for _ in range(k):
        q = 0
        while take(1):
            q += 1
        pos = prev + 1 + ((q << b) | take(b))
        if pos >= n:
            raise ValueError(f"ternary payload names position {pos} of a tensor of {n} values")
        out[pos] = -scale if take(1) else scale
        prev = pos
    if total - at >= 8 or (total - at and bits & ((1 << (total - at)) - 1)):
        raise ValueError(f"ternary payload of {len(data)} bytes does not hold {k} entries (trailing bytes)")
    return out


# --- the downlink: a delta against what each device holds, with error feedback per device ------------------

_SCALE = struct.Struct("<f")


def _sym8(x: np.ndarray) -> tuple[Encoded, np.ndarray]:
    """Symmetric int8: ``x ~ q * scale``, ``q`` in -127..127 (a zero delta is exact); the codes raw-deflated
    when that is smaller (a payload of exactly ``n`` code bytes is raw, a shorter one deflated)."""
    x = np.array(x, dtype=np.float32, order="C")
    top = float(np.abs(x).max()) if x.size else 0.0
    scale = np.float32(top / 127.0) if top > 0 else np.float32(1.0)
    q = np.clip(np.rint(x / scale), -127, 127).astype(np.int8)
    codes = q.tobytes()
    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    packed = z.compress(codes) + z.flush()
    body = packed if len(packed) < len(codes) else codes
    return Encoded(DOWN, tuple(x.shape), _SCALE.pack(scale) + body), (q.astype(np.float32) * scale).reshape(x.shape)


def _unsym8(data: bytes, n: int) -> np.ndarray:
    if len(data) < _SCALE.size or len(data) > _SCALE.size + n:
        raise ValueError(f"{DOWN} payload of {len(data)} bytes does not hold {n} values")
    (scale,) = _SCALE.unpack_from(data)
    scale = np.float32(scale)
    if not (np.isfinite(scale) and scale > 0):
        raise ValueError(f"{DOWN} scale {float(scale)} is not a positive finite number")
    body = data[_SCALE.size:]
    if len(body) < n:  # deflated: exactly n code bytes, nothing after the stream (no bomb: at most n out)
        z = zlib.decompressobj(-15)
        try:
            codes = z.decompress(body, n)
        except zlib.error as exc:
            raise ValueError(f"{DOWN} payload does not inflate: {exc}") from None
        if len(codes) != n or not z.eof or z.unconsumed_tail or z.unused_data:
            raise ValueError(f"{DOWN} payload of {len(data)} bytes does not inflate to {n} values")
        body = codes
    q = np.frombuffer(body, np.int8)
    if np.any(q == -128):
        raise ValueError(f"{DOWN} payload holds a code outside -127..127")
    return q.astype(np.float32) * scale


def arrays_digest(arrays: dict[str, np.ndarray]) -> str:
    """Names, shapes and float32 bytes of ``arrays``: the coordinator's record of what it sent, which a
    device checks its reconstruction against."""
    h = hashlib.sha256()
    for k in sorted(arrays):
        v = np.ascontiguousarray(arrays[k], dtype="<f4")
        h.update(f"{k} {v.shape}\n".encode())
        h.update(v.tobytes())
    return h.hexdigest()


def _base(base: dict[str, np.ndarray], k: str, like: np.ndarray) -> np.ndarray:
    b = base.get(k)
    return b.astype(np.float32) if b is not None and b.shape == like.shape else np.zeros(like.shape, np.float32)


def downlink_delta(target: dict[str, np.ndarray], held: dict[str, np.ndarray], exact=(),
                   ratio: float = DOWNLINK_RATIO) -> tuple[dict[str, Encoded], dict[str, np.ndarray]]:
    """The global arrays ``target`` as a delta against ``held`` (what this device reconstructed last; empty:
    zeros), and what the device reconstructs from it (``downlink_apply``). The coordinator keeps that as this
    device's next base, so what this message dropped is in its next delta (error feedback per device: over the
    messages nothing is lost).

    ``ratio`` 0: ``int8s`` per tensor (symmetric int8, deflated when smaller), the tensors named in ``exact``
    (BatchNorm statistics) as float32 deltas. ``ratio`` R > 0: at most 1/R of the float32 bytes (the uplink's
    ``sized`` codec), the ``exact`` tensors ``int8s`` first, or float32 where ``int8s`` would take a tensor the
    target holds >= 0 below zero (a variance)."""
    values = {k: (np.asarray(v, np.float32) - _base(held, k, np.asarray(v))).astype(np.float32)
              for k, v in target.items()}
    exact = set(exact) & set(values)
    if ratio > 0:
        enc, _ = _encode_sized(values, None, exact, int(sum(4 * v.size for v in values.values()) // ratio))
    else:
        enc = {k: encode_tensor(v, "fp32" if k in exact else DOWN)[0] for k, v in values.items()}
    new = downlink_apply(held, {k: decode_tensor(e) for k, e in enc.items()})
    for k in exact:
        if values[k].size and np.min(target[k]) >= 0 > np.min(new[k]):
            enc[k] = encode_tensor(values[k], "fp32")[0]
            new[k] = downlink_apply(held, {k: values[k]})[k]
    return enc, new


def downlink_apply(held: dict[str, np.ndarray], deltas: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A device's side of ``downlink_delta``: the same float32 sums, so the same arrays bit for bit."""
    return {k: (_base(held, k, d) + np.asarray(d, np.float32)).astype(np.float32) for k, d in deltas.items()}
