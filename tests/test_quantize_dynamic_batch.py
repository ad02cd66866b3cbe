"""Dynamic int8's accuracy depends on batch composition, and the quantize report says so beside its top-1
(issue 37: 82.63% against 82.85% for the same images, without a word)."""
from __future__ import annotations

import numpy as np

from edgetrain.cli.quantize import DYNAMIC_BATCH_NOTE, candidate_table
from edgetrain.int8 import Candidate


def test_a_dynamic_int8_models_scores_depend_on_the_inputs_batch_mates(digits5_onnx, tmp_path):
    """What the note says is true: ORT's dynamic int8 scales by the whole batch's range, so one image's scores
    change with the images beside it (fp32's do not)."""
    import onnxruntime as ort
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from edgetrain.data import load_data
    from edgetrain.models import load_onnx

    quantize_dynamic(str(digits5_onnx), str(tmp_path / "dyn.onnx"), weight_type=QuantType.QInt8)
    x, _ = load_data("builtin:digits", load_onnx(str(digits5_onnx)).preprocess).arrays(200)
    first_with = {}
    for name, path in (("fp32", digits5_onnx), ("dynamic", tmp_path / "dyn.onnx")):
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feed = session.get_inputs()[0].name
        first_with[name] = [session.run(None, {feed: x[idx]})[0][0]
                            for idx in (np.arange(64), np.r_[0, 100:163], np.array([0]))]
    assert all(np.allclose(first_with["fp32"][0], s, atol=1e-5) for s in first_with["fp32"][1:])
    assert max(np.abs(first_with["dynamic"][0] - s).max() for s in first_with["dynamic"][1:]) > 1e-3


def test_the_candidates_table_says_it_beside_a_dynamic_top1_only():
    static = Candidate("QDQ U8S8 (per-channel)", "static", top1=93.0, drop=0.1, size_bytes=25_000, p50_ms=0.3)
    dynamic = Candidate("dynamic (MatMul/Gemm int8)", "dynamic", top1=92.8, drop=0.3, size_bytes=60_000, p50_ms=0.2)
    untested = Candidate("dynamic (MatMul/Gemm int8)", "dynamic", size_bytes=60_000, p50_ms=0.2)  # no --val
    assert candidate_table([static, dynamic])[-1] == DYNAMIC_BATCH_NOTE
    assert DYNAMIC_BATCH_NOTE not in candidate_table([static]) + candidate_table([static, untested])
    assert "changes with which inputs share a batch" in DYNAMIC_BATCH_NOTE
