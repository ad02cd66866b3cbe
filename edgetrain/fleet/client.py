"""The device side of a round (runs inside Flower's ClientApp process, one process per message).

The device's settings come from the ``join.json`` its ``edgetrain fleet join`` wrote (named by the
SuperNode's node config). Its round state lives in the join's state folder.

Exactly once. A device's round state (the last round of it the coordinator aggregated, how many of its
rounds the coordinator aggregated, its SCAFFOLD control variate c_i, the 2-bit error-feedback residual)
is one file, ``state.npz``, replaced atomically, and no round writes it directly:

1. A round r trains from the committed state and *stages* its whole outcome in ``staged.npz`` (one
   atomic write): the reply exactly as it is sent, the new control variate and residual, keyed by r and
   by a digest of the round's inputs (the global arrays and settings). Then the reply leaves.
2. Every later instruction carries ``accepted``: the last round of this device whose update is in the
   global weights the coordinator has saved (its fleet-state.json, written after those weights). At the
   next instruction (the next round, or the goodbye) the staged round is committed when
   ``accepted == r`` (one rename), else dropped: the coordinator never aggregated it, so the device's
   state must not move either.
3. Round r asked again with the same inputs (the coordinator was killed after asking and resumed, or
   Flower delivered the instruction twice) is answered with the staged reply: no second training.

A kill at any point leaves a state the coordinator agrees with: before a staged round is proved it is
neither counted nor used; after, exactly once (committing twice writes the same file). An exclusive lock
(``lock``) keeps two ClientApp processes of one device from working at once (a retried instruction waits
for the first to stage, then replays it). Every stage/replay/commit/drop is a line of ``journal.log``.
"""
from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import time
import uuid
from pathlib import Path

import numpy as np

from .. import runtime
from ..devices import load_device
from ..errors import EdgetrainError, RunFailed, UsageError
from ..options import DEFAULT_TRAIN_LAYERS, TrainLayers
from ..fileio import atomic_write_bytes, atomic_write_text
from .codec import (CONTROL_STEP, DENSITY, DOWNLINK_WHERE, MIN_KEEP, Encoded, arrays_digest, decode_tensor,
                    derived_control, downlink_apply, encode_update, update_bytes)
from .hooks import delay
from .local import LocalSpec, ShapeMismatch, class_view, initial_arrays, start_digests, train_round
from .store import CONTROL

STATE = "state.npz"  # the committed round state (one file: it changes all at once or not at all)
STAGED = "staged.npz"  # a round trained and sent, not yet proved aggregated
JOURNAL = "journal.log"
LOCK = "lock"
DEVICE_ID = "device-id"  # this device's identity across rejoins (node ids change; names may collide)
LEGACY = ("client-state.json", "residual.npz", "control.npz")  # the state files before state.npz
REFUSED = "refused.json"
DONE = "done.json"
CURRENT = "current-round.json"
DOWNLINK = "downlink.npz"  # the global arrays this device last reconstructed (compact downlink) and their base
BUILTIN_MODELS = ("zoo:", "edgetrain.nets:")  # what a device loads by the coordinator's say-so alone
_SEP = "|"  # group|name inside the npz files (array names contain '/')


def load_join(path: str) -> dict:
    return json.loads(Path(path).read_text())


def device_id(folder: Path) -> str:
    """This device's key (made once, kept in its state folder)."""
    path = Path(folder) / DEVICE_ID
    if not path.exists():
        atomic_write_text(path, uuid.uuid4().hex + "\n", "fleet device id")
    return path.read_text().strip()


def identity(join_path: str) -> dict:
    """The answer to the coordinator's hello: who this device is, and where its initial arrays come from (its own
    --model and --params: local.start_digests, as start-model and start-params)."""
    join = load_join(join_path)
    start = start_digests(join.get("model"), join.get("params"))
    return {"key": device_id(Path(join["state"])), "name": join["name"], **{f"start-{k}": v for k, v in start.items()}}


