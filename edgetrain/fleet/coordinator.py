"""The coordinator's rounds (runs inside Flower's ServerApp process).

Each round: find who is there (every new Flower node is asked once for its name and device key: a device
keeps its key across rejoins, when its node id changes), send the global trainable part (float32: the
output layer, or with ``--train-layers last:N`` every array of the tail) to a fraction of the devices,
each message telling that device the last round of it the coordinator aggregated (``accepted``: what lets
a device commit its staged state exactly once, see client.py), collect replies until ``round_timeout``
(a hard deadline: each reply is pulled on its own and the round closes on time, whatever Flower is still
retrying), decode every update (refusing one whose arrays do not fit the global model, that is not finite, whose
sample count is not a whole number in 1..MAX_SAMPLES, or whose norm exceeds the round's bound: see
``norm_bound``; the device is named and the round goes on without it), average the
updates weighted by each device's sample count in a fixed order (by name: the same updates give the same
arrays bit for bit), add the average to the global weights and check them on the held-out data. Each
device asked is recorded once, by its name: a participant, refused, failed (with its reason) or timed out.
A round with fewer than ``min_updates`` usable updates leaves the global weights unchanged and is not a
completed round. After each round the global weights, then the round's state (its record, and which
device's update is in those weights) are written atomically to RUNDIR, so a coordinator killed and
started again with ``--resume`` continues after the last saved round, asking for the unsaved one again; then the
previous round's files are deleted (store.prune_rounds).
"""
from __future__ import annotations

import itertools
import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path

import numpy as np

from ..errors import EdgetrainError
from ..figures import Chance
from ..options import TrainLayers
from .codec import decode_tensor
from .local import Evaluator, LocalSpec, check_shapes
from .store import ServeSpec, load_global, prune_rounds, read_state, save_global, write_state
from .strategy import downlink_for, strategy_for

# the default server momentum, every codec: +1.2 points for fp32 on the last:2 fleet over 48 seeds, +1.8 on the
# head over 12, +2 to +5 on 30 devices (tools/fleet_codec_sim.py, tools/fleet_sim.py; the README's fleet section)
SERVER_MOMENTUM = 0.4
GOODBYE_SECONDS = 15.0  # how long the last message (the run is over) waits for the devices' answers


def decode_update(update: dict, global_arrays: dict, who: str) -> dict:
    """Decoded deltas of one device, or ShapeMismatch when they do not fit the global model."""
    check_shapes(global_arrays, {k: e.shape for k, e in update.items()}, f"update from {who}",
                 "that device fine-tunes a different model or class list; it is left out of the average")
    return {k: decode_tensor(e) for k, e in update.items()}


NORM_FACTOR = 10.0  # default bound: an update's norm at most this many times the round's median update norm
GLOBAL_FACTOR = 1000.0  # ... and at most this many times the global arrays' norm (at least 1)
MAX_SAMPLES = 10**9  # a device's sample count (its weight in the average) is an integer in 1..MAX_SAMPLES
COUNT_FACTOR = 10  # a device's weight in the average is at most this many times the round's median sample count


def answers(facts: dict, round_no: int, digest: str) -> str | None:
    """Why a reply does not answer this round with the arrays sent (a replayed message), or None."""
    said = facts.get("round")
    if said != round_no or facts.get("trained-from") != digest:
        what = f"round {said}" if said != round_no else "other global arrays than this round's"
        return f"its reply answers {what}, not round {round_no} (a replayed message)"
    return None


