"""FinetuneJob's stop_at_step (a tune's rung of a fraction of an epoch): the run stops inside an epoch, checkpointed
there with the held-out accuracy of that step, and a later run with more epochs resumes at that step and ends with
the weights of a run never stopped."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import edgetrain
from edgetrain.options import FinetuneOptions
from edgetrain.training import FinetuneJob, prepare_outdir

BASE = Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx"


def _job(data: Path, out: Path, epochs: int, stop_at: int | None = None, layers: str = "bias"):
    has = prepare_outdir(out, resume=True)
    opts = FinetuneOptions.unchecked(data=str(data), val=str(data), out=str(out), epochs=epochs, train_layers=layers,
                                     lr=0.01, seed=2, threads=1, resume=has, allow_chance=True)
    job = FinetuneJob(str(BASE), opts, val_split=None, budget_mb=None, threads=1, profile=None,
                      progress=lambda info: None, resume=has, stop_at_step=stop_at)
    return job, job.run(has)


@pytest.mark.parametrize("layers", ["head", "bias"])
def test_a_run_stopped_inside_an_epoch_resumes_to_the_weights_of_one_never_stopped(digits_npz, tmp_path, layers):
    steps = -(-300 // 32)   # digits_npz: 300 samples, batch 32
    _, whole = _job(digits_npz, tmp_path / "whole", 2, layers=layers)
    job, part = _job(digits_npz, tmp_path / "cut", 1, stop_at=3, layers=layers)  # 3 steps into the first epoch
    assert part.partial_epoch is not None
    assert (part.partial_epoch["epoch"], part.partial_epoch["step"], part.partial_epoch["steps"]) == (0, 3, steps)
    assert part.epochs == [] and part.final_accuracy == part.partial_epoch["val_accuracy"]
    assert job.global_step == 3
    # the same stop asked again (a cut after the checkpoint, before the tuner's record): nothing more trained
    job, again = _job(digits_npz, tmp_path / "cut", 1, stop_at=3, layers=layers)
    assert job.global_step == 3 and again.partial_epoch["val_accuracy"] == part.partial_epoch["val_accuracy"]
    job, rest = _job(digits_npz, tmp_path / "cut", 2, layers=layers)
    assert rest.resumed_from == {"epoch": 0, "step": 3} and rest.partial_epoch is None
    assert [e["val_accuracy"] for e in rest.epochs] == [e["val_accuracy"] for e in whole.epochs]
    from tunetools import model_weights

    mine, ref = model_weights(Path(rest.model)), model_weights(Path(whole.model))
    assert mine.keys() == ref.keys() and all(np.array_equal(mine[k], ref[k]) for k in mine)


def test_before_checkpoint_is_called_before_each_checkpoint_is_written(digits_npz, tmp_path):
    """The hook a tune waits for its journal in: called before every checkpoint write (the state on the disk at
    each call is the one before that write)."""
    from edgetrain.training import checkpoint

    out = tmp_path / "run"
    seen: list = []
    opts = FinetuneOptions.unchecked(data=str(digits_npz), val=str(digits_npz), out=str(out), epochs=2,
                                     train_layers="head", lr=0.01, seed=2, threads=1, allow_chance=True)
    path = out / checkpoint.FILENAME
    job = FinetuneJob(str(BASE), opts, val_split=None, budget_mb=None, threads=1, profile=None,
                      progress=lambda info: None, stop_at_step=12,
                      before_checkpoint=lambda: seen.append(checkpoint.peek(path).get("global_step")
                                                            if path.exists() else None))
    job.run(False)
    steps = -(-300 // 32)
    assert seen == [None, steps]   # the first epoch's end, then the stop 3 steps into the second
