"""Ctrl-C and SIGTERM while `edgetrain energy attribute` reads a meter's export of millions of rows, and while
`edgetrain energy calibrate` samples a board: exit 130 / 143 (128 + the signal) with no traceback, no output and no
temp file beside RESULT or -o, RESULT and the log as they were, no process left. Real child processes, real files,
a sensor tree standing in for the board (tests/metertools.py)."""
from __future__ import annotations

import hashlib
import os
import signal
import time
from pathlib import Path

import pytest

import metertools
from hostile import faults

SIGNALS = {"SIGINT": (signal.SIGINT, 130, "Aborted."), "SIGTERM": (signal.SIGTERM, 143, "stopped by SIGTERM")}
ROWS = 2_500_000   # a few seconds for each of the reads attribute makes of it


@pytest.fixture(scope="module")
def big_export(tmp_path_factory) -> dict:
    """A finished `profile --meter-export` result and an Otii export of ROWS readings covering its windows."""
    from test_profile_models import conv_gemm_onnx

    folder = tmp_path_factory.mktemp("attribute-signals")
    result = metertools.meter_export_result(folder, conv_gemm_onnx(folder / "convgemm.onnx"))
    start, seconds = metertools.recording(result)
    log = metertools.otii_export(folder / "Main power - Arc.csv", seconds, lambda s: 3.25, hz=ROWS / seconds)
    return {"result": result, "log": log, "start": metertools.stamp(start)}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _rchar(pid: int) -> int:
    try:
        text = Path(f"/proc/{pid}/io").read_text()
    except OSError:
        return 0
    return int(next(ln.split()[1] for ln in text.splitlines() if ln.startswith("rchar:")))


def _stopped(argv, sig: str, started, env: dict | None = None, cwd=None):
    """Run edgetrain, send ``sig`` once ``started(proc)`` says it is at work, and return (code, stderr)."""
    env, mark = faults.marked_env(env)
    proc = faults.start_cli(*argv, env=env, cwd=cwd)
    try:
        assert faults.wait_for(lambda: proc.poll() is not None or started(proc), 300, step=0.02), "never started"
        assert proc.poll() is None, "it finished before the signal: make its work longer\n" + proc.stderr.read()
        os.kill(proc.pid, SIGNALS[sig][0])
        _, err = proc.communicate(timeout=120)
        assert faults.wait_for(lambda: not faults.processes_with(mark), 15), "a process outlived the command"
    finally:
        faults.kill_marked(mark)
    return proc.returncode, err


@pytest.mark.slow
@pytest.mark.parametrize("output", ["-o", "beside-result"])
@pytest.mark.parametrize("sig", sorted(SIGNALS))
def test_a_signal_while_attribute_reads_a_large_log_leaves_nothing(big_export, tmp_path, sig, output):
    result = tmp_path / "run" / "profile.json"   # a copy, so that the default output lands in a folder of the test's
    result.parent.mkdir()
    result.write_bytes(big_export["result"].read_bytes())
    log = big_export["log"]
    out = tmp_path / "out" / "measured.json"
    out.parent.mkdir()
    before = {p: _digest(p) for p in (result, log)}
    argv = ["energy", "attribute", result, log, "--power-log-start", big_export["start"]]
    if output == "-o":
        argv += ["-o", out]
    size = log.stat().st_size
    code, err = _stopped(argv, sig, lambda proc: _rchar(proc.pid) >= size)  # it has read the log: parsing
    want_code, said = SIGNALS[sig][1:]
    assert code == want_code and said in err and "Traceback" not in err, (code, err[-3000:])
    assert sorted(p.name for p in result.parent.iterdir()) == ["profile.json"]   # no output, no temp file
    assert list(out.parent.iterdir()) == []
    assert {p: _digest(p) for p in before} == before


@pytest.mark.slow
@pytest.mark.parametrize("sig", sorted(SIGNALS))
def test_a_signal_while_calibrate_samples_leaves_nothing(tmp_path, sig):
    """The board: a sensor tree whose power steps (tests/fixtures/power has the real trees' layouts); the meter:
    a log in Unix seconds covering the sampling."""
    root = metertools.hwmon_tree(tmp_path / "sys", 1_500_000)
    log = metertools.clock_log(tmp_path / "meter.csv", time.time() - 1, 120)
    before = _digest(log)
    out = tmp_path / "out" / "cal.json"
    out.parent.mkdir()
    board = metertools.board_and_meter(root, tmp_path / "board-meter.csv", 1.0, 0.0, 60)  # steps the sensor
    lines: list[str] = []

    def sampling(proc) -> bool:  # its first line says the sampling has started
        if not lines:
            lines.append(proc.stdout.readline())
        return "sampling the board's sensor" in lines[0]

    try:
        code, err = _stopped(["energy", "calibrate", log, "-o", out, "--seconds", "30", "--phase", "0.5"], sig,
                             sampling, env=metertools.sensor_env(root, XDG_CONFIG_HOME=str(tmp_path / "config")))
    finally:
        board.kill()
        board.wait()
    want_code, said = SIGNALS[sig][1:]
    assert code == want_code and said in err and "Traceback" not in err, (code, err[-3000:])
    assert list(out.parent.iterdir()) == [] and not (tmp_path / "config").exists()
    assert _digest(log) == before and faults.temp_leftovers(tmp_path) == []

