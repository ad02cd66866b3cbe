"""One batch policy for every ONNX file edgetrain writes: a dynamic batch unless the user fixes it, proven at
more than one batch size (the fp32 export once took only batch 1 while quantize wrote a dynamic batch)."""
from __future__ import annotations

import numpy as np
import pytest

import edgetrain
from edgetrain.convert import BATCH_SIZES, check_batch_sizes
from edgetrain.errors import RunFailed
from edgetrain.models import load_onnx
from edgetrain.runners import OrtRunner


@pytest.fixture(scope="module")
def written(tmp_path_factory, digits_npz):
    """Every kind of ONNX file edgetrain writes, from the same model."""
    root = tmp_path_factory.mktemp("batch")
    model = "edgetrain.nets:pretrained_digits"
    files = {}
    assert edgetrain.export(model, root / "export.onnx").passed
    files["export (default)"] = root / "export.onnx"
    assert edgetrain.export(model, root / "fixed.onnx", dynamic_batch=False).passed
    assert edgetrain.export(model, root / "fp16.onnx", fp16=True).passed
    files["export --fp16"] = root / "fp16.onnx"
    for name, source in (("quantize (Gluon MODEL)", model), ("quantize (exported .onnx)", root / "export.onnx")):
        out = root / f"q{len(files)}.onnx"
        edgetrain.quantize(source, calib=digits_npz, output=out, samples=50, latency=False, scheme="rule")
        files[name] = out
    return root, files


def _inputs(path, n):
    pre = load_onnx(path).preprocess
    return np.random.RandomState(n).standard_normal(pre.batch_shape(n)).astype(np.float32)


@pytest.mark.parametrize("kind", ["export (default)", "export --fp16", "quantize (Gluon MODEL)",
                                  "quantize (exported .onnx)"])
def test_every_file_takes_any_batch_and_a_batch_equals_its_samples(written, kind):
    path = written[1][kind]
    runner = OrtRunner(path, 1)
    assert runner.fixed_batch is None, kind
    x = _inputs(path, 180)  # the batch that once failed with "Got: 180 Expected: 1"
    together = runner.run(x)[0]
    alone = np.concatenate([runner.run(x[i:i + 1])[0] for i in range(0, 180, 20)])
    assert together.shape[0] == 180
    assert np.allclose(together[::20], alone, atol=1e-3 * max(1.0, float(np.abs(alone).max())))
    checked = check_batch_sizes(path, load_onnx(path).preprocess, threads=1)
    assert checked["dynamic"] and checked["checked_sizes"] == list(BATCH_SIZES) and len(BATCH_SIZES) > 1


def test_fixed_batch_only_when_asked_and_predict_still_runs_it(written):
    root, _ = written
    runner = OrtRunner(root / "fixed.onnx", 1)
    assert runner.fixed_batch == 1
    assert check_batch_sizes(root / "fixed.onnx", load_onnx(root / "fixed.onnx").preprocess)["dynamic"] is False
    res = edgetrain.predict(root / "fixed.onnx", "builtin:digits", batch=32, threads=1)
    ref = edgetrain.predict(root / "export.onnx", "builtin:digits", batch=32, threads=1)
    assert [r["top"][0]["index"] for r in res.predictions] == [r["top"][0]["index"] for r in ref.predictions]


def test_export_validates_both_batch_sizes_by_default(tmp_path):
    res = edgetrain.export("edgetrain.nets:digits_cnn", tmp_path / "d.onnx")
    assert res.dynamic_batch and {b.batch for b in res.validated_with} == set(BATCH_SIZES)
    assert res.inputs[0].shape[0] == "batch"


def test_quantize_keeps_a_fixed_batch_the_user_chose(written, digits_npz, tmp_path):
    root, _ = written
    edgetrain.quantize(root / "fixed.onnx", calib=digits_npz, output=tmp_path / "q.onnx", samples=30,
                       latency=False, scheme="rule")
    assert OrtRunner(tmp_path / "q.onnx", 1).fixed_batch == 1


def test_the_check_catches_a_model_that_mixes_samples_of_a_batch(tmp_path):
    """A graph whose output depends on the other samples of its batch fails the check (it can fail)."""
    from onnx import TensorProto, helper

    from edgetrain.preprocess import Preprocess

    x = helper.make_tensor_value_info("data", TensorProto.FLOAT, ["batch", 1, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 16])
    nodes = [helper.make_node("Flatten", ["data"], ["f"]),
             helper.make_node("ReduceMean", ["f"], ["m"], axes=[0], keepdims=1),
             helper.make_node("Sub", ["f", "m"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "mix", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 13)])
    (tmp_path / "mix.onnx").write_bytes(model.SerializeToString())
    with pytest.raises(RunFailed) as err:
        check_batch_sizes(tmp_path / "mix.onnx", Preprocess(input_shape=(1, 4, 4), mean=(0.5,), std=(0.25,)))
    assert "other outputs than one sample at a time" in err.value.what
