"""A fleet run ends with deployable models (issue 25, item 6): a real loopback fleet (coordinator and two
devices as `edgetrain fleet` processes) writes RUNDIR/model, and the real `edgetrain predict` and
`edgetrain profile` commands take every file it names; its report reads whole in a real browser (headless
Chromium, tests/browser.py) at phone and desktop widths, with the accuracy chart."""
from __future__ import annotations

import json

import pytest

pytest.importorskip("flwr")

import browser  # noqa: E402
from clitools import assert_user_error, run_edgetrain  # noqa: E402
from fleettools import Fleet, make_shares, report  # noqa: E402


@pytest.fixture(scope="module")
def shares(tmp_path_factory):
    return make_shares(tmp_path_factory)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory, shares):
    """One real fleet run, 2 devices, 2 rounds, --export int8: its RUNDIR and fleet.json."""
    folder = tmp_path_factory.mktemp("fleet-deploy")
    f = Fleet(folder, tmp_path_factory.mktemp("fleet-cache"))
    f.shares = shares
    run = folder / "run"
    try:
        f.serve(run, "--rounds", 2, "--min-clients", 2, "--export", "int8", "--json", folder / "r.json")
        for d in range(2):
            f.join(f"device{d}", shares["devices"][d])
        code, _, err = f.wait("serve")
        assert code == 0, err
        for d in range(2):
            assert f.wait(f"device{d}", timeout=60)[0] == 0
    finally:
        left = f.close()
    assert not left, f"processes outlived the fleet: {left}"
    return run, report(run)


def _predict(model: str, data: str, tmp_path) -> dict:
    res = run_edgetrain("predict", model, data, "--format", "csv", "-o", tmp_path / "p.csv", "--json", "-",
                        "--threads", 1)
    assert res.code == 0, res.err
    return json.loads(res.out)


@pytest.mark.slow
def test_the_fleet_json_names_the_models_and_predict_and_profile_take_them(deployed, shares, tmp_path):
    run, res = deployed
    assert set(res["models"]) == {"prefix", "onnx", "int8"} and res["passed"], res
    for kind, path in res["models"].items():
        assert path.startswith(str(run / "model")), path
        files = [path + "-symbol.json", path + "-0000.params"] if kind == "prefix" else [path]
        assert all(__import__("os").path.isfile(p) for p in files), files
    assert not list(run.glob(".model.*")), "a temporary folder was left behind"
    n_val = None
    for kind in ("onnx", "int8"):
        out = _predict(res["models"][kind], shares["val"], tmp_path)
        # the model carries the fleet's class names and preprocessing: predict labels the held-out data by them
        assert out["classes"] == [str(c) for c in range(10)]
        n_val = out["accuracy"]["samples"]
        top1 = out["accuracy"]["top1"] / 100.0
        if kind == "onnx":  # the same weights the coordinator's held-out check measured, through one ONNX graph
            assert abs(top1 - res["final_accuracy"]) <= 1.0 / n_val, (top1, res["final_accuracy"])
        else:
            assert abs(top1 - res["final_accuracy"]) <= 0.05, (top1, res["final_accuracy"])
    for kind in ("prefix", "onnx", "int8"):
        prof = run_edgetrain("profile", res["models"][kind], "--runs", 3, "--warmup", 1, "--threads", 1, "--json", "-")
        assert prof.code == 0, prof.err
        assert json.loads(prof.out)["passed"]
    # the PREFIX is a model the fine-tune and export commands take too: it is the fleet's, with its classes
    meta = json.loads((run / "model" / "model-edgetrain.json").read_text())
    assert [str(c) for c in meta.get("class_names") or meta.get("preprocess", {}).get("class_names", [])] == \
        [str(c) for c in range(10)], meta


@pytest.mark.slow
@pytest.mark.skipif(browser.chromium() is None, reason="LOUD SKIP: no chromium on PATH, the fleet report was NOT "
                                                       "checked in a browser (apt-get install chromium)")
@pytest.mark.parametrize("width", browser.WIDTHS.values(), ids=browser.WIDTHS.keys())
def test_the_fleet_report_reads_whole_with_its_chart_at_phone_and_desktop_widths(deployed, width, tmp_path):
    run, res = deployed
    page = tmp_path / "fleet-report.html"
    page.write_text((run / "fleet-report.html").read_text(encoding="utf-8"), encoding="utf-8")
    text = page.read_text(encoding="utf-8")
    assert 'aria-label="held-out top-1 per round"' in text and text.count("<circle") == len(res["rounds"]) + 1
    assert "device0" in text and "device1" in text  # devices by the names given to `fleet join --name`
    browser.assert_reads_whole(page, width, tmp_path / f"fleet-{width}.png")


def test_a_round_with_no_accepted_update_is_reported_as_such_in_the_table_and_the_chart(tmp_path):
    from edgetrain.fleet.report import accuracy_svg, html_section, markdown_section

    rounds = [{"round": n, "participants": [], "refused": [], "failed": [], "timed_out": [], "updates": int(ok),
               "updated": ok, "bytes_up": 0, "bytes_up_fp32": 0, "bytes_down": 0, "accuracy": 0.1 * n, "seconds": 1.0}
              for n, ok in ((1, True), (2, False), (3, True))]
    doc = {"model": "m", "rundir": str(tmp_path), "rounds": rounds, "initial_accuracy": 0.05, "rounds_completed": 2,
           "rounds_requested": 3, "codec": "int8", "aggregate": "fedavg", "address": "127.0.0.1:1"}
    svg = accuracy_svg(doc)
    assert svg.count("<circle") == 4 and svg.count('fill="#fff"') == 1 and "round 2: no update accepted" in svg
    for text in (html_section(doc), markdown_section(doc)):
        assert text.count("no update accepted: not completed") == 1


def test_serve_refuses_an_unknown_export_in_one_line(tmp_path):
    res = run_edgetrain("fleet", "serve", "edgetrain.nets:pretrained_digits", "--val", "builtin:digits",
                        "-o", tmp_path / "run", "--export", "tflite")
    assert_user_error(res, 2, "--export")
    assert not (tmp_path / "run").exists()
