"""`edgetrain predict` end to end in a child process: formats, stdin, -o, --json, no mxnet, bad input."""
from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clitools import assert_user_error
from edgetrain.options import PredictOptions

from test_predict import models  # noqa: F401  (the fixture: fp32 / fixed-batch / int8 ONNX files + data)


# What `edgetrain predict` must never load (it starts as small and fast as a bare ONNX Runtime loop): mxnet
# and onnx, click (the light parser reads the declaration without it) and pydantic (no device profile here).
HEAVY = ("mxnet", "onnx", "click", "pydantic")


def _child(args, stdin: str = "", cwd=None):
    """The console script's ``main`` in a fresh interpreter that reports, as it exits, which of HEAVY were
    ever imported (a line 'LOADED a,b')."""
    code = ("import atexit, sys\n"
            f"atexit.register(lambda: sys.stderr.write('LOADED ' + ','.join(m for m in {HEAVY!r} "
            "if m in sys.modules) + '\\n'))\n"
            "from edgetrain.cli import main\n"
            f"main({[str(a) for a in args]!r})\n")
    env = {k: v for k, v in os.environ.items() if k != "EDGETRAIN_DEBUG"}
    return subprocess.run([sys.executable, "-c", code], input=stdin, capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=300)


@pytest.mark.parametrize("name", ["fp32.onnx", "int8.onnx"])
@pytest.mark.parametrize("data", ["npz", "folder", "stdin", "digits"])
def test_predict_never_imports_mxnet_onnx_click_or_pydantic(models, digits_folder, name, data, tmp_path):  # noqa: F811
    paths = sorted(str(p) for p in digits_folder.rglob("*.png"))
    arg = {"npz": models / "digits5.npz", "folder": digits_folder, "stdin": "-", "digits": "builtin:digits"}[data]
    extra = {"npz": ["--format", "csv"], "folder": ["-o", tmp_path / "p.txt"], "stdin": ["--json", "-"],
             "digits": ["--top-k=2", "--batch", "64"]}[data]
    res = _child(["predict", models / name, arg, "--threads", "1", *extra], stdin="\n".join(paths))
    assert res.returncode == 0, res.stderr
    assert "LOADED \n" in res.stderr, res.stderr  # none of HEAVY was ever in sys.modules


def test_the_check_sees_what_a_command_loads(models):  # noqa: F811
    """The check above can fail: the click path (here --help) is seen loading click."""
    res = _child(["predict", "--help"])
    assert res.returncode == 0 and "LOADED click\n" in res.stderr, res.stderr


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
    accuracy = next(ln for ln in res.err.splitlines() if ln.startswith("accuracy "))
    assert accuracy.count("top-") == 1, accuracy  # --top-k 1: "top-1 x%  top-1 x%" said it twice


def test_table_with_summary_and_confusion_on_stdout(cli, models):  # noqa: F811
    res = cli("predict", models / "int8.onnx", "builtin:digits", "--threads", "1")
    assert res.code == 0, res.err
    lines = res.out.splitlines()
    assert lines[0].startswith("input\tlabel\ttop-5") and lines[1].startswith("builtin:digits[0]\t0\t")
    assert "int8" in res.out and "confusion  class: recall" in res.out and "batch p50" in res.out
    assert "the model does not know (5, 6, 7, 8, 9)" in res.out


def test_output_file_holds_what_stdout_would(cli, models, tmp_path):  # noqa: F811
    for fmt in ("table", "csv", "jsonl", "json"):
        shown = cli("predict", models / "fp32.onnx", models / "digits5.npz", "--format", fmt, "--batch", "5")
        kept = cli("predict", models / "fp32.onnx", models / "digits5.npz", "--format", fmt, "-o",
                   tmp_path / f"p.{fmt}")
        assert kept.code == 0, kept.err
        written = (tmp_path / f"p.{fmt}").read_text()
        header = 0 if fmt == "jsonl" else 1
        assert written.splitlines()[: 200 + header] == shown.out.splitlines()[: 200 + header]
        assert "input" not in kept.out.split("model")[0]  # no prediction rows on stdout


def test_an_output_named_json_holds_json_and_a_format_that_says_otherwise_is_refused(cli, models, tmp_path):  # noqa: F811
    """`predict -o x.json` wrote the tab-separated table (issue 37): the name decides the format when --format is
    not given, and a --format that contradicts a name ending in .json, .jsonl, .csv or .tsv is one line, exit 2,
    before any work (nothing written)."""
    res = cli("predict", models / "fp32.onnx", models / "digits5.npz", "--top-k", "2", "-o", tmp_path / "p.json")
    assert res.code == 0, res.err
    rows = json.loads((tmp_path / "p.json").read_text())
    assert len(rows) == 200 and all(len(r["top"]) == 2 and "label" in r for r in rows)
    assert [r["input"] for r in rows] == [f"{models / 'digits5.npz'}[{i}]" for i in range(200)]
    res = cli("predict", models / "fp32.onnx", models / "digits5.npz", "-o", tmp_path / "p.CSV")
    assert res.code == 0 and (tmp_path / "p.CSV").read_text().startswith("input,label,top1_label"), res.err
    for fmt, name in (("table", "q.json"), ("csv", "q.jsonl"), ("jsonl", "q.json"), ("json", "q.tsv")):
        res = cli("predict", models / "fp32.onnx", models / "digits5.npz", "--format", fmt, "-o", tmp_path / name)
        assert_user_error(res, 2, f"is named as {PredictOptions.SUFFIX_FORMATS[name[1:]]} but --format is {fmt}")
        assert not (tmp_path / name).exists()
    res = cli("predict", models / "fp32.onnx", models / "digits5.npz", "--format", "json", "-o", tmp_path / "p.txt")
    assert res.code == 0 and len(json.loads((tmp_path / "p.txt").read_text())) == 200  # no format in the name