def weights(counts: list[int]) -> tuple[list[int], int | None]:
    """Each update's weight: its sample count, at most COUNT_FACTOR times the round's lower median (one device
    claiming more samples than it has cannot outweigh the others), and that cap (None: one update or none)."""
    if len(counts) < 2:
        return list(counts), None
    cap = COUNT_FACTOR * sorted(counts)[(len(counts) - 1) // 2]
    return [min(n, cap) for n in counts], cap


def sample_count(value) -> tuple[int | None, str | None]:
    """A device's reported sample count as the weight of its update, or why it is refused."""
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None, f"its sample count {value!r} is not a number"
    if not np.isfinite(v) or v != int(v) or not 1 <= v <= MAX_SAMPLES:
        return None, f"its sample count {value!r} is not a whole number in 1..{MAX_SAMPLES}"
    return int(v), None


def update_norm(delta: dict) -> float:
    """L2 norm of a whole update (every array, SCAFFOLD's control deltas included), inf when non-finite."""
    total = 0.0
    for v in delta.values():
        v = np.asarray(v, np.float64)
        if not np.all(np.isfinite(v)):
            return float("inf")
        total += float(np.sum(v * v))
    return float(np.sqrt(total)) if np.isfinite(total) else float("inf")


def norm_bound(norms: list[float], arrays: dict, given: float | None) -> tuple[float, str]:
    """The largest update norm this round accepts, and how it was set (``given``: --max-update-norm)."""
    if given:
        return float(given), f"--max-update-norm {given:g}"
    scale = max(1.0, update_norm(arrays))
    bound, how = GLOBAL_FACTOR * scale, f"{GLOBAL_FACTOR:g}x the global arrays' norm {scale:.3g}"
    finite = sorted(n for n in norms if np.isfinite(n))
    if len(finite) >= 2:  # the lower median: one hostile device among two cannot raise it
        median = finite[(len(finite) - 1) // 2]
        if NORM_FACTOR * median < bound:
            bound, how = NORM_FACTOR * median, f"{NORM_FACTOR:g}x the round's median update norm {median:.3g}"
    return bound, how


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


@dataclass
class RoundRecord:
    """One round as fleet-state.json records it: every device asked, once by name, under participants,
    refused, failed or timed_out; the bytes each way; the held-out top-1 of the global arrays after it."""

    round: int
    started: str
    codec: str
    available: int
    participants: list = field(default_factory=list)
    refused: list = field(default_factory=list)
    failed: list = field(default_factory=list)
    timed_out: list = field(default_factory=list)
    bytes_down: int = 0
    bytes_down_fp32: int = 0
    downlink_whole: list | None = None  # the ternary downlink: the devices sent the arrays whole
    max_update_norm: float = 0.0
    updates: int = 0
    updated: bool = False
    bytes_up: int = 0
    bytes_up_fp32: int = 0
    accuracy: float = 0.0
    seconds: float = 0.0

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if not (k == "downlink_whole" and v is None)}

    def drop(self, kind: str, d, reason: str | None, log, line: str | None = None) -> None:
        """Record device ``d`` under ``kind`` (refused, failed, timed_out) with its reason, and log ``line``
        (default: its update refused, and why)."""
        who = {"client": d.name, "device_id": d.key, "node_id": d.node}
        getattr(self, kind).append({**who, "reason": reason} if reason is not None else who)
        log(f"round {self.round}: " + (line or f"refused the update of {d.name}: {reason}"))

    def outcome(self, key: str) -> str | None:
        """Why device ``key`` has no update in this round, or None."""
        for kind in ("refused", "failed", "timed_out"):
            for x in getattr(self, kind):
                if x["device_id"] == key:
                    return x.get("reason") or f"no answer within the round ({kind.replace('_', ' ')})"
        return None


def sample(present: list, k: int, seed: int, round_no: int) -> list:
    """The ``k`` devices asked in round ``round_no``: a random sample of ``present`` seeded by ``seed`` and the
    round (as Flower's strategies sample: over the rounds every device is asked), the same again on --resume."""
    if k >= len(present):
        return list(present)
    pick = np.random.RandomState([seed, round_no]).choice(len(present), k, replace=False)
    return [present[i] for i in sorted(pick)]


@dataclass
class _Update:
    device: _Device
    delta: dict
    weight: int
    entry: dict  # its participants entry in the round's record


def run(grid, spec_path: str) -> None:
    """The whole federated run (the ServerApp's main)."""
    from . import wire  # lazy: Flower is an optional extra; wire imports it

    spec = ServeSpec.read(spec_path)
    rundir = Path(spec.rundir)
    log = _Log(rundir / "coordinator-rounds.log")
    state = read_state(rundir)
    if state is None:  # `fleet serve` writes it before any Flower process starts
        raise RuntimeError(f"{rundir} holds no fleet state")
    devices = state.setdefault("devices", {})  # device key -> name, accepted (its last round aggregated), ...
    evaluator = Evaluator(LocalSpec(model=spec.model, data=spec.val, workdir=str(rundir / "work"),
                                    threads=spec.threads, seed=spec.seed, params=spec.params,
                                    train_layers=TrainLayers(spec.train_layers)), spec.val)
    arrays = load_global(rundir, state["completed"])
    strategy = strategy_for(spec, state["completed"], arrays, evaluator.statistics)
    downlink = downlink_for(spec, state)
    roster = _Roster(grid, log)
    log(f"resuming after round {state['completed']}" if state["completed"] else
        "starting" + (" (again: no round was saved before)" if (rundir / "coordinator-rounds.log").exists() else ""))
    for round_no in range(state["completed"] + 1, spec.rounds + 1):
        present = roster.wait(spec.min_clients, spec.join_timeout)
        t0 = time.monotonic()
        record = RoundRecord(round_no, _now(), spec.codec, available=len(present))
        chosen = sample(present, max(spec.min_updates, int(round(len(present) * spec.fraction))), spec.seed, round_no)
        downlink.prepare(strategy.target(arrays), evaluator.statistics, wire)
        messages = _messages(spec, round_no, chosen, downlink, devices, evaluator.classes)
        log(f"round {round_no}: sent to {len(chosen)} of {len(present)} devices ({', '.join(d.name for d in chosen)})")
        replies = exchange(grid, messages, t0 + spec.round_timeout)
        waited = time.monotonic() - t0
        downlink.account(record, chosen, wire)
        answered = {d.key for d, reply in zip(chosen, replies) if reply is not None and not reply.has_error()}
        updates = [u for d, reply in zip(chosen, replies)
                   if (u := _screen(d, reply, record, arrays, downlink.received(d.key), strategy, waited, spec, log))]
        updates = _weigh(_bounded(updates, record, arrays, spec.max_update_norm, log), record, log)
        record.updates, record.updated = len(updates), len(updates) >= spec.min_updates
        _hold(round_no, "aggregating", rundir)
        if record.updated:
            # in a fixed order (by name, then key): the same updates give the same global arrays, bit for bit
            updates.sort(key=lambda u: (u.device.name, u.device.key))
            arrays = strategy.fold(arrays, [(u.delta, u.weight) for u in updates], record.available, round_no)
        else:
            log(f"round {round_no}: {len(updates)} usable update(s), fewer than --min-updates {spec.min_updates}: "
                "no update accepted, global weights unchanged")
        _note_devices(devices, chosen, record, {u.device.key for u in updates} if record.updated else set(),
                      answered, downlink, round_no)
        record.bytes_up = sum(p["bytes_up"] for p in record.participants)
        record.bytes_up_fp32 = sum(p["bytes_up_fp32"] for p in record.participants)
        record.accuracy = evaluator.top1(arrays)
        state["chance"] = Chance.measure(100.0 * record.accuracy, evaluator.job.train_ds.labels,
                                         len(evaluator.classes)).to_dict()
        record.seconds = round(time.monotonic() - t0, 3)
        strategy.save(rundir, round_no)
        save_global(rundir, round_no, arrays)
        downlink.save(rundir, round_no, state)
        _hold(round_no, "saving", rundir)
        state["rounds"].append(record.to_dict())
        state["completed"] = round_no
        # after the weights: the state never names weights not on disk; and a device's `accepted` becomes
        # true here, with the weights that hold its update (never before: a device commits on its word)
        write_state(rundir, state)
        _hold(round_no, "pruning", rundir)
        # only after the state: it no longer names what is deleted (the previous round's global arrays included)
        for _ in itertools.chain(downlink.prune(state), prune_rounds(rundir, round_no)):
            _hold(round_no, "pruned", rundir)
        log(f"round {round_no}: {len(updates)} update(s) accepted, held-out top-1 {record.accuracy:.4f}, "
            f"{record.bytes_up} bytes up, {record.seconds:.1f}s"
            + ("" if record.updated else " (no update accepted: not a completed round)"))
    state["finished"] = _now()
    write_state(rundir, state)
    # a device still finishing the last round (it timed out) takes the goodbye after it: then wait up to a
    # round (a dead one ends that sooner: Flower answers for a node whose heartbeat stopped)
    busy = bool(state["rounds"] and state["rounds"][-1].get("timed_out"))
    _goodbye(grid, roster, state, max(GOODBYE_SECONDS, spec.round_timeout) if busy else GOODBYE_SECONDS)


def _messages(spec: ServeSpec, round_no: int, chosen: list, downlink, devices: dict, classes) -> list:
    """The round's train message to each chosen device."""
    from flwr.app import ConfigRecord, Message, RecordDict

    config = {"round": round_no, "codec": spec.codec, "model": spec.model, "epochs": spec.epochs,
              "batch_size": spec.batch_size, "lr": spec.lr or 0.0, "optimizer": spec.optimizer, "seed": spec.seed,
              "train_layers": spec.train_layers, **downlink.config(),
              "classes": list(classes)}  # the fleet's: a device may hold any subset of them
    messages = []
    for d in chosen:
        content, extra = downlink.message(d.key, devices, d.start)
        # `accepted` is what lets a device commit (or drop) the round it staged: see client.py
        accepted = int(devices.get(d.key, {}).get("accepted", 0))
        messages.append(Message(content=RecordDict({"arrays": content, "config": ConfigRecord(
            {**config, **extra, "accepted": accepted})}), message_type="train", dst_node_id=d.node,
            ttl=spec.round_timeout))
    return messages


def _screen(d, reply, record: RoundRecord, arrays: dict, received: tuple[dict, str], strategy, waited: float,
            spec: ServeSpec, log) -> _Update | None:
    """Device ``d``'s reply as a usable update, or None with why in the record: no reply, an error reply, arrays
    that do not fit, a replayed message, a bad sample count or control scale, a non-finite update. ``received``:
    what the device was sent to train from, as it reconstructs it, and its digest."""
    from . import wire

    if reply is None:
        record.drop("timed_out", d, None, log, f"{d.name} timed out: no answer when the round closed after "
                                               f"{waited:.1f}s (--round-timeout {spec.round_timeout:g})")
        return None
    if reply.has_error():
        reason = _error_reason(reply.error)
        kind = "refused" if "model mismatch" in reason else "failed"
        record.drop(kind, d, reason, log, f"{d.name} {kind}: {reason}")
        return None
    metrics, facts = dict(reply.content["metrics"]), dict(reply.content["facts"])
    try:
        delta = decode_update(wire.from_record(reply.content["update"]), strategy.expected(arrays), d.name)
    except (EdgetrainError, ValueError) as exc:
        record.drop("refused", d, exc.line() if isinstance(exc, EdgetrainError) else str(exc), log)
        return None
    sent, digest = received
    count, why = sample_count(metrics.get("num-examples", 1))
    why = answers(facts, record.round, digest) or why
    if why is None:
        why = strategy.complete(delta, metrics, sent)
    norm = update_norm(delta)
    if why is None and not np.isfinite(norm):
        why = "its update is not finite (NaN or inf)"
    if why is not None or count is None:  # (no count: why says so)
        record.drop("refused", d, why, log)
        return None
    entry = {"client": d.name, "device_id": d.key, "node_id": d.node, "device": facts.get("device"),
             "energy_provenance": facts.get("energy"), "update_norm": norm,
             **{k.replace("-", "_"): v for k, v in metrics.items()}}
    record.participants.append(entry)
    return _Update(d, delta, count, entry)


def _bounded(updates: list[_Update], record: RoundRecord, arrays: dict, given: float | None, log) -> list[_Update]:
    """The updates whose norm is within the round's bound (from the user, else from this round's updates: see
    norm_bound); the others refused, by name."""
    bound, how = norm_bound([u.entry["update_norm"] for u in updates], arrays, given)
    record.max_update_norm = bound
    kept = []
    for u in updates:
        if u.entry["update_norm"] <= bound:
            kept.append(u)
            continue
        record.participants.remove(u.entry)
        record.drop("refused", u.device, f"its update's norm {u.entry['update_norm']:.3g} exceeds {bound:.3g} ({how})",
                    log)
    return kept


def _weigh(updates: list[_Update], record: RoundRecord, log) -> list[_Update]:
    """Each update weighted by its sample count, capped (see weights): a lie about the count still counts."""
    capped, cap = weights([u.weight for u in updates])
    for u, w in zip(updates, capped):
        u.entry["weight"] = w
        if cap is not None and w < u.weight:
            log(f"round {record.round}: capped the weight of {u.device.name}: it claims {u.weight} samples, more "
                f"than {COUNT_FACTOR}x the round's median ({cap // COUNT_FACTOR})")
        u.weight = w
    return updates


def _note_devices(devices: dict, chosen: list, record: RoundRecord, accepted: set, answered: set, downlink,
                  round_no: int) -> None:
    """Each device asked this round: asked once more, what it holds, and its last accepted round or why not."""
    for d in chosen:
        entry = devices.setdefault(d.key, {"name": d.name, "accepted": 0, "updates": 0, "asked": 0})
        entry["name"] = d.name
        entry["asked"] += 1
        downlink.after(entry, d.key in answered, round_no, record.outcome(d.key))
        if d.key in accepted:
            entry.update(accepted=round_no, updates=entry["updates"] + 1)
            entry.pop("reason", None)
        else:
            entry["reason"] = record.outcome(d.key) or "not enough updates this round (--min-updates)"


def _hold(round_no: int, phase: str, rundir: Path) -> None:
    from .hooks import delay

    delay(round_no, phase, rundir)


_FLOWER_ERRORS = {3: "the instruction expired before the device took it", 4: "its reply expired on the way",
                  5: "the device went offline (no heartbeat)", 8: "the device's ClientApp crashed"}


def _error_reason(error) -> str:
    """One line for an error reply: the device's own last line (its exception), or what Flower says."""
    text = (error.reason or "").strip()
    if error.code in _FLOWER_ERRORS:
        return _FLOWER_ERRORS[error.code]
    import re

    raised = re.fullmatch(r"<class '[\w.]+'>:<'(.*)'>", text, flags=re.S)  # how Flower wraps the exception
    text = raised.group(1) if raised else text
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else f"error code {error.code}")[:400]


