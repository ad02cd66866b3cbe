"""The fleet's update codec: round-trip error bounds for every codec and shape class, payload sizes,
and 2-bit error feedback carrying what one round dropped into the next (pure NumPy, no Flower)."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from edgetrain.fleet.codec import (CODECS, Encoded, decode_tensor, encode_tensor, encode_update, payload_size,
                                   update_bytes)

SHAPES = [(), (1,), (7,), (10, 32), (3, 5, 2, 2), (1001,)]
KINDS = ["normal", "constant", "zeros", "outlier", "tiny", "huge"]


def _tensor(kind: str, shape, rng) -> np.ndarray:
    x = rng.normal(size=shape).astype(np.float32)
    if kind == "constant":
        x = np.full(shape, 0.37, np.float32)
    elif kind == "zeros":
        x = np.zeros(shape, np.float32)
    elif kind == "outlier" and x.size:
        x.flat[0] = 1000.0
    elif kind == "tiny":
        x *= 1e-6
    elif kind == "huge":
        x *= 1e6
    return x


FIXED = [c for c in CODECS if c != "ternary"]  # the codecs whose payload size depends on the size alone


@pytest.mark.parametrize("codec", FIXED)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", KINDS)
def test_round_trip_is_within_half_a_step_and_payload_is_the_promised_size(codec, shape, kind):
    rng = np.random.RandomState(hash((codec, shape, kind)) % 2**31)
    x = _tensor(kind, shape, rng)
    enc, decoded = encode_tensor(x, codec)
    back = decode_tensor(Encoded(enc.codec, enc.shape, bytes(enc.data)))  # what the receiver gets
    assert back.shape == x.shape and back.dtype == np.float32
    np.testing.assert_array_equal(back, decoded)  # the sender knows exactly what was received
    assert enc.nbytes == payload_size(codec, x.size)
    if codec == "fp32":
        np.testing.assert_array_equal(back, x)
        return
    levels = 256 if codec == "int8" else 4
    step = (float(x.max()) - float(x.min())) / (levels - 1) if x.size else 0.0
    err = np.abs(back.astype(np.float64) - x)
    assert err.max(initial=0.0) <= step / 2 + 1e-6 * max(1.0, float(np.abs(x).max(initial=0.0)))
    if kind in ("constant", "zeros"):
        np.testing.assert_array_equal(back, x)  # a flat tensor is exact


def test_compressed_sizes_against_float32():
    n = 330  # the digits model's output layer (10 x 32 + 10), as in the benchmark
    assert 4 * n / payload_size("int8", n) >= 3.5
    assert 4 * n / payload_size("2bit", n) >= 12
    x = {"w": np.ones((10, 32), np.float32), "b": np.ones(10, np.float32)}
    assert update_bytes(encode_update(x, "int8")[0]) == payload_size("int8", 320) + payload_size("int8", 10)


@pytest.mark.parametrize("bad", [b"", b"\x00" * 7, b"\x00" * 100])
def test_a_payload_of_the_wrong_length_is_refused(bad):
    with pytest.raises(ValueError, match="does not hold"):
        decode_tensor(Encoded("int8", (10, 32), bad))


def test_unknown_codec_is_a_usage_error():
    from edgetrain.errors import UsageError

    with pytest.raises(UsageError, match="unknown update codec"):
        encode_tensor(np.ones(3, np.float32), "4bit")


@pytest.mark.parametrize("seed", range(5))
def test_error_feedback_accumulates_what_was_dropped(seed):
    """Over R rounds: sum(decoded) == sum(true updates) - final residual, and the residual stays bounded,
    so nothing dropped is lost; without feedback the sum drifts by the quantizer's bias."""
    rng = np.random.RandomState(seed)
    shape = (10, 32)
    residual: dict = {}
    sent = np.zeros(shape, np.float64)
    true = np.zeros(shape, np.float64)
    plain = np.zeros(shape, np.float64)
    bias = rng.normal(scale=0.01, size=shape)  # a steady small push that 2-bit alone would round away
    for _ in range(40):
        delta = (bias + rng.normal(scale=0.05, size=shape)).astype(np.float32)
        before = {k: v.copy() for k, v in residual.items()}
        enc, residual = encode_update({"w": delta}, "2bit", residual)
        decoded = decode_tensor(enc["w"])
        # this round's residual is exactly what this round failed to send of (delta + old residual)
        np.testing.assert_allclose(residual["w"], delta + before.get("w", 0) - decoded, atol=1e-6)
        sent += decoded
        true += delta
        plain += decode_tensor(encode_update({"w": delta}, "2bit")[0]["w"])
    np.testing.assert_allclose(sent, true - residual["w"], atol=1e-4)
    assert np.abs(residual["w"]).max() < 0.2  # bounded: half a step of the last round's range
    assert np.abs(sent - true).mean() < np.abs(plain - true).mean()


