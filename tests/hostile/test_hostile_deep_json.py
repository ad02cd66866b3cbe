"""JSON nested past what Python reads recursively (issue 37, R6): `energy attribute` on a deeply nested RESULT gave
a RecursionError traceback. Every JSON document a user hands edgetrain is read by ``fileio.parse_json``: nested
deeper than MAX_JSON_DEPTH (64; edgetrain's own are under 10) it is malformed JSON, refused in one line, exit 2 --
the attribute RESULT, a PREFIX's preprocessing record, the power calibration, an ONNX file's edgetrain metadata."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import edgetrain
from clitools import assert_user_error, run_edgetrain
from edgetrain.errors import UsageError
from edgetrain.fileio import MAX_JSON_DEPTH, parse_json

ONNX = Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx"
# past the limit; at json.loads' own recursion limit; far past it (a file of brackets alone)
DEPTHS = [MAX_JSON_DEPTH + 1, 5_000, 200_000]


def nested(depth: int, inner: str = "1", kind: str = "list") -> str:
    """``inner`` inside ``depth`` arrays (or objects): valid JSON, nested ``depth`` deep."""
    if kind == "list":
        return "[" * depth + inner + "]" * depth
    return '{"a": ' * depth + inner + "}" * depth


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_parse_json_reads_up_to_the_limit_and_refuses_past_it_as_malformed_json(kind):
    assert parse_json(nested(MAX_JSON_DEPTH - 1, '{"x": 1}' if kind == "dict" else "[1]", kind)) is not None
    for depth in DEPTHS:
        with pytest.raises(ValueError, match=f"nested deeper than {MAX_JSON_DEPTH} levels"):
            parse_json(nested(depth, kind=kind))


@pytest.mark.parametrize("depth", DEPTHS)
@pytest.mark.parametrize("where", ["top", "inside a result"])
def test_attribute_refuses_a_deeply_nested_result_in_one_line(tmp_path, depth, where):
    log = tmp_path / "meter.csv"
    log.write_text("timestamp,power (W)\n1796292000,3\n1796292001,3\n", encoding="utf-8")
    result = tmp_path / "profile.json"
    text = nested(depth) if where == "top" else '{"configs": [], "meter_windows": ' + nested(depth, kind="dict") + "}"
    result.write_text(text, encoding="utf-8")
    res = run_edgetrain("energy", "attribute", result, log)
    assert_user_error(res, 2, "cannot read the result as JSON", f"nested deeper than {MAX_JSON_DEPTH} levels",
                      str(result))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["meter.csv", "profile.json"]


def test_a_deep_preprocessing_record_beside_a_prefix_is_refused(tmp_path):
    from edgetrain.preprocess import read_sidecar, sidecar_path

    sidecar_path(tmp_path / "m").write_text(nested(5_000, kind="dict"), encoding="utf-8")
    with pytest.raises(UsageError, match="cannot read preprocessing record: JSON nested deeper"):
        read_sidecar(tmp_path / "m")


def test_a_deep_power_calibration_is_refused(tmp_path):
    from edgetrain.energy import calibration

    path = tmp_path / "power-calibration.json"
    path.write_text(nested(5_000), encoding="utf-8")
    with pytest.raises(UsageError, match="cannot read the power calibration"):
        calibration.load(path)


def test_predict_refuses_an_onnx_file_whose_metadata_is_nested_deep(tmp_path):
    import onnx

    model = onnx.load(str(ONNX))
    for p in model.metadata_props:
        if p.key == "edgetrain.preprocess":
            p.value = nested(5_000, json.dumps(json.loads(p.value)), kind="list")
    deep = tmp_path / "deep.onnx"
    deep.write_bytes(model.SerializeToString())
    res = run_edgetrain("predict", deep, "builtin:digits")
    assert_user_error(res, 2, "malformed edgetrain metadata 'edgetrain.preprocess'", "nested deeper")
    from edgetrain.models import load_onnx

    with pytest.raises(UsageError, match="nested deeper"):
        load_onnx(deep)
