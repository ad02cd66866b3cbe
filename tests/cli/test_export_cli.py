"""`edgetrain export` end to end in a child process: the result, exit 3 on a failed validation, bad input."""
from __future__ import annotations

import os

import pytest

from clitools import GROUPNORM_NET, assert_user_error



def leftovers(folder):
    """Anything but the inputs a test put there: outputs or temp files."""
    return sorted(p.name for p in folder.iterdir() if p.suffix not in (".py", ".params", ".json")
                  and p.name != "__pycache__")


def test_export_json_result(cli, tiny_prefix, tmp_path):
    res = cli("export", tiny_prefix, "-o", tmp_path / "d.onnx", "--dynamic-batch", "--device", "rpi-zero2w",
              "--threads", "1", "--json", "-", cwd=tmp_path)
    assert res.code == 0, res.err
    out = res.json()
    assert out["passed"] is True and out["path"] == str(tmp_path / "d.onnx")
    assert out["size_bytes"] == (tmp_path / "d.onnx").stat().st_size and out["opset"] == 13
    assert out["inputs"] == [{"name": "data", "shape": ["batch", 1, 16, 16], "dtype": "float32"}]
    assert out["outputs"][0]["shape"] == ["batch", 10]
    cmp = out["comparison"]
    assert cmp["atol"] == 1e-4 and cmp["rtol"] == 1e-3 and cmp["outputs"][0]["max_abs"] < 1e-4
    assert {"mean_abs", "median_abs", "max_rel", "worst_index", "atol_needed"} <= set(cmp["outputs"][0])
    assert {b["batch"] for b in out["validated_with"]} == {1, 3}
    assert out["device"] == "rpi-zero2w" and out["threads"] == 1
    energy = out["energy"]  # --device: the export ends with the profile's energy-budget report
    assert energy["latency"]["provenance"] == "estimated" and energy["latency"]["mean_ms"] > 0
    assert energy["report"]["device"] == "rpi-zero2w" and energy["report"]["per_inference"]["total_mj"] > 0
    assert energy["memory"]["fits"] is True and energy["failed_checks"] == []
    assert "Conv" in out["ops"]
    assert res.err == ""  # quiet with --json -


def test_energy_budget_over_is_exit_3_and_keeps_file(cli, tiny_prefix, tmp_path):
    res = cli("export", tiny_prefix, "-o", tmp_path / "d.onnx", "--device", "rpi4b-4gb", "--threads", "1",
              "--rate", "720/h", "--battery-wh", "37", "--budget-mj", "0.000001", cwd=tmp_path)
    assert_user_error(res, 3, "energy per inference", "over the budget of 1e-06 mJ", "rpi4b-4gb")
    assert "OVER BUDGET" in res.out and "battery    37 Wh lasts" in res.out
    assert (tmp_path / "d.onnx").is_file()


def test_energy_budget_needs_a_device(cli, tiny_prefix, tmp_path):
    res = cli("export", tiny_prefix, "-o", tmp_path / "d.onnx", "--budget-mj", "5", cwd=tmp_path)
    assert_user_error(res, 2, "an energy budget needs a device", "--device")
    assert not (tmp_path / "d.onnx").exists()


def test_bad_rate_is_refused_before_any_work(cli, tiny_prefix, tmp_path):
    res = cli("export", tiny_prefix, "-o", tmp_path / "d.onnx", "--device", "rpi4b-4gb", "--rate", "often",
              cwd=tmp_path)
    assert_user_error(res, 2, "--rate")
    assert not (tmp_path / "d.onnx").exists()


def test_export_human_output_with_data(cli, tmp_path):
    res = cli("export", "edgetrain.nets:digits_cnn", "-o", tmp_path / "d.onnx", "--data", "builtin:digits",
              "--device", "rpi4b-4gb", cwd=tmp_path)
    assert res.code == 0, res.err
    assert "wrote      " in res.out and "opset 13" in res.out and "result     PASS" in res.out
    assert "2 random x1, 1 random x3, 5 data x3, 1 data x1" in res.out and "device     rpi4b-4gb" in res.out
    assert "digits_dense0_fwd: ok; max abs" in res.out