def test_other_codecs_keep_no_residual():
    for codec in ("fp32", "int8"):
        _, residual = encode_update({"w": np.ones(4, np.float32)}, codec, {"w": np.ones(4, np.float32)})
        assert residual == {}


def test_a_residual_of_another_shape_is_not_added():
    enc, _ = encode_update({"w": np.zeros(4, np.float32)}, "2bit", {"w": np.ones(5, np.float32)})
    np.testing.assert_array_equal(decode_tensor(enc["w"]), np.zeros(4))


@pytest.mark.parametrize("codec", ["int8", "2bit"])
def test_tensors_named_exact_travel_as_float32_whatever_the_codec(codec):
    """BatchNorm running statistics (``exact``) go up bit for bit and leave no residual; the rest is coded
    (with ternary they go as int8 deltas with error feedback: below)."""
    rng = np.random.RandomState(1)
    update = {"w": rng.normal(size=(8, 4)).astype(np.float32), "running_var": rng.normal(size=16).astype(np.float32)}
    enc, residual = encode_update(update, codec, exact={"running_var"})
    assert enc["running_var"].codec == "fp32" and enc["w"].codec == codec
    np.testing.assert_array_equal(decode_tensor(enc["running_var"]), update["running_var"])
    assert "running_var" not in residual and ("w" in residual) == (codec == "2bit")
    assert enc["w"].nbytes == payload_size(codec, 32) and enc["running_var"].nbytes == 4 * 16


@pytest.mark.parametrize("seed", range(4))
def test_with_ternary_the_statistics_go_as_int8_deltas_whose_error_feedback_sums_exactly(seed):
    """``exact`` tensors with ternary: symmetric int8 (``int8s``, deflated when smaller), what rounding dropped
    kept in the residual and added next round: sum(decoded) == sum(true) - residual, and the residual stays
    within half a code step of the round's largest value; the wire payload decodes to what the sender kept."""
    from edgetrain.fleet.codec import DOWN, stats_codec

    assert stats_codec("ternary") == DOWN and all(stats_codec(c) == "fp32" for c in ("fp32", "int8", "2bit"))
    rng = np.random.RandomState(seed)
    residual: dict = {}
    sent = np.zeros(32, np.float64)
    true = np.zeros(32, np.float64)
    for r in range(30):
        update = {"w": rng.normal(size=(10, 32)).astype(np.float32),
                  "running_var": (rng.normal(scale=10.0 ** rng.uniform(-6, 2), size=32)).astype(np.float32)}
        if r == 7:
            update["running_var"][:] = 0  # a round that moved nothing: exact zeros (plus the residual)
        before = residual.get("running_var", np.zeros(32, np.float32)).copy()
        enc, residual = encode_update(update, "ternary", residual, exact={"running_var"})
        assert enc["running_var"].codec == DOWN and enc["w"].codec == "ternary"
        value = update["running_var"] + before
        back = decode_tensor(Encoded(DOWN, enc["running_var"].shape, bytes(enc["running_var"].data)))
        np.testing.assert_array_equal(residual["running_var"], value - back)
        assert np.abs(residual["running_var"]).max() <= np.abs(value).max() / 254 * (1 + 1e-6) + 1e-30
        assert enc["running_var"].nbytes <= 4 + 32  # one float32 scale, at most a byte a value
        sent += back
        true += update["running_var"]
    np.testing.assert_allclose(sent, true - residual["running_var"], rtol=1e-5, atol=1e-5)


# --- ternary (sparse ternary compression with error feedback) --------------------------------------------

