"""A build shared by the jobs of one process (training/buildstore.py, a tune's trials): a job that takes another's
build trains as it would have alone, bit for bit, and a build is never taken by a job that trains another part,
at another batch size, on other data or from a checkpoint planned otherwise."""
from __future__ import annotations

import gc
import weakref
from pathlib import Path

import numpy as np
import pytest

import edgetrain
from edgetrain.options import FinetuneOptions
from edgetrain.training import BuildStore, FeatureStore, FinetuneJob, prepare_outdir
from edgetrain.training import checkpoint as ckpt
from tunetools import digits_task, model_weights, trials_of

BASE = Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx"


def _job(data: Path, out: Path, *, builds: BuildStore | None, store: FeatureStore | None = None, layers="lite",
         lr=0.01, epochs=2, batch_size=32, optimizer="adam"):
    has = prepare_outdir(out, resume=True)
    opts = FinetuneOptions.unchecked(data=str(data), val=str(data), out=str(out), epochs=epochs, train_layers=layers,
                                     lr=lr, batch_size=batch_size, optimizer=optimizer, seed=2, threads=1, resume=has,
                                     allow_chance=True)
    job = FinetuneJob(str(BASE), opts, val_split=None, budget_mb=None, threads=1, profile=None,
                      progress=lambda info: None, resume=has, build_store=builds, feature_store=store)
    return job, job.run(has)


def _same_weights(a: str, b: str) -> None:
    mine, ref = model_weights(Path(a)), model_weights(Path(b))
    assert mine.keys() == ref.keys()
    differ = [k for k in mine if not np.array_equal(mine[k], ref[k])]
    assert not differ, differ


@pytest.mark.parametrize("layers", ["head", "bias", "lite"])
def test_a_job_that_takes_a_build_trains_as_it_would_alone(digits_npz, tmp_path, layers):
    builds, store = BuildStore(), FeatureStore()
    # the first job makes the build (and trains it: its arrays are no longer the loaded ones); the second takes it
    first, _ = _job(digits_npz, tmp_path / "first", builds=builds, store=store, layers=layers, lr=0.03)
    assert first.taken is None and builds.made == 1
    taken, got = _job(digits_npz, tmp_path / "taken", builds=builds, store=store, layers=layers, optimizer="sgd")
    assert taken.taken is not None and taken.engine is first.engine and builds.reused == 1
    alone, ref = _job(digits_npz, tmp_path / "alone", builds=None, layers=layers, optimizer="sgd")
    assert alone.taken is None and alone.engine is not first.engine
    assert [e["val_accuracy"] for e in got.epochs] == [e["val_accuracy"] for e in ref.epochs]
    assert [e["loss"] for e in got.epochs] == [e["loss"] for e in ref.epochs]
    # (head: the taken job's features came from the store, the lone job's from its own pass)
    assert [n for n in got.notes if "feature" not in n] == [n for n in ref.notes if "feature" not in n]
    assert (got.plan["micro_batch"], got.plan["ort_step"]) == (ref.plan["micro_batch"], ref.plan["ort_step"])
    _same_weights(got.model, ref.model)
    store.close()
    builds.release()