# --- the state files ------------------------------------------------------------------------------------

def _pack(meta: dict, groups: dict[str, dict[str, np.ndarray]]) -> bytes:
    arrays: dict = {f"{g}{_SEP}{k}": v for g, arrs in groups.items() for k, v in arrs.items()}  # (names, not options)
    buf = io.BytesIO()
    np.savez(buf, meta=np.array(json.dumps(meta)), **arrays)
    return buf.getvalue()


def _unpack(path: Path) -> tuple[dict, dict[str, dict[str, np.ndarray]]]:
    groups: dict[str, dict[str, np.ndarray]] = {}
    with np.load(path, allow_pickle=False) as z:
        meta = json.loads(str(z["meta"]))
        for key in z.files:
            if key != "meta":
                g, _, name = key.partition(_SEP)
                groups.setdefault(g, {})[name] = z[key]
    return meta, groups


def _load(path: Path):
    if not path.exists():
        return None
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def committed(folder: Path) -> tuple[dict, dict, dict]:
    """(meta, control variate, residual) as last committed; a device that never committed: round 0."""
    if (folder / STATE).exists():
        meta, groups = _unpack(folder / STATE)
        return meta, groups.get("control", {}), groups.get("residual", {})
    if (folder / LEGACY[0]).exists():  # a state folder written before state.npz: read it once
        meta = json.loads((folder / LEGACY[0]).read_text())
        residual, control = (_load(folder / name) or {} for name in LEGACY[1:])
        return meta, control, residual
    return {"round": 0, "trained": 0}, {}, {}


def _journal(folder: Path, line: str) -> None:
    with open(folder / JOURNAL, "a") as fh:
        fh.write(f"{time.strftime('%Y-%m-%dT%H:%M:%S')} pid {os.getpid()} {line}\n")


@contextlib.contextmanager
def _locked(folder: Path, seconds: float | None = None):
    """Hold this device's lock (released by the kernel when a holder dies); yields False when ``seconds``
    passed without it."""
    import fcntl

    with open(folder / LOCK, "a") as fh:
        end = math.inf if seconds is None else time.monotonic() + seconds
        while True:
            try:
                fcntl.flock(fh, fcntl.LOCK_EX | (fcntl.LOCK_NB if seconds is not None else 0))
                break
            except BlockingIOError:  # (only without blocking: within ``seconds``)
                if time.monotonic() > end:
                    yield False
                    return
                time.sleep(0.2)
        yield True


def settle(folder: Path, accepted: int, round_no: int | None = None, digest: str | None = None) -> dict | None:
    """Resolve the staged round against the coordinator's word ``accepted`` (see the module's docstring).
    Returns the staged round when it is exactly this instruction's replay (same round, same inputs)."""
    if not (folder / STAGED).exists():
        return None
    meta, groups = _unpack(folder / STAGED)
    r = int(meta["round"])
    if accepted == r:
        atomic_write_bytes(folder / STATE, _pack(meta["state"], {"control": groups.get("control", {}),
                                                                 "residual": groups.get("residual", {})}),
                           "fleet state")
        for name in LEGACY:  # state.npz is the state now
            (folder / name).unlink(missing_ok=True)
        (folder / STAGED).unlink()
        _journal(folder, f"committed round {r}")
        return None
    if round_no == r and digest == meta["digest"]:
        return {"meta": meta, "groups": groups}
    (folder / STAGED).unlink()
    _journal(folder, f"dropped round {r} (the coordinator's last accepted round of this device: {accepted})")
    return None


# the coordinator's bookkeeping, not a round's inputs (how the arrays came down: the arrays themselves count)
NOT_INPUTS = ("accepted", "down", "base", "base-digest", "target-digest")


