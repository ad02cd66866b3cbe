"""The README's own-Gluon-model example runs as written, in a fresh interpreter, with whatever numpy this
environment has (CI runs it on numpy 1.23 and on numpy 2): its script, then its export command."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from clitools import run_edgetrain

README = Path(__file__).resolve().parents[1] / "README.md"


def _example() -> tuple[str, str]:
    text = README.read_text(encoding="utf-8")
    start = text.index("Your own Gluon model, on the host")
    script = re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)
    command = re.search(r"```sh\n(.*?)```", text[start:], re.S).group(1).strip()
    return script, command


def test_the_readmes_own_model_example_runs_as_written(tmp_path):
    script, command = _example()
    assert script.splitlines()[0].startswith("import edgetrain")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "mynet-symbol.json").is_file() and (tmp_path / "mynet-0000.params").is_file()
    args = command.split()
    assert args[0] == "edgetrain"
    res = run_edgetrain(*args[1:], cwd=tmp_path)
    assert res.code == 0, res.err
    assert (tmp_path / "mynet.onnx").is_file()


# --- the README's `energy attribute` workflow: record, profile, stop, export, attribute -----------------------

def _attribute_workflow() -> list[list[str]]:
    """The README's commands for a meter whose app exports only after the recording is stopped, as written."""
    import shlex

    text = README.read_text(encoding="utf-8")
    start = text.index("export only after the recording is stopped")
    block = re.search(r"```sh\n(.*?)```", text[start:], re.S).group(1).replace("\\\n", " ")
    return [shlex.split(ln) for ln in block.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


IDLE_W, BUSY_W = 2.0, 3.25   # what the meter reads: the board idle, and while the model runs


@pytest.mark.slow
def test_the_readmes_attribute_workflow_runs_as_written(tmp_path):
    """`profile --meter-export` records its windows; a PPK2 export and an Otii export covering them, in the formats
    the apps write (tests/fixtures/power/SOURCES.md), are attributed as written -- only --power-log-start is this
    recording's -- and the measured joules are the power written times each window's length, within what the
    meter's rows can resolve; RESULT is never changed."""
    import json
    import shutil

    import metertools

    commands = _attribute_workflow()
    assert [c[:3] for c in commands] == [["edgetrain", "profile", "model.onnx"],
                                         ["edgetrain", "energy", "attribute"], ["edgetrain", "energy", "attribute"]]
    shutil.copyfile(Path(__file__).resolve().parents[1] / "edgetrain" / "_builtin" / "digits5.onnx",
                    tmp_path / "model.onnx")
    res = run_edgetrain(*commands[0][1:], cwd=tmp_path, env=metertools.sensor_env(tmp_path / "no-sensor"))
    assert res.code == 0, res.err
    result = tmp_path / commands[0][commands[0].index("--json") + 1]
    before = result.read_bytes()
    windows = json.loads(before)["meter_windows"]["configs"]
    assert windows and all(w["timed"][1] - w["timed"][0] >= 10 for w in windows)

    t0, seconds = metertools.recording(result)
    hz = 1000.0

    def watts(s: float) -> float:  # the meter's reading s seconds into its recording
        return BUSY_W if any(w["timed"][0] <= t0 + s <= w["timed"][1] for w in windows) else IDLE_W

    volts = 3.3
    microamps = {w: round(w / volts * 1e6, 3) for w in (IDLE_W, BUSY_W)}   # the export's toFixed(3)
    for args in commands[1:]:
        log = args[4]
        if "--power-log-voltage" in args:
            assert float(args[args.index("--power-log-voltage") + 1]) == volts
            metertools.ppk2_export(tmp_path / log, seconds, lambda s: microamps[watts(s)], hz)
            read = {w: microamps[w] * volts / 1e6 for w in microamps}
        else:
            metertools.otii_export(tmp_path / log, seconds, watts, hz)
            read = {w: w for w in microamps}
        args = list(args)
        args[args.index("--power-log-start") + 1] = metertools.stamp(t0)   # this recording's start, not the example's
        out = tmp_path / (args[args.index("-o") + 1] if "-o" in args else "profile-measured.json")
        if out.exists():
            out.unlink()
        res = run_edgetrain(*args[1:], cwd=tmp_path)
        assert res.code == 0, res.err
        assert result.read_bytes() == before and "measured" in res.out
        measured = json.loads(out.read_text())
        for w in windows:
            c = next(c for c in measured["configs"] if c["threads"] == w["threads"])
            p = c["power"]
            length = w["timed"][1] - w["timed"][0]
            # the trapezoid's error: where the reading steps (each end of the window) within one row's time
            slack = 2 * (read[BUSY_W] - read[IDLE_W]) / hz
            assert p["source"] == "power-log" and p["window"]["seconds"] == pytest.approx(length)
            assert abs(p["joules"] - read[BUSY_W] * length) <= slack, (p["joules"], read[BUSY_W] * length)
            assert p["idle_w"] == pytest.approx(read[IDLE_W], abs=slack / (w["idle"][1] - w["idle"][0]))
            board = next(b for b in measured["host_energy"]["board"] if b["threads"] == c["threads"])
            assert board["total_mj"] == pytest.approx(p["joules"] / p["inferences"] * 1000)
        assert [p.name for p in tmp_path.iterdir() if "edgetrain-tmp" in p.name or p.name.endswith(".tmp")] == []
