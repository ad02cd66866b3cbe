"""`edgetrain quantize` end to end in a child process: reports, JSON, exit codes, bad input."""
from __future__ import annotations

import numpy as np
import pytest

from clitools import assert_user_error

from test_quantize import trained_digits_dir  # one training run, shared by both modules


@pytest.fixture(scope="session")
def trained(tmp_path_factory):
    return trained_digits_dir(tmp_path_factory)


def _no_outputs(folder, *keep):
    left = sorted(p.name for p in folder.iterdir() if p.name not in keep)
    assert left == [], f"left behind: {left}"


def test_json_report_on_stdout_and_progress_stays_off_it(cli, tiny_prefix, digits_folder, tmp_path):
    res = cli("quantize", tiny_prefix, "--calib", digits_folder, "-o", tmp_path / "q.onnx", "--samples", "20",
              "--threads", "1", "--json", "-", "--scheme", "rule", cwd=tmp_path)
    assert res.code == 0, res.err
    out = res.json()
    assert out["backend"] == "onnxruntime" and out["output"].endswith("q.onnx") and (tmp_path / "q.onnx").is_file()
    assert out["calibration"]["samples"] == 20 and out["accuracy"]["checked"] is False
    assert out["passed"] is True and out["failed_checks"] == [] and out["latency"]["threads"] == 1
    assert out["size"]["ratio"] > 1 and out["scheme"]["format"] == "QDQ"
    assert any("not checked" in n for n in out["notes"])


def test_human_report_for_a_device_without_vnni(cli, trained, tmp_path):
    res = cli("quantize", trained / "digits10", "--calib", trained / "calib.npz", "--val", trained / "val.npz",
              "-o", tmp_path / "q.onnx", "--device", "x86-64-generic", "--threads", "1", "--samples", "100",
              "--json", tmp_path / "r.json", cwd=tmp_path)
    assert res.code == 0, res.err
    assert "QDQ U8S8 (per-channel, reduce_range) for x86-64-generic" in res.out
    assert "saturat" in res.out and "warning    x86-64-generic has neither x86 VNNI nor ARM dot-product" in res.out
    assert "accuracy   fp32 " in res.out and "measured on this host" in res.out and "not on x86-64-generic" in res.out
    import json

    report = json.loads((tmp_path / "r.json").read_text())
    assert report["scheme"]["reduce_range"] is True and report["accuracy"]["drop"] <= 1.0


def test_budget_not_met_exits_3_and_keeps_the_best_model(cli, trained, tmp_path):
    np.savez(tmp_path / "blank.npz", data=np.zeros((8, 8, 8), np.float32), label=np.arange(8) % 2)
    res = cli("quantize", trained / "digits10", "--calib", tmp_path / "blank.npz", "--val", trained / "val.npz",
              "-o", tmp_path / "q.onnx", "--max-fp32-nodes", "0", "--threads", "1", "--json", tmp_path / "r.json",
              "--scheme", "rule", cwd=tmp_path)  # rule: the budget search alone, no timing
    assert_user_error(res, 3, "exceeds --max-drop 1", "best model is kept")
    assert (tmp_path / "q.onnx").is_file() and (tmp_path / "r.json").is_file()
    assert "no mix of int8 and fp32 nodes met --max-drop 1" in res.out


def test_mxnet_backend_says_it_cannot_go_to_onnx(cli, tiny_prefix, digits_folder, tmp_path):
    res = cli("quantize", tiny_prefix, "--calib", digits_folder, "-o", tmp_path / "mx", "--backend", "mxnet",
              "--samples", "12", "--threads", "1", cwd=tmp_path)
    assert res.code == 0, res.err
    assert "cannot be exported to ONNX" in res.out and (tmp_path / "mx-symbol.json").is_file()
    assert (tmp_path / "mx-0000.params").stat().st_size > 10_000 and (tmp_path / "mx-edgetrain.json").is_file()
    res = cli("inspect", tmp_path / "mx", "--json", "-", cwd=tmp_path)  # loads as a PREFIX, as profile will
    assert res.code == 0, res.err
    assert res.json()["num_classes"] == 10 and res.json()["input_shape"] == [1, 1, 16, 16]


@pytest.mark.parametrize("value,fragment", [("-1", "greater than or equal to 0"), ("abc", "valid number"),
                                            ("nan", "finite number")])
def test_bad_max_drop(cli, tiny_prefix, tmp_path, value, fragment):
    res = cli("quantize", tiny_prefix, "--calib", "builtin:digits", "-o", tmp_path / "q.onnx", "--max-drop", value,
              cwd=tmp_path)
    assert_user_error(res, 2, "--max-drop", fragment)
    _no_outputs(tmp_path)


def test_calibration_data_that_is_not_images(cli, tiny_prefix, tmp_path):
    np.savez(tmp_path / "vectors.npz", data=np.zeros((10, 7), np.float32), label=np.arange(10) % 2)
    res = cli("quantize", tiny_prefix, "--calib", tmp_path / "vectors.npz", "-o", tmp_path / "q.onnx", cwd=tmp_path)
    assert_user_error(res, 2, "'data' has shape (10, 7)", "vectors.npz")
    _no_outputs(tmp_path, "vectors.npz")


