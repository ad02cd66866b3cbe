"""--codec ternary end to end on loopback: sparse ternary updates up (>= 100x fewer bytes than float32), the
global arrays down as int8 deltas; a device that joins late (its base unknown) gets the arrays whole, and
every device rebuilds exactly the arrays the coordinator recorded as sent."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from fleettools import RUN_TIMEOUT, fleet, fleet_cache, report, shares, wait_for  # noqa: E402,F401  (fixtures)




def _npz(path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.slow
def test_ternary_up_int8_delta_down_and_a_late_device_gets_the_arrays_whole(fleet, tmp_path, shares):
    from edgetrain.fleet.client import DOWNLINK, _unpack
    from edgetrain.fleet.codec import arrays_digest

    run = tmp_path / "run"
    rounds = 5
    # round 1 waits --join-timeout for three devices and starts with two; the next rounds wait for the third
    # the head's 330 values at one entry in 80 (the defaults' floor of 48 entries a tensor is for larger layers)
    fleet.serve(run, "--rounds", rounds, "--min-clients", 3, "--join-timeout", 60, "--codec", "ternary",
                "--round-timeout", 120, "--ternary-density", 0.0125,
                "--ternary-min-keep", 1, "--uplink-ratio", 0)
    fleet.join("a", shares["devices"][0])
    fleet.join("b", shares["devices"][1])
    log = run / "coordinator-rounds.log"
    wait_for(lambda: log.exists() and "round 1: sent to" in log.read_text(), RUN_TIMEOUT, "round 1")
    fleet.join("c", shares["devices"][2])  # late: the coordinator has no base for it
    code, _, err = fleet.wait("serve", timeout=3 * RUN_TIMEOUT)  # five rounds and a wait for a third device
    assert code == 0, err
    res = report(run)
    assert res["rounds_completed"] == rounds
    first_of_c = None
    for r in res["rounds"]:
        names = sorted(p["client"] for p in r["participants"])
        assert r["updated"] and not r["refused"] and not r["failed"], r
        # up: >= 100x fewer bytes than the same updates as float32, every round
        assert r["bytes_up_fp32"] >= 100 * r["bytes_up"], r
        if "c" in names and first_of_c is None:
            first_of_c = r["round"]
            assert r["downlink_whole"] == ["c"], r  # its base is unknown: the arrays whole
        else:
            assert r["downlink_whole"] == [], r  # everyone else: a delta against what they hold
        if not r["downlink_whole"]:  # down: deltas only, >= 3.5x fewer bytes than float32 in every such round
            assert r["bytes_down_fp32"] >= 3.5 * r["bytes_down"], r
    assert first_of_c is not None and first_of_c >= 2
    down = sum(r["bytes_down"] for r in res["rounds"])
    assert sum(r["bytes_down_fp32"] for r in res["rounds"]) > 2.5 * down  # one whole copy among the deltas
    # every device holds exactly what the coordinator recorded as sent in the last round
    sent = _npz(run / f"down-{rounds:04d}.npz")
    for d in ("a", "b", "c"):
        meta, groups = _unpack(tmp_path / d / DOWNLINK)
        assert meta["round"] == rounds and meta["digest"] == arrays_digest(sent)
        assert sorted(groups["arrays"]) == sorted(sent)
        for k, v in sent.items():
            np.testing.assert_array_equal(groups["arrays"][k], v)
        assert fleet.wait(d, timeout=60)[0] == 0
    # the downlink's error feedback: what the devices hold is the global model they were sent (the one
    # saved after the round before) to within one round's int8 rounding
    final = _npz(run / f"global-{rounds - 1:04d}.npz")
    for k, v in final.items():
        assert np.abs(sent[k] - v).max() <= np.abs(v).max() / 127 + 1e-6
    assert res["final_accuracy"] > res["initial_accuracy"]