def exchange(grid, messages: list, deadline: float, poll: float = 1.0) -> list:
    """Send ``messages`` and collect their replies until ``deadline`` (time.monotonic()): the replies in the
    messages' order, None where none came. A hard bound: Flower's own send_and_receive pulls every reply
    in one call that waits (up to hours) for a half-uploaded one; here each message is pulled by its own
    thread, and at the deadline the round goes on without the threads still waiting."""
    return _Replies(grid, messages, deadline, poll).collect()


class _Replies:
    """``messages`` sent, and their replies pulled in the background (each message by its own thread) until
    ``deadline``: ``got`` holds each reply as it comes (None: none yet), in the messages' order."""

    def __init__(self, grid, messages: list, deadline: float, poll: float = 1.0) -> None:
        import threading

        self.grid, self.messages, self.deadline, self.poll = grid, messages, deadline, poll
        self.got: list = [None] * len(messages)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        import threading

        ids: list = []

        def push():
            ids.extend(self.grid.push_messages(self.messages))

        pusher = threading.Thread(target=push, daemon=True)
        pusher.start()
        pusher.join(max(0.0, self.deadline - time.monotonic()))
        if pusher.is_alive() or not ids:
            return
        threads = [threading.Thread(target=self._pull, args=(i, mid), daemon=True) for i, mid in enumerate(ids) if mid]
        for th in threads:
            th.start()
        for th in threads:
            th.join(max(0.0, self.deadline - time.monotonic()))

    def _pull(self, i: int, mid: str) -> None:
        while not self.stop.is_set() and time.monotonic() < self.deadline:
            got = list(self.grid.pull_messages([mid]))
            if got:
                self.got[i] = got[0]
                return
            self.stop.wait(self.poll)

    def collect(self) -> list:
        """The replies once all came or at the deadline (later replies are dropped)."""
        self.thread.join(max(0.0, self.deadline - time.monotonic()))
        self.stop.set()
        return list(self.got)  # a copy: a reply pulled after the deadline is not this round's


