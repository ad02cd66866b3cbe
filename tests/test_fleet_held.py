"""The coordinator's RUNDIR over a long run: what `--resume` compares with (serve.json, read as the typed
ServeSpec), the per-device downlink bases (held-NNNN.npz) and the rounds' global arrays, control variates and
momentum steps pruned to what a device or a resume can still need, crash-safely."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("flwr")

from clitools import assert_user_error, run_edgetrain  # noqa: E402
from fleettools import (CONFIG, DEVICES, HOLD, MODEL, RUN_TIMEOUT, device, exactly_once,  # noqa: E402,F401  (fixtures)
                        fault_free, final_arrays, finish, fleet, fleet_cache, report, shares, wait_for)


# --- --resume compares with serve.json, read as the ServeSpec (no Flower process starts) ---------------------

def _stopped_run(rundir, spec: dict | None, codec: str = "int8") -> None:
    """A RUNDIR as a coordinator stopped after its first state leaves it (``spec``: its serve.json, or none)."""
    from edgetrain.fleet import store

    rundir.mkdir()
    store.write_state(rundir, {"format": store.STATE_FORMAT, "completed": 0, "classes": [str(d) for d in range(10)],
                               "rounds": [], "model": MODEL, "codec": codec})
    if spec is not None:
        (rundir / store.SPEC).write_text(json.dumps(spec))


def test_resume_refuses_a_different_setting_than_serve_json_says_old_and_new(tmp_path, shares):
    from edgetrain.fleet import store

    spec = store.ServeSpec(rundir=str(tmp_path / "new"), model=MODEL, val=shares["val"], rounds=3, min_clients=2,
                           round_timeout=60.0, join_timeout=60.0, codec="ternary", epochs=1, batch_size=32,
                           optimizer="sgd", seed=0, aggregate="scaffold").to_dict()
    _stopped_run(tmp_path / "new", spec, codec="ternary")
    base = ("fleet", "serve", MODEL, "--val", shares["val"], "--resume", "--port", 1)
    assert_user_error(run_edgetrain(*base, "-o", tmp_path / "new", "--codec", "int8"), 2,
                      "--resume with a different codec than the run in RUNDIR")
    # a spec written before --train-layers (no such field) trained the head: last:2 is a different run
    old = {k: v for k, v in spec.items() if k not in ("train_layers", "format", "downlink_ratio")}
    old["rundir"] = str(tmp_path / "old")
    _stopped_run(tmp_path / "old", old, codec="ternary")
    assert_user_error(run_edgetrain(*base, "-o", tmp_path / "old", "--codec", "ternary", "--train-layers", "last:2"),
                      2, "different train_layers")
    # a run stopped between its first state and its spec: its state names the model and codec it ran
    _stopped_run(tmp_path / "nospec", None, codec="ternary")
    assert_user_error(run_edgetrain(*base, "-o", tmp_path / "nospec", "--codec", "2bit"), 2, "different codec")


# --- the per-device downlink bases (held-NNNN.npz) are pruned to what a device or a resume can need ----------

HOLD = "EDGETRAIN_FLEET_TEST_DELAY"


def _held_rounds(rundir) -> list[int]:
    return sorted(int(p.name[5:9]) for p in rundir.glob("held-[0-9]*.npz"))


def _needed(state: dict) -> set[int]:
    """The held files a resume from ``state`` reads: each device's base (0: global-0000, -1: none)."""
    return {int(e["held"]) for e in state["devices"].values() if int(e.get("held", 0)) > 0}


def test_prune_keeps_each_devices_base_and_the_newest_and_nothing_else(tmp_path):
    import numpy as np

    from edgetrain.fleet import store
    from edgetrain.fleet.strategy import DeltaDownlink

    spec = store.ServeSpec(rundir=str(tmp_path), model=MODEL, val="v", rounds=9, min_clients=1, round_timeout=1.0,
                           join_timeout=1.0, codec="ternary", epochs=1, batch_size=1, optimizer="sgd", seed=0)
    for r in range(1, 8):
        store.save_global(tmp_path, r, {"k|w": np.full(3, r, np.float32)}, store.HELD_PREFIX)
    store.save_global(tmp_path, 0, {"w": np.zeros(3, np.float32)})
    (tmp_path / "held-notes.npz").write_text("not a round's")  # not one of the downlink's: left alone
    state = {"completed": 7, "devices": {"a": {"held": 2}, "b": {"held": 5}, "c": {"held": -1}, "d": {"held": 0},
                                         "e": {"held": 5}}}
    gone = list(DeltaDownlink(spec, state).prune(state))
    assert sorted(p.name for p in gone) == ["held-0001.npz", "held-0003.npz", "held-0004.npz", "held-0006.npz"]
    assert _held_rounds(tmp_path) == [2, 5, 7] and (tmp_path / "held-notes.npz").exists()
    assert (tmp_path / "global-0000.npz").exists()  # the base of a device never asked, or a late one
    assert list(DeltaDownlink(spec, state).prune(state)) == []  # nothing more to delete


