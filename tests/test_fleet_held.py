"""The coordinator's RUNDIR over a long run: what `--resume` compares with (serve.json, read as the typed
ServeSpec), and the per-device downlink bases (held-NNNN.npz) pruned to what a device or a resume can still
need, crash-safely."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("flwr")

from clitools import assert_user_error, run_edgetrain  # noqa: E402
from fleettools import MODEL, fleet, fleet_cache, report, shares, wait_for  # noqa: E402,F401  (fixtures)


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
