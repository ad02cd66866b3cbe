"""The fleet's watchdog process (``python -I -m edgetrain.fleet.watchdog TAG``, started by ``procs.Watchdog``).

It blocks reading standard input, a pipe whose write end only the edgetrain process that started it holds.
When that process exits, however it dies (SIGKILL included), the read returns and every process carrying
``EDGETRAIN_FLEET_TAG=TAG`` (Flower's helpers, which a process-group kill and PDEATHSIG do not reach) is
killed. It imports only the standard library and psutil, so it starts in a few tens of milliseconds.
"""
from __future__ import annotations

import os
import signal
import sys
import time

import psutil

TAG = "EDGETRAIN_FLEET_TAG"   # procs.TAG: not imported from there, so this process loads no more than it needs


def tagged(tag: str, me: int) -> list[int]:
    pids = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.pid != me and p.environ().get(TAG) == tag:
                pids.append(p.pid)
        except (psutil.Error, OSError):
            pass
    return pids


def main(tag: str) -> None:
    me = os.getpid()
    sys.stdin.buffer.read()  # returns when the edgetrain process that started us has exited, however it died
    for _ in range(5):
        pids = tagged(tag, me)
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.2)


if __name__ == "__main__":
    main(sys.argv[1])
