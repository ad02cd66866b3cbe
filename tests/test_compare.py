"""compare_outputs: Polygraphy's element-wise rule, the error statistics, and the tolerance that would pass."""
from __future__ import annotations

import json

import numpy as np
import pytest

from edgetrain.compare import compare_outputs, merge


def _pair():
    rng = np.random.RandomState(0)
    expected = rng.randn(4, 10).astype(np.float32) * 5
    actual = expected.copy()
    actual[2, 7] += 0.5  # one clear outlier
    actual += 1e-6  # and float-rounding noise everywhere
    return expected, actual


def test_identical_outputs_pass():
    e, _ = _pair()
    res = compare_outputs({"y": e}, {"y": e.copy()}, atol=0, rtol=0)
    assert res.passed and res.outputs[0].max_abs == 0 and res.outputs[0].mismatches == 0


def test_failure_reports_where_and_by_how_much():
    e, a = _pair()
    res = compare_outputs({"y": e}, {"y": a}, atol=1e-4, rtol=1e-3)
    out = res.outputs[0]
    assert not res.passed and res.failed == [out]
    assert out.mismatches == 1 and out.elements == 40
    assert out.worst_index == [2, 7]
    assert out.worst_expected == pytest.approx(float(e[2, 7]))
    assert out.worst_actual == pytest.approx(float(a[2, 7]))
    assert out.max_abs == pytest.approx(0.5, rel=1e-4)
    assert out.median_abs == pytest.approx(1e-6, rel=0.5)
    line = out.summary()
    # atol scales with the output's magnitude (max |e| ~ 11): the tolerance that passes is stated unscaled
    assert out.atol_scale == pytest.approx(float(np.abs(e).max()))
    assert out.atol_needed * out.atol_scale == pytest.approx(0.5, rel=1e-4)
    assert "FAIL" in line and "[2,7]" in line and f"would pass with atol {out.atol_needed:.3g}" in line


def test_tolerance_that_would_have_passed_does_pass():
    e, a = _pair()
    first = compare_outputs([e], [a], atol=1e-4, rtol=1e-3).outputs[0]
    assert compare_outputs([e], [a], atol=first.atol_needed, rtol=1e-3).passed
    assert compare_outputs([e], [a], atol=1e-4, rtol=first.rtol_needed).passed
    assert not compare_outputs([e], [a], atol=first.atol_needed * 0.99, rtol=1e-3).passed


def test_element_mismatches_only_when_out_of_both_tolerances():
    e = np.array([[100.0, 0.001]])
    a = np.array([[100.05, 0.0012]])  # abs 0.05 (rel 5e-4); abs 2e-4 (rel 0.2)
    # atol in force = atol x max|e| (100): 1e-6 -> 1e-4, so only the small one is out of both
    assert compare_outputs([e], [a], atol=1e-6, rtol=1e-3).outputs[0].mismatches == 1  # the small one
    assert compare_outputs([e], [a], atol=1e-5, rtol=1e-3).passed


def test_relative_error_against_zero_is_infinite_and_null_in_json():
    res = compare_outputs({"y": np.zeros((1, 3))}, {"y": np.array([[0.0, 1e-5, 0.0]])}, atol=1e-4, rtol=1e-3)
    out = res.outputs[0]
    assert res.passed and out.max_rel == float("inf")  # atol covers it
    d = json.loads(json.dumps(res.to_dict()))
    assert d["outputs"][0]["max_rel"] is None and d["passed"] is True


def test_nan_in_converted_output_fails():
    e = np.ones((1, 4))
    a = e.copy()
    a[0, 1] = np.nan
    out = compare_outputs([e], [a], atol=1, rtol=1).outputs[0]
    assert not out.passed and "non-finite" in out.error and "FAIL" in out.summary()


def test_shape_mismatch_and_missing_outputs():
    res = compare_outputs({"a": np.zeros((1, 3)), "b": np.zeros(2)}, {"a": np.zeros((1, 4)), "c": np.zeros(2)},
                          atol=1e-4, rtol=1e-3)
    by_name = {o.name: o for o in res.outputs}
    assert not res.passed
    assert "shape [1, 4] != expected [1, 3]" in by_name["a"].error
    assert "missing" in by_name["b"].error and "not among the reference" in by_name["c"].error


def test_merge_concatenates_batches_of_different_sizes():
    batches = [{"y": np.zeros((1, 3))}, {"y": np.ones((3, 3))}]
    assert merge(batches)["y"].shape == (4, 3)
    assert merge([[np.zeros((1, 2))], [np.zeros((2, 2))]])[0].shape == (3, 2)


@pytest.mark.parametrize("bad", ["abc", -1, float("nan"), None])
def test_bad_tolerance_is_rejected(bad):
    with pytest.raises(ValueError, match="atol"):
        compare_outputs([np.zeros(1)], [np.zeros(1)], atol=bad, rtol=1e-3)


MAGNITUDES = [0.01, 1.0, 20.0, 300.0, 1e4]


@pytest.mark.parametrize("mag", MAGNITUDES)
@pytest.mark.parametrize("n", [10, 1000, 4096])
def test_fp32_round_off_passes_at_every_magnitude(mag, n):
    """The same logits computed in float64 and in float32 with another summation order (what ONNX
    Runtime vs MXNet does) pass the default export tolerance whatever their size."""
    rng = np.random.RandomState(n)
    x = rng.randn(8, 2048)
    w = rng.randn(2048, n) / np.sqrt(2048) * mag
    expected = (x @ w).astype(np.float32)
    actual = np.zeros((8, n), np.float32)
    for k in range(0, 2048, 64):  # blocked, in float32
        actual += x[:, k:k + 64].astype(np.float32) @ w[k:k + 64].astype(np.float32)
    assert compare_outputs([expected], [actual], atol=1e-4, rtol=1e-3).passed


@pytest.mark.parametrize("mag", MAGNITUDES)
def test_real_errors_still_fail_at_every_magnitude(mag):
    rng = np.random.RandomState(1)
    expected = (rng.randn(4, 100) * mag).astype(np.float32)
    for err in (0.05, 0.5):  # 5% and 50% of the output's scale on one element near the top
        actual = expected.copy()
        i = np.unravel_index(np.argmax(np.abs(expected)), expected.shape)
        actual[i] += err * max(mag, 1.0) * 4
        res = compare_outputs([expected], [actual], atol=1e-4, rtol=1e-3)
        assert not res.passed, (mag, err)
