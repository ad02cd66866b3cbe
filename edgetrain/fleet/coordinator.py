"""The coordinator's rounds (runs inside Flower's ServerApp process).

Each round: wait for ``min_clients`` devices, send the global trainable part (float32: the output
layer, or with ``--train-layers last:N`` every array of the tail) to a fraction of them, wait at most
``round_timeout`` seconds, decode every update that came back (refusing one whose arrays do not fit
the global model), average the updates weighted by each device's sample count, add
the average to the global weights and check them on the held-out data. A round with fewer than
``min_updates`` usable updates leaves the global weights unchanged. After each round the global
weights and the round's record are written atomically to RUNDIR, so a coordinator killed and started
again with ``--resume`` continues after the last completed round.
"""
from __future__ import annotations

import io
import json
import time
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ..errors import EdgetrainError
from ..fileio import atomic_write_bytes, atomic_write_text
from .codec import decode_tensor
from .local import Evaluator, LocalSpec, check_shapes

STATE = "fleet-state.json"
CONTROL = "control/"  # the SCAFFOLD control variates travel beside the weights under this prefix
CONTROL_PREFIX = "control"  # RUNDIR/control-NNNN.npz: the global control variate after round NNNN
STATE_FORMAT = "edgetrain-fleet-state/1"
GOODBYE_SECONDS = 15.0  # how long the last message (the run is over) waits for the devices' answers


def global_path(rundir: Path, round_no: int, prefix: str = "global") -> Path:
    return rundir / f"{prefix}-{round_no:04d}.npz"


def save_global(rundir: Path, round_no: int, arrays: dict, prefix: str = "global") -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(global_path(rundir, round_no, prefix), buf.getvalue(), "global weights")


def load_global(rundir: Path, round_no: int, prefix: str = "global") -> dict:
    with np.load(global_path(rundir, round_no, prefix), allow_pickle=False) as z:
        return {k: z[k].astype(np.float32) for k in z.files}


def read_state(rundir: Path) -> dict | None:
    path = rundir / STATE
    return json.loads(path.read_text()) if path.exists() else None


def write_state(rundir: Path, state: dict) -> None:
    atomic_write_text(rundir / STATE, json.dumps(state, indent=2) + "\n", "fleet state")


def decode_update(update: dict, global_arrays: dict, who: str) -> dict:
    """Decoded deltas of one device, or ShapeMismatch when they do not fit the global model."""
    check_shapes(global_arrays, {k: e.shape for k, e in update.items()}, f"update from {who}",
                 "that device fine-tunes a different model or class list; it is left out of the average")
    return {k: decode_tensor(e) for k, e in update.items()}


