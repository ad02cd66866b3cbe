"""`edgetrain finetune` guards, end to end in child processes: one run per OUTDIR (the second names the
first's PID), and a diverging run stops with exit 1 and writes no model, on both training paths."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clitools import assert_user_error, run_edgetrain

BASE = "edgetrain.nets:pretrained_digits"


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory, monkeypatch):
    """The head-only path's per-user export cache, kept out of the user's home."""
    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "edgetrain-cache"))


@pytest.mark.parametrize("layers", ["head", "all"])
@pytest.mark.parametrize("second", [[], ["--resume"]])
def test_a_second_run_into_a_busy_outdir_refuses_with_the_first_ones_pid(layers, second, digits_npz, tmp_path):
    out = tmp_path / "run"
    args = ["finetune", BASE, "--data", str(digits_npz), "-o", str(out), "--train-layers", layers,
            "--epochs", "400", "--batch-size", "4", "--threads", "1"]
    env = {k: v for k, v in os.environ.items() if k != "EDGETRAIN_DEBUG"}
    first = subprocess.Popen([sys.executable, "-m", "edgetrain", *args], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:
        t0 = time.monotonic()
        while not (out / "checkpoint.npz").exists():  # training is under way (the lock is held from the start)
            assert first.poll() is None, first.communicate()
            assert time.monotonic() - t0 < 300
            time.sleep(0.05)
        res = run_edgetrain(*args, *second, cwd=tmp_path)
        assert_user_error(res, 2, "OUTDIR is in use by another finetune run", f"PID {first.pid}")
        assert first.poll() is None, "the second run must not disturb the first"
    finally:
        first.kill()
        first.communicate()


@pytest.mark.parametrize("layers", ["head", "last:2", "all"])
def test_a_diverging_run_fails_and_writes_no_model(layers, digits_npz, tmp_path):
    out = tmp_path / "run"
    res = run_edgetrain("finetune", BASE, "--data", digits_npz, "-o", out, "--train-layers", layers, "--epochs", "3",
                        "--optimizer", "sgd", "--lr", "1e38", "--threads", "1", cwd=tmp_path)
    assert_user_error(res, 1, "training diverged", "no model was written")
    assert not list(Path(tmp_path).glob("run/model-*")), "a diverged run must not leave a final model"


@pytest.mark.parametrize("layers", ["head", "all"])
def test_notes_known_before_training_are_printed_before_it(layers, digits_npz, tmp_path):
    res = run_edgetrain("finetune", BASE, "--data", digits_npz, "-o", tmp_path / "run", "--train-layers", layers,
                        "--epochs", "1", "--threads", "1", cwd=tmp_path)
    assert res.code == 0, res.err
    lines = res.err.splitlines()
    note = next(i for i, ln in enumerate(lines) if "output layer replaced" in ln)
    first_epoch = next(i for i, ln in enumerate(lines) if ln.startswith("epoch 1"))
    assert note < first_epoch, res.err


@pytest.mark.parametrize("layers", ["head", "last:2"])
def test_a_model_at_chance_on_held_out_data_exits_3_unless_allowed(layers, tmp_path):
    """Labels that carry nothing (shuffled): whatever trains, held-out top-1 is at chance. A real (not random)
    base: the check is not waived. Exit 3 with the model kept; --allow-chance accepts it."""
    import json

    import numpy as np

    from edgetrain.data import load_data
    from edgetrain.preprocess import Preprocess

    x, _ = load_data("builtin:digits", Preprocess((1, 8, 8), mean=(0.0,), std=(1.0,))).arrays()
    labels = np.random.RandomState(0).randint(0, 10, size=len(x))
    np.savez(tmp_path / "noise.npz", data=x[:, 0], label=labels)
    args = ["finetune", "edgetrain.nets:pretrained_digits", "--data", tmp_path / "noise.npz", "--epochs", "2",
            "--train-layers", layers, "--threads", "1"]
    res = run_edgetrain(*args, "-o", tmp_path / "a", "--json", tmp_path / "a.json", cwd=tmp_path)
    assert_user_error(res, 3, "is at chance", "--allow-chance")
    record = json.loads((tmp_path / "a.json").read_text())
    assert record["passed"] is False and record["chance"]["at_chance"] and (tmp_path / "a" / "model-symbol.json").is_file()
    ok = run_edgetrain(*args, "--allow-chance", "-o", tmp_path / "b", cwd=tmp_path)
    assert ok.code == 0, ok.err[-2000:]


@pytest.mark.parametrize("layers", ["head", "last:2"])
def test_a_gluon_model_keeps_a_budget_and_refuses_one_too_small(layers, digits_npz, tmp_path, monkeypatch):
    """For a Gluon model the memory plan holds too: with the export cached, a run within --memory-budget
    peaks under it (measured RSS), and a budget too small for even micro-batch 1 is refused up front,
    leaving no OUTDIR behind."""
    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", str(tmp_path / "cache"))
    args = ("finetune", BASE, "--data", digits_npz, "--epochs", "1", "--train-layers", layers, "--threads", "1")
    warm = run_edgetrain(*args, "-o", tmp_path / "warm", cwd=tmp_path)
    assert warm.code == 0, warm.err
    ok = run_edgetrain(*args, "-o", tmp_path / "ok", "--memory-budget", "150MB", "--json", "-", cwd=tmp_path)
    assert ok.code == 0, ok.err
    r = ok.json()
    assert r["budget_mb"] == 150 and r["plan"]["budget_mb"] == 150 and 0 < r["peak_rss_mb"] <= 150, r
    small = run_edgetrain(*args, "-o", tmp_path / "small", "--memory-budget", "30MB", cwd=tmp_path)
    assert_user_error(small, 2, "memory budget 30 MB is too small")
    assert not (tmp_path / "small").exists()


