"""Issue 26: the coordinator refuses an update that is not finite, out of range (its norm) or weighted by a
bad sample count, names the device, and the round goes on without it; a run whose global model ends at
chance exits 3. The hostile device is a real `fleet join` whose ClientApp trains for real and then sends
poison (tests/fleet_hostile/sitecustomize.py, on that device's PYTHONPATH only)."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("flwr")

from fleettools import final_arrays, fleet, fleet_cache, report, shares  # noqa: E402,F401  (fixtures)

HOSTILE = Path(__file__).parent / "fleet_hostile"
PLAN = ["nan", "inf", "huge", "count=nan", "count=-3", "count=1e30", "count=0", "count=2.5"]




def _hostile_env(plan: list[str]) -> dict:
    return {"PYTHONPATH": os.pathsep.join([str(HOSTILE), os.environ.get("PYTHONPATH", "")]),
            "EDGETRAIN_TEST_HOSTILE": ",".join(plan)}


@pytest.mark.slow
def test_every_hostile_update_is_refused_by_name_and_the_rounds_go_on(fleet, tmp_path, shares):
    run = tmp_path / "run"
    fleet.serve(run, "--rounds", len(PLAN), "--min-clients", 3, "--codec", "fp32", "--round-timeout", 120, "--export", "none")
    fleet.join("honest-a", shares["devices"][0])
    fleet.join("honest-b", shares["devices"][1])
    fleet.join("mallory", shares["devices"][2], env=_hostile_env(PLAN))
    code, out, err = fleet.wait("serve")
    assert code == 0, err
    res = report(run)
    assert res["rounds_completed"] == len(PLAN)
    for r, mode in zip(res["rounds"], PLAN):
        assert sorted(p["client"] for p in r["participants"]) == ["honest-a", "honest-b"], (mode, r)
        [refused] = r["refused"]
        assert refused["client"] == "mallory", r
        why = refused["reason"]
        if mode in ("nan", "inf"):
            assert "not finite" in why
        elif mode == "huge":
            assert "norm" in why and "exceeds" in why and "median" in why
        else:
            assert "sample count" in why and "1..1000000000" in why
        # the log names the device and says why, once per round
        log = (run / "coordinator-rounds.log").read_text()
        assert f"round {r['round']}: refused the update of mallory: {why}" in log
    arrays = final_arrays(run)
    assert all(np.all(np.isfinite(v)) for v in arrays.values())
    assert res["final_accuracy"] > res["initial_accuracy"] + 0.1  # the honest devices still taught the model
    code, _, err = fleet.wait("mallory", timeout=60)
    assert code == 1, err  # none of its updates reached the model: it says the coordinator's last reason
    assert err.count("Error:") == 1 and "sample count" in err, err
    for d in ("honest-a", "honest-b"):
        assert fleet.wait(d, timeout=60)[0] == 0


@pytest.mark.slow
def test_a_bound_the_user_sets_is_the_bound_and_a_model_driven_to_chance_exits_3(fleet, tmp_path, shares):
    """--max-update-norm replaces the derived bound: set absurdly high it lets a 1e30 update in (an inf one
    is still refused: non-finite is never in range); the global model then predicts one class and the run
    exits 3, naming chance, instead of 0."""
    run = tmp_path / "run"
    fleet.serve(run, "--rounds", 2, "--min-clients", 2, "--codec", "fp32", "--max-update-norm", 1e38,
                "--round-timeout", 120, "--export", "none")
    fleet.join("honest", shares["devices"][0])
    fleet.join("mallory", shares["devices"][2], env=_hostile_env(["inf", "huge"]))
    code, out, err = fleet.wait("serve")
    assert code == 3, err
    lines = [ln for ln in err.splitlines() if ln.startswith("Error:")]
    assert len(lines) == 1 and "at chance" in lines[0], err
    res = report(run)
    first, second = res["rounds"]
    assert [x["client"] for x in first["refused"]] == ["mallory"] and "not finite" in first["refused"][0]["reason"]
    assert sorted(p["client"] for p in second["participants"]) == ["honest", "mallory"] and not second["refused"]
    assert second["max_update_norm"] == 1e38
    assert res["chance"]["at_chance"] and not res["passed"]


@pytest.mark.slow
def test_a_ternary_update_without_a_usable_control_scale_is_refused_by_name(fleet, tmp_path, shares):
    """With ternary each side derives the control delta from the update and the device's control scale: an
    update whose scale is missing, zero or beyond float32 is refused (it would corrupt the control variate),
    the device is named with the reason, and the rounds go on with the honest device."""
    plan = ["scale=none", "scale=0", "scale=1e39"]
    run = tmp_path / "run"
    fleet.serve(run, "--rounds", len(plan), "--min-clients", 2, "--codec", "ternary", "--round-timeout", 120, "--export", "none")
    fleet.join("honest", shares["devices"][0])
    fleet.join("mallory", shares["devices"][2], env=_hostile_env(plan))
    code, _, err = fleet.wait("serve")
    assert code == 0, err
    res = report(run)
    log = (run / "coordinator-rounds.log").read_text()
    for r, mode in zip(res["rounds"], plan):
        assert [p["client"] for p in r["participants"]] == ["honest"] and r["updated"], (mode, r)
        [refused] = r["refused"]
        assert refused["client"] == "mallory" and "control scale" in refused["reason"], r
        assert ("not a number" if mode == "scale=none" else "not a positive finite float32") in refused["reason"]
        assert f"round {r['round']}: refused the update of mallory: {refused['reason']}" in log
    code, _, err = fleet.wait("mallory", timeout=60)
    assert code == 1 and err.count("Error:") == 1 and "control scale" in err, err
    assert fleet.wait("honest", timeout=60)[0] == 0


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -3, 0, -0.0, 1e39, 1e-46, "x", None])
def test_a_control_scale_that_is_not_a_positive_finite_float32_is_refused(value):
    from edgetrain.fleet.strategy import control_scale

    scale, why = control_scale(value)
    assert scale is None and "control scale" in why
    for good in (1e-30, 0.3, 7.0, 3e38):
        assert control_scale(good) == (good, None)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), -3, 0, 2.5, 1e30, 10**9 + 1, "x", None])
def test_a_sample_count_that_is_not_a_whole_number_in_range_is_refused(value):
    from edgetrain.fleet.coordinator import MAX_SAMPLES, sample_count

    count, why = sample_count(value)
    assert count is None and "sample count" in why
    for good in (1, 90, 90.0, MAX_SAMPLES):
        assert sample_count(good) == (int(good), None)


def test_the_default_norm_bound_follows_the_rounds_lower_median_and_a_given_bound_replaces_it():
    from edgetrain.fleet.coordinator import GLOBAL_FACTOR, NORM_FACTOR, norm_bound, update_norm

    arrays = {"w": np.full((10, 32), 0.1, np.float32)}
    g = update_norm(arrays)
    rng = np.random.RandomState(0)
    for _ in range(20):
        honest = list(rng.uniform(0.5, 2.0, size=rng.randint(2, 8)))
        for hostile in ([], [1e30], [1e30, float("inf")]):
            norms = honest + hostile
            bound, how = norm_bound(norms, arrays, None)
            assert max(honest) <= bound < 1e30 and "median" in how  # the honest in, the hostile out
            finite = sorted(n for n in norms if np.isfinite(n))
            assert bound == NORM_FACTOR * finite[(len(finite) - 1) // 2]
    # one update, or none: the global arrays' norm sets the bound
    assert norm_bound([3.0], arrays, None)[0] == GLOBAL_FACTOR * max(1.0, g)
    assert norm_bound([], arrays, None)[0] == GLOBAL_FACTOR * max(1.0, g)
    assert norm_bound([1.0, 1e30], arrays, 5.0) == (5.0, "--max-update-norm 5")
    assert update_norm({"w": np.array([np.nan], np.float32)}) == float("inf")
    assert update_norm({"w": np.full(4, 3e38, np.float32)}) == pytest.approx(6e38)  # no float32 overflow


# issue 38 item 4: one bad device a round, each kind once, over real Flower processes with ternary
BAD = ["count=1000000000", "replay", "drop", "extra", "scale=nan", "honest"]


@pytest.mark.slow
def test_replays_lies_wrong_arrays_and_a_nan_scale_are_each_handled_and_no_honest_update_is_lost(fleet, tmp_path, shares):
    """A sample count in range but a lie is capped at COUNT_FACTOR x the round's median (the update still
    counts); a reply replayed from the round before, an update missing an array or with one the model lacks,
    and a NaN control scale are refused by name; the honest devices' updates are in every round, and the
    hostile device's honest round at the end is taken."""
    from edgetrain.fleet.coordinator import COUNT_FACTOR

    run = tmp_path / "run"
    keep = tmp_path / "mallory-replies"
    keep.mkdir()
    fleet.serve(run, "--rounds", len(BAD), "--min-clients", 3, "--codec", "ternary", "--round-timeout", 120, "--export", "none")
    fleet.join("honest-a", shares["devices"][0])
    fleet.join("honest-b", shares["devices"][1])
    fleet.join("mallory", shares["devices"][2], env={**_hostile_env(BAD), "EDGETRAIN_TEST_HOSTILE_DIR": str(keep)})
    code, _, err = fleet.wait("serve")
    assert code == 0, err
    res = report(run)
    assert res["rounds_completed"] == len(BAD)
    log = (run / "coordinator-rounds.log").read_text()
    for r, mode in zip(res["rounds"], BAD):
        names = sorted(p["client"] for p in r["participants"])
        assert {"honest-a", "honest-b"} <= set(names) and r["updated"], (mode, r)
        honest = sorted(p["num_examples"] for p in r["participants"] if p["client"] != "mallory")
        assert all(p["weight"] == p["num_examples"] for p in r["participants"] if p["client"] != "mallory")
        if mode in ("count=1000000000", "honest"):
            [m] = [p for p in r["participants"] if p["client"] == "mallory"]
            assert not r["refused"], r
            if mode == "honest":
                assert m["weight"] == m["num_examples"] < 10**9
                continue
            assert m["num_examples"] == 10**9 and m["weight"] == COUNT_FACTOR * honest[0], (m, honest)
            assert f"round {r['round']}: capped the weight of mallory: it claims 1000000000 samples" in log
            continue
        assert names == ["honest-a", "honest-b"], (mode, r)
        [refused] = r["refused"]
        why = refused["reason"]
        assert refused["client"] == "mallory", r
        assert f"round {r['round']}: refused the update of mallory: {why}" in log
        want = {"replay": f"answers round {r['round'] - 1}, not round {r['round']} (a replayed message)",
                "drop": "missing", "extra": "not_in_this_model not in this model",
                "scale=nan": "control scale nan is not a positive finite float32"}[mode]
        assert want in why, (mode, why)
    arrays = final_arrays(run)
    assert all(np.all(np.isfinite(v)) for v in arrays.values())
    assert res["final_accuracy"] > res["initial_accuracy"] + 0.1
    for d in ("honest-a", "honest-b", "mallory"):
        assert fleet.wait(d, timeout=60)[0] == 0, d


def test_a_lie_about_the_sample_count_is_capped_at_the_rounds_lower_median():
    from edgetrain.fleet.coordinator import COUNT_FACTOR, weights

    assert weights([]) == ([], None) and weights([10**9]) == ([10**9], None)
    assert weights([90, 10**9]) == ([90, COUNT_FACTOR * 90], COUNT_FACTOR * 90)
    assert weights([90, 120, 10**9]) == ([90, 120, COUNT_FACTOR * 120], COUNT_FACTOR * 120)
    assert weights([90, 100, 110]) == ([90, 100, 110], COUNT_FACTOR * 100)  # honest counts pass unchanged


def test_a_reply_for_another_round_or_other_arrays_is_a_replay():
    from edgetrain.fleet.coordinator import answers

    assert answers({"round": 3, "trained-from": "d3"}, 3, "d3") is None
    assert "answers round 2, not round 3" in answers({"round": 2, "trained-from": "d2"}, 3, "d3")
    assert "other global arrays" in answers({"round": 3, "trained-from": "d2"}, 3, "d3")
    assert "answers round None" in answers({}, 3, "d3")