def inputs_digest(global_arrays: dict, config: dict) -> str:
    """What a round's outcome depends on besides the committed state (which cannot change while a round is
    staged: only settling the staged round changes it)."""
    h = hashlib.sha256(json.dumps({k: v for k, v in sorted(config.items()) if k not in NOT_INPUTS},
                                  sort_keys=True, default=str).encode())
    for k in sorted(global_arrays):
        v = np.ascontiguousarray(global_arrays[k], dtype=np.float32)
        h.update(f"{k} {v.shape}".encode())
        h.update(v.tobytes())
    return h.hexdigest()


def received(folder: Path, arrays: dict, config: dict, initial=None) -> dict:
    """The global arrays of this round. With a compact downlink (``down`` in the config) ``arrays`` are a
    delta against what this device reconstructed in round ``base`` (0: the model's initial arrays, ``initial()``),
    which it must hold (the last arrays it reconstructed, or the base of those: the coordinator may not have
    saved that this device took them), else it fails the round and the coordinator sends the arrays whole next
    time; or the arrays whole. Either way the result must match the coordinator's record (``target-digest``) bit
    for bit, and is kept, with the base it came from, for the next delta."""
    mode = config.get("down")
    if not mode:
        return arrays
    round_no, want = int(config["round"]), str(config["target-digest"])
    meta, groups = _unpack(folder / DOWNLINK) if (folder / DOWNLINK).exists() else ({}, {})
    mine, kept = groups.get("arrays", {}), None  # kept: the arrays the delta was applied to
    if mode == "delta":
        if meta.get("round") == round_no and meta.get("digest") == want:  # this round asked again
            return mine
        base, base_digest = int(config["base"]), config.get("base-digest")
        held = {(meta.get("round"), meta.get("digest")): mine,
                (meta.get("base"), meta.get("base-digest")): groups.get("base", {})}
        kept = held.get((base, base_digest))
        if kept is None and base == 0 and initial is not None:
            computed = initial()
            kept = computed if arrays_digest(computed) == base_digest else None
        if kept is None:
            raise RunFailed(f"the coordinator sent round {round_no}'s global arrays as a change to round {base}'s, "
                            f"and this device holds round {meta.get('round', 'none')}'s",
                            DOWNLINK_WHERE, "the coordinator sends them whole next round")
        arrays = downlink_apply(kept, arrays)
    if arrays_digest(arrays) != want:
        raise RunFailed(f"round {round_no}'s global arrays rebuilt here differ from what the coordinator sent",
                        DOWNLINK_WHERE, "the coordinator sends them whole next round")
    atomic_write_bytes(folder / DOWNLINK, _pack({"round": round_no, "digest": want, **(
        {"base": int(config["base"]), "base-digest": config.get("base-digest")} if kept is not None else {})},
        {"arrays": arrays, "base": kept or {}}), "fleet downlink")
    return arrays


def _reply_from(staged: dict) -> tuple[dict, dict, dict]:
    meta, groups = staged["meta"], staged["groups"]
    encoded = {k: Encoded(c, tuple(s), groups.get("update", {})[k].tobytes()) for k, (c, s) in meta["update"].items()}
    return encoded, meta["metrics"], meta["facts"]


def model_for(join: dict, offered: str) -> str:
    """The model this device trains: its own --model, else the coordinator's if it is built in."""
    if join.get("model"):
        return join["model"]
    if offered.startswith(BUILTIN_MODELS):
        return offered
    raise UsageError(f"the coordinator's model '{offered}' is not built in; a device loads only its own files "
                     "and built-in models", "edgetrain fleet join", "pass --model PREFIX (the same model, on this device)")


def train(join_path: str, global_arrays: dict, config: dict) -> tuple[dict, dict, dict]:
    """One round: returns (encoded update, numeric metrics, text facts)."""
    join = load_join(join_path)
    folder = Path(join["state"])
    with _locked(folder):
        try:
            with _refusals(folder, config):
                arrays = received(folder, global_arrays, config, lambda: initial_arrays(_spec(join, folder, config)))
            return _train(join, folder, arrays, config)
        finally:
            (folder / CURRENT).unlink(missing_ok=True)


