"""Round 5 (issue 37.8): tune's --eta and --min-rung shape successive halving only. With --strategy grid or
random they were accepted and ignored (exit 0: every point trained in full, as if they were not given). Now
either is refused in one line before any work, exit 2, nothing written; with halving (the default) they run."""
from __future__ import annotations

from pathlib import Path

import pytest

import edgetrain
from tests.clitools import assert_user_error, run_edgetrain

ONNX = str(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx")


@pytest.mark.parametrize("strategy", ["grid", "random"])
@pytest.mark.parametrize("option, value", [("--min-rung", "0.5"), ("--eta", "2")])
def test_a_halving_option_with_another_strategy_is_refused(strategy, option, value, tmp_path):
    out = tmp_path / "out"
    res = run_edgetrain("tune", ONNX, "--data", "builtin:digits", "--grid", "lr=0.01,0.003", "--epochs", "1",
                        "--strategy", strategy, option, value, "-o", out)
    assert_user_error(res, 2, option, "--strategy halving")
    assert not out.exists()


def test_the_api_refuses_it_too(tmp_path):
    with pytest.raises(edgetrain.UsageError, match="--min-rung has no effect without --strategy halving"):
        edgetrain.tune(ONNX, "builtin:digits", tmp_path / "out", grid={"lr": [0.01]}, strategy="grid", min_rung=0.5)
    assert not (tmp_path / "out").exists()


def test_with_halving_they_run(tmp_path):
    res = run_edgetrain("tune", ONNX, "--data", "builtin:digits", "--grid", "lr=0.01,0.003", "--epochs", "2",
                        "--threads", "1", "--min-rung", "0.5", "--eta", "2", "-o", tmp_path / "out")
    assert res.code == 0, res.err[-2000:]
    # the default values are no request: with grid they are what grid means anyway
    res = run_edgetrain("tune", ONNX, "--data", "builtin:digits", "--grid", "lr=0.01", "--epochs", "1",
                        "--threads", "1", "--strategy", "grid", "--min-rung", "1", "--eta", "3", "-o",
                        tmp_path / "out2")
    assert res.code == 0, res.err[-2000:]
