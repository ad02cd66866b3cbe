"""quantize's memory plan (ROUND5.md L8, M3): its refusal says what its activations are of, and the plan models
what the per-node SQNR pass holds."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
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
    from edgetrain.errors import UsageError
    from edgetrain.int8.memplan import check_memory_plan, memory_plan

    plan = memory_plan(DIGITS, (1, 16, 16), 1.0)
    assert plan.input_shape == [1, 1, 16, 16] and not plan.fits
    with pytest.raises(UsageError, match="of activations per sample at 1x16x16"):
        check_memory_plan(plan, "a 1 MB board")


def _symbolic_hw(path: Path) -> Path:
    m = onnx.load(str(DIGITS))
    dims = m.graph.input[0].type.tensor_type.shape.dim
    for d, name in ((dims[2], "H"), (dims[3], "W")):
        d.ClearField("dim_value")
        d.dim_param = name
    del m.graph.value_info[:]
    onnx.save(m, str(path))
    return path


@pytest.mark.slow
def test_the_plan_is_at_or_just_above_the_peak_of_a_graph_of_few_large_tensors(tmp_path):
    """The digits CNN with symbolic H/W at 400x400 (ROUND5.md M3: at 500x500 planned 288 MB, 385 measured). The
    per-node SQNR pass ran ORT's augmented models (a flattened copy of every tensor, all held to the end of each
    run) and took float64 copies of whole tensors; the plan counted BatchNorm outputs that quantize folds away.
    The plan is now the process's peak RSS (imports included) within 15% below and 10% above it: the peak of the same
    command moves between runs and machines (219-226 MB alone here against a plan of 236, in CI's venv too; 241.7 and
    259.8 in CI's slow stage, beside another test), so no fixed plan is never below it; before the refit it was 25%
    below (288 planned, 385 measured at 500x500)."""
    import json
    import os
    import subprocess
    import sys

    model = _symbolic_hw(tmp_path / "dyn.onnx")
    x = np.random.default_rng(0).random((8, 16, 16), dtype=np.float32)
    np.savez(tmp_path / "d.npz", data=x, label=np.arange(8) % 5)
    argv = [sys.executable, "-m", "edgetrain", "quantize", str(model), "--calib", str(tmp_path / "d.npz"), "-o",
            str(tmp_path / "q.onnx"), "--device", "rpi4b-4gb", "--input-shape", "1,400,400",
            "--json", str(tmp_path / "q.json")]
    peak = ("import resource, subprocess, sys\n"
            "code = subprocess.run(sys.argv[1:]).returncode\n"
            "print(code, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024)")
    env = {k: v for k, v in os.environ.items() if k != "EDGETRAIN_DEBUG"}
    proc = subprocess.run([sys.executable, "-c", peak, *argv], capture_output=True, text=True, timeout=900, env=env)
    code, peak_mb = proc.stdout.splitlines()[-1].split()
    assert code == "0", proc.stderr
    note = next(n for n in json.loads((tmp_path / "q.json").read_text())["notes"] if n.startswith("memory plan:"))
    planned = float(note.split("about ")[1].split(" MB")[0])
    assert 0.85 * float(peak_mb) <= planned <= 1.10 * float(peak_mb), (peak_mb, note)
