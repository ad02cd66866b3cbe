"""MODEL references: every form loads, every bad reference is a clear UsageError (exit 2)."""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from edgetrain.errors import UsageError
from edgetrain.models import load_gluon, parse_model_ref, save_prefix


def test_prefix_round_trip_keeps_weights_and_preprocessing(tiny_prefix, tmp_path):
    model = load_gluon(str(tiny_prefix))
    assert model.ref.kind == "prefix"
    assert model.preprocess.input_shape == (1, 16, 16)
    assert model.num_classes == 10
    x = np.random.RandomState(0).rand(2, 1, 16, 16).astype("float32")
    save_prefix(model.__class__(model.block, model.ref, model.preprocess.with_classes("abcdefghij"), 10),
                tmp_path / "copy")
    again = load_gluon(str(tmp_path / "copy"))
    np.testing.assert_allclose(again.predict(x), model.predict(x), rtol=1e-5, atol=1e-6)
    assert again.preprocess.class_names == tuple("abcdefghij")
    assert not list(tmp_path.glob(".*")), "temp files left behind"


def test_zoo_model_is_random_unless_params(tmp_path):
    model = load_gluon("zoo:mobilenetv2_0.25", input_shape=(3, 64, 64))
    assert model.random_weights and model.num_classes == 1000
    params = tmp_path / "sq.params"
    model.block.save_parameters(str(params))
    loaded = load_gluon("zoo:mobilenetv2_0.25", params=str(params), input_shape=(3, 64, 64))
    assert not loaded.random_weights
    x = np.ones((1, 3, 64, 64), "float32")
    np.testing.assert_allclose(loaded.predict(x), model.predict(x), rtol=1e-5, atol=1e-6)


def test_factory_model_uses_its_recorded_preprocessing():
    model = load_gluon("edgetrain.nets:digits_cnn")
    assert model.ref.kind == "factory" and model.preprocess.channels == 1
    assert model.random_weights


@pytest.mark.parametrize("ref, fragment", [
    ("zoo:resnet9000", "unknown model zoo name"),
    ("zoo:", "empty model zoo name"),
    ("nosuchpkg.mod:make", "cannot import module"),
    ("edgetrain.nets:nothing_here", "has no function"),
    ("edgetrain.runtime:usable_cores", "not a gluon.HybridBlock"),
    ("edgetrain.preprocess:default_norm", "cannot be called without arguments"),
    ("/nonexistent/model", "model not found"),
])
def test_bad_references(ref, fragment):
    with pytest.raises(UsageError) as info:
        load_gluon(ref)
    assert fragment in info.value.what
    assert info.value.exit_code == 2


def test_truncated_params_is_refused(tiny_prefix, tmp_path):
    bad = tmp_path / "digits"
    for f in tiny_prefix.parent.glob("digits*"):
        shutil.copy(f, tmp_path / f.name)
    params = tmp_path / "digits-0000.params"
    params.write_bytes(params.read_bytes()[:200])
    with pytest.raises(UsageError) as info:
        load_gluon(str(bad))
    assert "corrupt or truncated" in info.value.what


def test_params_from_another_model_is_refused(tiny_prefix, tmp_path):
    other = load_gluon("zoo:mobilenetv2_0.25", input_shape=(3, 32, 32))
    save_prefix(other, tmp_path / "sq")
    shutil.copy(tiny_prefix.with_name("digits-symbol.json"), tmp_path / "mixed-symbol.json")
    shutil.copy(tmp_path / "sq-0000.params", tmp_path / "mixed-0000.params")
    with pytest.raises(UsageError) as info:
        load_gluon(str(tmp_path / "mixed"))
    assert "does not match the symbol" in info.value.what


def test_shape_that_does_not_fit(tiny_prefix):
    with pytest.raises(UsageError) as info:
        load_gluon("zoo:alexnet", input_shape=(3, 8, 8))
    assert "does not fit the model" in info.value.what


def test_onnx_only_where_accepted(tmp_path):
    f = tmp_path / "m.onnx"
    f.write_bytes(b"x")
    with pytest.raises(UsageError, match="takes a Gluon model"):
        parse_model_ref(str(f))
    assert parse_model_ref(str(f), accept_onnx=True).kind == "onnx"