def test_a_build_is_not_taken_by_another_part_batch_size_or_data(digits_npz, tmp_path):
    builds = BuildStore()
    first, _ = _job(digits_npz, tmp_path / "lite", builds=builds, epochs=1)
    kept = builds.key
    other, _ = _job(digits_npz, tmp_path / "bias", builds=builds, layers="bias", epochs=1)
    assert other.taken is None and other.engine is not first.engine and builds.key != kept
    smaller, _ = _job(digits_npz, tmp_path / "b16", builds=builds, layers="bias", batch_size=16, epochs=1)
    assert smaller.taken is None and smaller.engine is not other.engine
    assert (smaller.plan.micro_batch, other.plan.micro_batch) == (16, 32)
    # other data: three classes, so another output layer (the build's has ten)
    x, y = np.load(digits_npz)["data"], np.load(digits_npz)["label"]
    three = tmp_path / "three.npz"
    np.savez(three, data=x[y < 3], label=y[y < 3])
    has = prepare_outdir(tmp_path / "three", resume=True)
    opts = FinetuneOptions.unchecked(data=str(three), val=str(three), out=str(tmp_path / "three"), epochs=1,
                                     train_layers="bias", batch_size=16, lr=0.01, seed=2, threads=1,
                                     allow_chance=True)
    job = FinetuneJob(str(BASE), opts, val_split=None, budget_mb=None, threads=1, profile=None,
                      progress=lambda info: None, build_store=builds)
    res = job.run(has)
    assert job.taken is None and job.engine is not smaller.engine and len(res.classes) == 3
    assert (builds.made, builds.reused) == (4, 0)
    # and what each let go is gone, though the tuner froze it out of the collector's reach
    builds.release()


def test_a_resume_planned_otherwise_builds_its_own(digits_npz, tmp_path):
    """A checkpoint whose plan differs from the build's (another micro-batch: a budget measured in another
    process) is resumed on a build of its own, at the checkpoint's plan."""
    builds = BuildStore()
    _job(digits_npz, tmp_path / "maker", builds=builds, epochs=1)
    same, other = tmp_path / "same", tmp_path / "other"
    for out in (same, other):
        _job(digits_npz, out, builds=None, epochs=1)
    job, _ = _job(digits_npz, same, builds=builds, epochs=2)   # its checkpoint's plan is the build's
    assert job.taken is not None
    meta, arrays = ckpt.load(other / ckpt.FILENAME)
    assert meta["plan"]["micro_batch"] == 32
    meta["plan"]["micro_batch"] = 16
    ckpt.save(other / ckpt.FILENAME, {k: v for k, v in meta.items() if k not in ("format", "sha256")}, arrays)
    job, res = _job(digits_npz, other, builds=builds, epochs=2)
    assert job.taken is None and res.resumed_from == {"epoch": 1, "step": 0} and res.plan["micro_batch"] == 16
    builds.release()


def test_a_released_build_frees_its_arrays_under_gc_freeze(digits_npz, tmp_path):
    builds = BuildStore()
    job, _ = _job(digits_npz, tmp_path / "one", builds=builds, epochs=1)
    engine = job.engine
    arrays = [weakref.ref(a) for a in engine.trainable_arrays().values()]
    session = weakref.ref(engine.step_graph.session)
    del job, engine
    gc.collect()
    gc.freeze()   # as the tuner does before each trial: only reference counting frees what is released
    try:
        builds.release()
        assert all(r() is None for r in arrays) and session() is None
    finally:
        gc.unfreeze()


@pytest.fixture(scope="module")
def task(tmp_path_factory) -> dict:
    return digits_task(tmp_path_factory.mktemp("tune-builds"), train=160, val=80)


def test_a_tune_trial_that_took_a_build_equals_the_same_finetune_run_alone(task, tmp_path):
    out = tmp_path / "tuned"
    res = edgetrain.tune(task["model"], task["train"], out, val=task["val"], grid={"lr": [0.003, 0.03],
                         "train_layers": ["head", "lite"]}, epochs=2, strategy="grid", threads=1, progress=None)
    assert res.features["builds"] == {"made": 2, "reused": 2}   # a rung's trials of one part run together
    for trial in trials_of(out):
        if trial["trial"] not in (3, 4):   # lr 0.03: the second of its part, on the first one's build
            continue
        alone = edgetrain.finetune(task["model"], out / "data" / "train.npz", tmp_path / f"alone{trial['trial']}",
                                   val=out / "data" / "val.npz", epochs=2, lr=trial["lr"],
                                   train_layers=trial["train_layers"], seed=0, threads=1, allow_chance=True,
                                   progress=None)
        assert alone.final_accuracy == trial["val_accuracy"]
        _same_weights(str(out / "trials" / f"{trial['trial']:03d}" / "model.onnx"), alone.model)
