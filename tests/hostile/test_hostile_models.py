"""Hostile MODEL references: code never runs unasked, and every bad model is one line (exit 2)."""
from __future__ import annotations

import json
import shutil

import pytest

from clitools import assert_user_error
from edgetrain.errors import UsageError
from edgetrain.models import is_factory_ref, load_gluon, load_onnx, parse_model_ref

COLON_NAMES = ["model:best", "model:v2", "pkg.model:best", "a.b.c:run", "model:_x"]
TRAP = "from pathlib import Path\nPath('IMPORTED').write_text('code ran')\n" \
       "def best():\n    raise SystemExit(99)\nv2 = run = _x = best\n"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from edgetrain.models import save_prefix

    root = tmp_path_factory.mktemp("saved")
    save_prefix(load_gluon("edgetrain.nets:digits_cnn"), root / "net")
    return root


def _copy_prefix(src, dst_prefix):
    for suffix in ("-symbol.json", "-0000.params", "-edgetrain.json"):
        shutil.copy(f"{src}{suffix}", f"{dst_prefix}{suffix}")


@pytest.mark.parametrize("name", COLON_NAMES)
def test_colon_prefix_on_disk_is_a_prefix_never_imported(tmp_path, saved, cli, name):
    work = tmp_path / "work"
    work.mkdir()
    _copy_prefix(saved / "net", work / name)
    module = name.split(":")[0]
    (work / (module.replace(".", "/") + ".py")).parent.mkdir(parents=True, exist_ok=True)
    for part in range(module.count(".")):  # packages along the way
        (work / "/".join(module.split(".")[: part + 1]) / "__init__.py").write_text(TRAP)
    (work / (module.replace(".", "/") + ".py")).write_text(TRAP)
    assert not is_factory_ref(str(work / name))
    res = cli("inspect", name, cwd=work)
    assert res.code == 0, res.err
    assert not (work / "IMPORTED").exists()
    # the same reference with only the params file (no symbol) is still not imported
    (work / f"{name}-symbol.json").unlink()
    res = cli("inspect", name, cwd=work)
    assert res.code == 2 and not (work / "IMPORTED").exists(), res.err


BAD_FACTORIES = {
    "syntax-error": "def make(:\n    pass\n",
    "raises-on-import": "raise RuntimeError('boom at import ' + 'x' * 5000)\n",
    "imports-missing": "import no_such_module_anywhere\ndef make():\n    pass\n",
    "factory-raises": "def make():\n    raise ValueError('bad ' * 2000)\n",
    "factory-exits": "def make():\n    raise KeyError('k')\n",
    "returns-none": "def make():\n    return None\n",
    "needs-args": "def make(classes):\n    return None\n",
    "not-callable": "make = 3\n",
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(BAD_FACTORIES))
def test_bad_factory_is_one_line_exit_2(tmp_path, cli, case):
    (tmp_path / "userfac.py").write_text(BAD_FACTORIES[case])
    res = cli("inspect", "userfac:make", cwd=tmp_path)
    assert_user_error(res, 2, "userfac")
    assert len(res.err) < 1200


METADATA = {
    "not-json": "{not json",
    "a-list": "[1, 2, 3]",
    "a-string": '"hello"',
    "missing-keys": "{}",
    "shape-absurd": json.dumps({"input_shape": [3, 10**9, 10**9], "mean": [0, 0, 0], "std": [1, 1, 1]}),
    "shape-negative": json.dumps({"input_shape": [3, -4, 4], "mean": [0, 0, 0], "std": [1, 1, 1]}),
    "channels-7": json.dumps({"input_shape": [7, 4, 4], "mean": [0] * 7, "std": [1] * 7}),
    "std-zero": json.dumps({"input_shape": [1, 4, 4], "mean": [0], "std": [0]}),
    "std-nan": json.dumps({"input_shape": [1, 4, 4], "mean": [0], "std": ["nan"]}),
    "mean-wrong-count": json.dumps({"input_shape": [3, 4, 4], "mean": [0], "std": [1, 1, 1]}),
    "huge": json.dumps({"input_shape": [1, 4, 4], "mean": [0], "std": [1], "class_names": ["x" * 100] * 100000}),
}


def _onnx_with(tmp_path, meta: dict[str, str], custom_op: bool = False):
    import onnx
    from onnx import TensorProto, helper

    node = helper.make_node("Relu" if not custom_op else "MyFancyOp", ["data"], ["out"], name="n0",
                            domain="" if not custom_op else "com.example.private")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 1, 4, 4])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [1, 1, 4, 4])])
    opsets = [helper.make_opsetid("", 13)] + ([helper.make_opsetid("com.example.private", 1)] if custom_op else [])
    model = helper.make_model(graph, opset_imports=opsets)
    for k, v in meta.items():
        e = model.metadata_props.add()
        e.key, e.value = k, v
    path = tmp_path / "m.onnx"
    onnx.save(model, str(path))
    return path


@pytest.mark.parametrize("case", sorted(METADATA))
def test_malformed_edgetrain_metadata_is_one_line(tmp_path, case):
    path = _onnx_with(tmp_path, {"edgetrain.preprocess": METADATA[case]})
    if case == "huge":  # well-formed, just large: read, never echoed
        assert load_onnx(path).preprocess is not None
        return
    with pytest.raises(UsageError) as info:
        load_onnx(path)
    assert len(info.value.line()) < 1000


