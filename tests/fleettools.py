"""The fleet test harness: real `edgetrain fleet` processes (and the Flower processes they start), each
marked in its environment so a test can SIGKILL a process's whole family (a power cut) and the teardown can
check that nothing survived; the digits shares and the engine's export cache shared by a module."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

psutil = pytest.importorskip("psutil")

MODEL = "edgetrain.nets:pretrained_digits"
MARK = "EDGETRAIN_TEST_FLEET_MARK"
RUN_TIMEOUT = 300  # seconds any one fleet run may take here before the test fails


def marked(prefix: str) -> list[int]:
    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and (p.environ().get(MARK) or "").startswith(prefix):
                found.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return found


def kill_marked(prefix: str) -> None:
    for _ in range(5):
        pids = marked(prefix)
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.3)


class Fleet:
    """Starts `edgetrain fleet ...` processes, each under a key; kills a key's whole process family."""

    def __init__(self, folder: Path, cache: Path):
        self.folder, self.cache = folder, cache
        self.mark = f"fleet-test-{uuid.uuid4().hex[:8]}"
        self.procs: dict[str, subprocess.Popen] = {}
        self.port = free_port()
        self.model = MODEL  # what serve coordinates
        self.join_args: tuple = ()  # given to every device (e.g. its own --model)

    def start(self, key: str, *args, env: dict | None = None, module: str = "edgetrain") -> subprocess.Popen:
        full = {k: v for k, v in os.environ.items() if k != "EDGETRAIN_DEBUG"}
        full.update({MARK: f"{self.mark}:{key}:", "EDGETRAIN_CACHE_DIR": str(self.cache), **(env or {})})
        out = open(self.folder / f"{key}.out", "w")
        err = open(self.folder / f"{key}.err", "w")
        p = subprocess.Popen([sys.executable, "-m", module, *map(str, args)], stdout=out, stderr=err, env=full,
                             start_new_session=True)
        self.procs[key] = p
        return p

    def serve(self, rundir, *args, key="serve", **kw):
        return self.start(key, "fleet", "serve", self.model, "--val", self.shares["val"], "-o", rundir, "--port", self.port,
                          "--threads", 1, "--join-timeout", 60, *args, **kw)

    def join(self, key, data, *args, **kw):
        return self.start(key, "fleet", "join", f"127.0.0.1:{self.port}", "--data", data, "-o", self.folder / key,
                          "--name", key, "--threads", 1, *self.join_args, *args, **kw)

    def wait(self, key: str, timeout: float = RUN_TIMEOUT) -> tuple[int, str, str]:
        code = self.procs[key].wait(timeout=timeout)
        return code, (self.folder / f"{key}.out").read_text(), (self.folder / f"{key}.err").read_text()

    def kill(self, key: str) -> None:
        """A power cut: the process and everything it (and Flower for it) started, SIGKILL."""
        kill_marked(f"{self.mark}:{key}:")
        self.procs[key].wait(timeout=30)

    def close(self) -> list[int]:
        """Kill whatever is still running; returns what survived the kill (must be nothing)."""
        kill_marked(self.mark)
        for p in self.procs.values():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        return marked(self.mark)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}")


def make_shares(tmp_path_factory) -> dict:
    """The digits split into three non-IID device shares and a held-out set (for a module fixture)."""
    from edgetrain.fleet.demo import split_digits

    return split_digits(tmp_path_factory.mktemp("fleet-shares"), per_device=90)


def fleet_of(tmp_path, shares, cache):
    """A Fleet for one test (a fixture's body): killed in teardown, which fails if a process survives."""
    f = Fleet(tmp_path, cache)
    f.shares = shares
    yield f
    left = f.close()
    assert not left, f"processes outlived the fleet: {left}"


# The fixtures every loopback-fleet test module shares: `from fleettools import fleet_cache, fleet, shares`.
@pytest.fixture(scope="module")
def shares(tmp_path_factory):
    return make_shares(tmp_path_factory)


@pytest.fixture(scope="module")
def fleet_cache(tmp_path_factory):
    return tmp_path_factory.mktemp("fleet-cache")


@pytest.fixture
def fleet(tmp_path, shares, fleet_cache):
    yield from fleet_of(tmp_path, shares, fleet_cache)


def round_in_progress(folder: Path) -> int | None:
    """The round a device is inside (its current-round.json), or None between rounds."""
    try:
        return json.loads((folder / "current-round.json").read_text())["round"]
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def report(rundir: Path) -> dict:
    return json.loads((rundir / "fleet.json").read_text())


def final_arrays(rundir: Path) -> dict[str, np.ndarray]:
    """The last global arrays, control variate and server momentum step of a run, by name."""
    out = {}
    for prefix in ("global", "control", "momentum"):
        files = sorted(rundir.glob(f"{prefix}-*.npz"))
        if files:
            with np.load(files[-1]) as z:
                out.update({f"{prefix}/{k}": z[k] for k in z.files})
    return out