@pytest.mark.parametrize("shape", SHAPES + [(64, 300)])
@pytest.mark.parametrize("kind", KINDS + ["ties", "sparse"])
def test_ternary_sends_the_k_largest_as_one_scale_and_the_receiver_decodes_what_the_sender_kept(shape, kind):
    from edgetrain.fleet.codec import keep_count

    rng = np.random.RandomState(hash((shape, kind)) % 2**31)
    x = _tensor(kind, shape, rng)
    if kind == "ties":
        x = np.sign(rng.normal(size=shape)).astype(np.float32)  # every magnitude equal
    elif kind == "sparse" and x.size:
        x = np.where(rng.uniform(size=shape) < 0.002, x, 0).astype(np.float32)
    enc, decoded = encode_tensor(x, "ternary")
    back = decode_tensor(Encoded(enc.codec, enc.shape, bytes(enc.data)))
    assert back.shape == x.shape and back.dtype == np.float32
    np.testing.assert_array_equal(back, decoded)
    kept = np.flatnonzero(back.ravel())
    assert kept.size <= keep_count(x.size)
    assert kept.size == min(keep_count(x.size), np.count_nonzero(x))  # nothing nonzero is skipped while k allows
    if kept.size:
        mags = np.abs(x.ravel())
        assert mags[kept].min() >= np.delete(mags, kept).max(initial=0.0)  # the largest magnitudes
        assert np.all(np.sign(back.ravel()[kept]) == np.sign(x.ravel()[kept]))  # their signs
        scale = np.abs(back.ravel()[kept])
        assert np.all(scale == scale[0])  # one shared scale ...
        assert abs(scale[0] - mags[kept].mean()) <= mags[kept].mean() * 2 ** -8  # ... their mean, to bfloat16
    # the payload: count, scale, and about log2(n/k) + 3 bits per kept entry, never more than int8's
    assert enc.nbytes <= 1 + 2 + kept.size * (np.log2(max(x.size, 1) / max(kept.size, 1)) + 3) / 8 + 2
    assert enc.nbytes < payload_size("int8", x.size) or x.size <= 4


def test_ternary_is_at_least_100x_smaller_than_float32_on_the_digits_head_at_one_in_80():
    rng = np.random.RandomState(0)
    update = {"w": rng.normal(size=(10, 32)).astype(np.float32), "b": rng.normal(size=10).astype(np.float32)}
    update.update({"control/" + k: v * 0.1 for k, v in update.items()})  # SCAFFOLD's control deltas travel too
    enc, _ = encode_update(update, "ternary", {}, density=1 / 80, floor=1)
    fp32 = sum(4 * v.size for v in update.values())
    assert fp32 / update_bytes(enc) >= 100


def test_ternary_defaults_are_at_least_100x_smaller_than_float32_on_the_last_two_layers():
    """--train-layers last:2 of the digits model (the bench's goal configuration): conv 32x32x3x3, BatchNorm
    (gamma, beta trained; running statistics as int8 deltas), the head. SCAFFOLD's control deltas do not
    travel with ternary (both sides derive them: one float32 scale goes up instead); the fp32 fleet sends them."""
    rng = np.random.RandomState(0)
    shapes = {"conv": (32, 32, 3, 3), "gamma": (32,), "beta": (32,), "w": (10, 32), "b": (10,)}
    update = {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}
    controls = sum(4 * v.size for v in update.values())
    update.update({"mean": rng.normal(size=32).astype(np.float32), "var": rng.normal(size=32).astype(np.float32)})
    enc, _ = encode_update(update, "ternary", {}, exact={"mean", "var"})
    fp32 = sum(4 * v.size for v in update.values()) + controls
    assert fp32 / (update_bytes(enc) + 4) >= 100
    assert np.count_nonzero(decode_tensor(enc["w"])) == 48  # the floor: a small tensor sends more than 9 in 100
    assert enc["var"].codec == "int8s" and enc["var"].nbytes <= 4 + 32


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("step", [0.25, 0.5, 1.0])
def test_derived_control_keeps_the_coordinators_control_variate_the_mean_of_the_devices(seed, step):
    """Ternary's SCAFFOLD: each device moves c_i by derived_control(c, decoded own update, its scale), the
    coordinator moves c by the mean of the same deltas, computed from the bytes it received: after any
    number of rounds c is the mean of the c_i (what SCAFFOLD's correction c - c_i needs), and each side's
    delta is the other's bit for bit. Compressed control deltas with error feedback (the earlier protocol)
    leave c behind by the devices' unsent residuals."""
    from edgetrain.fleet.codec import derived_control, encode_tensor

    rng = np.random.RandomState(seed)
    shape, devices = (32, 32, 3, 3), 3
    c = np.zeros(shape, np.float32)  # the coordinator's, as the devices rebuild it (exact here)
    mine = [np.zeros(shape, np.float32) for _ in range(devices)]
    residual = [np.zeros(shape, np.float32) for _ in range(devices)]
    bias = [rng.normal(scale=0.01, size=shape) for _ in range(devices)]  # non-IID: each device its own pull
    for _ in range(12):
        moves = []
        for i in range(devices):
            scale = float(np.float32(rng.uniform(0.05, 0.5)))
            true = (bias[i] + rng.normal(scale=0.005, size=shape) + scale * (c - mine[i])).astype(np.float32)
            enc, decoded = encode_tensor(true + residual[i], "ternary")
            residual[i] = (true + residual[i] - decoded).astype(np.float32)
            sent = Encoded(enc.codec, enc.shape, bytes(enc.data))  # what crossed the wire
            theirs = derived_control({"k": c}, {"k": decode_tensor(sent)}, scale, step)["k"]
            ours = derived_control({"k": c}, {"k": decoded}, scale, step)["k"]
            np.testing.assert_array_equal(theirs, ours)
            mine[i] = (mine[i] + ours).astype(np.float32)
            moves.append(theirs)
        c = (c + np.mean(moves, axis=0)).astype(np.float32)
        np.testing.assert_allclose(c, np.mean(mine, axis=0), rtol=0, atol=1e-5 * float(np.abs(c).max()) + 1e-7)
    assert np.abs(c).max() > 0.01  # it moved: the test compares something