def test_json_on_stdout_is_one_array_and_the_api_writes_it_too(cli, models, tmp_path):  # noqa: F811
    import edgetrain

    res = cli("predict", models / "fp32.onnx", models / "digits5.npz", "--format", "json", "--batch", "7")
    assert res.code == 0, res.err
    assert len(json.loads(res.out)) == 200 and "accuracy   top-1" in res.err  # the summary is not in the array
    edgetrain.predict(models / "fp32.onnx", models / "digits5.npz", output=tmp_path / "api.json", batch=7,
                      progress=None)
    assert json.loads((tmp_path / "api.json").read_text()) == json.loads(res.out)
    with pytest.raises(edgetrain.UsageError, match="is named as json but --format is csv"):
        edgetrain.predict(models / "fp32.onnx", models / "digits5.npz", output=tmp_path / "x.json", format="csv")


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


def test_a_device_profile_takes_the_declared_path(models):  # noqa: F811
    """--device NAME is read by the declaration (its profile with pydantic), and its thread count applies."""
    res = _child(["predict", models / "int8.onnx", models / "digits5.npz", "--device", "rpi4b-4gb", "--json", "-"])
    assert res.returncode == 0, res.stderr
    # the device's default (4), capped to the cores this process may use, as ONNX Runtime is given it
    assert json.loads(res.stdout)["threads"] == min(4, len(os.sched_getaffinity(0))), res.stderr


# Command lines the light parser must read into the same options as click does (or leave to click: None).
LINES = [
    ["M", "D"], ["M", "D", "--top-k", "3"], ["--top-k=3", "M", "D"], ["M", "-", "-o", "out.txt"],
    ["M", "D", "-oout.txt"], ["M", "D", "--output=x.csv", "--format", "csv"], ["M", "D", "--json", "-"],
    ["M", "D", "--format", "csv", "--format", "jsonl"], ["--", "-M", "D"], ["M", "--", "D"],
    ["M", "D", "--threads", "2", "--batch", "1"], ["M", "D", "--top-k", "1000"], ["M", "D", "--batch=4096"],
    ["M", "D", "--json=r.json", "--top-k", "07"], ["", "D"], ["M", "D", "--device", "rpi4b-4gb"],
    ["M", "D", "--top-k", "+3"], ["M", "D", "--top-k", " 3"], ["M", "D", "--device", "rpi9"],
]
CLICK_ONLY = [  # errors, help and what click reads its own way: the light parser must hand these over
    ["M", "D", "--top-k", "0"], ["M", "D", "--top-k", "1001"], ["M", "D", "--top-k", "x"],
    ["M", "D", "--format", "xml"], ["M"], [], ["M", "D", "E"], ["M", "D", "--help"], ["-h"], ["M", "D", "--nope"],
    ["M", "D", "--top-k"], ["M", "D", "-o", "-x"], ["M", "D", "-x"], ["M", "D", "--top"],
    ["M", "D", "--batch", "1_0"], ["M", "D", "--threads", "0"],
]


def _click_reading(args):
    """(MODEL, DATA, --json, the options) as the click command reads ``args``, or None where it refuses them."""
    import click

    from edgetrain.cli.options import parse
    from edgetrain.cli.predict import predict
    from edgetrain.errors import UsageError
    from edgetrain.options import PredictOptions

    try:
        ctx = predict.make_context("predict", list(args))
        params = dict(ctx.params)
        return params.pop("model"), params.pop("data"), params.pop("json_path"), parse(PredictOptions, params)
    except (click.exceptions.ClickException, click.exceptions.Exit, UsageError):
        return None


@pytest.mark.parametrize("args", LINES + CLICK_ONLY, ids=lambda a: " ".join(a) or "nothing")
def test_the_light_parser_reads_a_command_line_as_click_does_or_hands_it_to_click(args):
    from edgetrain.cli.predict_fast import parse

    light, declared = parse(args), _click_reading(args)
    if args in LINES:
        assert light is not None and light == declared, (light, declared)
    else:
        assert light is None


def test_help_and_errors_are_clicks(cli):
    res = cli("predict", "--help")
    assert res.code == 0 and "Usage: edgetrain predict [OPTIONS] MODEL DATA" in res.out
    assert "--top-k K" in res.out and "Labels shown per input" in res.out
    assert_user_error(cli("predict", "m.onnx", "d", "--nope"), 2, "No such option '--nope'")
    assert_user_error(cli("predict", "m.onnx"), 2, "Missing argument 'DATA'")


def test_an_interrupt_is_aborted_with_exit_130(models):  # noqa: F811
    """Ctrl-C on the light path ends as on click's: 'Aborted.' and exit code 130, no traceback."""
    import signal
    import time

    env = {k: v for k, v in os.environ.items() if k != "EDGETRAIN_DEBUG"}
    proc = subprocess.Popen([sys.executable, "-m", "edgetrain", "predict", str(models / "fp32.onnx"), "-"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        deadline = time.monotonic() + 120
        while "pipe" not in Path(f"/proc/{proc.pid}/wchan").read_text():  # reading paths from its stdin
            assert proc.poll() is None and time.monotonic() < deadline, "never waited on standard input"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130 and err.strip() == "Aborted." and "Traceback" not in err, err