class _Device:
    """A device as its hello described it; ``start``: where its initial arrays come from (local.start_digests;
    None: a device that did not say)."""

    __slots__ = ("node", "key", "name", "seen", "start")

    def __init__(self, node: int, key: str, name: str, seen: float, start: dict | None = None):
        self.node, self.key, self.name, self.seen, self.start = node, key, name, seen, start


class _Roster:
    """Who is there, by device: Flower's node ids, each asked once who it is (a ``hello`` query: its name
    and device key). A device that rejoins gets a new node id while Flower still lists the old one for a
    while; the newest node of a key stands for the device, so each device is asked once per round.

    A hello does not block: it is sent, its reply pulled in the background, and each call of ``identify`` takes
    the replies come since. Flower lists a node whose SuperNode died until its heartbeat runs out (up to a
    minute): after a restart, the nodes of devices killed with the coordinator never answer. So the nodes listed
    when the coordinator starts are waited for only as long as a round needs devices (``wait``'s ``want``); a
    node that appears later (a device joining, or rejoining with a new node id while its old one is known) is
    waited for through its hello, as it always was, so a device that rejoined takes part in the next round."""

    HELLO_SECONDS = 20.0
    # a node that did not say who it is is asked again after this long: no longer than a hello's wait, or a
    # device still busy with a round when the coordinator restarted (its SuperNode answers the hello after the
    # ClientApp it is running) is not asked again within --join-timeout and the resumed round goes on without
    # it (measured: 5 devices held in round 2 while the coordinator was killed; 4 of 5 missed round 2 at 60 s)
    SILENT_RETRY = HELLO_SECONDS

    def __init__(self, grid, log) -> None:
        self.grid, self.log = grid, log
        self.known: dict[int, _Device] = {}
        self.asking: dict[int, tuple[float, float, _Replies, int]] = {}  # node -> its hello's start, end, ... its index
        self.silent: set[int] = set()  # nodes that let a whole hello's wait pass without saying who they are
        self.listed: list[int] = []  # the nodes Flower listed at the last call of identify
        self.initial: set[int] | None = None  # ... at the first: dead ones among them after a restart

    def identify(self, seconds: float) -> list[_Device]:
        """The devices known now, newest node of each key, by name; every node listed that has not said who it
        is (and is not being asked) is sent a hello that waits ``seconds`` for it, not blocking this call."""
        from flwr.app import ConfigRecord, Message, RecordDict

        nodes = self.listed = sorted(self.grid.get_node_ids())
        if self.initial is None:
            self.initial = set(nodes)
        self._heard()
        ask = [n for n in nodes if n not in self.known and n not in self.asking]
        if ask:
            hello = [Message(content=RecordDict({"config": ConfigRecord({"hello": True})}), message_type="query",
                             dst_node_id=n, ttl=seconds) for n in ask]
            now = time.monotonic()
            end = now + min(seconds, self.SILENT_RETRY)
            replies = _Replies(self.grid, hello, end)
            self.asking.update({n: (now, end, replies, i) for i, n in enumerate(ask)})
        newest: dict[str, _Device] = {}
        for n in nodes:
            d = self.known.get(n)
            if d is not None and (d.key not in newest or d.seen > newest[d.key].seen):
                newest[d.key] = d
        return sorted(newest.values(), key=lambda d: (d.name, d.key))

    def _heard(self) -> None:
        """Take the hellos answered since the last call; a node whose hello's wait passed is asked again."""
        now = time.monotonic()
        for n, (asked, end, replies, i) in list(self.asking.items()):
            reply = replies.got[i]
            if reply is not None and not reply.has_error():
                c = dict(reply.content["config"])
                start = ({k: str(c[f"start-{k}"]) for k in ("model", "params")} if "start-params" in c else None)
                self.known[n] = _Device(n, str(c["key"]), str(c["name"]), now, start)
                self.log(f"{c['name']} said who it is {now - asked:.1f}s after it was asked")
                self.silent.discard(n)
                del self.asking[n]
            elif now >= end:  # (an error reply too: the node is asked again once the hello's wait is over)
                self.silent.add(n)
                del self.asking[n]

    def joining(self) -> list[int]:
        """The nodes that appeared after the coordinator started and are being asked who they are for the first
        time (a device joining or rejoining: each answers within its hello's wait, unless it is gone already)."""
        initial = self.initial or set()
        return [n for n in self.listed if n in self.asking and n not in self.silent and n not in initial]

    def wait(self, want: int, seconds: float) -> list[_Device]:
        """``want`` devices, as soon as they are known and no device joining is still saying who it is, or after
        ``seconds`` whoever is there (at least one)."""
        end = time.monotonic() + seconds
        while True:
            present = self.identify(min(self.HELLO_SECONDS, seconds))
            if len(present) >= want and not self.joining() or present and time.monotonic() > end:
                return present
            if time.monotonic() > end + seconds:
                raise RuntimeError(f"no device joined within {2 * seconds:.0f}s")
            time.sleep(0.5)

    def settle(self, seconds: float) -> list[_Device]:
        """The devices known once no device joining is still saying who it is, or after ``seconds``."""
        end = time.monotonic() + seconds
        while True:
            present = self.identify(min(self.HELLO_SECONDS, seconds))
            if not self.joining() or time.monotonic() > end:
                return present
            time.sleep(0.5)