@contextlib.contextmanager
def _refusals(folder: Path, config: dict):
    """A UsageError inside: this device cannot take part (another model, no model); it stops, one line."""
    try:
        yield
    except UsageError as exc:
        atomic_write_text(folder / REFUSED, json.dumps({"round": int(config["round"]), "error": exc.line(),
                                                        "what": exc.what, "where": exc.where, "fix": exc.fix}),
                          "fleet state")
        raise exc from None


def _spec(join: dict, folder: Path, config: dict) -> LocalSpec:
    """This device's round settings: the coordinator's (``config``) and its own (``join``)."""
    threads = runtime.apply_threads(join.get("threads"), strict=False)
    device = load_device(join["device"]) if join.get("device") else None
    classes = [str(c) for c in config.get("classes") or []]
    data = class_view(join["data"], classes, folder / "work")
    return LocalSpec(model=model_for(join, str(config["model"])), data=data, workdir=str(folder / "work"),
                     epochs=int(config["epochs"]), batch_size=int(config["batch_size"]),
                     lr=float(config["lr"]) if float(config["lr"]) > 0 else None, optimizer=str(config["optimizer"]),
                     seed=int(config["seed"]), threads=threads, budget_mb=join.get("memory_budget"),
                     device=device, params=join.get("params"),
                     train_layers=TrainLayers(config.get("train_layers", DEFAULT_TRAIN_LAYERS)))


