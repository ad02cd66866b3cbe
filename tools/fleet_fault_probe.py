"""Issue 25's fault figures, measured on loopback with real processes:

    python tools/fleet_fault_probe.py [--round-timeout 15] [--out DIR]

(a) a round with one device slower than --round-timeout (it waits in its round through the test hook
EDGETRAIN_FLEET_TEST_DELAY): the round's wall time in fleet.json against the timeout, and who is listed as
answered / timed out; (b) `kill -9` of `edgetrain fleet serve` while its ServerApp runs: seconds until no
process it started (Flower's SuperLink, SuperExec, `flwr run`, ServerApp) is left.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

MODEL = "edgetrain.nets:pretrained_digits"
MARK = "EDGETRAIN_PROBE_MARK"


def _marked(mark: str, word: str = "") -> list[int]:
    import psutil

    out = []
    for p in psutil.process_iter():
        try:
            if p.environ().get(MARK) == mark and word in " ".join(p.cmdline()):
                out.append(p.pid)
        except psutil.Error:
            continue
    return out


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(mark: str, log: Path, *args, env: dict | None = None) -> subprocess.Popen:
    full = {**os.environ, MARK: mark, **(env or {})}
    return subprocess.Popen([sys.executable, "-m", "edgetrain", *map(str, args)], env=full, start_new_session=True,
                            stdout=open(log.with_suffix(".out"), "w"), stderr=open(log.with_suffix(".err"), "w"))


def _kill(mark: str) -> None:
    for pid in _marked(mark):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def timed_out_round(work: Path, data: dict, timeout: float) -> dict:
    mark, port, run = uuid.uuid4().hex, _port(), work / "run"
    try:
        serve = _start(mark, work / "serve", "fleet", "serve", MODEL, "--val", data["val"], "-o", run, "--port", port,
                       "--rounds", 1, "--min-clients", 2, "--round-timeout", timeout, "--threads", 1)
        for d, env in ((0, None), (1, {"EDGETRAIN_FLEET_TEST_DELAY": f"1:{3 * timeout:g}:training"})):
            _start(mark, work / f"device{d}", "fleet", "join", f"127.0.0.1:{port}", "--data", data["devices"][d], "-o",
                   work / f"device{d}", "--name", f"device{d}", "--threads", 1, env=env)
        serve.wait(timeout=600)
        r = json.loads((run / "fleet.json").read_text())["rounds"][0]
        return {"round_timeout_s": timeout, "round_wall_s": r["seconds"],
                "answered": [p["client"] for p in r["participants"]],
                "timed_out": [x["client"] for x in r["timed_out"]], "failed": [x["client"] for x in r["failed"]]}
    finally:
        _kill(mark)


def kill9_cleanup(work: Path, data: dict) -> dict:
    mark, port = uuid.uuid4().hex, _port()
    try:
        serve = _start(mark, work / "serve-kill", "fleet", "serve", MODEL, "--val", data["val"], "-o", work / "run-kill",
                       "--port", port, "--rounds", 1, "--min-clients", 1, "--threads", 1)
        end = time.monotonic() + 120
        while not _marked(mark, "flwr-serverapp") and time.monotonic() < end:
            time.sleep(0.2)
        before = len(_marked(mark))
        os.kill(serve.pid, signal.SIGKILL)
        t0 = time.monotonic()
        serve.wait()
        while _marked(mark) and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        return {"processes_before": before, "seconds_until_none_left": round(time.monotonic() - t0, 2),
                "left": len(_marked(mark))}
    finally:
        _kill(mark)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--round-timeout", type=float, default=15.0)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    from edgetrain.fleet.demo import split_digits

    work = Path(a.out or tempfile.mkdtemp(prefix="fleet-probe-"))
    work.mkdir(parents=True, exist_ok=True)
    data = split_digits(work / "data", per_device=90)
    out = {"timed_out_round": timed_out_round(work, data, a.round_timeout), "kill9": kill9_cleanup(work, data)}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
