"""A test hook (never set by users), read by the device and the coordinator alike.

``EDGETRAIN_FLEET_TEST_DELAY=ROUND:SECONDS[:PHASE]`` makes the process wait SECONDS in round ROUND (0: every
round) at PHASE: ``training`` (a device, before it trains; the default), ``sending`` (a device, after its
update is staged, before the reply leaves), ``aggregating`` (the coordinator, replies in hand, nothing
averaged), ``saving`` (the coordinator, global weights written, the round's state not yet), ``pruning`` (the coordinator,
the round's state written, the downlink's stale files and the previous round's files not yet deleted), ``pruned``
(after each of those deletions, the downlink's first, the rest still there). On entering the
wait it writes ``delayed-PHASE-ROUND`` into its folder, so a test can SIGKILL it at exactly that point.
"""
from __future__ import annotations

import time
from pathlib import Path

from .. import envvars

PHASES = ("training", "sending", "aggregating", "saving", "pruning", "pruned")


def delay(round_no: int, phase: str, folder: Path) -> None:
    hook = envvars.get("EDGETRAIN_FLEET_TEST_DELAY")
    if not hook:
        return
    parts = hook.split(":")
    at = parts[2] if len(parts) > 2 else "training"
    if at == phase and int(parts[0]) in (0, round_no):
        (Path(folder) / f"delayed-{phase}-{round_no}").write_text("")
        time.sleep(float(parts[1]))