@pytest.mark.parametrize("seed", range(5))
def test_ternary_error_feedback_sends_everything_eventually(seed):
    """With ``decay=1.0`` (the whole residual, the codec before RESIDUAL_DECAY): sum(decoded) == sum(true
    updates) - final residual, exactly round by round; and the residual stays bounded, so every
    coordinate's push arrives (plain top-k without feedback never sends the small ones)."""
    rng = np.random.RandomState(seed)
    shape = (10, 32)
    residual: dict = {}
    sent = np.zeros(shape, np.float64)
    true = np.zeros(shape, np.float64)
    bias = rng.normal(scale=0.01, size=shape)
    biggest = 0.0
    for _ in range(200):
        delta = (bias + rng.normal(scale=0.002, size=shape)).astype(np.float32)
        biggest = max(biggest, float(np.abs(delta).max()))
        before = residual.get("w", np.zeros(shape, np.float32)).copy()
        enc, residual = encode_update({"w": delta}, "ternary", residual, decay=1.0)
        decoded = decode_tensor(enc["w"])
        np.testing.assert_array_equal(residual["w"], (delta + before) - decoded)
        sent += decoded
        true += delta
    np.testing.assert_allclose(sent, true - residual["w"], atol=1e-4)
    # bounded: a coordinate waits at most about n/k rounds for its turn, whatever the number of rounds
    from edgetrain.fleet.codec import keep_count

    assert np.abs(residual["w"]).max() <= 2 * (delta.size / keep_count(delta.size)) * biggest
    assert np.corrcoef(sent.ravel(), true.ravel())[0, 1] > 0.95


def _ternary_payload(n=320, seed=0) -> bytes:
    x = np.random.RandomState(seed).normal(size=n).astype(np.float32)
    return encode_tensor(x, "ternary")[0].data


def test_hostile_ternary_payloads_are_refused_with_a_reason():
    good = _ternary_payload()
    cases = {
        b"": "no entry count",
        b"\xff\xff\xff\xff\xff\xff": "no entry count",
        good[:1]: "truncated before its scale",
        good[:3]: "truncated",
        good[:-1]: "truncated",
        good + b"\x00": "trailing bytes",
        good + b"\x00\x00": "trailing bytes",
        bytes([0]) + b"\x00": "does not hold 0 entries",
        bytes([200, 2]) + good[1:]: "names 328 entries",  # more entries than values
    }
    for payload, why in cases.items():
        with pytest.raises(ValueError, match=why):
            decode_tensor(Encoded("ternary", (320,), payload))


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -1.0, 0.0, -0.0])
def test_a_ternary_scale_that_is_not_positive_and_finite_is_refused(scale):
    good = _ternary_payload()
    hi = int(np.array([scale], "<f4").view("<u4")[0]) >> 16
    bad = good[:1] + struct.pack("<H", hi) + good[3:]
    with pytest.raises(ValueError, match="not a positive finite number"):
        decode_tensor(Encoded("ternary", (320,), bad))


def test_a_ternary_position_beyond_the_tensor_is_refused():
    # one entry whose gap (all ones in the Rice code's unary part, then a zero) points past a 10-value tensor
    payload = b"\x01" + b"\x80\x3f" + bytes([0b11111111, 0b11111110, 0, 0])[:2]
    with pytest.raises(ValueError, match="position|truncated|trailing"):
        decode_tensor(Encoded("ternary", (10,), payload))
    with pytest.raises(ValueError, match="names position"):
        decode_tensor(Encoded("ternary", (10,), b"\x01\x80\x3f" + bytes([0b11111111, 0b00000000])))


def test_the_ternary_encoding_is_deterministic():
    x = np.random.RandomState(3).normal(size=(10, 32)).astype(np.float32)
    assert encode_tensor(x, "ternary")[0].data == encode_tensor(x.copy(), "ternary")[0].data


