"""Round 5 (issue 37.8): predict's -o decides the format by its name. Two names slipped through: `-o -` wrote a
file named '-' in the working folder (where `--json -` means standard output), and a file named only '.json'
got the tab-separated table (Python's splitext gives a dotfile no suffix). Now `-o -` is standard output and
'.json' holds JSON; a --format that contradicts the name is still refused (exit 2, nothing written)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import edgetrain
from tests.clitools import assert_user_error, run_edgetrain

ONNX = str(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx")


@pytest.mark.parametrize("fmt, first", [([], "input\tlabel\ttop-1 (score)"), (["--format", "csv"], "input,label,"),
                                        (["--format", "json"], "[")])
def test_dash_is_standard_output(fmt, first, tmp_path):
    res = run_edgetrain("predict", ONNX, "builtin:digits", "--top-k", "1", "-o", "-", *fmt, cwd=tmp_path)
    assert res.code == 0, res.err[-2000:]
    assert res.out.startswith(first), res.out[:200]
    assert list(tmp_path.iterdir()) == []  # no file named '-'


def test_a_file_named_dot_json_holds_json(tmp_path):
    res = run_edgetrain("predict", ONNX, "builtin:digits", "--top-k", "1", "-o", ".json", cwd=tmp_path)
    assert res.code == 0, res.err[-2000:]
    rows = json.loads((tmp_path / ".json").read_text())
    assert len(rows) == 1797 and rows[0]["top"][0]["label"] == "0"


def test_dot_json_with_another_format_is_refused(tmp_path):
    res = run_edgetrain("predict", ONNX, "builtin:digits", "-o", ".json", "--format", "csv", cwd=tmp_path)
    assert_user_error(res, 2, "named as json but --format is csv")
    assert list(tmp_path.iterdir()) == []
