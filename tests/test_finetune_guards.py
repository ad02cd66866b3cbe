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


NO_MXNET = """
import json, sys
import edgetrain
r = edgetrain.finetune(sys.argv[1], data=sys.argv[2], out=sys.argv[3], train_layers=sys.argv[4], epochs=2, threads=1)
print(json.dumps({"mxnet_imported": "mxnet" in sys.modules, "notes": r.notes}))
"""


@pytest.mark.parametrize("layers", ["head", "last:2"])
def test_runs_after_the_first_import_no_mxnet_and_a_damaged_cache_is_exported_again(layers, digits_npz, tmp_path,
                                                                                   monkeypatch):
    """head and last:N train in NumPy: mxnet only in the first run's child (the export), never in the
    process itself, and not even in a child once the export is cached; the cached run trains the same."""
    import json

    env = {**os.environ, "EDGETRAIN_CACHE_DIR": str(tmp_path / "cache")}

    def run(name):
        proc = subprocess.run([sys.executable, "-c", NO_MXNET, BASE, str(digits_npz), str(tmp_path / name), layers],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        assert got["mxnet_imported"] is False, got["notes"]
        return got

    first, second = run("a"), run("b")
    assert any("mxnet only in that step" in n for n in first["notes"])
    assert any("no mxnet in this run" in n for n in second["notes"])
    assert not any("mxnet only in that step" in n for n in second["notes"])
    import mxnet as mx

    a = mx.nd.load(str(tmp_path / "a" / "model-0000.params"))
    b = mx.nd.load(str(tmp_path / "b" / "model-0000.params"))
    assert a.keys() == b.keys() and all((a[k] == b[k]).asnumpy().all() for k in a), "cached run trains the same"
    for f in (tmp_path / "cache").rglob("template-0000.params"):
        f.write_bytes(b"damaged")
    third, fourth = run("c"), run("d")
    assert any("mxnet only in that step" in n for n in third["notes"]), "a damaged entry is never trusted"
    assert any("no mxnet in this run" in n for n in fourth["notes"]), "and it is replaced"


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


def test_mxnet_tail_runs_after_the_first_take_the_model_from_the_cache_and_train_the_same(digits_npz, tmp_path,
                                                                                           monkeypatch, mxnet_tail_prefix):
    """A last:N whose trained part trains in MXNet loads, checks and exports a base model once: later runs
    build the split from the cached template (graph + weights) and reuse the cached frozen part; the PREFIX
    is bit for bit what a run without any cache writes; a damaged template is never trusted, and replaced."""
    import mxnet as mx

    def run(name, cache):
        monkeypatch.setenv("EDGETRAIN_CACHE_DIR", cache)
        res = run_edgetrain("finetune", mxnet_tail_prefix, "--data", digits_npz, "-o", tmp_path / name, "--epochs", "2",
                            "--train-layers", "last:2", "--threads", "1", "--json", "-", "--allow-chance",  # random weights
                            cwd=tmp_path)
        assert res.code == 0, res.err
        return res.json()

    reused = "base model's graph and weights reused from the cache"
    cache = str(tmp_path / "cache")
    first, second, plain = run("a", cache), run("b", cache), run("c", "")
    assert all(any(n.startswith("the trained part trains in MXNet: ") and "LayerNorm" in n for n in r["notes"])
               for r in (first, second, plain)), first["notes"]
    assert not any("mxnet only in that step" in n for n in second["notes"]), "the refusal is cached: no second child"
    assert not any(reused in n for n in first["notes"]) and not any(reused in n for n in plain["notes"])
    assert any(reused in n for n in second["notes"])
    assert any("frozen part's ONNX export reused from the cache" in n for n in second["notes"])
    params = {name: mx.nd.load(str(tmp_path / name / "model-0000.params")) for name in "abc"}
    for name in "ab":
        assert params[name].keys() == params["c"].keys()
        assert all((params[name][k] == params["c"][k]).asnumpy().all() for k in params["c"]), name
    assert (tmp_path / "b" / "model-symbol.json").read_text() == (tmp_path / "c" / "model-symbol.json").read_text()
    for f in (tmp_path / "cache" / "finetune-template").rglob("template-0000.params"):
        f.write_bytes(b"damaged")
    third, fourth = run("d", cache), run("e", cache)
    assert not any(reused in n for n in third["notes"]), "a damaged entry is never trusted"
    assert any(reused in n for n in fourth["notes"]), "and it is replaced"


@pytest.mark.parametrize("layers", ["head", "last:2"])
def test_numpy_paths_keep_a_budget_and_refuse_one_too_small(layers, digits_npz, tmp_path, monkeypatch):
    """On the NumPy paths the memory plan holds too: with the export cached, a run within --memory-budget
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
    assert not any("trains in MXNet" in n for n in r["notes"])
    small = run_edgetrain(*args, "-o", tmp_path / "small", "--memory-budget", "30MB", cwd=tmp_path)
    assert_user_error(small, 2, "memory budget 30 MB is too small")
    assert not (tmp_path / "small").exists()


def test_last_n_reaching_the_input_trains_everything_in_mxnet_and_caches_that(digits_npz, tmp_path, monkeypatch):
    """last:N with N = the model's depth freezes nothing: the child's record says so, it is cached (no frozen
    part in it), and the run trains in MXNet like --train-layers all, the same on the cached second run."""
    import json

    import mxnet as mx

    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", str(tmp_path / "cache"))

    def run(name):
        res = run_edgetrain("finetune", BASE, "--data", digits_npz, "-o", tmp_path / name, "--epochs", "1",
                            "--train-layers", "last:4", "--threads", "1", "--json", "-", cwd=tmp_path)
        assert res.code == 0, res.err
        return res.json()

    first, second = run("a"), run("b")
    for r in (first, second):
        assert "the trained part trains in MXNet: nothing is frozen (the whole network trains)" in r["notes"]
        assert r["feature_seconds"] == 0 and r["trained_parameters"] > 0.95 * (r["trained_parameters"] + r["frozen_parameters"])
    records = [json.loads(p.read_text()) for p in (tmp_path / "cache" / "finetune-prep").glob("*/prep.json")]
    assert [(r["tail"], r.get("frozen_sha256")) for r in records] == [(False, None)]
    assert not list((tmp_path / "cache" / "finetune-prep").glob("*/frozen.onnx"))
    a, b = (mx.nd.load(str(tmp_path / n / "model-0000.params")) for n in "ab")
    assert a.keys() == b.keys() and all((a[k] == b[k]).asnumpy().all() for k in a)