# --- the downlink: a delta against each device's base, with error feedback --------------------------------------------

def _rounds(seed=0, n_rounds=30):
    """A global model drifting round by round, as the coordinator's arrays do."""
    rng = np.random.RandomState(seed)
    g = {"w": rng.normal(size=(10, 32)).astype(np.float32), "b": rng.normal(size=10).astype(np.float32),
         "running_var": rng.uniform(0.5, 2, size=16).astype(np.float32)}
    out = []
    for _ in range(n_rounds):
        g = {k: (v + rng.normal(scale=0.05, size=v.shape)).astype(np.float32) for k, v in g.items()}
        out.append(g)
    return out


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("ratio", [0, 16])
def test_a_device_that_skips_rounds_rebuilds_the_coordinators_record_and_error_feedback_closes_the_gap(seed, ratio):
    """The per-device downlink: a device asked in a few rounds only (as with --fraction 0.3) gets each time a
    delta against what it rebuilt last (--downlink-ratio 16: in <= 1/16 of the float32 bytes; 0: int8 codes, the
    statistics float32); it rebuilds exactly what the coordinator recorded for it (bit for bit, from the bytes on
    the wire), its running variance stays >= 0, and once the model stops moving the messages close what earlier
    ones dropped (error feedback: nothing is lost; ternary at 16x closes a heavy-tailed gap slowly: to under a
    quarter in 80 messages; int8 at once, to within its rounding)."""
    from edgetrain.fleet.codec import arrays_digest, downlink_apply, downlink_delta

    targets = _rounds(seed, 30)
    initial = {k: v - 0.3 for k, v in targets[0].items()}  # round 0: what both sides start from
    asked = sorted(np.random.RandomState(seed).choice(30, 9, replace=False))
    held_coord, held_device, gaps = initial, dict(initial), []

    def send(target):
        nonlocal held_coord, held_device
        enc, held_coord = downlink_delta(target, held_coord, exact={"running_var"}, ratio=ratio)
        wire = {k: Encoded(e.codec, e.shape, bytes(e.data)) for k, e in enc.items()}
        held_device = downlink_apply(held_device, {k: decode_tensor(e) for k, e in wire.items()})
        assert arrays_digest(held_device) == arrays_digest(held_coord)  # exactly what the coordinator recorded
        if ratio:
            assert update_bytes(enc) * ratio <= sum(4 * v.size for v in target.values())
        else:
            assert enc["running_var"].codec == "fp32" and enc["w"].codec == "int8s"
            np.testing.assert_allclose(held_coord["running_var"], target["running_var"], rtol=1e-6)
        assert held_device["running_var"].min() >= 0
        gaps.append(max(float(np.abs(held_device[k] - target[k]).max()) for k in target))

    for r in asked:  # it skipped the rounds in between: one delta spans them
        send(targets[r])
    assert max(gaps) < 3.0  # the arrays move ~0.05 a round in each entry and ~9 rounds a skip: the error stays bounded
    final = targets[asked[-1]]
    for _ in range(80):  # the model no longer moves: what the earlier messages dropped arrives
        send(final)
    closing = gaps[len(asked) - 1::20]
    if ratio:
        assert all(b < a for a, b in zip(closing, closing[1:])) and closing[-1] < 0.25 * closing[0], closing
    else:  # one int8 step of what is left: each message leaves at most half a step of the one before
        assert gaps[len(asked)] <= gaps[len(asked) - 1] / 127 + 1e-6 and gaps[-1] < 1e-6, gaps


def test_the_downlink_sends_a_variance_as_float32_where_int8_would_take_it_below_zero():
    from edgetrain.fleet.codec import downlink_apply, downlink_delta

    held = {"w": np.ones(64, np.float32), "running_var": np.full(16, 3.0, np.float32)}
    target = {"w": np.zeros(64, np.float32), "running_var": np.full(16, 3.0, np.float32)}
    target["running_var"][1] = 10.0  # sets the int8 step: 7 / 127
    held["running_var"][0] = 54.6 * 7 / 127  # ... of which the delta to a variance near zero is -54.6 steps: -55
    target["running_var"][0] = 1e-9
    enc, new = downlink_delta(target, held, exact={"running_var"}, ratio=16)
    assert enc["running_var"].codec == "fp32" and new["running_var"].min() >= 0
    np.testing.assert_array_equal(new["running_var"], downlink_apply(held, {"running_var": target["running_var"]
                                                                             - held["running_var"]})["running_var"])
    target["running_var"][0] = 2.0
    enc, new = downlink_delta(target, held, exact={"running_var"}, ratio=16)
    assert enc["running_var"].codec == "int8s"  # int8 keeps it >= 0 here: the cheaper codec


