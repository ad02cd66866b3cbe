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


# A separate process plays the board and the meter at once: it steps the board's power every STEP_S seconds
# (rewriting `power1_input` in place, every level the same number of digits, so a read never sees half a
# value) and logs what a meter at the
# board's input would read at the same instants, gain x sensor + offset, in pyummeter's UM34C CSV
# (tests/fixtures/power/SOURCES.md). It logs only in the middle of each step, so the sensor's samples either
# side of a meter reading saw the same power and the line is recovered closely, not just roughly.

UM34C_HEADER = ("Date;Voltage (V);Intensity (A);Power (W);Resistance (Ohm);USB D+ (V);USB D- (V);Charging Mode;"
                "Temperature (°C);Model;Recording;Record duration (sec);Record intensity (A);Record capacity (Ah);"
                "Record energy (Wh);Capacity (Ah);Energy (Wh)")
STEP_S = 0.6
LEVELS_UW = (1_500_000, 3_900_000, 2_400_000, 5_200_000)  # the board's own sensor, µW (7 digits each)

BOARD_AND_METER = r"""
import sys, time
from datetime import datetime
power_file, log, gain, offset, seconds, step = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), \
    float(sys.argv[5]), float(sys.argv[6])
levels = [int(x) for x in sys.argv[7].split(",")]
end = time.time() + seconds
i = 0
while time.time() < end:
    start = time.time()
    uw = levels[i % len(levels)]
    with open(power_file, "r+") as f:  # in place, as a driver's file (the reader keeps it open); same length
        f.write(f"{uw}\n")
    for at in (0.25, 0.3, 0.35):  # mid-step: the sampler's neighbours (20 Hz) are inside the step
        time.sleep(max(0.0, start + at * step / 0.6 - time.time()))
        w = gain * uw / 1e6 + offset
        amps = w / 5.1
        with open(log, "a", encoding="utf-8", newline="") as f:
            f.write(f"{datetime.now().isoformat(sep=' ')};5.1;{amps:.3f};{w:.3f};9999.9;0.01;0.02;DCP1.5A;20;"
                    "UM34C;0;240;0.1;0.016;0.256;0.011;0.056\r\n")
    time.sleep(max(0.0, start + step - time.time()))
    i += 1
"""


def um34c_log(path: Path) -> Path:
    """An empty UM34C CSV (its header alone), for board_and_meter to log into."""
    path.write_text(UM34C_HEADER + "\r\n", encoding="utf-8", newline="")
    return path


def board_and_meter(root: Path, log: Path, gain: float, offset: float, seconds: float) -> subprocess.Popen:
    power = root / "class" / "hwmon" / "hwmon0" / "power1_input"
    return subprocess.Popen([sys.executable, "-c", BOARD_AND_METER, str(power), str(log), str(gain), str(offset),
                             str(seconds), str(STEP_S), ",".join(map(str, LEVELS_UW))])


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
