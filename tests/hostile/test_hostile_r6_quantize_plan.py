"""quantize's memory plan (ROUND5.md L8, M3): its refusal says what its activations are of, and the plan models
what the per-node SQNR pass holds."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from clitools import assert_user_error, run_edgetrain

DIGITS = Path(__file__).resolve().parents[2] / "edgetrain" / "_builtin" / "digits5.onnx"


def _fixed_batch(path: Path, batch: int) -> Path:
    m = onnx.load(str(DIGITS))
    for value in [*m.graph.input, *m.graph.output]:
        d = value.type.tensor_type.shape.dim[0]
        d.ClearField("dim_param")
        d.dim_value = batch
    del m.graph.value_info[:]
    onnx.save(m, str(path))
    return path


def test_a_refusal_for_a_graph_of_fixed_batch_says_its_figures_are_of_that_batch(tmp_path):
    """'8242 MB of activations per sample at 1x16x16' counted the graph's whole batch of 100000."""
    model = _fixed_batch(tmp_path / "b100000.onnx", 100000)
    np.savez(tmp_path / "d.npz", data=np.zeros((4, 16, 16), np.float32), label=np.zeros(4, np.int64))
    res = run_edgetrain("quantize", model, "--calib", tmp_path / "d.npz", "-o", tmp_path / "q.onnx",
                        "--device", "rpi-zero2w", timeout=300)
    assert_user_error(res, 2, "quantizing needs about", "of activations for one input of 100000x1x16x16",
                      "the batch of 100000 its graph fixes")
    assert "per sample" not in res.err
    assert not (tmp_path / "q.onnx").exists()


def test_a_plan_at_batch_1_says_per_sample():
    import pytest

    from edgetrain.errors import UsageError
    from edgetrain.int8.memplan import check_memory_plan, memory_plan

    plan = memory_plan(DIGITS, (1, 16, 16), 1.0)
    assert plan.input_shape == [1, 1, 16, 16] and not plan.fits
    with pytest.raises(UsageError, match="of activations per sample at 1x16x16"):
        check_memory_plan(plan, "a 1 MB board")