def test_a_stale_base_does_not_rebuild_the_record():
    from edgetrain.fleet.codec import arrays_digest, downlink_apply, downlink_delta

    r1, r2, r3 = _rounds(5, 3)
    _, held1 = downlink_delta(r1, {})
    enc2, held2 = downlink_delta(r2, held1)
    enc3, held3 = downlink_delta(r3, held2)
    skipped = downlink_apply(held1, {k: decode_tensor(e) for k, e in enc3.items()})  # it missed round 2
    assert arrays_digest(skipped) != arrays_digest(held3)


def _down_payload(n=320):
    x = np.zeros(n, np.float32)
    x[::7] = 1.0  # compressible: deflated
    return encode_tensor(x, "int8s")[0].data


def test_hostile_downlink_payloads_are_refused_with_a_reason():
    good = _down_payload()
    assert len(good) < 4 + 320  # deflated
    raw = struct.pack("<f", 0.01) + bytes(320)
    nan = struct.pack("<f", float("nan")) + good[4:]
    cases = {b"": "does not hold", good[:3]: "does not hold", raw + b"\x00": "does not hold",
             good[:-2]: "inflate", good[:4] + b"\xff" * 20: "inflate", nan: "not a positive finite",
             struct.pack("<f", -1.0) + good[4:]: "not a positive finite",
             struct.pack("<f", 0.01) + b"\x80" * 320: "outside -127..127"}
    # a deflate bomb: a short stream that inflates far beyond 320 bytes is cut at 320 and refused
    import zlib

    z = zlib.compressobj(9, zlib.DEFLATED, -15)
    cases[struct.pack("<f", 0.01) + z.compress(bytes(10**5)) + z.flush()] = "does not inflate to 320"
    for payload, why in cases.items():
        with pytest.raises(ValueError, match=why):
            decode_tensor(Encoded("int8s", (320,), payload))
    np.testing.assert_array_equal(decode_tensor(Encoded("int8s", (320,), raw)), np.zeros(320))


@pytest.mark.parametrize("density", [0.001, 0.0125, 0.1, 0.5, 1.0])
def test_the_ternary_density_sets_how_many_entries_go_up(density):
    from edgetrain.fleet.codec import keep_count

    x = np.random.RandomState(7).normal(size=(10, 32)).astype(np.float32)
    enc, decoded = encode_tensor(x, "ternary", density, floor=1)
    back = decode_tensor(enc)  # the receiver needs no density: the count travels
    np.testing.assert_array_equal(back, decoded)
    assert np.count_nonzero(back) == keep_count(x.size, density, 1) == min(x.size, max(1, int(np.ceil(320 * density))))
    assert keep_count(x.size, density, 48) == min(x.size, max(48, int(np.ceil(320 * density))))


def test_the_fleet_serve_defaults_are_the_codecs():
    from edgetrain.fleet import codec
    from edgetrain.options import FleetServeOptions

    opts = FleetServeOptions.unchecked()
    assert (opts.ternary_density, opts.ternary_control_step, opts.ternary_min_keep, opts.uplink_ratio,
            opts.downlink_ratio) == (codec.DENSITY, codec.CONTROL_STEP, codec.MIN_KEEP, codec.UPLINK_RATIO,
                                     codec.DOWNLINK_RATIO)


@pytest.mark.parametrize("sizes", [{"w": (10, 32), "b": (10,)}, {"conv": (32, 16, 3, 3), "fc": (10, 32), "b": (10,)}])
@pytest.mark.parametrize("ratio", [100, 30, 20])
def test_the_ternary_codec_sizes_each_message_to_its_bytes_target(sizes, ratio):
    """--uplink-ratio: the message (the trained tensors) fits float32 bytes / ratio, spends most of it, decodes
    without knowing the target, and keeps exactly what it did not send."""
    from edgetrain.fleet.codec import decode_tensor, encode_update, update_bytes

    rng = np.random.default_rng(ratio)
    update = {k: rng.standard_normal(shape).astype(np.float32) for k, shape in sizes.items()}
    residual = {k: (0.1 * rng.standard_normal(v.shape)).astype(np.float32) for k, v in update.items()}
    target = sum(4 * v.size for v in update.values()) // ratio
    enc, new_res = encode_update(update, "ternary", residual, target=target, decay=1.0)
    spent = update_bytes(enc)
    assert spent <= target and spent >= 0.8 * target, (spent, target)
    for k, v in update.items():
        np.testing.assert_array_equal(new_res[k], (v + residual[k]) - decode_tensor(enc[k]))
    # more bytes, more entries (ternary all along at these ratios)
    more, _ = encode_update(update, "ternary", residual, target=2 * target)
    assert all(e.codec == "ternary" for e in enc.values())
    assert sum(np.count_nonzero(decode_tensor(e)) for e in more.values()) > sum(
        np.count_nonzero(decode_tensor(e)) for e in enc.values())