@pytest.mark.parametrize("case", ["not-json", "shape-absurd", "std-nan"])
def test_malformed_metadata_cli(tmp_path, cli, case):
    path = _onnx_with(tmp_path, {"edgetrain.preprocess": METADATA[case]})
    res = cli("quantize", path, "--calib", "builtin:digits", "-o", tmp_path / "q.onnx")
    assert_user_error(res, 2)


def test_custom_op_blamed_on_the_model_not_the_data(tmp_path, cli):
    meta = {"edgetrain.preprocess": json.dumps({"input_shape": [1, 4, 4], "mean": [0.5], "std": [0.25]})}
    path = _onnx_with(tmp_path, meta, custom_op=True)
    with pytest.raises(UsageError, match="custom operator com.example.private::MyFancyOp"):
        load_onnx(path)
    for args in (("quantize", path, "--calib", "builtin:digits", "-o", tmp_path / "q.onnx"),
                 ("profile", path, "--runs", "2", "--warmup", "0")):
        res = cli(*args)
        assert_user_error(res, 2, "custom operator")
        assert "calib" not in res.err.lower()


SHAPES = ["1,3,100000,100000", "3,0,224", "1,1,1", "2,3,224,224", "1,3,224", "1,5,32,32", "1,3,-1,8", "a,b,c",
          "1," * 200 + "1", "9" * 400, "1,3,8193,8"]


@pytest.mark.slow
@pytest.mark.parametrize("shape", SHAPES, ids=range(len(SHAPES)))
def test_absurd_input_shape_is_one_line(cli, shape):
    res = cli("inspect", "edgetrain.nets:digits_cnn", "--input-shape", shape)
    assert res.code == 2 and "Traceback" not in res.err, res.err
    assert len(res.err) < 1500


def test_prefix_without_record_needs_the_input_shape(tmp_path, saved, cli):
    """HybridBlock.export writes no record: no silent 224x224 + ImageNet mean/std."""
    for suffix in ("-symbol.json", "-0000.params"):
        shutil.copy(f"{saved / 'net'}{suffix}", tmp_path / f"raw{suffix}")
    with pytest.raises(UsageError, match="input shape unknown"):
        load_gluon(str(tmp_path / "raw"))
    res = cli("export", tmp_path / "raw", "-o", tmp_path / "raw.onnx")
    assert_user_error(res, 2, "input shape unknown", "--input-shape")
    assert not (tmp_path / "raw.onnx").exists()
    model = load_gluon(str(tmp_path / "raw"), input_shape=(1, 16, 16))
    assert model.preprocess.input_shape == (1, 16, 16)
    assert any("no normalisation recorded" in n for n in model.notes)
    model = load_gluon(str(tmp_path / "raw"), input_shape=(1, 16, 16), mean="0.3", std="0.4")
    assert model.preprocess.mean == (0.3,) and model.preprocess.std == (0.4,)
    assert not any("no normalisation recorded" in n for n in model.notes)
    res = cli("inspect", tmp_path / "raw", "--input-shape", "1,1,16,16", "--mean", "0.3", "--std", "0.4", "--json", "-")
    assert res.code == 0 and res.json()["preprocess"]["mean"] == [0.3], res.err


@pytest.mark.slow
@pytest.mark.parametrize("bad", ["nan", "0,0", "x", "inf", ""])
def test_bad_mean_std_is_one_line(cli, bad):
    for flag in ("--mean", "--std"):
        res = cli("inspect", "edgetrain.nets:digits_cnn", flag, bad)
        assert_user_error(res, 2)
    for zero_or_less in ("0", "-0.5", "1e-9"):  # a std divides: the smallest it may be is named
        res = cli("inspect", "edgetrain.nets:digits_cnn", "--std", zero_or_less)
        assert_user_error(res, 2, "--std", "from 1e-06")


def test_parse_model_ref_never_imports(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "spy.py").write_text(TRAP)
    ref = parse_model_ref("spy:best")
    assert ref.kind == "factory" and not (tmp_path / "IMPORTED").exists()


# --- thread caps above the cores ----------------------------------------------------------------------

CAP_CODE = ("import os, sys\nos.sched_setaffinity(0, {0})\nfrom edgetrain import runtime\n"
            "print(runtime.apply_threads(int(sys.argv[1])))\n")


@pytest.mark.parametrize("asked", [2, 8, 64, 256])
def test_thread_cap_above_the_cores_is_capped_with_a_warning(asked):
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", CAP_CODE, str(asked)], capture_output=True, text=True, timeout=60)
    assert res.stdout.strip() == "1", res.stderr
    assert res.stderr.count("warning: thread cap") == 1 and "capped to 1" in res.stderr
    env = {**__import__("os").environ, "EDGETRAIN_ALLOW_OVERSUBSCRIBE": "1"}
    res = subprocess.run([sys.executable, "-c", CAP_CODE, str(asked)], capture_output=True, text=True, timeout=60,
                         env=env)
    assert res.stdout.strip() == str(asked) and "warning" not in res.stderr


@pytest.mark.parametrize("device", ["rpi-zero2w", "jetson-nano-10w"])
def test_device_default_above_the_cores_is_capped(tmp_path, device):
    """A 4-thread device default on a 1-core host: capped, said once, and the command runs."""
    import os
    import subprocess
    import sys

    def one_core():
        os.sched_setaffinity(0, {0})

    res = subprocess.run([sys.executable, "-m", "edgetrain", "export", "edgetrain.nets:digits_cnn", "-o",
                          str(tmp_path / "m.onnx"), "--device", device, "--json", "-"], capture_output=True, text=True,
                         timeout=600, preexec_fn=one_core)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "thread cap 4 is above the 1 core(s)" in res.stderr
