"""--codec ternary end to end on loopback: sparse ternary updates up (>= 100x fewer bytes than float32), the
global arrays down as compact deltas against what each device holds (>= 16x fewer); a device that joins late
starts from the model's initial arrays, and every device rebuilds exactly the arrays the coordinator recorded
as sent to it."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("flwr")

from fleettools import RUN_TIMEOUT, fleet, fleet_cache, report, shares, wait_for  # noqa: E402,F401  (fixtures)




def _npz(path) -> dict:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


@pytest.mark.slow
def test_ternary_up_compact_delta_down_per_device_and_a_late_device_starts_from_the_initial_arrays(fleet, tmp_path,
                                                                                                    shares):
    from edgetrain.fleet.client import DEVICE_ID, DOWNLINK, _unpack
    from edgetrain.fleet.codec import arrays_digest

    run = tmp_path / "run"
    rounds = 5
    # round 1 waits --join-timeout for three devices and starts with those there; the next rounds wait for the third
    # the head's 330 values at one entry in 80 (the defaults' floor of 48 entries a tensor is for larger layers)
    # held with the last round's replies in hand: the global arrays the devices were sent are still on disk (the
    # next state deletes them), to compare with what each device rebuilt
    fleet.serve(run, "--rounds", rounds, "--min-clients", 3, "--join-timeout", 20, "--codec", "ternary",
                "--round-timeout", 120, "--ternary-density", 0.0125,
                "--ternary-min-keep", 1, "--uplink-ratio", 0, "--downlink-ratio", 16, "--export", "none",
                env={"EDGETRAIN_FLEET_TEST_DELAY": f"{rounds}:10:aggregating"})
    fleet.join("a", shares["devices"][0])
    fleet.join("b", shares["devices"][1])
    log = run / "coordinator-rounds.log"
    wait_for(lambda: log.exists() and "round 1: sent to" in log.read_text(), RUN_TIMEOUT, "round 1")
    fleet.join("c", shares["devices"][2])  # late: it starts from the model's initial arrays, as round 1 did
    wait_for(lambda: (run / f"delayed-aggregating-{rounds}").exists(), 3 * RUN_TIMEOUT, "the last round's replies")
    final = _npz(run / f"global-{rounds - 1:04d}.npz")
    code, _, err = fleet.wait("serve", timeout=3 * RUN_TIMEOUT)  # five rounds and a wait for a third device
    assert code == 0, err
    assert not (run / f"global-{rounds - 1:04d}.npz").exists()  # deleted once the last round's state was written
    res = report(run)
    assert res["rounds_completed"] == rounds
    first_of_c = None
    for r in res["rounds"]:
        names = sorted(p["client"] for p in r["participants"])
        assert r["updated"] and not r["refused"] and not r["failed"], r
        # up: >= 100x fewer bytes than the same updates as float32, every round
        assert r["bytes_up_fp32"] >= 100 * r["bytes_up"], r
        first_of_c = first_of_c or ("c" in names and r["round"])
        # down: a delta against what each device holds (c: the initial arrays), >= 16x fewer bytes than float32
        assert r["downlink_whole"] == [], r
        assert r["bytes_down_fp32"] >= 16 * r["bytes_down"], r
    assert first_of_c and first_of_c >= 2
    # every device holds exactly what the coordinator recorded as sent to it in the last round
    held = _npz(run / f"held-{rounds:04d}.npz")
    start = _npz(run / "global-0000.npz")
    for d in ("a", "b", "c"):
        key = (tmp_path / d / DEVICE_ID).read_text().strip()
        sent = {k.partition("|")[2]: v for k, v in held.items() if k.partition("|")[0] == key}
        meta, groups = _unpack(tmp_path / d / DOWNLINK)
        assert meta["round"] == rounds and meta["digest"] == arrays_digest(sent)
        assert sorted(groups["arrays"]) == sorted(sent)
        for k, v in sent.items():
            np.testing.assert_array_equal(groups["arrays"][k], v)
        # what it trained from is the global model it was sent (saved after the round before), to within what
        # the compact messages have not yet closed: nearer to it than the starting arrays are
        gap = np.sqrt(sum(np.sum((sent[k] - v) ** 2) for k, v in final.items()))
        moved = np.sqrt(sum(np.sum((start[k] - v) ** 2) for k, v in final.items()))
        assert gap < 0.5 * moved, (d, gap, moved)
        assert fleet.wait(d, timeout=60)[0] == 0
    assert res["final_accuracy"] > res["initial_accuracy"]
