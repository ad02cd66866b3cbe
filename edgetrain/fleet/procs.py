"""Flower's processes (SuperLink, SuperNode, ``flwr run``), started and stopped as one unit.

Flower starts helpers in new sessions (SuperExec, then a ServerApp or ClientApp process per run or
message), so a process-group kill does not reach them, and PR_SET_PDEATHSIG (which our direct children
get) is not inherited by theirs. Every process edgetrain starts here carries an environment tag
(``EDGETRAIN_FLEET_TAG``) that Flower's own children inherit; ``kill_tagged`` ends every process with that
tag, whoever started it. That covers a stop we see (an exception, SIGINT, SIGTERM); for one we cannot see
(SIGKILL), ``Watchdog`` is a small process in its own session holding the read end of a pipe whose write end
only we hold: when we die, however, the pipe closes and it kills the tag's processes at once.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

from ..child import make_preexec
from ..errors import RunFailed, UsageError

TAG = "EDGETRAIN_FLEET_TAG"


def new_tag(kind: str) -> str:
    return f"{kind}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def flower_bin(name: str) -> str:
    """A Flower executable: beside this Python first (a venv), else on PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    found = shutil.which(name)
    if not found:
        raise UsageError(f"Flower's '{name}' is not installed", "edgetrain fleet",
                         'install the fleet extra: pip install "edgetrain[fleet]"')
    return found


def flower_env(tag: str, flwr_home: Path, extra: dict | None = None) -> dict:
    env = dict(os.environ)
    env[TAG] = tag
    env["FLWR_HOME"] = str(flwr_home)
    # SuperLink/SuperNode start `flower-superexec` and `flwr-serverapp`/`flwr-clientapp` by name
    env["PATH"] = str(Path(flower_bin("flower-superlink")).parent) + os.pathsep + env.get("PATH", "")
    env.update(extra or {})
    return env


def spawn(argv: list[str], env: dict, log: Path) -> subprocess.Popen:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as fh:
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, preexec_fn=make_preexec(os.getpid(), None))


def tagged(tag: str) -> list[int]:
    """PIDs of live processes carrying ``tag`` (Flower's detached helpers included)."""
    import psutil

    found = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != os.getpid() and p.environ().get(TAG) == tag:
                found.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return found


def kill_tagged(tag: str, procs=()) -> None:
    """SIGKILL every process carrying ``tag`` (and ``procs``), then reap our own children."""
    for _ in range(3):  # a helper may be starting another one while we kill
        pids = set(tagged(tag)) | {p.pid for p in procs if p.poll() is None}
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.2)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_open(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host if host not in ("0.0.0.0", "::") else "127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_port(host: str, port: int, proc: subprocess.Popen, seconds: float, log: Path, what: str) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if port_open(host, port):
            return
        if proc.poll() is not None:
            raise RunFailed(f"{what} exited (code {proc.returncode}) before listening: {last_line(log)}", str(log),
                            "see the log; is the port in use?")
        time.sleep(0.2)
    raise RunFailed(f"{what} did not listen on {host}:{port} within {seconds:.0f}s", str(log), "see the log")


def last_line(log: Path) -> str:
    try:
        lines = [ln for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "no log"
    import re

    return re.sub(r"\x1b\[[0-9;]*m", "", lines[-1]).strip()[:300] if lines else "no output"


def stop_signals(handler) -> dict:
    old = {}
    for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            old[s] = signal.signal(s, handler)
        except ValueError:  # not the main thread
            pass
    return old


class Watchdog:
    """Kills every process carrying ``tag`` as soon as this process exits, even by SIGKILL (see above; the
    process is edgetrain/fleet/watchdog.py)."""

    def __init__(self, tag: str):
        env = {k: v for k, v in os.environ.items() if k != TAG}
        self.proc = subprocess.Popen([sys.executable, "-I", "-m", "edgetrain.fleet.watchdog", tag],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                                     start_new_session=True)

    def close(self) -> None:
        """We are done (our own cleanup ran): let it check once more and exit."""
        try:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            self.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
