"""A file name over NAME_MAX (255 bytes) or a path over PATH_MAX, given to any option that names a file
(issue 26, closing campaign): pathlib's exists()/stat() raise ENAMETOOLONG wherever the path is first looked
at, and every command ended in a traceback, exit 1 (predict -o, --json, profile --report, export/quantize -o,
finetune -o, --power-log). Now one `Error:` line, exit 2; the API raises UsageError naming the argument."""
from __future__ import annotations

from pathlib import Path

import pytest

import edgetrain
from clitools import assert_user_error, run_edgetrain
from edgetrain.errors import UsageError

ONNX = str(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx")
LONG = "n" * 300

CASES = {
    "predict-o": lambda t: ["predict", ONNX, "builtin:digits", "-o", t / f"{LONG}.csv"],
    "predict-json": lambda t: ["predict", ONNX, "builtin:digits", "--json", t / f"{LONG}.json"],
    "predict-data": lambda t: ["predict", ONNX, t / LONG],
    "profile-report": lambda t: ["profile", ONNX, "--runs", "2", "--warmup", "0", "--report", t / f"{LONG}.md"],
    "quantize-o": lambda t: ["quantize", ONNX, "--calib", "builtin:digits", "-o", t / f"{LONG}.onnx"],
    "finetune-o-inner": lambda t: ["finetune", ONNX, "--data", "builtin:digits", "--train-layers", "bias",
                                   "--epochs", "1", "-o", t / LONG / "run"],
    "finetune-power-log": lambda t: ["finetune", ONNX, "--data", "builtin:digits", "--train-layers", "bias",
                                     "--epochs", "1", "-o", t / "run", "--power-log", t / f"{LONG}.csv"],
    "finetune-path-over-path-max": lambda t: ["finetune", ONNX, "--data", "builtin:digits", "--train-layers", "bias",
                                              "--epochs", "1", "-o", t.joinpath(*["d" * 200] * 21)],
}


@pytest.mark.parametrize("case", list(CASES))
def test_long_name_is_one_line(tmp_path, case):
    res = run_edgetrain(*CASES[case](tmp_path), timeout=180)
    assert_user_error(res, 2, "too long")
    assert not (tmp_path / "run" / "model.onnx").exists()


@pytest.mark.parametrize("call", ["finetune", "predict"])
def test_api_long_name_is_usage_error(tmp_path, call):
    with pytest.raises(UsageError, match=r"(too|bytes) long"):
        if call == "finetune":
            edgetrain.finetune(ONNX, "builtin:digits", str(tmp_path / LONG), epochs=1, progress=None)
        else:
            edgetrain.predict(ONNX, "builtin:digits", output=tmp_path / f"{LONG}.csv", progress=None)
