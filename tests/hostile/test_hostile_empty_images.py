"""An .npz whose images have no pixels (N,0,W or N,H,0; issue 26, closing campaign): predict answered every
sample (exit 0) and finetune trained on them to exit 3 "at chance". Now one `Error:` line (exit 2) before
any work, from every command that reads DATA."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import edgetrain
from clitools import assert_user_error, run_edgetrain

ONNX = str(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx")
SHAPES = {"no-rows": (8, 0, 8), "no-columns": (8, 8, 0), "nhwc-no-rows": (8, 0, 8, 1), "nchw-no-columns": (8, 1, 8, 0)}


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("command", ["predict", "finetune"])
def test_images_without_pixels_are_refused(tmp_path, shape, command):
    data = tmp_path / "empty-images.npz"
    np.savez(data, data=np.zeros(SHAPES[shape], "float32"), label=np.arange(8) % 2)
    if command == "predict":
        res = run_edgetrain("predict", ONNX, data, timeout=120)
    else:
        res = run_edgetrain("finetune", ONNX, "--data", data, "--epochs", "1", "--train-layers", "bias", "-o",
                            tmp_path / "out", timeout=120)
    assert_user_error(res, 2)
    assert not (tmp_path / "out" / "model.onnx").exists()
