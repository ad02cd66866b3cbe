"""edgetrain fleet under faults: real SIGKILLs of the real processes (a device, the coordinator, both: each
with everything Flower started for it) at each phase of a round, then the killed ones started again; the
final global arrays (weights and SCAFFOLD control variate) must equal a fault-free run's bit for bit, every
device's committed state must count exactly the rounds the coordinator aggregated from it, and no round
may be trained twice (a replayed round answers with the staged reply: the devices' journals say which).

The phases are reached with the test hook EDGETRAIN_FLEET_TEST_DELAY=ROUND:SECONDS:PHASE, which makes the
process wait there and leave a marker file; the kill is a SIGKILL while it waits. A device killed before
its update reached the coordinator cannot match the fault-free run (its update of that round is lost, on
both sides): it is compared with the run where that device is too slow for that round (timed out)."""
from __future__ import annotations

import os
import re
import signal
import time
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from fleettools import (CONFIG, DEVICES, HOLD, MODEL, RUN_TIMEOUT, TIMEOUT, Fleet, device,  # noqa: E402,F401
                        exactly_once, fault_free, final_arrays, finish, fleet, fleet_cache, marked, no_mxnet, onnx_mode,
                        onnx_reference, report, shares, wait_for)


@pytest.fixture(scope="module")
def reference(tmp_path_factory, shares, fleet_cache):
    """The fault-free run every kill is compared with."""
    arrays, res, _ = fault_free(tmp_path_factory, shares, fleet_cache, "reference")
    assert all(r["updates"] == len(DEVICES) for r in res["rounds"])
    return arrays


@pytest.fixture(scope="module")
def without_dev1_round1(tmp_path_factory, shares, fleet_cache):
    """The fault-free run where dev1's round-1 update never arrives (dev1 is slower than the round)."""
    arrays, res, _ = fault_free(tmp_path_factory, shares, fleet_cache, "slow-dev1",
                                {"dev1": {HOLD: f"1:{TIMEOUT + 5}:training"}})
    r1 = res["rounds"][0]
    assert [x["client"] for x in r1["timed_out"]] == ["dev1"] and r1["updates"] == 1
    return arrays