def test_calibration_images_that_do_not_fit_the_onnx_input(cli, trained, tmp_path):
    fp32 = tmp_path / "fp32.onnx"
    res = cli("export", trained / "digits10", "-o", fp32, cwd=tmp_path)
    assert res.code == 0, res.err
    res = cli("quantize", fp32, "--calib", trained / "calib.npz", "-o", tmp_path / "q.onnx",
              "--input-shape", "1,1,20,20", cwd=tmp_path)
    assert_user_error(res, 2, "do not fit the model input", "--calib")
    _no_outputs(tmp_path, "fp32.onnx")


def test_empty_calibration_set(cli, tiny_prefix, tmp_path):
    for cls in ("a", "b"):
        (tmp_path / "empty" / cls).mkdir(parents=True)
    res = cli("quantize", tiny_prefix, "--calib", tmp_path / "empty", "-o", tmp_path / "q.onnx", cwd=tmp_path)
    assert_user_error(res, 2, "no readable images", "empty")
    _no_outputs(tmp_path, "empty")


def test_val_labels_outside_the_model(cli, tiny_prefix, tmp_path):
    np.savez(tmp_path / "val.npz", data=np.zeros((12, 8, 8), np.float32), label=np.arange(12))
    res = cli("quantize", tiny_prefix, "--calib", "builtin:digits", "--val", tmp_path / "val.npz",
              "-o", tmp_path / "q.onnx", cwd=tmp_path)
    assert_user_error(res, 2, "12 classes", "10 outputs", "val.npz")
    _no_outputs(tmp_path, "val.npz")


def test_already_quantized_model(cli, tiny_prefix, tmp_path):
    res = cli("quantize", tiny_prefix, "--calib", "builtin:digits", "-o", tmp_path / "q.onnx", "--samples", "10",
              "--threads", "1", "--scheme", "rule", cwd=tmp_path)  # rule: no timing (every scheme writes int8)
    assert res.code == 0, res.err
    res = cli("quantize", tmp_path / "q.onnx", "--calib", "builtin:digits", "-o", tmp_path / "q2.onnx", cwd=tmp_path)
    assert_user_error(res, 2, "already quantized", "fp32 model")
    _no_outputs(tmp_path, "q.onnx")


def test_output_folder_missing_fails_before_any_work(cli, tiny_prefix, tmp_path):
    res = cli("quantize", tiny_prefix, "--calib", "builtin:digits", "-o", tmp_path / "nope" / "q.onnx", cwd=tmp_path)
    assert_user_error(res, 2, "folder does not exist", "nope")
    _no_outputs(tmp_path)


def test_a_scheme_with_the_mxnet_backend_is_refused_before_any_work(cli, tiny_prefix, tmp_path):
    """--backend mxnet quantizes with MXNet's own scheme: an ONNX Runtime --scheme cannot apply there."""
    for scheme in ("int8", "qdq", "rule"):
        res = cli("quantize", tiny_prefix, "--calib", "builtin:digits", "-o", tmp_path / "mx_int8", "--backend",
                  "mxnet", "--scheme", scheme, cwd=tmp_path)
        assert_user_error(res, 2, "--scheme has no effect without --backend onnxruntime", "--scheme")
    _no_outputs(tmp_path)


@pytest.mark.parametrize("scheme", ["fp32", "dynamic", ""])
def test_a_scheme_quantize_does_not_have(cli, tiny_prefix, tmp_path, scheme):
    res = cli("quantize", tiny_prefix, "--calib", "builtin:digits", "-o", tmp_path / "q.onnx", "--scheme", scheme,
              cwd=tmp_path)
    assert_user_error(res, 2, "--scheme")
    _no_outputs(tmp_path)


def test_a_model_with_no_weights_to_quantize_is_refused(cli, tmp_path):
    """Only activations would be wrapped in Quantize/DequantizeLinear: nothing int8 to store. One line, exit 2,
    no file (fp32 under an int8 name is what issue 37 forbids)."""
    from importlib import resources

    import onnx
    from onnx import TensorProto, helper

    with resources.as_file(resources.files("edgetrain._builtin").joinpath("digits5.onnx")) as base:
        src = onnx.load(str(base))
    graph = helper.make_graph([helper.make_node("GlobalAveragePool", ["data"], ["p"], name="gap"),
                               helper.make_node("Flatten", ["p"], ["out"], name="flat")], "noweights",
                              [src.graph.input[0]], [helper.make_tensor_value_info("out", TensorProto.FLOAT,
                                                                                   ["batch", 1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = src.ir_version
    for p in src.metadata_props:  # edgetrain's preprocessing record: otherwise a good fp32 export
        entry = model.metadata_props.add()
        entry.key, entry.value = p.key, p.value
    onnx.save(model, str(tmp_path / "noweights.onnx"))
    for scheme in ("auto", "rule"):
        res = cli("quantize", tmp_path / "noweights.onnx", "--calib", "builtin:digits", "-o",
                  tmp_path / "nw_int8.onnx", "--samples", "10", "--threads", "1", "--scheme", scheme, cwd=tmp_path)
        assert_user_error(res, 2, "nothing in this model quantizes to int8", "noweights.onnx")
    _no_outputs(tmp_path, "noweights.onnx")
