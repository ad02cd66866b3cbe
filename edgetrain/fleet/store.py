"""The coordinator's RUNDIR: what it was asked for (serve.json), the global arrays after the last saved round (and
beside them what a strategy keeps between rounds, under its own prefix; older rounds' are deleted: prune_rounds) and
the starting arrays (global-0000), and the run's state file. Every write is atomic."""
from __future__ import annotations

import io
import json
from collections.abc import Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from ..fileio import atomic_write_bytes, atomic_write_text
from ..options import DEFAULT_TRAIN_LAYERS

SPEC = "serve.json"
STATE = "fleet-state.json"
STATE_FORMAT = "edgetrain-fleet-state/1"
SPEC_FORMAT = "edgetrain-fleet-serve/1"
CONTROL = "control/"  # the SCAFFOLD control variates travel beside the weights under this prefix
CONTROL_PREFIX = "control"  # RUNDIR/control-NNNN.npz: the global control variate after round NNNN
HELD_PREFIX = "held"  # RUNDIR/held-NNNN.npz: what each device sent round NNNN reconstructed (DEVICE-KEY|NAME)
MOMENTUM_PREFIX = "momentum"  # RUNDIR/momentum-NNNN.npz: the server momentum's last global step (FedAvgM)
ROUND_PREFIXES = ("global", CONTROL_PREFIX, MOMENTUM_PREFIX)  # what a round saves that the next round replaces


def global_path(rundir: Path, round_no: int, prefix: str = "global") -> Path:
    return rundir / f"{prefix}-{round_no:04d}.npz"


def save_global(rundir: Path, round_no: int, arrays: dict, prefix: str = "global") -> None:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    atomic_write_bytes(global_path(rundir, round_no, prefix), buf.getvalue(), "global weights")


def load_global(rundir: Path, round_no: int, prefix: str = "global", keep=None) -> dict:
    """The arrays of RUNDIR/PREFIX-NNNN.npz, as float32; with ``keep``, only the names it accepts (the others are
    not read)."""
    with np.load(global_path(rundir, round_no, prefix), allow_pickle=False) as z:
        return {k: z[k].astype(np.float32) for k in z.files if keep is None or keep(k)}


def prune_rounds(rundir: Path, completed: int) -> Iterator[Path]:
    """Delete the global arrays, control variates and momentum steps of the rounds before ``completed``, oldest first,
    yielding each file deleted; global-0000 (the starting arrays: a device's first downlink base) is kept. Call it once
    the state naming ``completed`` is written: a resume reads only round ``completed``'s files (and a round saved
    after it but not named by the state is saved again), so a kill between two deletions leaves only files no resume
    reads, deleted after a later round."""
    for prefix in ROUND_PREFIXES:
        for path in sorted(rundir.glob(f"{prefix}-*.npz")):
            number = path.name[len(prefix) + 1:-len(".npz")]
            if number.isdigit() and 0 < int(number) < completed:
                path.unlink(missing_ok=True)
                yield path


def read_state(rundir: Path) -> dict | None:
    path = rundir / STATE
    return json.loads(path.read_text()) if path.exists() else None


def write_state(rundir: Path, state: dict) -> None:
    atomic_write_text(rundir / STATE, json.dumps(state, indent=2) + "\n", "fleet state")


@dataclass
class ServeSpec:
    """RUNDIR/serve.json: what `fleet serve` was asked for, as the coordinator reads it. A spec written by an
    earlier edgetrain may lack the later fields: each has the default those runs had."""

    rundir: str
    model: str
    val: str
    rounds: int
    min_clients: int
    round_timeout: float
    join_timeout: float
    codec: str
    epochs: int
    batch_size: int
    optimizer: str
    seed: int
    min_updates: int = 1
    fraction: float = 1.0
    aggregate: str = "fedavg"
    lr: float | None = None
    params: str | None = None
    train_layers: str = DEFAULT_TRAIN_LAYERS
    threads: int | None = None
    max_update_norm: float | None = None
    ternary_density: float | None = None
    ternary_control_step: float | None = None
    ternary_min_keep: int | None = None
    uplink_ratio: float | None = None
    downlink_ratio: float | None = None
    server_momentum: float | None = None
    format: str = SPEC_FORMAT

    @classmethod
    def read(cls, path: Path | str) -> ServeSpec:
        given = json.loads(Path(path).read_text())
        return cls(**{f.name: given[f.name] for f in fields(cls) if f.name in given})

    def to_dict(self) -> dict:
        return asdict(self)

    def write(self) -> Path:
        """RUNDIR/serve.json, atomically; returns its path."""
        path = Path(self.rundir) / SPEC
        atomic_write_text(path, json.dumps(self.to_dict(), indent=2) + "\n", "fleet spec")
        return path
