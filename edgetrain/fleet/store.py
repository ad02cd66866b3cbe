"""The coordinator's RUNDIR: the global arrays after each round (and beside them what a strategy keeps between
rounds, under its own prefix), and the run's state file. Every write is atomic."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from ..fileio import atomic_write_bytes, atomic_write_text

STATE = "fleet-state.json"
STATE_FORMAT = "edgetrain-fleet-state/1"
CONTROL = "control/"  # the SCAFFOLD control variates travel beside the weights under this prefix
CONTROL_PREFIX = "control"  # RUNDIR/control-NNNN.npz: the global control variate after round NNNN
MOMENTUM_PREFIX = "momentum"  # RUNDIR/momentum-NNNN.npz: the server momentum's last global step (FedAvgM)


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