def _equal(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    diff = {k: float(np.abs(a[k] - b[k]).max()) for k in a if not np.array_equal(a[k], b[k])}
    assert not diff, diff


def _killed_run(fleet: Fleet, held: dict[str, str], wait: list[Path], kill: list[str], extra=(),
                resumed_after: int = 0, env: dict | None = None) -> tuple[dict, dict]:
    """Start the coordinator and the devices (``held``: process -> hook value; ``env``: every process's), wait
    for the markers, SIGKILL the processes in ``kill`` (each with its whole Flower family), start them again
    (the coordinator with --resume), run to the end. Returns (final arrays, fleet.json)."""
    run = fleet.folder / "run"
    env = env or {}
    fleet.serve(run, *CONFIG, *extra, env={**env, HOLD: held["serve"]} if "serve" in held else env)
    for d in DEVICES:
        device(fleet, d, env={**env, HOLD: held[d]} if d in held else env)
    wait_for(lambda: all(p.exists() for p in wait), RUN_TIMEOUT, f"markers {[p.name for p in wait]}")
    for who in kill:
        fleet.kill("serve" if who == "serve" else f"{who}-0")
    serve_key = "serve"
    keys = {d: f"{d}-0" for d in DEVICES}
    for who in kill:
        if who == "serve":
            serve_key = "serve-1"
            fleet.serve(run, *CONFIG, *extra, "--resume", key=serve_key, env=env)
        else:
            device(fleet, who, 1, env=env)
            keys[who] = f"{who}-1"
    res = finish(fleet, serve_key, keys.values())
    if "serve" in kill:  # the kill came before the state of round resumed_after + 1 was written
        assert res["resumed_after"] == resumed_after
    return final_arrays(run), res


# where each process waits (and leaves its marker) before the kill; the kills; what the result must equal
SCENARIOS = {
    # the coordinator dies while the devices train round 1 (they finish, stage, cannot deliver): resumed,
    # it asks for round 1 again and gets the staged replies
    "coordinator-while-devices-train": ({"dev0": "1:8:training", "dev1": "1:8:training"}, ["dev0", "dev1"],
                                        ["serve"], "reference"),
    # ... while the replies are on their way (staged, not yet returned)
    "coordinator-while-replies-travel": ({"dev0": "1:8:sending", "dev1": "1:8:sending"}, ["dev0", "dev1"],
                                         ["serve"], "reference"),
    "coordinator-aggregating": ({"serve": "1:600:aggregating"}, ["run"], ["serve"], "reference"),
    # global weights written, the round's state not: round 1 is redone from the same weights
    "coordinator-saving": ({"serve": "1:600:saving"}, ["run"], ["serve"], "reference"),
    # a device dies after the coordinator has its update: it commits on the next round's word
    "device-while-coordinator-aggregates": ({"serve": "1:10:aggregating"}, ["run"], ["dev1"], "reference"),
    # a device dies before its update left: lost on both sides, like a device too slow for the round
    "device-training": ({"dev1": "1:600:training"}, ["dev1"], ["dev1"], "without_dev1_round1"),
    "device-sending": ({"dev1": "1:600:sending"}, ["dev1"], ["dev1"], "without_dev1_round1"),
    "both-while-devices-train": ({"dev0": "1:600:training", "dev1": "1:600:training"}, ["dev0", "dev1"],
                                 ["serve", "dev0", "dev1"], "reference"),
}


def _marker(fleet: Fleet, held: dict, where: str) -> Path:
    phase = held["serve" if where == "run" else where].split(":")[2]
    return fleet.folder / where / f"delayed-{phase}-1"


def _check(fleet, request, name: str, held, wait, kill, expected) -> dict:
    arrays, res = _killed_run(fleet, held, [_marker(fleet, held, w) for w in wait], kill)
    journals = exactly_once(fleet, res)
    _equal(arrays, request.getfixturevalue(expected))
    return journals


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_a_kill_at_each_phase_neither_trains_twice_nor_loses_a_round(fleet, request, name):
    journals = _check(fleet, request, name, *SCENARIOS[name])
    if name.startswith("coordinator"):  # round 1 asked again: answered from the stage, not trained again
        assert all(("replayed", 1) in journals[d] for d in DEVICES), journals


def test_coordinator_and_devices_killed_while_saving_resume_to_the_fault_free_arrays(fleet, request):
    """The promise once in the default run: coordinator and both devices SIGKILLed together while the
    coordinator saves round 1 (weights written, state not); all started again: round 1 is redone from the
    same weights, the devices answer it from their stage (no second training), commit it on round 2's
    word, and the final arrays are the fault-free run's, bit for bit."""
    journals = _check(fleet, request, "both-saving", {"serve": "1:600:saving"}, ["run"], ["serve", "dev0", "dev1"],
                      "reference")
    for d in DEVICES:
        assert [e for e in journals[d] if e[1] == 1] == [("staged", 1), ("replayed", 1), ("committed", 1)], journals


# --- stopping serve leaves no Flower process ----------------------------------------------------------

def _flower_running(fleet: Fleet, key: str) -> bool:
    import psutil

    for pid in marked(f"{fleet.mark}:{key}:"):
        try:
            if "flwr-serverapp" in " ".join(psutil.Process(pid).cmdline()):
                return True
        except psutil.Error:
            continue
    return False


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=["SIGKILL", "SIGTERM", "SIGINT"])
def test_stopping_serve_leaves_no_flower_process(fleet, tmp_path, sig):
    """kill -9 included: Flower's helpers (SuperExec, the ServerApp) run in their own sessions, out of
    reach of a process group and of PDEATHSIG; the watchdog ends them when serve dies."""
    p = fleet.serve(tmp_path / "run", "--rounds", 1, "--min-clients", 1)
    wait_for(lambda: _flower_running(fleet, "serve"), RUN_TIMEOUT, "the ServerApp")
    assert len(marked(f"{fleet.mark}:serve:")) >= 5  # serve, watchdog, SuperLink, SuperExec, flwr run, ServerApp
    os.kill(p.pid, sig)
    p.wait(timeout=30)
    t0 = time.monotonic()
    wait_for(lambda: not marked(f"{fleet.mark}:serve:"), 5, "every Flower process of serve to end")
    assert time.monotonic() - t0 < 5
    if sig != signal.SIGKILL:
        assert p.returncode == 128 + sig and "stopped by" in (fleet.folder / "serve.err").read_text()


