"""The device side of a round (runs inside Flower's ClientApp process, one process per message).

The device's settings come from the ``join.json`` its ``edgetrain fleet join`` wrote (named by the
SuperNode's node config); its state (the round it last finished and the 2-bit error-feedback residual)
lives in the join's state folder, written atomically after each round, so a device killed mid-round
rejoins with the residual of its last finished round.
"""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

from .. import envvars, runtime
from ..devices import load_device
from ..errors import EdgetrainError, UsageError
from ..fileio import atomic_write_bytes, atomic_write_text
from .codec import encode_update, update_bytes
from .local import LocalSpec, ShapeMismatch, train_round

STATE = "client-state.json"
RESIDUAL = "residual.npz"
CONTROL_FILE = "control.npz"
CONTROL = "control/"  # prefix of the SCAFFOLD control variates among the arrays that travel
REFUSED = "refused.json"
DONE = "done.json"
CURRENT = "current-round.json"
BUILTIN_MODELS = ("zoo:", "edgetrain.nets:")  # what a device loads by the coordinator's say-so alone


def load_join(path: str) -> dict:
    return json.loads(Path(path).read_text())


def _state(folder: Path) -> tuple[dict, dict]:
    meta = json.loads((folder / STATE).read_text()) if (folder / STATE).exists() else {"round": 0}
    residual = {}
    if (folder / RESIDUAL).exists():
        with np.load(folder / RESIDUAL, allow_pickle=False) as z:
            residual = {k: z[k] for k in z.files}
    return meta, residual


def _save_arrays(path: Path, arrays: dict, what: str) -> None:
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(path, buf.getvalue(), what)


def _control(folder: Path, like: dict) -> dict:
    """This device's SCAFFOLD control variate c_i (zeros before its first round)."""
    if (folder / CONTROL_FILE).exists():
        with np.load(folder / CONTROL_FILE, allow_pickle=False) as z:
            got = {k: z[k] for k in z.files}
        if all(k in got and got[k].shape == v.shape for k, v in like.items()):
            return got
    return {k: np.zeros_like(v) for k, v in like.items()}


def _save_state(folder: Path, meta: dict, residual: dict) -> None:
    _save_arrays(folder / RESIDUAL, residual, "fleet residual")
    atomic_write_text(folder / STATE, json.dumps(meta), "fleet state")  # last: it vouches for the residual


def model_for(join: dict, offered: str) -> str:
    """The model this device trains: its own --model, else the coordinator's if it is built in."""
    if join.get("model"):
        return join["model"]
    if offered.startswith(BUILTIN_MODELS):
        return offered
    raise UsageError(f"the coordinator's model '{offered}' is not built in; a device loads only its own files "
                     "and built-in models", "edgetrain fleet join", "pass --model PREFIX (the same model, on this device)")


def _test_delay(round_no: int) -> None:
    """Test hook (never set by users): EDGETRAIN_FLEET_TEST_DELAY=ROUND:SECONDS makes this device slow."""
    hook = envvars.get("EDGETRAIN_FLEET_TEST_DELAY")
    if hook:
        r, s = hook.split(":")
        if int(r) in (0, round_no):
            time.sleep(float(s))


def train(join_path: str, global_arrays: dict, config: dict) -> tuple[dict, dict, dict]:
    """One round: returns (encoded update, numeric metrics, text facts)."""
    join = load_join(join_path)
    folder = Path(join["state"])
    round_no = int(config["round"])
    codec = str(config["codec"])
    atomic_write_text(folder / CURRENT, json.dumps({"round": round_no, "pid": os.getpid()}), "fleet state")
    _test_delay(round_no)
    threads = runtime.apply_threads(join.get("threads"), strict=False)
    device = load_device(join["device"]) if join.get("device") else None
    spec = LocalSpec(model=model_for(join, str(config["model"])), data=join["data"], workdir=str(folder / "work"),
                     epochs=int(config["epochs"]), batch_size=int(config["batch_size"]),
                     lr=float(config["lr"]) if float(config["lr"]) > 0 else None, optimizer=str(config["optimizer"]),
                     seed=int(config["seed"]), threads=threads, budget_mb=join.get("memory_budget"),
                     device=device, params=join.get("params"), train_layers=str(config.get("train_layers", "head")))
    # one seed for every round: the engine caches its ONNX export per (model, seed)
    meta, residual = _state(folder)
    if meta.get("codec") not in (None, codec):
        residual = {}  # a residual only means something to the codec that dropped it
    t0 = time.monotonic()
    weights = {k: v for k, v in global_arrays.items() if not k.startswith(CONTROL)}
    # SCAFFOLD: a control variate for each array a gradient trains (none for BatchNorm's running statistics)
    c_global = {k[len(CONTROL):]: v for k, v in global_arrays.items() if k.startswith(CONTROL)}
    try:
        stray = sorted(set(c_global) - set(weights))
        if stray:
            raise ShapeMismatch(f"model mismatch: control variate for '{stray[0]}', which is not among the weights",
                                "global weights from the coordinator",
                                "every device must fine-tune the same model for the same classes")
        c_mine = _control(folder, {k: weights[k] for k in c_global}) if c_global else {}
        correction = {k: c_global[k] - c_mine[k] for k in c_global} if c_global else None
        new, result = train_round(spec, weights, round_no, correction)
    except ShapeMismatch as exc:
        atomic_write_text(folder / REFUSED, json.dumps({"round": round_no, "error": exc.line()}), "fleet state")
        raise exc from None
    delta = {k: new[k] - weights[k] for k in new}
    if c_global:  # SCAFFOLD: this device's new control variate, from how far its weights moved
        c_new = {k: c_mine[k] - c_global[k] + (weights[k] - new[k]) / np.float32(result.fleet_scale) for k in c_global}
        delta.update({CONTROL + k: (c_new[k] - c_mine[k]).astype(np.float32) for k in c_global})
    # running statistics travel exactly (a variance must stay positive); everything else with the codec
    encoded, residual = encode_update(delta, codec, residual, exact=result.fleet_statistics)
    seconds = time.monotonic() - t0
    if c_global:
        _save_arrays(folder / CONTROL_FILE, c_new, "fleet control variate")
    _save_state(folder, {"round": round_no, "codec": codec, "name": join["name"],
                         "trained": int(meta.get("trained", 0)) + 1}, residual)
    (folder / CURRENT).unlink(missing_ok=True)
    last = result.epochs[-1] if result.epochs else {}
    energy = result.energy or {}
    metrics = {"num-examples": int(last.get("samples", 0)) or 1, "seconds": round(seconds, 3),
               "train-seconds": float(result.seconds), "peak-rss-mb": float(result.peak_rss_mb or 0.0),
               "bytes-up": update_bytes(encoded), "bytes-up-fp32": sum(4 * int(v.size) for v in delta.values()),
               "train-loss": float(last.get("loss") or 0.0), "train-accuracy": float(last.get("train_accuracy") or 0.0),
               "joules": float(energy.get("joules") or 0.0), "threads": int(result.threads or 0)}
    facts = {"name": join["name"], "device": join.get("device") or "this host",
             "energy": str(energy.get("provenance") or "") if energy else ""}
    return encoded, metrics, facts


def finished(join_path: str, summary: dict) -> None:
    join = load_join(join_path)
    atomic_write_text(Path(join["state"]) / DONE, json.dumps(summary), "fleet state")


def error_text(exc: BaseException) -> str:
    return exc.line() if isinstance(exc, EdgetrainError) else f"{type(exc).__name__}: {exc}"
