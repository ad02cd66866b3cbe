"""Round 5 (issue 37.8): BatchNorm trains in training mode with all, last:N and lite, on the batch statistics.
With --batch-size 1 and all, the shipped digits CNN ended at 0.32 held-out top-1 (0.94 at 32) with exit 0 and no
word: the note about noisy statistics came only when the memory budget cut the micro-batch. It now comes for a
small --batch-size too, naming it; head and bias (BatchNorm frozen) and a batch of 8 get no such note."""
from __future__ import annotations

from pathlib import Path

import pytest

import edgetrain
from tests.clitools import run_edgetrain

ONNX = str(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx")
NOTE = "BatchNorm in the trained layers trains on batches of"


@pytest.mark.parametrize("layers, batch, said", [
    ("all", "2", True), ("last:2", "4", True), ("lite", "2", True),
    ("all", "8", False), ("bias", "2", False), ("head", "1", False),
])
def test_a_small_batch_with_batchnorm_training_is_said(layers, batch, said, tmp_path):
    res = run_edgetrain("finetune", ONNX, "--data", "builtin:digits", "--epochs", "1", "--threads", "1",
                        "--train-layers", layers, "--batch-size", batch, "-o", tmp_path / "out")
    assert res.code == 0, res.err[-2000:]
    notes = [ln for ln in res.err.splitlines() if NOTE in ln]
    if said:
        assert len(notes) == 1 and f"batches of {batch} (--batch-size)" in notes[0], res.err[-2000:]
    else:
        assert notes == [], notes
