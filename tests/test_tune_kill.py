"""edgetrain tune after a power cut: a real child process SIGKILLed at a phase of a trial (a step, an epoch's end,
inside a checkpoint write, the feature pass) or at a moment, then ``--resume``: the same trials, the same
accuracies at every rung, the same choice and the same model as a run never interrupted, with no whole epoch
trained twice (at most the one the cut fell in)."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from clitools import run_edgetrain
from tunetools import digits_task, model_weights, what_was_decided

GRID = ["--grid", "lr=0.003,0.03", "--grid", "train_layers=head,lite", "--epochs", "3", "--threads", "1"]


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict:
    return digits_task(tmp_path_factory.mktemp("tune-kill"), train=120, val=60)


@pytest.fixture(scope="module")
def reference(task, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "out"
    res = _tune(task, out)
    assert res.code == 0, res.err[-2000:]
    return out


@pytest.fixture(scope="module")
def reference_2(task, tmp_path_factory) -> Path:
    """--epochs 2 --min-rung 0.5: a first rung of 2/3 of an epoch (3 of its 4 steps), then 2 epochs."""
    out = tmp_path_factory.mktemp("ref2") / "out"
    res = _tune(task, out, grid=GRID_2)
    assert res.code == 0, res.err[-2000:]
    return out


GRID_2 = [*GRID[:4], "--epochs", "2", "--min-rung", "0.5", *GRID[6:]]


def _tune(task, out: Path, *more, env=None, grid=GRID):
    return run_edgetrain("tune", task["model"], "--data", task["train"], "--val", task["val"], *grid, "-o", out,
                         *more, env=env)


def _epochs_trained(out: Path) -> float:
    """Epochs trained over every session of the run: each rung record's own, plus those a killed session
    checkpointed before its record was written (the gap between a trial's last record and where it resumed); to
    a thousandth (a rung of a fraction of an epoch is that share of its steps)."""
    total, last = 0, {}
    for line in (out / "journal.jsonl").read_text().splitlines():
        rec = json.loads(line)
        if rec.get("kind") != "rung":
            continue
        prev = last.get(rec["trial"], 0)
        if rec.get("resumed_at") is not None and rec["resumed_at"] > prev:
            total += rec["resumed_at"] - prev
        total += rec["trained"]
        last[rec["trial"]] = rec["epochs"]
    return round(total, 3)


def _same_as_reference(out: Path, reference: Path) -> None:
    assert what_was_decided(out) == what_was_decided(reference)
    mine, ref = model_weights(out / "model.onnx"), model_weights(reference / "model.onnx")
    assert mine.keys() == ref.keys() and all(np.array_equal(mine[k], ref[k]) for k in mine)
    assert _epochs_trained(out) == _epochs_trained(reference)


def _cut_and_resume(task, out: Path, reference: Path, phase: str, grid=GRID) -> None:
    killed = _tune(task, out, env={"EDGETRAIN_TEST_KILL_AT": phase}, grid=grid)
    assert killed.code == -signal.SIGKILL, (phase, killed.code, killed.err[-2000:])
    resumed = _tune(task, out, "--resume", grid=grid)
    assert resumed.code == 0, resumed.err[-2000:]
    assert "Traceback" not in resumed.err
    _same_as_reference(out, reference)


def test_a_cut_in_the_middle_of_an_epoch_resumes_to_the_same_choice(task, reference, tmp_path):
    _cut_and_resume(task, tmp_path / "out", reference, "step:9")


def test_a_cut_in_the_checkpoint_of_a_rung_inside_an_epoch_resumes_to_the_same_choice(task, reference_2, tmp_path):
    # save:1: the first trial's checkpoint at its third step (its rung's stop), torn before its rename
    _cut_and_resume(task, tmp_path / "out", reference_2, "save:1", grid=GRID_2)
    assert json.loads((reference_2 / "tune.json").read_text())["rungs"][0]["epochs"] == 0.6667


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["step:3", "step:5", "save:2", "epoch:1", "step:14"])
def test_a_cut_at_every_phase_of_a_run_with_a_rung_inside_an_epoch_resumes_to_the_same_choice(task, reference_2,
                                                                                                 tmp_path, phase):
    _cut_and_resume(task, tmp_path / "out", reference_2, phase, grid=GRID_2)


@pytest.mark.slow
@pytest.mark.parametrize("phase", ["features:1", "step:1", "step:4", "epoch:1", "epoch:5", "save:3", "step:22",
                                   "epoch:6"])  # the run: 4 trials x 1 epoch, then 1 x 2 more, 4 steps an epoch
def test_a_cut_at_every_phase_resumes_to_the_same_choice(task, reference, tmp_path, phase):
    _cut_and_resume(task, tmp_path / "out", reference, phase)


@pytest.mark.slow
@pytest.mark.parametrize("after", [0.3, 1.0, 1.8, 2.6, 3.4])
def test_a_cut_at_any_moment_resumes_to_the_same_choice(task, reference, tmp_path, after):
    """SIGKILL after ``after`` seconds, wherever the run is (start-up, decoding, a trial, the journal, the
    outputs), as many times as it takes, then a resume that finishes."""
    out = tmp_path / "out"
    args = [sys.executable, "-m", "edgetrain", "tune", str(task["model"]), "--data", str(task["train"]), "--val",
            str(task["val"]), *GRID, "-o", str(out)]
    for attempt in range(3):
        proc = subprocess.Popen(args + (["--resume"] if attempt else []), stdout=subprocess.DEVNULL,
                                stderr=subprocess.PIPE, text=True)
        time.sleep(after)
        proc.send_signal(signal.SIGKILL)
        proc.communicate(timeout=120)
    res = _tune(task, out, "--resume")
    assert res.code == 0, res.err[-2000:]
    _same_as_reference(out, reference)