def test_a_generous_bytes_target_buys_levels_not_only_entries():
    from edgetrain.fleet.codec import encode_update, update_bytes

    update = {"w": np.linspace(-1, 1, 320, dtype=np.float32).reshape(10, 32), "b": np.ones(10, np.float32)}
    for target, codec in ((330 + 16, "int8"), (330 // 4 + 2 + 16, "2bit"), (60, "ternary")):
        enc, res = encode_update(update, "ternary", {}, target=target, decay=1.0)
        assert {e.codec for e in enc.values()} == {codec} and update_bytes(enc) <= target
        assert set(res) == set(update) if codec != "int8" else True


@pytest.mark.parametrize("bad", ["0", "-0.1", "1.5", "nan", "x"])
def test_a_bad_ternary_density_or_update_norm_is_refused_in_one_line(bad, tmp_path):
    from clitools import assert_user_error, run_edgetrain

    for flag in ("--ternary-density", "--ternary-control-step", "--max-update-norm", "--downlink-ratio"):
        if flag in ("--max-update-norm", "--downlink-ratio") and bad in ("1.5", "0"):
            continue  # a norm bound of 1.5 is fine, and a downlink ratio of 1.5 or 0
        res = run_edgetrain("fleet", "serve", "edgetrain.nets:pretrained_digits", "--val", tmp_path / "v.npz",
                            "-o", tmp_path / "r", "--codec", "ternary", flag, bad)
        assert_user_error(res, 2, flag)


def test_a_device_rebuilds_from_its_base_replays_its_round_and_refuses_a_stale_base(tmp_path):
    """client.received with real state files: round 1 from the model's initial arrays (computed on the device,
    checked against the coordinator's digest), round 2 from round 1's arrays, round 2 asked again (the same
    arrays, nothing applied twice), round 3 from round 1's (the base of what it holds: the coordinator had not
    saved that it took round 2), the arrays whole; a delta against a round this device does not hold, or one that
    does not rebuild the coordinator's record, fails the round."""
    from edgetrain.errors import RunFailed
    from edgetrain.fleet.client import received
    from edgetrain.fleet.codec import arrays_digest, downlink_delta

    r0, r1, r2, r3, r4 = _rounds(9, 5)
    computed = []

    def initial():
        computed.append(1)
        return dict(r0)

    def message(target, held, base):
        enc, sent = downlink_delta(target, held)
        arrays = {k: decode_tensor(e) for k, e in enc.items()}
        config = {"down": "delta", "base": base, "base-digest": arrays_digest(held), "target-digest": arrays_digest(sent)}
        return arrays, config, sent

    a1, c1, s1 = message(r1, r0, 0)
    with pytest.raises(RunFailed, match="holds round none's"):  # other initial arrays than the coordinator's
        received(tmp_path, a1, {"round": 1, **c1}, lambda: {k: v + 1 for k, v in r0.items()})
    got = received(tmp_path, a1, {"round": 1, **c1}, initial)
    assert arrays_digest(got) == arrays_digest(s1) and computed == [1]
    a2, c2, s2 = message(r2, s1, 1)
    got = received(tmp_path, a2, {"round": 2, **c2}, initial)
    assert arrays_digest(got) == arrays_digest(s2)
    again = received(tmp_path, a2, {"round": 2, **c2})  # asked again: the same arrays, the delta not re-added
    assert arrays_digest(again) == arrays_digest(s2)
    a3, c3, s3 = message(r3, s1, 1)  # against round 1's arrays, the base of the round 2 it holds
    assert arrays_digest(received(tmp_path, a3, {"round": 3, **c3})) == arrays_digest(s3)
    a4, c4, s4 = message(r4, s2, 2)  # round 2's: neither what it holds (round 3's) nor their base (round 1's)
    with pytest.raises(RunFailed, match="holds round 3's"):
        received(tmp_path, a4, {"round": 4, **c4}, initial)
    a4, c4, s4 = message(r4, s3, 3)
    with pytest.raises(RunFailed, match="differ from what the coordinator sent"):
        received(tmp_path, a4, {"round": 4, **c4, "target-digest": "0" * 64})
    whole = received(tmp_path, s4, {"round": 4, "down": "whole", "target-digest": arrays_digest(s4)})
    assert arrays_digest(whole) == arrays_digest(s4) and computed == [1]
    assert received(tmp_path, {"w": r1["w"]}, {"round": 5}) == {"w": r1["w"]}  # no compact downlink: as given


def test_a_ternary_update_with_int8s_statistics_crosses_the_wire_and_a_hostile_one_is_refused_in_one_line():
    """The device's ternary update (weights sparse, BatchNorm statistics int8s) through Flower's records and
    the coordinator's decode: the same arrays the device kept; a statistics payload that is truncated,
    padded, has a scale that is not positive and finite, or a code outside -127..127 is refused (the
    coordinator names the device with this one line and leaves its update out)."""
    pytest.importorskip("flwr")
    from edgetrain.fleet import wire
    from edgetrain.fleet.coordinator import decode_update

    rng = np.random.RandomState(3)
    update = {"w": rng.normal(size=(10, 32)).astype(np.float32), "running_var": rng.normal(size=32).astype(np.float32)}
    enc, residual = encode_update(update, "ternary", {}, exact={"running_var"}, decay=1.0)
    back = decode_update(wire.from_record(wire.to_record(enc)), update, "dev")
    assert enc["running_var"].codec == "int8s" and set(residual) == set(update)
    for k in update:  # what the device kept as sent (update - residual, to float32 rounding)
        np.testing.assert_array_equal(back[k], decode_tensor(enc[k]))
        np.testing.assert_allclose(back[k], update[k] - residual[k], rtol=0, atol=1e-6)
    good = enc["running_var"].data
    bad = {good[:3]: "does not hold", good + b"\x00" * 40: "does not hold",
           struct.pack("<f", float("nan")) + good[4:]: "not a positive finite",
           struct.pack("<f", 0.0) + good[4:]: "not a positive finite",
           good[:4] + b"\x80" * 32: "outside -127..127"}
    for payload, why in bad.items():
        hostile = {**enc, "running_var": Encoded("int8s", (32,), payload)}
        with pytest.raises(ValueError, match=why) as info:
            decode_update(wire.from_record(wire.to_record(hostile)), update, "dev")
        assert "\n" not in str(info.value)


@pytest.mark.parametrize("decay", [None, 0.0])
@pytest.mark.parametrize("target", [None, 26])
def test_ternary_adds_a_decayed_residual_for_the_trained_tensors_and_the_whole_one_for_the_statistics(target, decay):
    """RESIDUAL_DECAY (0.5; ``decay`` 0: none): the trained tensors' residual is scaled before it is added, so the
    message is what the whole-residual codec sends from the scaled residual, byte for byte; the statistics' int8s
    residual is added whole and its error feedback sums exactly; with 0 no trained residual is added or kept."""
    from edgetrain.fleet import codec as c

    assert c.RESIDUAL_DECAY == 0.5
    f = c.RESIDUAL_DECAY if decay is None else decay
    rng = np.random.RandomState(5)
    update = {"w": rng.normal(size=(10, 32)).astype(np.float32), "b": rng.normal(size=10).astype(np.float32),
              "running_var": rng.normal(size=32).astype(np.float32)}
    old = {k: (10 * rng.normal(size=v.shape)).astype(np.float32) for k, v in update.items()}
    enc, residual = encode_update(update, "ternary", old, exact={"running_var"}, target=target, decay=decay)
    scaled = {k: v if k == "running_var" else (v * np.float32(f)).astype(np.float32) for k, v in old.items()}
    same, _ = encode_update(update, "ternary", scaled if f else {"running_var": old["running_var"]},
                            exact={"running_var"}, target=target, decay=1.0)
    assert {k: e.data for k, e in enc.items()} == {k: e.data for k, e in same.items()}
    np.testing.assert_array_equal(residual["running_var"],
                                  update["running_var"] + old["running_var"] - decode_tensor(enc["running_var"]))
    if f:
        assert set(residual) == set(update)
        for k in ("w", "b"):  # what this message did not send of the update plus the scaled residual
            np.testing.assert_array_equal(residual[k], (update[k] + scaled[k]) - decode_tensor(enc[k]))
    else:
        assert set(residual) == {"running_var"}
        for k in ("w", "b"):  # the top entries of the update itself, whatever the old residual
            back = decode_tensor(enc[k])
            kept = back != 0
            assert kept.any() and np.all(np.sign(back[kept]) == np.sign(update[k][kept]))
            assert np.abs(update[k][kept]).min() >= np.abs(update[k][~kept]).max(initial=0)
    # the whole residual would have sent something else
    whole, _ = encode_update(update, "ternary", old, exact={"running_var"}, target=target, decay=1.0)
    assert whole["w"].data != enc["w"].data