@pytest.mark.slow
def test_a_long_ternary_fleet_keeps_a_bounded_number_of_bases_through_kills_while_pruning(fleet, tmp_path, shares):
    """Three devices, one asked per round (--fraction 0.34, --seed 2: a b b b a): five rounds leave at most one held
    file per device plus the newest, and a, asked in round 1 and again in round 5, still gets a delta against its
    round-1 base. The coordinator is SIGKILLed after round 3's state is written with its stale file not yet
    deleted, then after the first of round 4's two deletions; each time `--resume` goes on from there."""
    from edgetrain.fleet.client import DEVICE_ID, DOWNLINK, _unpack
    from edgetrain.fleet.codec import arrays_digest
    from edgetrain.fleet.store import load_global, read_state

    run = tmp_path / "run"
    config = ("--rounds", 5, "--min-clients", 3, "--fraction", 0.34, "--seed", 2, "--codec", "ternary",
              "--round-timeout", 60)
    fleet.serve(run, *config, env={HOLD: "3:600:pruning"})
    for d, data in zip("abc", shares["devices"]):
        fleet.join(d, data)
    for n, (marker, hook) in enumerate((("delayed-pruning-3", "4:600:pruned"), ("delayed-pruned-4", None))):
        wait_for(lambda m=marker: (run / m).exists(), 3 * RUN_TIMEOUT, marker)
        fleet.kill("serve" if n == 0 else f"serve-{n}")
        state = read_state(run)
        # killed after the state: it names only files still there (one stale file left over, either way)
        assert state["completed"] == 3 + n and _needed(state) <= set(_held_rounds(run))
        assert _held_rounds(run) == [[1, 2, 3], [1, 3, 4]][n]
        fleet.serve(run, *config, "--resume", key=f"serve-{n + 1}", env={HOLD: hook} if hook else None)
    code, _, err = fleet.wait("serve-2")
    assert code == 0, err
    res = report(run)
    assert res["resumed_after"] == 4 and res["rounds_completed"] == 5
    assert [[p["client"] for p in r["participants"]] for r in res["rounds"]] == [["a"], ["b"], ["b"], ["b"], ["a"]]
    # every device got a delta against a base the coordinator still had, a's in round 5 the round-1 one
    assert all(r["downlink_whole"] == [] and not r["failed"] and not r["refused"] for r in res["rounds"]), res
    state = read_state(run)
    assert _held_rounds(run) == sorted(_needed(state) | {5}) == [4, 5]
    for d in "ab":
        key = (tmp_path / d / DEVICE_ID).read_text().strip()
        meta = _unpack(tmp_path / d / DOWNLINK)[0]
        mine = load_global(run, meta["round"], "held", keep=lambda k, key=key: k.partition("|")[0] == key)
        assert meta["digest"] == arrays_digest({k.partition("|")[2]: v for k, v in mine.items()})
    assert _unpack(tmp_path / "a" / DOWNLINK)[0]["base"] == 1
    for d in "abc":  # c, never asked, is told the run is over too
        assert fleet.wait(d, timeout=60)[0] == 0


# --- the rounds' global arrays, control variates and momentum steps: only the last saved round's (and the start) ---

def _round_files(rundir) -> list[str]:
    return sorted(p.name for p in rundir.glob("*-[0-9][0-9][0-9][0-9].npz") if not p.name.startswith("held-"))


def test_prune_rounds_keeps_the_start_and_the_last_round_and_nothing_else(tmp_path):
    import numpy as np

    from edgetrain.fleet import store

    for r in range(6):
        for prefix in store.ROUND_PREFIXES[: 1 if r == 0 else 3]:
            store.save_global(tmp_path, r, {"w": np.full(3, r, np.float32)}, prefix)
    store.save_global(tmp_path, 6, {"w": np.zeros(3, np.float32)})  # a round saved, its state not written
    (tmp_path / "global-notes.npz").write_text("not a round's")  # left alone
    gone = list(store.prune_rounds(tmp_path, 5))
    assert [p.name for p in gone] == [f"{prefix}-000{r}.npz" for prefix in store.ROUND_PREFIXES for r in range(1, 5)]
    assert _round_files(tmp_path) == ["control-0005.npz", "global-0000.npz", "global-0005.npz", "global-0006.npz",
                                      "momentum-0005.npz"]
    assert (tmp_path / "global-notes.npz").exists()
    assert list(store.prune_rounds(tmp_path, 5)) == []  # nothing more to delete
    assert store.load_global(tmp_path, 5, store.MOMENTUM_PREFIX)["w"][0] == 5