def _train(join: dict, folder: Path, global_arrays: dict, config: dict) -> tuple[dict, dict, dict]:
    round_no = int(config["round"])
    codec = str(config["codec"])
    atomic_write_text(folder / CURRENT, json.dumps({"round": round_no, "pid": os.getpid()}), "fleet state")
    digest = inputs_digest(global_arrays, config)
    replay = settle(folder, int(config.get("accepted", -1)), round_no, digest)
    if replay is not None:
        _journal(folder, f"replayed round {round_no} (no second training)")
        delay(round_no, "sending", folder)
        return _reply_from(replay)
    meta, c_saved, residual = committed(folder)  # after settle: it may have committed the round before
    delay(round_no, "training", folder)
    # one seed for every round: the engine caches its ONNX export per (model, seed)
    if meta.get("codec") not in (None, codec):
        residual = {}  # a residual only means something to the codec that dropped it
    t0 = time.monotonic()
    weights = {k: v for k, v in global_arrays.items() if not k.startswith(CONTROL)}
    # SCAFFOLD: a control variate for each array a gradient trains (none for BatchNorm's running statistics)
    c_global = {k[len(CONTROL):]: v for k, v in global_arrays.items() if k.startswith(CONTROL)}
    with _refusals(folder, config):
        spec = _spec(join, folder, config)
        stray = sorted(set(c_global) - set(weights))
        if stray:
            raise ShapeMismatch(f"model mismatch: control variate for '{stray[0]}', which is not among the weights",
                                "global weights from the coordinator",
                                "every device must fine-tune the same model for the same classes")
        c_mine = {}
        if c_global:
            fits = all(k in c_saved and c_saved[k].shape == v.shape for k, v in c_global.items())
            c_mine = {k: (c_saved[k] if fits else np.zeros_like(v)) for k, v in c_global.items()}
        correction = {k: c_global[k] - c_mine[k] for k in c_global} if c_global else None
        new, result = train_round(spec, weights, round_no, correction)
    delta = {k: new[k] - weights[k] for k in new}
    c_new = c_saved
    derive = bool(c_global) and codec == "ternary"  # the control deltas are derived on both sides, not sent
    if c_global and not derive:  # SCAFFOLD: this device's new control variate, from how far its weights moved
        c_new = {k: c_mine[k] - c_global[k] + (weights[k] - new[k]) / np.float32(result.fleet_scale) for k in c_global}
        delta.update({CONTROL + k: (c_new[k] - c_mine[k]).astype(np.float32) for k in c_global})
    fp32_bytes = (sum(4 * int(v.size) for v in delta.values())
                  + (sum(4 * int(v.size) for v in c_global.values()) if derive else 0))
    ratio = float(config.get("uplink-ratio", 0.0) or 0.0) if codec == "ternary" else 0.0
    # the message's bytes target: its float32 bytes / the ratio, less the derived control scale (one float32)
    target = int(fp32_bytes // ratio) - (4 if derive else 0) if ratio > 0 else None
    # running statistics travel exactly (a variance must stay positive); everything else with the codec
    encoded, residual = encode_update(delta, codec, residual, exact=result.fleet_statistics,
                                      density=float(config.get("density", DENSITY)),
                                      floor=int(config.get("min-keep", MIN_KEEP)), target=target)
    extra = {}
    if derive:  # from the weight delta as the coordinator decodes it, and the scale that travels with it
        scale = float(np.float32(result.fleet_scale))
        moved = derived_control(c_global, {k: decode_tensor(encoded[k]) for k in c_global}, scale,
                                float(config.get("control-step", CONTROL_STEP)))
        c_new = {k: (c_mine[k] + moved[k]).astype(np.float32) for k in c_global}
        extra = {"control-scale": scale}
    seconds = time.monotonic() - t0
    last = result.epochs[-1] if result.epochs else {}
    energy = result.energy or {}
    metrics = {"num-examples": int(last.get("samples", 0)) or 1, "seconds": round(seconds, 3),
               "train-seconds": float(result.seconds), "peak-rss-mb": float(result.peak_rss_mb or 0.0),
               # a derived control scale is one float32; the fp32 fleet would send the control deltas too
               "bytes-up": update_bytes(encoded) + 4 * len(extra),
               "bytes-up-fp32": fp32_bytes,
               "train-loss": float(last.get("loss") or 0.0), "train-accuracy": float(last.get("train_accuracy") or 0.0),
               "joules": float(energy.get("joules") or 0.0), "threads": int(result.threads or 0), **extra}
    # the round this answers and the global arrays it trained from: the coordinator refuses a reply that
    # names another (a replayed message)
    facts = {"name": join["name"], "device": join.get("device") or "this host",
             "energy": str(energy.get("provenance") or "") if energy else "",
             "round": round_no, "trained-from": arrays_digest(global_arrays)}
    state = {"round": round_no, "codec": codec, "name": join["name"], "trained": int(meta.get("trained", 0)) + 1}
    staged = {"round": round_no, "digest": digest, "state": state, "metrics": metrics, "facts": facts,
              "update": {k: [e.codec, list(e.shape)] for k, e in encoded.items()}}
    payloads = {k: np.frombuffer(e.data, np.uint8) for k, e in encoded.items()}
    atomic_write_bytes(folder / STAGED, _pack(staged, {"update": payloads, "control": c_new,
                                                       "residual": residual}), "fleet staged round")
    _journal(folder, f"staged round {round_no}")
    delay(round_no, "sending", folder)
    return encoded, metrics, facts


def finished(join_path: str, summary: dict) -> None:
    """The coordinator's goodbye: settle the last staged round, then tell `fleet join` the run is over."""
    join = load_join(join_path)
    folder = Path(join["state"])
    # a round still training here when the run ended was not aggregated: its stage is dropped at the next
    # instruction; don't wait for it
    with _locked(folder, 5.0) as mine:
        if mine:
            settle(folder, int(summary.get("accepted", -1)))
    atomic_write_text(folder / DONE, json.dumps(summary), "fleet state")


def error_text(exc: BaseException) -> str:
    return exc.line() if isinstance(exc, EdgetrainError) else f"{type(exc).__name__}: {exc}"