def average(deltas: list[tuple[dict, int]]) -> dict:
    total = float(sum(n for _, n in deltas))
    keys = [k for k in deltas[0][0] if not k.startswith(CONTROL)]
    return {k: sum(d[k] * (n / total) for d, n in deltas).astype(np.float32) for k in keys}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run(grid, spec_path: str) -> None:
    """The whole federated run (the ServerApp's main)."""
    from flwr.app import ConfigRecord, Message, RecordDict

    from . import wire  # lazy: Flower is an optional extra; wire imports it

    spec = json.loads(Path(spec_path).read_text())
    rundir = Path(spec["rundir"])
    log = _Log(rundir / "coordinator-rounds.log")
    state = read_state(rundir)
    train_layers = spec.get("train_layers", "head")
    evaluator = Evaluator(LocalSpec(model=spec["model"], data=spec["val"], workdir=str(rundir / "work"),
                                    threads=spec.get("threads"), seed=spec["seed"], params=spec.get("params"),
                                    train_layers=train_layers), spec["val"])
    arrays = load_global(rundir, state["completed"])
    scaffold = spec.get("aggregate") == "scaffold"
    # a control variate per array a gradient trains; BatchNorm's running statistics are only averaged
    control = (load_global(rundir, state["completed"], CONTROL_PREFIX) if scaffold and state["completed"]
               else {k: np.zeros_like(v) for k, v in arrays.items() if k not in evaluator.statistics})
    log(f"resuming after round {state['completed']}" if state["completed"] else "starting")
    for round_no in range(state["completed"] + 1, spec["rounds"] + 1):
        t0 = time.monotonic()
        record = {"round": round_no, "started": _now(), "codec": spec["codec"], "participants": [], "refused": [],
                  "failed": [], "missing": []}
        nodes = _wait_for_nodes(grid, spec["min_clients"], spec["join_timeout"])
        record["available"] = len(nodes)
        chosen = nodes[: max(spec["min_updates"], int(round(len(nodes) * spec["fraction"])))]
        down = wire.weights_record({**arrays, **({CONTROL + k: v for k, v in control.items()} if scaffold else {})})
        config = ConfigRecord({"round": round_no, "codec": spec["codec"], "model": spec["model"],
                               "epochs": spec["epochs"], "batch_size": spec["batch_size"], "lr": spec["lr"] or 0.0,
                               "optimizer": spec["optimizer"], "seed": spec["seed"], "train_layers": train_layers})
        messages = [Message(content=RecordDict({"arrays": down, "config": config}), message_type="train",
                            dst_node_id=node) for node in chosen]
        log(f"round {round_no}: sent to {len(chosen)} of {len(nodes)} devices")
        replies = list(grid.send_and_receive(messages, timeout=spec["round_timeout"]))
        record["bytes_down"] = wire.record_bytes(down) * len(chosen)
        answered = set()
        deltas = []
        for reply in replies:
            node = reply.metadata.src_node_id
            answered.add(node)
            if reply.has_error():
                reason = reply.error.reason or f"error code {reply.error.code}"
                kind = "refused" if "model mismatch" in reason else "failed"
                record[kind].append({"node_id": node, "reason": reason[-400:]})
                last_line = reason.strip().splitlines()[-1][:300] if reason.strip() else reason
                log(f"round {round_no}: device {node} {kind}: {last_line}")
                continue
            metrics = dict(reply.content["metrics"])
            facts = dict(reply.content["facts"])
            try:
                update = wire.from_record(reply.content["update"])
                expected = {**arrays, **({CONTROL + k: arrays[k] for k in control} if scaffold else {})}
                delta = decode_update(update, expected, f"{facts.get('name')} (node {node})")
            except (EdgetrainError, ValueError) as exc:
                reason = exc.line() if isinstance(exc, EdgetrainError) else str(exc)
                record["refused"].append({"node_id": node, "client": facts.get("name"), "reason": reason})
                log(f"round {round_no}: refused the update of {facts.get('name')}: {reason}")
                continue
            deltas.append((delta, int(metrics.get("num-examples", 1))))
            record["participants"].append({"client": facts.get("name"), "node_id": node, "device": facts.get("device"),
                                           "energy_provenance": facts.get("energy"),
                                           **{k.replace("-", "_"): v for k, v in metrics.items()}})
        record["missing"] = [n for n in chosen if n not in answered]
        for n in record["missing"]:
            log(f"round {round_no}: no answer from device {n} within {spec['round_timeout']:g}s (round timeout)")
        record["updates"] = len(deltas)
        record["updated"] = len(deltas) >= spec["min_updates"]
        if record["updated"]:
            avg = average(deltas)
            arrays = {k: (arrays[k] + avg[k]).astype(np.float32) for k in arrays}
            if scaffold:  # c += (|S| / N) * mean(delta c_i): a device that did not report keeps its share
                share = len(deltas) / max(record["available"], len(deltas))
                control = {k: (control[k] + share * np.mean([d[CONTROL + k] for d, _ in deltas], axis=0))
                           .astype(np.float32) for k in control}
        else:
            log(f"round {round_no}: {len(deltas)} usable update(s), fewer than --min-updates {spec['min_updates']}: "
                "global weights unchanged")
        record["bytes_up"] = sum(p["bytes_up"] for p in record["participants"])
        record["bytes_up_fp32"] = sum(p["bytes_up_fp32"] for p in record["participants"])
        record["accuracy"] = evaluator.top1(arrays)
        record["seconds"] = round(time.monotonic() - t0, 3)
        if scaffold:
            save_global(rundir, round_no, control, CONTROL_PREFIX)
        save_global(rundir, round_no, arrays)
        state["rounds"].append(record)
        state["completed"] = round_no
        write_state(rundir, state)  # after the weights: the state never names weights not on disk
        log(f"round {round_no}: {len(deltas)} update(s), held-out top-1 {record['accuracy']:.4f}, "
            f"{record['bytes_up']} bytes up, {record['seconds']:.1f}s")
    state["finished"] = _now()
    write_state(rundir, state)
    _goodbye(grid, state, GOODBYE_SECONDS)


def _wait_for_nodes(grid, want: int, seconds: float) -> list[int]:
    """``want`` devices, or after ``seconds`` whoever is there (at least one)."""
    end = time.monotonic() + seconds
    while True:
        nodes = sorted(grid.get_node_ids())
        if len(nodes) >= want or nodes and time.monotonic() > end:
            return nodes
        if time.monotonic() > end + seconds:
            raise RuntimeError(f"no device joined within {2 * seconds:.0f}s")
        time.sleep(0.5)


def _goodbye(grid, state: dict, timeout: float) -> None:
    """Tell every device the run is over (their `fleet join` then exits 0)."""
    from flwr.app import ConfigRecord, Message, RecordDict

    last = state["rounds"][-1] if state["rounds"] else {}
    done = ConfigRecord({"finished": True, "rounds": int(state["completed"]),
                         "accuracy": float(last.get("accuracy") or 0.0)})
    messages = [Message(content=RecordDict({"config": done}), message_type="query", dst_node_id=n)
                for n in grid.get_node_ids()]
    if messages:
        list(grid.send_and_receive(messages, timeout=timeout))


class _Log:
    def __init__(self, path: Path):
        self.path = path

    def __call__(self, line: str) -> None:
        text = f"{_now()} {line}"
        print(text, flush=True)
        with open(self.path, "a") as fh:
            fh.write(text + "\n")
