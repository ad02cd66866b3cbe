"""`edgetrain inspect`: MODEL and DATA references end to end, bad ones as one-line errors with exit 2."""
from __future__ import annotations

import shutil

from clitools import assert_user_error


def test_inspect_prefix_with_image_folder(cli, tiny_prefix, digits_folder, tmp_path):
    res = cli("inspect", tiny_prefix, "--data", digits_folder, "--json", "-", cwd=tmp_path)
    assert res.code == 0, res.err
    out = res.json()
    assert out["kind"] == "prefix" and out["input_shape"] == [1, 1, 16, 16] and out["num_classes"] == 10
    assert out["data"]["samples"] == 36 and out["data"]["skipped_files"] == 1
    assert out["data"]["classes"] == ["digit0", "digit1", "digit2"]


def test_inspect_human_output(cli, tmp_path):
    res = cli("inspect", "edgetrain.nets:digits_cnn", "--data", "builtin:digits", cwd=tmp_path)
    assert res.code == 0, res.err
    assert "1797 samples, 10 classes" in res.out and "random weights" in res.out


def test_missing_model(cli, tmp_path):
    assert_user_error(cli("inspect", tmp_path / "nope", cwd=tmp_path), 2, "model not found")


def test_unknown_zoo_name(cli, tmp_path):
    assert_user_error(cli("inspect", "zoo:resnet9000", cwd=tmp_path), 2, "unknown model zoo name", "resnet")


def test_truncated_params(cli, tiny_prefix, tmp_path):
    for f in tiny_prefix.parent.glob("digits*"):
        shutil.copy(f, tmp_path / f.name)
    p = tmp_path / "digits-0000.params"
    p.write_bytes(p.read_bytes()[:-100])
    assert_user_error(cli("inspect", tmp_path / "digits", cwd=tmp_path), 2, "corrupt or truncated")


def test_factory_not_a_block(cli, tmp_path):
    (tmp_path / "myfactory.py").write_text("def make():\n    return 42\n")
    assert_user_error(cli("inspect", "myfactory:make", cwd=tmp_path), 2, "not a gluon.HybridBlock")


def test_shape_that_does_not_fit_is_one_line(cli, tmp_path):
    res = cli("inspect", "zoo:alexnet", "--input-shape", "3,8,8", cwd=tmp_path)
    assert_user_error(res, 2, "does not fit the model", "--input-shape")
    assert res.out == ""


def test_bad_input_shape(cli, tmp_path):
    res = cli("inspect", "zoo:alexnet", "--input-shape", "a,b", cwd=tmp_path)
    assert res.code == 2 and "not a shape" in res.err and "Traceback" not in res.err
    res = cli("inspect", "zoo:alexnet", "--input-shape", "8,3,224,224", cwd=tmp_path)
    assert res.code == 2 and "batch size 8" in res.err and "--batch" in res.err


def test_one_class_folder(cli, tiny_prefix, digits_folder, tmp_path):
    shutil.copytree(digits_folder / "digit1", tmp_path / "one" / "digit1")
    assert_user_error(cli("inspect", tiny_prefix, "--data", tmp_path / "one", cwd=tmp_path), 2, "1 class")


def test_data_with_more_classes_than_model(cli, tmp_path):
    assert_user_error(cli("inspect", "zoo:mobilenetv2_0.25", "--input-shape", "1,3,32,32", "--params",
                          tmp_path / "none.params", cwd=tmp_path), 2, "params file not found")


def test_debug_env_keeps_traceback(cli, tmp_path):
    res = cli("inspect", "zoo:resnet9000", cwd=tmp_path, env={"EDGETRAIN_DEBUG": "1"})
    assert res.code != 0 and "Traceback" in res.err