def test_a_device_killed_leaves_no_flower_process(fleet, tmp_path, shares):
    """The same for `fleet join` (its SuperNode starts Flower's SuperExec in another session): kill -9."""
    import psutil

    def superexec():
        for pid in marked(f"{fleet.mark}:dev:"):
            try:
                if "flower-superexec" in " ".join(psutil.Process(pid).cmdline()):
                    return True
            except psutil.Error:
                continue
        return False

    p = fleet.join("dev", shares["devices"][0])  # no coordinator: the SuperNode waits for one
    wait_for(superexec, RUN_TIMEOUT, "the SuperNode's SuperExec")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    # at once: Flower's SuperExec notices its SuperNode's death by itself only after about 5 s
    wait_for(lambda: not marked(f"{fleet.mark}:dev:"), 2, "every Flower process of join to end")


# --- a node Flower still lists whose SuperNode is dead never holds up a round --------------------------

class _Reply:
    def __init__(self, key: str):
        from flwr.app import ConfigRecord, RecordDict

        self.content = RecordDict({"config": ConfigRecord({"key": key, "name": key})})

    def has_error(self) -> bool:
        return False


class _Grid:
    """Flower's Grid as a coordinator restarted after its devices were killed and started again sees it: the live
    nodes answer a hello (``late``: only after that many pulls, a device still busy with a round); the dead ones,
    still listed until their heartbeat runs out, never do."""

    def __init__(self, live: dict[int, str], dead: list[int], late: dict[int, int] | None = None):
        self.live, self.nodes, self.late = live, sorted([*live, *dead]), dict(late or {})
        self.sent: list[int] = []

    def get_node_ids(self):
        return list(self.nodes)

    def push_messages(self, messages):
        self.sent += [m.metadata.dst_node_id for m in messages]
        return [f"{m.metadata.dst_node_id}:{len(self.sent)}" for m in messages]

    def pull_messages(self, ids):
        node = int(ids[0].partition(":")[0])
        if node not in self.live:
            return []
        if self.late.get(node, 0) > 0:
            self.late[node] -= 1
            return []
        return [_Reply(self.live[node])]


def test_a_resumed_coordinator_does_not_wait_for_nodes_whose_supernode_is_dead(monkeypatch):
    """The round starts as soon as the devices it needs are known (it waited a whole hello, 20 s, for every dead
    node before); a device that answers late (busy with the killed coordinator's round) is still taken when the
    round needs it; a device that rejoins later (a new node) is waited for, by the round and by the goodbye."""
    from flwr.supercore.task_identity import TaskIdentity

    from edgetrain.fleet.coordinator import _Roster

    for name in ("_run_id", "_node_id", "_task_id"):  # what Flower sets in a ServerApp (its messages need them)
        monkeypatch.setattr(TaskIdentity, name, 1)
    lines: list[str] = []
    roster = _Roster(_Grid({3: "a", 4: "b", 7: "c"}, dead=[1, 2], late={7: 3}), lines.append)
    t0 = time.monotonic()
    assert [d.name for d in roster.wait(2, 60)] == ["a", "b"]
    assert [d.name for d in roster.wait(3, 60)] == ["a", "b", "c"]  # c: after its ClientApp (3 pulls, ~3 s)
    assert sorted(roster.grid.sent) == [1, 2, 3, 4, 7]  # each node asked once
    roster.grid.nodes.append(9)  # b rejoins: a new node, answering after 2 pulls, while its old one is known
    roster.grid.live[9] = "b"
    roster.grid.late[9] = 2
    assert [(d.name, d.node) for d in roster.wait(3, 60)] == [("a", 3), ("b", 9), ("c", 7)]
    assert [d.name for d in roster.settle(60)] == ["a", "b", "c"]
    assert time.monotonic() - t0 < roster.HELLO_SECONDS  # (the dead nodes' hellos are still unanswered)
    assert [ln.split()[0] for ln in lines] == ["a", "b", "c", "b"]  # who said who it is, once a node