def _goodbye(grid, roster: _Roster, state: dict, timeout: float) -> None:
    """Tell every device the run is over, and what became of its updates (their `fleet join` then exits:
    0, or 1 when none of its updates was aggregated, with the reason)."""
    from flwr.app import ConfigRecord, Message, RecordDict

    last = state["rounds"][-1] if state["rounds"] else {}
    devices = state.get("devices", {})
    messages = []
    for d in roster.settle(min(roster.HELLO_SECONDS, timeout)):
        mine = devices.get(d.key, {})
        messages.append(Message(content=RecordDict({"config": ConfigRecord({
            "finished": True, "rounds": int(state["completed"]), "accuracy": float(last.get("accuracy") or 0.0),
            "accepted": int(mine.get("accepted", 0)), "updates": int(mine.get("updates", 0)),
            "asked": int(mine.get("asked", 0)), "reason": str(mine.get("reason", ""))})}),
            message_type="query", dst_node_id=d.node, ttl=timeout))
    if messages:
        exchange(grid, messages, time.monotonic() + timeout)


class _Log:
    def __init__(self, path: Path):
        self.path = path

    def __call__(self, line: str) -> None:
        text = f"{_now()} {line}"
        print(text, flush=True)
        with open(self.path, "a") as fh:
            fh.write(text + "\n")
