"""predict --format csv with file names a CSV must quote (issue 26, closing campaign): a name holding a line
break was written unquoted (the writer's line terminator was empty, so it did not know a newline needs
quotes) and every CSV reader read that prediction as two broken rows. Each name now reads back whole, on
stdout and in -o, beside names with a comma, a quote, a tab and a leading blank."""
from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

import edgetrain
from clitools import run_edgetrain

ONNX = str(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx")
NAMES = ["a,b.png", 'q"x.png', "new\nline.png", "cr\rx.png", " lead.png", "tab\t.png", "plain.png"]


@pytest.mark.parametrize("where", ["stdout", "-o"])
def test_csv_rows_read_back_whole(tmp_path, where):
    from PIL import Image

    folder = tmp_path / "flat"
    folder.mkdir()
    for n in NAMES:
        Image.new("L", (16, 16), 128).save(folder / n, format="PNG")
    out = tmp_path / "pred.csv"
    args = ["predict", ONNX, folder, "--format", "csv", "--top-k", "1"] + (["-o", out] if where == "-o" else [])
    res = run_edgetrain(*args, timeout=120)
    assert res.code == 0, res.err
    text = out.read_bytes().decode() if where == "-o" else res.out
    rows = list(csv.reader(io.StringIO(text, newline="")))
    assert rows[0][0] == "input"
    # the runner reads stdout with universal newlines: a CR inside a quoted name comes back as LF
    want = NAMES if where == "-o" else [n.replace("\r", "\n") for n in NAMES]
    assert sorted(Path(r[0]).name for r in rows[1:]) == sorted(want)
    assert all(len(r) == len(rows[0]) for r in rows)
