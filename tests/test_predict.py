"""edgetrain.predict: the ONNX file alone classifies exactly as the rest of edgetrain preprocesses and scores."""
from __future__ import annotations

import io

import numpy as np
import pytest

import edgetrain
from edgetrain.int8 import onnx_top1
from edgetrain.data import load_data
from edgetrain.errors import UsageError
from edgetrain.models import load_onnx
from edgetrain.runners import OrtRunner


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The shipped 5-digit model as fp32 ONNX (dynamic batch), fixed batch 1, and int8; with 0-4 digits data."""
    root = tmp_path_factory.mktemp("predict")
    digits = load_data("builtin:digits", load_gluon_pre())
    keep = np.flatnonzero(digits.labels < 5)[:200]
    x = np.stack([digits._raw(int(i))[..., 0] for i in keep])
    np.savez(root / "digits5.npz", data=x, label=digits.labels[keep])
    fp32 = edgetrain.export("edgetrain.nets:pretrained_digits", root / "fp32.onnx", dynamic_batch=True)
    fixed = edgetrain.export("edgetrain.nets:pretrained_digits", root / "fixed.onnx", dynamic_batch=False)
    assert fp32.passed and fixed.passed
    q = edgetrain.quantize(root / "fp32.onnx", calib=root / "digits5.npz", output=root / "int8.onnx",
                           latency=False, samples=100, scheme="rule")
    assert (root / "int8.onnx").is_file(), q
    return root


def load_gluon_pre():
    from edgetrain.preprocess import Preprocess

    return Preprocess(input_shape=(1, 8, 8), mean=(0.0,), std=(1.0,))


@pytest.mark.parametrize("name", ["fp32.onnx", "fixed.onnx", "int8.onnx"])
def test_top1_is_what_quantize_and_export_measure(models, name):
    """predict applies the recorded preprocessing: its top-1 equals the one quantize's accuracy check computes."""
    model = models / name
    res = edgetrain.predict(model, models / "digits5.npz", batch=7, threads=1)
    pre = load_onnx(model).preprocess
    expected = onnx_top1(model, load_data(str(models / "digits5.npz"), pre), threads=1)
    assert res.accuracy.top1 == pytest.approx(expected)
    assert res.accuracy.top1 > 90 and res.samples == 200 and len(res.predictions) == 200
    assert res.precision.startswith("int8") == (name == "int8.onnx")


def test_scores_are_the_model_outputs_softmaxed_and_sorted(models):
    model = models / "fp32.onnx"
    res = edgetrain.predict(model, models / "digits5.npz", top_k=3, threads=1)
    pre = load_onnx(model).preprocess
    x, _ = load_data(str(models / "digits5.npz"), pre).arrays()
    z = OrtRunner(model, 1).infer(x)
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    for i, row in enumerate(res.predictions):
        order = np.argsort(-p[i], kind="stable")[:3]
        assert [t["index"] for t in row["top"]] == order.tolist()
        assert [t["score"] for t in row["top"]] == pytest.approx(p[i, order], abs=1e-5)
        assert [t["label"] for t in row["top"]] == [str(c) for c in order]  # the model's recorded class names


