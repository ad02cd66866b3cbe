"""Many simulated fleet devices on one machine, driven by the fleet's own code (for tools/bench_fleet.py).

Flower's simulation engine needs Ray (its only backend, `flwr[simulation]`), which edgetrain does not
install; and 30 real `fleet join` processes (each a SuperNode, a SuperExec and a ClientApp process per
message) do not fit two cores. So this runs what those processes run, in one process: the coordinator's
rounds (``edgetrain.fleet.coordinator.run``, unchanged) talk to an in-process grid (``LocalGrid``: the three
calls the coordinator makes of Flower's Grid) that hands each message to the ClientApp's own functions
(``edgetrain.fleet.apps``: ``client.train`` with its staged exactly-once state, the codec, the wire records)
with each device's join.json, as Flower's in-memory grid and simulation engine do. What is left out is only
the transport (gRPC/HTTP, TLS): the bytes reported are those of the encoded records.

Each round a seeded 20% of the devices drop out: each is asked, and answers as a device whose heartbeat
stopped does under Flower (an error reply, code 5), so the coordinator records it under ``failed``.
"""
from __future__ import annotations

import json
import queue
import threading
import uuid
from pathlib import Path

import numpy as np


class LocalGrid:
    """The coordinator's view of Flower's Grid (get_node_ids, push_messages, pull_messages), in process.
    ``devices``: node id -> join.json path. ``drop``: a function (round) -> node ids that drop out that round.
    One worker trains at a time (the machine's cores are the devices' threads)."""

    def __init__(self, devices: dict[int, str], drop, workers: int = 1):
        from flwr.supercore.task_identity import TaskIdentity

        TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 0, 1  # as in a ServerApp process
        self.devices, self.drop = devices, drop
        self.replies: dict[str, object] = {}
        self.lock = threading.Lock()
        self.jobs: queue.Queue = queue.Queue()
        self.workers = [threading.Thread(target=self._work, daemon=True) for _ in range(workers)]
        for w in self.workers:
            w.start()

    def get_node_ids(self):
        return list(self.devices)

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            mid = uuid.uuid4().hex
            msg.metadata.__dict__["_message_id"] = mid  # what the SuperLink does (Flower's InMemoryGrid too)
            self.jobs.put(msg)
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        with self.lock:
            return [self.replies.pop(m) for m in message_ids if m in self.replies]

    def _work(self):
        from flwr.app import Context, Error, Message, RecordDict

        from edgetrain.fleet import apps

        while True:
            msg = self.jobs.get()
            node = msg.metadata.dst_node_id
            ctx = Context(run_id=1, node_id=node, node_config={"edgetrain": self.devices[node]}, state=RecordDict(),
                          run_config={})
            config = dict(msg.content["config"])
            try:
                if msg.metadata.message_type == "train" and node in self.drop(int(config["round"])):
                    reply = Message(Error(code=5, reason="the node went offline (simulated dropout)"), reply_to=msg)
                elif msg.metadata.message_type == "train":
                    reply = apps._train(msg, ctx)
                else:
                    reply = apps._query(msg, ctx)
            except Exception as exc:  # as Flower wraps a ClientApp's exception
                reply = Message(Error(code=0, reason=f"<class '{type(exc).__name__}'>:<'{exc}'>"), reply_to=msg)
            with self.lock:
                self.replies[msg.metadata.message_id] = reply


def shares_for(n: int, per_device: int = 3, seed: int = 0) -> tuple:
    """Non-IID: device k holds ``per_device`` of the ten digits (a seeded choice; every digit held by some)."""
    rng = np.random.RandomState(seed)
    out = []
    for k in range(n):
        first = k % 10  # every digit is some device's
        rest = rng.choice([d for d in range(10) if d != first], per_device - 1, replace=False)
        out.append(tuple(sorted([first, *map(int, rest)])))
    return tuple(out)


def run(work: Path, model: str, n: int, rounds: int, drop_fraction: float = 0.2, seed: int = 0, codec: str = "int8",
        aggregate: str = "scaffold", epochs: int = 1, per_device: int | None = None,
        server_momentum: float | None = None, alpha: float | None = None, fraction: float = 1.0,
        train_layers: str = "head", uplink_ratio: float = 0.0, downlink_ratio: float = 0.0) -> dict:
    """A whole simulated fleet: writes work/run (RUNDIR, as `fleet serve` writes it) and returns fleet.json's
    rounds with each round's wall time."""
    import time

    from edgetrain.fleet import coordinator as coord
    from edgetrain.fleet import store
    from edgetrain.fleet.demo import split_digits
    from edgetrain.fleet.local import Evaluator, LocalSpec

    work.mkdir(parents=True, exist_ok=True)
    data = split_digits(work / "data", shares=shares_for(n, seed=seed), per_device=per_device,
                        seed=seed if alpha else 0, dirichlet=(n, alpha) if alpha else None)
    rundir = work / "run"
    rundir.mkdir()
    ev = Evaluator(LocalSpec(model=model, data=data["val"], workdir=str(rundir / "work"), threads=1, seed=seed,
                             train_layers=train_layers),
                   data["val"])
    store.save_global(rundir, 0, ev.initial)
    store.write_state(rundir, {"format": store.STATE_FORMAT, "completed": 0, "classes": ev.classes,
                               "initial_accuracy": ev.top1(ev.initial), "rounds": [], "model": model, "codec": codec})
    spec = store.ServeSpec(
        rundir=str(rundir), model=model, val=data["val"], rounds=rounds, min_clients=n, min_updates=1,
        fraction=fraction, aggregate=aggregate, round_timeout=600.0, join_timeout=60.0, codec=codec, epochs=epochs,
        batch_size=32, optimizer="sgd", seed=seed, train_layers=train_layers, threads=1, uplink_ratio=uplink_ratio,
        downlink_ratio=downlink_ratio,
        server_momentum=server_momentum if server_momentum is not None else coord.SERVER_MOMENTUM)
    spec_path = spec.write()
    devices = {}
    for k, path in enumerate(data["devices"]):
        state = work / f"device-{k:02d}"
        state.mkdir()
        join = {"name": f"device-{k:02d}", "data": path, "state": str(state), "device": None, "threads": 1,
                "memory_budget": None, "model": model, "params": None}
        (state / "join.json").write_text(json.dumps(join))
        devices[1000 + k] = str(state / "join.json")
    rng = np.random.RandomState(seed + 1)
    dropped = {r: set(rng.choice(sorted(devices), int(round(drop_fraction * n)), replace=False).tolist())
               for r in range(1, rounds + 1)}
    grid = LocalGrid(devices, lambda r: dropped.get(r, set()))
    coord.GOODBYE_SECONDS = 30.0
    t0 = time.monotonic()
    coord.run(grid, str(spec_path))
    state = store.read_state(rundir)
    return {"devices": n, "rounds": state["rounds"], "initial_accuracy": state["initial_accuracy"],
            "shares": shares_for(n, seed=seed), "dropped": {r: len(v) for r, v in dropped.items()},
            "wall_seconds": time.monotonic() - t0, "rundir": str(rundir)}