def test_out_of_tolerance_exits_3_and_keeps_file(cli, tmp_path):
    res = cli("export", "edgetrain.nets:digits_cnn", "-o", tmp_path / "d.onnx", "--atol", "0", "--rtol", "0",
              "--json", tmp_path / "r.json", cwd=tmp_path)
    assert_user_error(res, 3, "ONNX output 'digits_dense0_fwd' differs", "max abs", "would pass with --atol")
    assert (tmp_path / "d.onnx").is_file() and "result     FAIL" in res.out
    import json
    assert json.loads((tmp_path / "r.json").read_text())["passed"] is False


def test_untranslatable_operator_exits_2(cli, tmp_path):
    (tmp_path / "gnnet.py").write_text(GROUPNORM_NET)
    res = cli("export", "gnnet:make", "-o", tmp_path / "g.onnx", cwd=tmp_path)
    assert_user_error(res, 2, "cannot export operator 'GroupNorm'", "layer gn_groupnorm0")
    assert leftovers(tmp_path) == []


def test_onnx_file_as_model(cli, tmp_path):
    (tmp_path / "given.onnx").write_bytes(b"not really")
    res = cli("export", tmp_path / "given.onnx", "-o", tmp_path / "out.onnx", cwd=tmp_path)
    assert_user_error(res, 2, "takes a Gluon model, not an ONNX file")
    assert leftovers(tmp_path) == ["given.onnx"]


def test_output_is_a_directory(cli, tmp_path):
    (tmp_path / "outdir").mkdir()
    res = cli("export", "edgetrain.nets:digits_cnn", "-o", tmp_path / "outdir", cwd=tmp_path)
    assert_user_error(res, 2, "output path is a directory")
    assert list((tmp_path / "outdir").iterdir()) == []


def test_output_folder_missing(cli, tmp_path):
    res = cli("export", "edgetrain.nets:digits_cnn", "-o", tmp_path / "nope" / "m.onnx", cwd=tmp_path)
    assert_user_error(res, 2, "output folder does not exist")
    assert leftovers(tmp_path) == []


def _refuses_new_files(folder: str) -> bool:
    import tempfile

    try:
        fd, probe = tempfile.mkstemp(dir=folder)
    except OSError:
        return True
    os.close(fd)
    os.unlink(probe)
    return False


@pytest.mark.skipif(not os.path.isdir("/sys") or not _refuses_new_files("/sys"),
                    reason="needs a folder that refuses new files even to root")
def test_output_folder_unwritable(cli, tmp_path):
    target = "/sys/edgetrain-test.onnx"
    res = cli("export", "edgetrain.nets:digits_cnn", "-o", target, cwd=tmp_path)
    assert_user_error(res, 2, "not writable")
    assert not os.path.exists(target)


def test_unwritable_folder_as_a_user(cli, tmp_path):
    if os.geteuid() == 0:
        pytest.skip("root writes into read-only folders; test_output_folder_unwritable covers root")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    res = cli("export", "edgetrain.nets:digits_cnn", "-o", ro / "m.onnx", cwd=tmp_path)
    assert_user_error(res, 2, "not writable")
    assert list(ro.iterdir()) == []


def test_shape_that_does_not_fit(cli, tmp_path):
    res = cli("export", "zoo:squeezenet1.1", "--input-shape", "1,3,32,32", "-o", tmp_path / "s.onnx", cwd=tmp_path)
    assert_user_error(res, 2, "does not fit the model", "--input-shape")
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("flag,value", [("--atol", "abc"), ("--rtol", "1e-3x"), ("--atol", "nan"), ("--atol", "-1")])
def test_tolerance_not_a_number(cli, tmp_path, flag, value):
    res = cli("export", "edgetrain.nets:digits_cnn", "-o", tmp_path / "d.onnx", flag, value, cwd=tmp_path)
    assert_user_error(res, 2, flag)
    assert leftovers(tmp_path) == []


def test_unsupported_opset(cli, tmp_path):
    res = cli("export", "edgetrain.nets:digits_cnn", "-o", tmp_path / "d.onnx", "--opset", "17", cwd=tmp_path)
    assert_user_error(res, 2, "opset 17 is not one", "use 12 or 13")
    assert leftovers(tmp_path) == []


def test_fp16(cli, tmp_path):
    res = cli("export", "edgetrain.nets:digits_cnn", "-o", tmp_path / "h.onnx", "--fp16", "--json", "-", cwd=tmp_path)
    assert res.code == 0, res.err
    out = res.json()
    assert out["precision"] == "fp16" and out["comparison"]["atol"] == 0.01 and out["passed"]
