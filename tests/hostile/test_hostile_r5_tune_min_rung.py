"""Round 5 (issue 37.8): a first rung of a fraction of an epoch whose steps do not divide evenly never ended.
``tune --epochs 1 --min-rung 0.5 --eta 2`` on builtin:digits (45 steps an epoch) stops the first rung at step 22,
0.4889 epochs; the rung's target compared in epochs (0.4889 < 0.5) ran the same stop again, forever (the progress
bar at 149/3 after 25 s, a CPU spinning for as long as one let it). A rung is now reached in the steps its stop
is made of; each of these ends in seconds, with the first rung's figure in the trials table."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest

import edgetrain
from tests.clitools import run_edgetrain

ONNX = str(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx")


@pytest.mark.parametrize("epochs, eta, min_rung, first", [
    ("1", "2", "0.5", 0.4889),    # 22.5 steps of 45: stops at 22
    ("2", "2", "0.5", 0.4889),    # rungs 0.5, 1, 2
    ("1", "3", "0.3", 0.3333),    # 15 of 45: exact
    ("1", "4", "0.25", 0.2444),   # 11.25 steps: stops at 11
])
def test_a_fractional_first_rung_ends(epochs, eta, min_rung, first, tmp_path):
    out = tmp_path / "out"
    res = run_edgetrain("tune", ONNX, "--data", "builtin:digits", "--grid", "lr=0.01,0.003", "--epochs", epochs,
                        "--eta", eta, "--min-rung", min_rung, "--threads", "1", "-o", out, timeout=240)
    assert res.code == 0, res.err[-2000:]
    rows = list(csv.DictReader((out / "trials.csv").open()))
    assert [r["status"] for r in rows].count("chosen") == 1
    assert all(r["accuracy_by_rung"].startswith(f"{first:g}:") for r in rows), rows
    chosen = next(r for r in rows if r["status"] == "chosen")
    assert float(chosen["epochs_run"]) == float(epochs)