@pytest.mark.slow
def test_a_coordinator_killed_between_deleting_a_rounds_files_resumes_and_a_later_round_deletes_the_rest(
        fleet, tmp_path_factory, shares, fleet_cache):
    """Three rounds of two devices (2-bit, SCAFFOLD, server momentum): after round 2's state is written the coordinator
    deletes round 1's global arrays, control variate and momentum step; SIGKILLed after the first of those deletions,
    it leaves round 2's files as the fault-free run saved them (bit for bit) and only extras no resume reads;
    `--resume` runs round 3 from them, every round counted exactly once, and round 3 deletes the leftovers."""
    from edgetrain.fleet.store import load_global

    want = fault_free(tmp_path_factory, shares, fleet_cache, "reference")[0]  # (shared with test_fleet_faults.py)
    three = ("--rounds", 3)
    run = fleet.folder / "run"
    fleet.serve(run, *CONFIG, *three, env={HOLD: "2:600:pruned"})
    for d in DEVICES:
        device(fleet, d)
    wait_for(lambda: (run / "delayed-pruned-2").exists(), 2 * RUN_TIMEOUT, "the first deletion of round 2")
    fleet.kill("serve")
    assert json.loads((run / "fleet-state.json").read_text())["completed"] == 2
    assert _round_files(run) == ["control-0001.npz", "control-0002.npz", "global-0000.npz", "global-0002.npz",
                                 "momentum-0001.npz", "momentum-0002.npz"]
    saved = {f"{prefix}/{k}": v for prefix in ("global", "control", "momentum")
             for k, v in load_global(run, 2, prefix).items()}
    assert sorted(saved) == sorted(want) and all((saved[k] == want[k]).all() for k in want)
    fleet.serve(run, *CONFIG, *three, "--resume", key="serve-1")
    res = finish(fleet, "serve-1", [f"{d}-0" for d in DEVICES])
    assert res["resumed_after"] == 2 and res["rounds_completed"] == 3
    assert all(r["updates"] == len(DEVICES) for r in res["rounds"]), res["rounds"]
    exactly_once(fleet, res, rounds=3)
    assert _round_files(run) == ["control-0003.npz", "global-0000.npz", "global-0003.npz", "momentum-0003.npz"]


# --- a device whose own weights give other initial arrays gets its first round whole --------------------------

MOVED_PARAMS = """
import sys
from importlib import resources
from edgetrain import _lazy
mx = _lazy.mxnet()
with resources.as_file(resources.files("edgetrain._builtin").joinpath("digits5-0000.params")) as p:
    saved = mx.nd.load(str(p))
mx.nd.save(sys.argv[1], {k: v * 1.01 for k, v in saved.items()})
"""


def test_start_digests_tell_a_devices_own_weights_from_the_coordinators(tmp_path):
    from edgetrain.fleet.local import same_start, start_digests

    mine, copy, other = (tmp_path / n for n in ("mine.params", "copy.params", "other.params"))
    mine.write_bytes(b"weights")
    copy.write_bytes(b"weights")
    other.write_bytes(b"weights, moved")
    coordinator = start_digests(MODEL, str(mine))
    assert same_start(start_digests(None, str(copy)), coordinator)  # the coordinator's model, the same weights
    assert same_start(start_digests(MODEL, str(copy)), coordinator)
    assert not same_start(start_digests(None, str(other)), coordinator)
    assert not same_start(start_digests(None, None), coordinator)
    assert not same_start(start_digests(None, str(tmp_path / "gone.params")), coordinator)
    assert not same_start(start_digests("zoo:mobilenetv2_1.0", str(copy)), coordinator)
    assert not same_start(None, coordinator)  # a device that did not say
    (tmp_path / "m-symbol.json").write_text("{}")
    (tmp_path / "m-0000.params").write_bytes(b"a")
    prefix = start_digests(str(tmp_path / "m"), None)
    (tmp_path / "m-0000.params").write_bytes(b"b")
    assert not same_start(start_digests(str(tmp_path / "m"), None), prefix)


@pytest.mark.slow
def test_a_device_whose_own_params_differ_gets_its_first_round_whole_and_trains_it(fleet, tmp_path, shares):
    """`--train-layers last:2` trains a layer the device's own --params set (each weight 1% off the built-in model's):
    its initial arrays are not the coordinator's, so a delta against them cannot be rebuilt there. Its hello says
    so; round 1 sends it the arrays whole and it trains that round (it failed it, before); round 2 is a delta."""
    import subprocess
    import sys

    params = tmp_path / "moved.params"
    subprocess.run([sys.executable, "-c", MOVED_PARAMS, str(params)], check=True, timeout=300)
    run = tmp_path / "run"
    fleet.serve(run, "--rounds", 2, "--min-clients", 2, "--codec", "ternary", "--train-layers", "last:2",
                "--round-timeout", 90)
    fleet.join("plain", shares["devices"][0])
    fleet.join("own", shares["devices"][1], "--params", params)
    code, _, err = fleet.wait("serve")
    assert code == 0, err
    r1, r2 = report(run)["rounds"]
    assert [p["client"] for p in r1["participants"]] == ["own", "plain"] and not r1["failed"], r1
    assert r1["downlink_whole"] == ["own"]
    assert [p["client"] for p in r2["participants"]] == ["own", "plain"] and r2["downlink_whole"] == [], r2
    for d in ("own", "plain"):
        assert fleet.wait(d, timeout=60)[0] == 0