# --- a round's outcome per device, each once by name; the timeout is a hard bound -------------------

@pytest.fixture(scope="module")
def prefix(tmp_path_factory):
    """The fleet's model as files (not built in: a device must bring its own --model)."""
    from edgetrain.models import load_gluon, save_prefix

    folder = tmp_path_factory.mktemp("prefix")
    save_prefix(load_gluon(MODEL), folder / "digits")
    return str(folder / "digits")


def test_a_round_says_who_answered_timed_out_and_failed_by_name_within_the_timeout(fleet, tmp_path, shares, prefix):
    timeout = 20
    run = tmp_path / "run"
    fleet.start("serve", "fleet", "serve", prefix, "--val", shares["val"], "-o", run, "--port", fleet.port, "--threads", 1,
                "--rounds", 1, "--min-clients", 3, "--round-timeout", timeout, "--join-timeout", 60)
    fleet.join("good", shares["devices"][0], "--model", prefix)
    # slower than the round, done before the goodbye's wait (a round) is over: it hears what became of it
    fleet.join("slow", shares["devices"][1], "--model", prefix, env={HOLD: f"1:{timeout + 10}:training"})
    fleet.join("nomodel", shares["devices"][2])  # the coordinator's model is not built in: this round fails
    code, _, err = fleet.wait("serve")
    assert code == 0, err
    r = report(run)["rounds"][0]
    assert [p["client"] for p in r["participants"]] == ["good"]
    assert [x["client"] for x in r["timed_out"]] == ["slow"] and not r["refused"]
    assert [x["client"] for x in r["failed"]] == ["nomodel"] and "not built in" in r["failed"][0]["reason"]
    assert r["seconds"] <= timeout + 3, r["seconds"]  # waited the timeout, then checked and saved
    log = (run / "coordinator-rounds.log").read_text()
    assert re.search(r"round 1: slow timed out: no answer when the round closed after (\d+\.\d)s", log), log
    assert "round 1: nomodel failed: " in log and not re.search(r"node \d", log), log  # names, not node ids
    # the device that failed every round: one line, the reason, non-zero (a user's mistake here: 2)
    code, _, err = fleet.wait("nomodel", timeout=60)
    lines = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert code == 2 and len(lines) == 1 and "not built in" in lines[0] and "--model" in lines[0], err
    # the device whose every round timed out: exit 1, the coordinator's reason in one line
    code, _, err = fleet.wait("slow", timeout=60)
    lines = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert code == 1 and len(lines) == 1 and "none of this device's 1 round(s)" in lines[0] and "timed out" in lines[0], err
    assert fleet.wait("good", timeout=60)[0] == 0
    devices = {d["client"]: d for d in report(run)["devices"]}
    assert {k: (d["asked"], d["updates"]) for k, d in devices.items()} == {"good": (1, 1), "slow": (1, 0),
                                                                           "nomodel": (1, 0)}


