"""A meter beside a run, for the tests that drive `edgetrain energy` in child processes: a device profile of this
machine, a sensor tree and a board whose power steps, a finished `profile --meter-export` result, and meter
exports in the PPK2 and Otii formats (tests/fixtures/power/SOURCES.md) covering that result's windows."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from clitools import run_edgetrain
from test_power import write


def this_host(folder: Path) -> Path:
    """A device profile that matches this machine: what is measured here is measured on the device."""
    from edgetrain.host import detect_host
    from test_profile_models import user_profile

    host = detect_host()
    return user_profile(folder, name="this-board", arch=host.arch, cores=host.cores_usable, ram_mb=host.ram_mb,
                        default_threads=1, os_reserve_mb=256, memory_budget_mb=1024)


def hwmon_tree(root: Path, microwatts: int) -> Path:
    write(root / "class" / "hwmon" / "hwmon0" / "name", "ina219")
    write(root / "class" / "hwmon" / "hwmon0" / "power1_input", microwatts)
    return root


def sensor_env(root: Path, **more) -> dict:
    return {"EDGETRAIN_SYSFS_ROOT": str(root), "EDGETRAIN_VCGENCMD": str(root / "no-vcgencmd"), **more}


# A board whose own sensor steps between levels (rewritten in place, every level the same number of digits)
BOARD = r"""
import sys, time
power, seconds, levels = sys.argv[1], float(sys.argv[2]), sys.argv[3].split(",")
end, i = time.time() + seconds, 0
while time.time() < end:
    with open(power, "r+") as f:
        f.write(levels[i % len(levels)] + "\n")
    time.sleep(0.3)
    i += 1
"""


def stepping_board(root: Path, seconds: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", BOARD, str(root / "class" / "hwmon" / "hwmon0" / "power1_input"),
                             str(seconds), "1500000,3900000,2400000,5200000"])


def clock_log(path: Path, start: float, seconds: float, watts: float = 2.5, hz: float = 10.0) -> Path:
    """A meter log in Unix seconds with its unit in the header (what `--power-log` reads as it is written)."""
    rows = [f"{start + i / hz:.3f},{watts:.3f}\n" for i in range(int(seconds * hz) + 1)]
    path.write_text("timestamp,power (W)\n" + "".join(rows), encoding="utf-8")
    return path


def stamp(t: float) -> str:
    """``t`` (Unix seconds, to the millisecond) as the local ISO 8601 time `--power-log-start` reads."""
    whole, ms = divmod(int(round(t * 1000)), 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(whole)) + f".{ms:03d}"


def meter_export_result(folder: Path, model: Path, *more: str) -> Path:
    """A finished `edgetrain profile MODEL --meter-export --json RESULT` on this machine, no sensor."""
    result = folder / "profile.json"
    res = run_edgetrain("profile", model, "--device", this_host(folder), "--meter-export", "--json", result,
                        "--warmup", "1", "--runs", "20", "--input-shape", "1,3,16,16", *more,
                        env=sensor_env(folder / "empty-sys"))
    assert res.code == 0, res.err
    assert json.loads(result.read_text())["meter_windows"]["held_for_a_meter"]
    return result


def recording(result: Path, margin: float = 2.0) -> tuple[float, float]:
    """(start, seconds) of a meter recording covering every window RESULT holds, started on a whole second."""
    import math

    d = json.loads(result.read_text())
    windows = d["meter_windows"]["configs"]
    t0 = math.floor(min(c["idle"][0] for c in windows) - margin)
    return float(t0), max(c["timed"][1] for c in windows) + margin - t0


def _rows(seconds: float, hz: float) -> range:
    return range(int(seconds * hz) + 1)


def otii_export(path: Path, seconds: float, watts, hz: float = 1000.0) -> Path:
    """As the Otii 3 app writes a channel's export ('"Timestamp","Value"', %.6f seconds from the recording's start,
    %.9g in the channel's unit): ``watts(s)`` at each time s (the app exports every sample, this 1/hz s)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write('"Timestamp","Value"\n')
        f.writelines(f"{i / hz:.6f},{watts(i / hz):.9g}\n" for i in _rows(seconds, hz))
    return path


def ppk2_export(path: Path, seconds: float, microamps, hz: float = 1000.0) -> Path:
    """As pc-nrfconnect-ppk exports (ms from the recording's start, current toFixed(3) µA, digital channels)."""
    with open(path, "w", encoding="utf-8") as f:
        f.write("Timestamp(ms),Current(uA),D0-D7\n")
        f.writelines(f"{i * 1000.0 / hz:g},{microamps(i / hz):.3f},--------\n" for i in _rows(seconds, hz))
    return path
