"""`edgetrain predict` end to end in a child process: formats, stdin, -o, --json, no mxnet, bad input."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import pytest

from clitools import assert_user_error

from test_predict import models  # noqa: F401  (the fixture: fp32 / fixed-batch / int8 ONNX files + data)


def _child(args, stdin: str = "", cwd=None):
    """The CLI in a fresh interpreter that reports, as it exits, which heavy packages were ever imported."""
    code = ("import atexit, sys\n"
            "atexit.register(lambda: sys.stderr.write('LOADED ' + ','.join(sorted(m for m in ('mxnet', 'onnx') "
            "if m in sys.modules)) + '\\n'))\n"
            "from edgetrain.cli import main\n"
            f"main({[str(a) for a in args]!r})\n")
    env = {k: v for k, v in os.environ.items() if k != "EDGETRAIN_DEBUG"}
    return subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


@pytest.mark.parametrize("name", ["fp32.onnx", "int8.onnx"])
@pytest.mark.parametrize("data", ["npz", "folder", "stdin", "digits"])
def test_predict_never_imports_mxnet_or_onnx(models, digits_folder, name, data):  # noqa: F811
    paths = sorted(str(p) for p in digits_folder.rglob("*.png"))
    arg = {"npz": models / "digits5.npz", "folder": digits_folder, "stdin": "-", "digits": "builtin:digits"}[data]
    res = _child(["predict", models / name, arg, "--threads", "1"], stdin="\n".join(paths))
    assert res.returncode == 0, res.stderr
    assert "LOADED \n" in res.stderr, res.stderr  # neither mxnet nor onnx was ever in sys.modules


def test_csv_and_jsonl_on_stdout_summary_on_stderr(cli, models):  # noqa: F811
    res = cli("predict", models / "fp32.onnx", models / "digits5.npz", "--format", "csv", "--top-k", "2")
    assert res.code == 0, res.err
    rows = list(csv.DictReader(io.StringIO(res.out)))
    assert len(rows) == 200 and list(rows[0]) == ["input", "label", "top1_label", "top1_score", "top2_label",
                                                  "top2_score"]
    assert all(0 <= float(r["top1_score"]) <= 1 and float(r["top1_score"]) >= float(r["top2_score"]) for r in rows)
    assert "accuracy   top-1" in res.err and "images/s" in res.err

    res = cli("predict", models / "fp32.onnx", models / "digits5.npz", "--format", "jsonl", "--top-k", "1")
    lines = [json.loads(line) for line in res.out.splitlines()]
    assert len(lines) == 200 and all(len(r["top"]) == 1 and "label" in r for r in lines)
    hits = sum(r["top"][0]["label"] == r["label"] for r in lines)
    assert f"top-1 {100 * hits / 200:.2f}%" in res.err


def test_table_with_summary_and_confusion_on_stdout(cli, models):  # noqa: F811
    res = cli("predict", models / "int8.onnx", "builtin:digits", "--threads", "1")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    assert lines[0].startswith("input\tlabel\ttop-5") and lines[1].startswith("builtin:digits[0]\t0\t")
    assert "int8" in res.out and "confusion  class: recall" in res.out and "batch p50" in res.out
    assert "the model does not know (5, 6, 7, 8, 9)" in res.out


def test_output_file_holds_what_stdout_would(cli, models, tmp_path):  # noqa: F811
    for fmt in ("table", "csv", "jsonl"):
        shown = cli("predict", models / "fp32.onnx", models / "digits5.npz", "--format", fmt, "--batch", "5")
        kept = cli("predict", models / "fp32.onnx", models / "digits5.npz", "--format", fmt, "-o",
                   tmp_path / f"p.{fmt}")
        assert kept.code == 0, kept.err
        written = (tmp_path / f"p.{fmt}").read_text()
        header = 0 if fmt == "jsonl" else 1
        assert written.splitlines()[: 200 + header] == shown.out.splitlines()[: 200 + header]
        assert "input" not in kept.out.split("model")[0]  # no prediction rows on stdout


def test_json_on_stdout_carries_the_predictions_and_nothing_else(cli, models):  # noqa: F811
    res = cli("predict", models / "fp32.onnx", models / "digits5.npz", "--json", "-")
    assert res.code == 0, res.err
    out = res.json()
    assert out["passed"] is True and out["samples"] == 200 and len(out["predictions"]) == 200
    assert out["accuracy"]["top1"] > 90 and out["timing"]["images_per_s"] > 0


@pytest.mark.parametrize("args,fragment", [
    (["--top-k", "0"], "--top-k"), (["--batch", "0"], "--batch"), (["--threads", "0"], "--threads"),
])
def test_bad_options_are_one_line(cli, models, args, fragment):  # noqa: F811
    res = cli("predict", models / "fp32.onnx", models / "digits5.npz", *args)
    assert_user_error(res, 2, fragment)


def test_bad_format_is_refused_by_click(cli, models):  # noqa: F811
    res = cli("predict", models / "fp32.onnx", models / "digits5.npz", "--format", "xml")
    assert res.code == 2 and "Traceback" not in res.err and "xml" in res.err


def test_bad_model_data_and_outputs_are_one_line_errors(cli, models, tmp_path):  # noqa: F811
    (tmp_path / "notes.txt").write_text("x")
    assert_user_error(cli("predict", tmp_path / "none.onnx", models / "digits5.npz"), 2, "ONNX file not found")
    assert_user_error(cli("predict", models / "fp32.onnx", tmp_path / "notes.txt"), 2, "not an image")
    assert_user_error(cli("predict", models / "fp32.onnx", tmp_path / "nothing"), 2, "data not found")
    assert_user_error(cli("predict", models / "fp32.onnx", models / "digits5.npz", "-o", models / "fp32.onnx"),
                      2, "-o")
    res = _child(["predict", models / "fp32.onnx", "-"], stdin=str(tmp_path / "gone.png") + "\n")
    assert res.returncode == 2 and "Error: image file not found" in res.stderr and "Traceback" not in res.stderr


def test_the_flag_file_is_what_the_declaration_says():
    """predict's click options come from predict_flags.json (no pydantic at start-up); it must be exactly
    what options.PredictOptions declares (regenerate: python -m edgetrain.cli.predict --write-flags)."""
    from edgetrain.cli.predict import FLAGS, flag_specs

    assert json.loads(FLAGS.read_text(encoding="utf-8")) == flag_specs()


def test_start_up_loads_neither_pydantic_nor_the_options_without_a_device(models):  # noqa: F811
    code = ("import atexit, sys\n"
            "atexit.register(lambda: sys.stderr.write('LOADED ' + ','.join(sorted(m for m in ('pydantic', "
            "'edgetrain.options', 'mxnet', 'onnx') if m in sys.modules)) + '\\n'))\n"
            "from edgetrain.cli import main\n"
            f"main(['predict', {str(models / 'int8.onnx')!r}, {str(models / 'digits5.npz')!r}])\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert res.returncode == 0 and "LOADED \n" in res.stderr, res.stderr
    res = _child(["predict", models / "int8.onnx", models / "digits5.npz", "--device", "rpi4b-4gb", "--json", "-"])
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["threads"] == 4  # the device's default threads (capped warning aside)