def test_a_round_without_an_accepted_update_is_not_a_completed_round(fleet, tmp_path, shares, prefix):
    run = tmp_path / "run"
    fleet.start("serve", "fleet", "serve", prefix, "--val", shares["val"], "-o", run, "--port", fleet.port, "--threads", 1,
                "--rounds", 1, "--min-clients", 1, "--round-timeout", 60, "--join-timeout", 60)
    fleet.join("nomodel", shares["devices"][2])
    code, out, err = fleet.wait("serve")
    res = report(run)
    assert code == 3 and res["rounds_completed"] == 0 and res["rounds_run"] == 1 and res["rounds_without_update"] == [1]
    assert "round(s) 1 aggregated no update" in err and not res["rounds"][0]["updated"]


# --- bias and lite (issue 23, item 5): the same promise for a fleet of an .onnx base -------------------

@pytest.mark.slow
@pytest.mark.parametrize("layers", ["bias", "lite"])
def test_bias_and_lite_fleets_killed_while_saving_resume_to_the_fault_free_arrays(fleet, tmp_path_factory, shares,
                                                                                 fleet_cache, layers):
    """Coordinator and both devices SIGKILLed while the coordinator saves round 1, all started again: the
    devices answer round 1 from their stage, and the final arrays (biases, BatchNorm shifts, the lite
    modules, the output layer and their control variates) are the fault-free run's, bit for bit. Every
    process without mxnet, as in the fault-free run (tests/test_fleet_adapt.py checks that run)."""
    expected = onnx_reference(tmp_path_factory, shares, fleet_cache, layers)[0]
    held = {"serve": "1:600:saving"}
    extra = onnx_mode(fleet, layers)
    arrays, res = _killed_run(fleet, held, [_marker(fleet, held, "run")], ["serve", "dev0", "dev1"], extra,
                              env=no_mxnet(fleet.folder))
    journals = exactly_once(fleet, res)
    _equal(arrays, expected)
    assert any(k.startswith("global/lite") for k in arrays) == (layers == "lite")
    # a device that had answered round 1 before the kill answers it again from its stage; one the first
    # coordinator had given up on (too slow on a loaded machine) trains it then, once
    firsts = {d: [e for e in journals[d] if e[1] == 1] for d in DEVICES}
    assert all(f in ([("staged", 1), ("replayed", 1), ("committed", 1)], [("staged", 1), ("committed", 1)])
               for f in firsts.values()), journals
    assert any(("replayed", 1) in f for f in firsts.values()), journals


# --- server momentum (FedAvgM, the default with ternary) across a coordinator kill ------------------------

TERNARY = ("--codec", "ternary")


@pytest.fixture(scope="module")
def ternary_run(tmp_path_factory, shares, fleet_cache):
    """The fault-free ternary run (server momentum on, the downlink as compact per-device deltas): its final arrays, its
    report and its folder (the devices' state folders are FOLDER/NAME)."""
    arrays, res, folder = fault_free(tmp_path_factory, shares, fleet_cache, "reference-ternary", extra=TERNARY)
    assert all(r["updates"] == len(DEVICES) for r in res["rounds"])
    return arrays, res, folder


@pytest.fixture(scope="module")
def ternary_reference(ternary_run):
    return ternary_run[0]


