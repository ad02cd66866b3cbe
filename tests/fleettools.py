"""The fleet test harness: real `edgetrain fleet` processes (and the Flower processes they start), each
marked in its environment so a test can SIGKILL a process's whole family (a power cut) and the teardown can
check that nothing survived; the digits shares and the engine's export cache shared by a module."""
from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
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


def shared_run(tmp_path_factory, name: str, make) -> Path:
    """A fault-free fleet run several tests read (and compare with, bit for bit), made once per test session:
    ``make(folder)`` runs it into FOLDER on whichever pytest-xdist worker asks first, under a lock the other
    workers wait on; they then read the same folder. A run whose ``make`` failed is made again by the next
    asker (and fails there too). Returns FOLDER."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the session's folder, above each worker's own
    folder = root / f"shared-{name}"
    with open(root / f"shared-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (folder / "MADE").exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            make(folder)
            (folder / "MADE").write_text("")
    return folder


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


# --- the fault-free runs of two devices the kill tests compare with (tests/test_fleet_faults.py), bit for bit;
# other modules read the same runs for what they show (each made once per session: shared_run)

DEVICES = ("dev0", "dev1")
ROUNDS = 2
TIMEOUT = 30  # --round-timeout: a round here takes about 6 s
# --export none: no test of these runs reads the deployable model (a later --export in extra gives one)
CONFIG = ("--rounds", ROUNDS, "--min-clients", len(DEVICES), "--codec", "2bit", "--aggregate", "scaffold",
          "--round-timeout", TIMEOUT, "--export", "none")
HOLD = "EDGETRAIN_FLEET_TEST_DELAY"


def device(fleet: Fleet, name: str, gen: int = 0, env: dict | None = None, devices=DEVICES):
    """Device ``name`` (its own state folder, whatever the generation: a restart is the same device); more
    devices than shares take the shares in turn."""
    shares = fleet.shares["devices"]
    return fleet.start(f"{name}-{gen}", "fleet", "join", f"127.0.0.1:{fleet.port}", "--data",
                       shares[devices.index(name) % len(shares)], "-o", fleet.folder / name, "--name", name,
                       "--threads", 1, *fleet.join_args, env=env)


def finish(fleet: Fleet, serve_key: str, device_keys) -> dict:
    code, _, err = fleet.wait(serve_key)
    assert code == 0, err
    for key in device_keys:
        code, _, err = fleet.wait(key, timeout=60)
        assert code == 0, (key, err)
    return report(fleet.folder / "run")


def journal(folder: Path) -> list[tuple[str, int]]:
    text = (folder / "journal.log").read_text() if (folder / "journal.log").exists() else ""
    return [(m.group(1), int(m.group(2))) for m in re.finditer(r"(staged|replayed|committed|dropped) round (\d+)", text)]


def exactly_once(fleet: Fleet, res: dict, devices=DEVICES, rounds=ROUNDS) -> dict[str, list]:
    """Each device's committed state counts exactly the rounds the coordinator aggregated from it, and no
    round was trained (staged) twice unless the first was dropped (never aggregated). Returns the journals."""
    from edgetrain.fleet.client import committed

    by_name = {d["client"]: d for d in res["devices"]}
    journals = {}
    for name in devices:
        events = journal(fleet.folder / name)
        journals[name] = events
        meta = committed(fleet.folder / name)[0]
        took_part = [r["round"] for r in res["rounds"] if name in [p["client"] for p in r["participants"]]]
        assert meta.get("trained", 0) == len(took_part) == by_name[name]["updates"], (name, meta, took_part, events)
        assert [r for e, r in events if e == "committed"] == took_part, (name, events)
        if took_part:
            assert meta["round"] == took_part[-1]
        for r in {r for e, r in events if e == "staged"}:
            staged = sum(1 for e, x in events if (e, x) == ("staged", r))
            dropped = sum(1 for e, x in events if (e, x) == ("dropped", r))
            assert staged <= 1 + dropped, (name, r, events)  # trained twice only if the first never counted
        assert not (fleet.folder / name / "staged.npz").exists()  # the goodbye settled the last round
    assert [r["round"] for r in res["rounds"]] == list(range(1, rounds + 1))
    for r in res["rounds"]:  # a device that rejoined (a new node id, the old one still listed) is asked once
        named = [x["client"] for k in ("participants", "refused", "failed", "timed_out") for x in r[k]]
        assert sorted(named) == sorted(set(named)), r
    return journals


def fault_free(tmp_path_factory, shares, fleet_cache, name: str, env: dict | None = None, mode=None,
                extra=()) -> tuple[dict, dict, Path]:
    """A fault-free run of CONFIG (``mode``: of the ONNX base training those layers; ``env``: a process's own
    environment, by key: serve, dev0, dev1), made once per test session (shared_run): its final arrays, its
    report and its folder (the devices' state folders are FOLDER/NAME)."""
    def make(folder: Path) -> None:
        f = Fleet(folder, fleet_cache)
        f.shares = shares
        try:
            f.serve(folder / "run", *CONFIG, *(onnx_mode(f, mode) if mode else ()), *extra, env=(env or {}).get("serve"))
            for d in DEVICES:
                device(f, d, env=(env or {}).get(d))
            exactly_once(f, finish(f, "serve", [f"{d}-0" for d in DEVICES]))
        finally:
            assert not f.close()

    folder = shared_run(tmp_path_factory, name, make)
    return final_arrays(folder / "run"), report(folder / "run"), folder



def onnx_mode(fleet: Fleet, layers: str) -> tuple:
    """A fleet of the shipped ONNX base (the digits model's export) training ``layers``; every device brings
    the file (--model). Returns serve's extra arguments."""
    import edgetrain

    base = str(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx")
    fleet.model, fleet.join_args = base, ("--model", base)
    # a ClientApp of these modes loads the gradient code at start: a longer round on a loaded machine (the last
    # --round-timeout given is the one in force)
    return ("--train-layers", layers, "--round-timeout", 4 * TIMEOUT)


def no_mxnet(folder: Path) -> dict:
    """The environment of a process in which mxnet cannot be imported (a stand-in ``mxnet`` package that raises,
    ahead of the real one, in FOLDER/no-mxnet): the device's environment, as tests/test_device_loop.py makes it."""
    blocker = folder / "no-mxnet" / "mxnet"
    blocker.mkdir(parents=True, exist_ok=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named mxnet (this is the device)')\n")
    return {"PYTHONPATH": os.pathsep.join(p for p in (str(blocker.parent), os.environ.get("PYTHONPATH")) if p)}


def onnx_reference(tmp_path_factory, shares, fleet_cache, layers: str) -> tuple[dict, dict, Path]:
    """The fault-free fleet of the shipped ONNX base training ``layers`` (bias or lite), every process without
    mxnet, its global model exported (--export int8): what tests/test_fleet_adapt.py checks, and what the kills
    of tests/test_fleet_faults.py must end at. As fault_free returns it."""
    env = no_mxnet(tmp_path_factory.getbasetemp())
    return fault_free(tmp_path_factory, shares, fleet_cache, f"reference-{layers}", {k: env for k in ("serve", *DEVICES)},
                      mode=layers, extra=("--export", "int8"))
