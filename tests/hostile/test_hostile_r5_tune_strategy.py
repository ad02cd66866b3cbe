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


# --objective's weight: finite was not enough. latency:1e308 made every score about -1.8e306, the accuracy lost
# in its rounding; two trials of the same graph (the same latency) tied and the less accurate one was chosen,
# exit 0. The weight is now at most a million points per ms or mJ.
@pytest.mark.parametrize("objective", ["latency:1e308", "energy:1e7", "latency:1e300"])
def test_an_objective_weight_beyond_a_million_is_refused(objective, tmp_path):
    res = run_edgetrain("tune", ONNX, "--data", "builtin:digits", "--grid", "lr=0.01,0.003", "--epochs", "1",
                        "--objective", objective, "-o", tmp_path / "out")
    assert_user_error(res, 2, "--objective", "at most 1e+06")
    assert not (tmp_path / "out").exists()


def test_a_weight_of_a_million_is_taken():
    from edgetrain.options import TuneOptions

    assert TuneOptions.fields["objective"].read("latency:1e6") == "latency:1e+06"