@pytest.mark.parametrize("batch", [1, 3, 16, 500])
@pytest.mark.parametrize("name", ["fp32.onnx", "fixed.onnx"])
def test_batch_size_never_changes_a_prediction(models, name, batch):
    base = edgetrain.predict(models / "fp32.onnx", models / "digits5.npz", batch=1, threads=1)
    res = edgetrain.predict(models / name, models / "digits5.npz", batch=batch, threads=1)
    assert [r["top"][0]["index"] for r in res.predictions] == [r["top"][0]["index"] for r in base.predictions]
    for a, b in zip(res.predictions, base.predictions):
        assert a["top"][0]["score"] == pytest.approx(b["top"][0]["score"], abs=1e-5)
    assert res.timing.batches == -(-200 // batch)


def test_every_form_of_data_gives_the_same_prediction_for_the_same_image(models, digits_folder, tmp_path):
    """A labelled folder, a flat folder, single files and paths on stdin decode an image identically,
    and identically to the DATA reader every other command uses."""
    model = models / "fp32.onnx"
    labelled = edgetrain.predict(model, digits_folder, threads=1)
    files = [r["input"] for r in labelled.predictions]
    assert len(files) == 36 and not any(f.endswith(".txt") for f in files)
    flat = tmp_path / "flat"
    flat.mkdir()
    for k, f in enumerate(files):
        (flat / f"{k:03d}{f[-4:]}").write_bytes(open(f, "rb").read())
    from edgetrain.ops.predict import predict as op
    from edgetrain.options import PredictOptions

    piped = op(str(model), "-", PredictOptions(threads=1), stdin=io.StringIO("\n".join(files) + "\n\n"))
    flat_res = edgetrain.predict(model, flat, threads=1)
    single = [edgetrain.predict(model, f, threads=1).predictions[0] for f in files[::7]]
    ref = load_data(str(digits_folder), load_onnx(model).preprocess)
    scores = OrtRunner(model, 1).infer(ref.batch(np.arange(len(ref))))
    for i, row in enumerate(labelled.predictions):
        assert row["top"][0]["index"] == int(scores[i].argmax())
        assert piped.predictions[i]["top"] == row["top"] == flat_res.predictions[i]["top"]
        assert "label" in row and "label" not in flat_res.predictions[i] and "label" not in piped.predictions[i]
    assert [s["top"] for s in single] == [labelled.predictions[i]["top"] for i in range(0, 36, 7)]
    assert labelled.accuracy is not None and flat_res.accuracy is None and piped.accuracy is None


def test_confusion_counts_every_labelled_input_once(models):
    res = edgetrain.predict(models / "int8.onnx", "builtin:digits", threads=1)
    a = res.accuracy
    assert a.samples == res.samples == 1797
    assert sum(c.count for c in a.confusion) == 1797
    assert sum(c.samples for c in a.per_class) == 1797
    correct = sum(1 for r in res.predictions if r["label"] == r["top"][0]["label"])
    assert a.top1 == pytest.approx(100 * correct / 1797)
    unknown = {c.label for c in a.per_class if c.index is None}
    assert unknown == {"5", "6", "7", "8", "9"}  # classes the 5-digit model does not have count as wrong
    assert all(c.correct == 0 for c in a.per_class if c.index is None)
    assert any("does not know" in n for n in res.notes)


def test_throughput_and_latency_are_reported(models):
    res = edgetrain.predict(models / "fp32.onnx", models / "digits5.npz", batch=8, threads=1)
    t = res.timing
    assert t.images_per_s > 0 and t.inference_images_per_s >= t.images_per_s
    assert 0 < t.batch_p50_ms <= t.batch_p90_ms and t.batches == 25
    assert 0 < t.load_s < t.first_result_s and res.threads == 1


def _fake_onnx(path, with_metadata: bool):
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("data", TensorProto.FLOAT, [1, 1, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64])
    g = helper.make_graph([helper.make_node("Flatten", ["data"], ["y"])], "g", [x], [y])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    if with_metadata:
        m.metadata_props.add(key="edgetrain.preprocess", value="[1, 2")
    path.write_bytes(m.SerializeToString())
    return path


BAD_MODELS = {
    "not onnx": (lambda p: p / "m.params", "predict takes an ONNX file"),
    "missing": (lambda p: p / "gone.onnx", "ONNX file not found"),
    "garbage": (lambda p: (p / "g.onnx").write_bytes(b"\x00garbage" * 10) and p / "g.onnx",
                "ONNX Runtime cannot load the model"),
    "no metadata": (lambda p: _fake_onnx(p / "plain.onnx", False), "no edgetrain preprocessing record"),
    "bad metadata": (lambda p: _fake_onnx(p / "bad.onnx", True), "malformed edgetrain metadata"),
}


@pytest.mark.parametrize("case", sorted(BAD_MODELS))
def test_a_model_predict_cannot_use_is_one_usage_error(case, tmp_path, models):
    make, fragment = BAD_MODELS[case]
    path = make(tmp_path)
    with pytest.raises(UsageError) as err:
        edgetrain.predict(path, models / "digits5.npz")
    assert fragment in err.value.line() and "\n" not in err.value.line()


def _bad_image(p):
    (p / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\x00" * 40)
    return p / "broken.png"


BAD_DATA = {
    "missing": (lambda p: p / "nothing", "data not found"),
    "text file": (lambda p: (p / "a.txt").write_text("hi") and p / "a.txt", "not an image"),
    "empty folder": (lambda p: (p / "empty").mkdir() or p / "empty", "folder has no images"),
    "undecodable image": (_bad_image, "image cannot be decoded"),
    "npz without label": (lambda p: np.savez(p / "x.npz", data=np.zeros((2, 8, 8))) or p / "x.npz",
                          "no 'label' array"),
}


@pytest.mark.parametrize("case", sorted(BAD_DATA))
def test_data_predict_cannot_use_is_one_usage_error(case, tmp_path, models):
    make, fragment = BAD_DATA[case]
    path = make(tmp_path)
    with pytest.raises(UsageError) as err:
        edgetrain.predict(models / "fp32.onnx", path)
    assert fragment in err.value.line(), err.value.line()


def test_stdin_naming_a_missing_file_or_nothing_is_one_usage_error(models):
    from edgetrain.ops.predict import predict as op
    from edgetrain.options import PredictOptions

    for text, fragment in (("/no/such.png\n", "image file not found"), ("\n\n", "no images to classify")):
        with pytest.raises(UsageError) as err:
            op(str(models / "fp32.onnx"), "-", PredictOptions(), stdin=io.StringIO(text))
        assert fragment in err.value.line()
