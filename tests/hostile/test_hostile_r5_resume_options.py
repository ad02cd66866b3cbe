"""Round 5 (issue 37.8): a resume with another --momentum or --weight-decay than the checkpoint's is refused
(exit 2); the refusal said "now: None" for an option left at its default, which reads as if the run had none.
It now says "the default". A resume with the same value written another way (1e-2 for 0.01) continues, and
one killed with SIGKILL after its first checkpoint, resumed with the same options (sgd with momentum and weight
decay, BatchNorm in training mode), writes the same model.onnx, byte for byte, as a run never stopped."""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import edgetrain
from tests.clitools import assert_user_error, run_edgetrain

ONNX = str(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx")
FT = ["finetune", ONNX, "--data", "builtin:digits", "--threads", "1", "--optimizer", "sgd", "--epochs", "2"]


@pytest.mark.parametrize("first, then, said", [
    (["--momentum", "0.5"], [], "checkpoint: 0.5, now: the default"),
    ([], ["--weight-decay", "0.01"], "checkpoint: the default, now: 0.01"),
])
def test_a_resume_with_another_value_says_the_default(first, then, said, tmp_path):
    out = tmp_path / "out"
    assert run_edgetrain(*FT, *first, "-o", out).code == 0
    before = (out / "model.onnx").read_bytes()
    res = run_edgetrain(*FT, *then, "-o", out, "--resume")
    assert_user_error(res, 2, said)
    assert (out / "model.onnx").read_bytes() == before


def test_the_same_value_written_another_way_resumes(tmp_path):
    out = tmp_path / "out"
    assert run_edgetrain(*FT, "--weight-decay", "0.01", "-o", out).code == 0
    res = run_edgetrain(*FT, "--weight-decay", "1e-2", "-o", out, "--resume")
    assert res.code == 0, res.err[-2000:]


@pytest.mark.slow
@pytest.mark.parametrize("layers", ["all", "last:2", "lite"])
def test_kill9_then_resume_writes_the_model_a_run_never_stopped_writes(layers, tmp_path):
    args = [*FT, "--epochs", "3", "--batch-size", "8", "--momentum", "0.7", "--weight-decay", "0.001",
            "--train-layers", layers]
    ref, out = tmp_path / "ref", tmp_path / "out"
    assert run_edgetrain(*args, "-o", ref).code == 0
    proc = subprocess.Popen([sys.executable, "-m", "edgetrain", *args, "-o", str(out)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while not (out / "checkpoint.npz").exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    res = run_edgetrain(*args, "-o", out, "--resume")
    assert res.code == 0, res.err[-2000:]
    assert (out / "model.onnx").read_bytes() == (ref / "model.onnx").read_bytes()
