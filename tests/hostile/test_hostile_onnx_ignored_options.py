"""finetune MODEL.onnx with --input-shape or --params (issue 26, closing campaign): both were silently
ignored (`--input-shape 1,3,16,16` on a one-channel 16x16 file trained and exited 0 as if not given). They
do not apply to an ONNX file (its graph fixes the shape, its weights are in it): one `Error:` line, exit 2,
before any work, from the CLI and the API."""
from __future__ import annotations

from pathlib import Path

import pytest

import edgetrain
from clitools import assert_user_error, run_edgetrain
from edgetrain.errors import UsageError

ONNX = str(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx")
CASES = {"input-shape-other": ("--input-shape", "1,3,16,16"), "input-shape-same": ("--input-shape", "1,1,16,16"),
         "params": ("--params", ONNX)}


@pytest.mark.parametrize("case", list(CASES))
def test_cli_refuses_options_an_onnx_file_fixes(tmp_path, case):
    flag, value = CASES[case]
    res = run_edgetrain("finetune", ONNX, "--data", "builtin:digits", "--epochs", "1", "--train-layers", "bias",
                        "-o", tmp_path / "out", flag, value, timeout=120)
    assert_user_error(res, 2, flag)
    assert not (tmp_path / "out").exists()


def test_api_refuses_input_shape_for_onnx(tmp_path):
    with pytest.raises(UsageError, match="--input-shape"):
        edgetrain.finetune(ONNX, "builtin:digits", tmp_path / "out", epochs=1, train_layers="bias",
                           input_shape=(1, 3, 16, 16), progress=None)