@pytest.mark.slow
def test_ternary_control_deltas_are_derived_on_both_sides_and_the_control_variates_agree(ternary_run):
    """--codec ternary sends no control delta: each device and the coordinator derive it from the update as
    decoded (one float32 scale travels with it), so after the run the coordinator's control variate is the
    mean of the devices' (each device answered every round), and no message carried a control array."""
    from edgetrain.fleet.client import committed

    arrays, res, folder = ternary_run
    mine = [committed(folder / d)[1] for d in DEVICES]
    keys = sorted(k[len("control/"):] for k in arrays if k.startswith("control/"))
    assert keys and all(sorted(c) == keys for c in mine)
    for k in keys:
        c = arrays["control/" + k]
        assert np.any(c)
        np.testing.assert_allclose(c, np.mean([m[k] for m in mine], axis=0), rtol=0,
                                   atol=1e-5 * float(np.abs(c).max()))
    # every update was accepted (above): one with control arrays would have been refused as a model mismatch
    fp32 = 4 * sum(v.size for k, v in arrays.items() if k.startswith(("global/", "control/")))
    for r in res["rounds"]:
        for p in r["participants"]:
            assert p["control_scale"] > 0 and np.isfinite(p["control_scale"]), p
            # "x fewer" is against the fp32 fleet's message: the arrays and the control deltas as float32
            assert p["bytes_up_fp32"] == fp32 and p["bytes_up"] < fp32 / 40, p


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["aggregating", "saving"])
def test_server_momentum_resumes_bit_for_bit_after_a_coordinator_kill_with_ternary(fleet, ternary_reference, phase):
    """--codec ternary: the coordinator SIGKILLed in round 2, with round 1's momentum step saved, either with
    round 2's replies in hand (nothing averaged) or after round 2's momentum-0002.npz and global weights were
    written but not its state; resumed, it continues from round 1's momentum step and downlink record, the
    devices answer round 2 from their stage, and the final weights, control variate and momentum step are
    the fault-free run's, bit for bit."""
    run = fleet.folder / "run"
    held = {"serve": f"2:600:{phase}"}
    arrays, res = _killed_run(fleet, held, [run / f"delayed-{phase}-2"], ["serve"], TERNARY, resumed_after=1)
    journals = exactly_once(fleet, res)
    assert any(k.startswith("momentum/") for k in arrays) and any(np.any(v) for k, v in arrays.items()
                                                                   if k.startswith("momentum/"))
    _equal(arrays, ternary_reference)
    assert all(("replayed", 2) in journals[d] for d in DEVICES), journals
    assert all(r["updates"] == len(DEVICES) for r in res["rounds"]), res["rounds"]


FIVE = tuple(f"dev{i}" for i in range(5))


@pytest.mark.slow
def test_five_devices_with_the_coordinator_killed_while_they_train_resume_to_the_fault_free_arrays(
        fleet, tmp_path_factory, shares, fleet_cache):
    """Issue 38 item 4: five devices (ternary, SCAFFOLD, server momentum); the coordinator SIGKILLed while all
    five train round 2, then `--resume`: round 2 is asked again, every device answers from its stage (no
    second training), all five updates count in every round, and the arrays equal a fault-free run's."""
    config = ("--rounds", 3, "--min-clients", len(FIVE), "--codec", "ternary", "--round-timeout", 90,
              "--export", "none")
    ref = Fleet(tmp_path_factory.mktemp("five-reference"), fleet_cache)
    ref.shares = shares
    try:
        ref.serve(ref.folder / "run", *config)
        for d in FIVE:
            device(ref, d, devices=FIVE)
        res = finish(ref, "serve", [f"{d}-0" for d in FIVE])
        exactly_once(ref, res, FIVE, 3)
        want = final_arrays(ref.folder / "run")
    finally:
        assert not ref.close()
    run = fleet.folder / "run"
    fleet.serve(run, *config)
    for d in FIVE:
        device(fleet, d, env={HOLD: "2:25:training"}, devices=FIVE)
    wait_for(lambda: all((fleet.folder / d / "delayed-training-2").exists() for d in FIVE), RUN_TIMEOUT,
             "all five devices inside round 2")
    fleet.kill("serve")
    fleet.serve(run, *config, "--resume", key="serve-1")
    res = finish(fleet, "serve-1", [f"{d}-0" for d in FIVE])
    assert res["resumed_after"] == 1
    journals = exactly_once(fleet, res, FIVE, 3)
    assert all(("replayed", 2) in journals[d] for d in FIVE), journals
    assert all(sorted(p["client"] for p in r["participants"]) == list(FIVE) for r in res["rounds"]), res["rounds"]
    _equal(final_arrays(run), want)
