"""The fleet's round-by-round report is a section of edgetrain's report: the fleet's own page
(RUNDIR/fleet-report.html) is the run report's page holding it, and a recipe's report step naming a
fleet RUNDIR puts the same section, with the figures of RUNDIR/fleet.json, into the run's report."""
from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from clitools import assert_user_error, edited_copies, run_edgetrain
from edgetrain.fleet.report import HTML, RESULT, html_section
from edgetrain.ops.fleet import _result
from edgetrain.options import FleetServeOptions
from edgetrain.run_report import STYLE


def _participant(name: str, seconds: float, rss: float, up: int, joules: float) -> dict:
    """One device's entry in a round, as the coordinator records it (the device's metrics and facts)."""
    return {"client": name, "node_id": hash(name) % 1000, "device": "rpi4b-4gb",
            "energy_provenance": "modelled (rpi4b-4gb)", "num_examples": 90, "seconds": seconds,
            "train_seconds": seconds / 2, "peak_rss_mb": rss, "bytes_up": up, "bytes_up_fp32": 4 * up,
            "train_loss": 1.0, "train_accuracy": 0.5, "joules": joules, "threads": 1}


ROUNDS = [
    {"round": 1, "participants": [_participant("alpha", 3.25, 281.0, 19556, 11.74),
                                  _participant("beta", 3.62, 279.4, 19556, 13.14)],
     "refused": [], "failed": [], "missing": [4242], "updates": 2, "updated": True, "bytes_up": 39112,
     "bytes_up_fp32": 156448, "bytes_down": 308544, "accuracy": 0.2511, "seconds": 15.2, "available": 3},
    {"round": 2, "participants": [_participant("alpha", 6.56, 288.3, 19556, 23.67)],
     "refused": [{"node_id": 7, "client": "gamma", "reason": "model mismatch: 'w' is 10x32 there but 5x32 here"}],
     "failed": [], "missing": [], "updates": 1, "updated": True, "bytes_up": 19556, "bytes_up_fp32": 78224,
     "bytes_down": 205696, "accuracy": 0.4311, "seconds": 17.3, "available": 3},
]


@pytest.fixture
def fleet_run(tmp_path) -> Path:
    """A fleet RUNDIR whose fleet.json and fleet-report.html are written by `fleet serve`'s own code."""
    rundir = tmp_path / "fleet-run"
    rundir.mkdir()
    state = {"model": "edgetrain.nets:pretrained_digits", "completed": 2, "initial_accuracy": 0.0911, "rounds": ROUNDS}
    opts = FleetServeOptions(val="val.npz", out=str(rundir), rounds=2, codec="int8", train_layers="last:2")
    _result(state, rundir, "127.0.0.1:9092", False, opts, 0, [])
    return rundir


def _check_figures(text: str) -> None:
    """Every round's figures from fleet.json: accuracy, who took part, bytes, per-device time, RSS, energy."""
    for r in ROUNDS:
        assert f"{r['accuracy']:.4f}" in text and str(r["bytes_up"]) in text and str(r["bytes_down"]) in text
        for p in r["participants"]:
            assert f"{p['client']} (rpi4b-4gb): {p['seconds']:.1f}s, peak {p['peak_rss_mb']:.0f} MB" in text
            assert f"{p['joules']:.2f} J" in text
    assert "2 of 3" in text and "1 of 2" in text  # updates of devices asked: a missing one, a refused one
    assert "24.88" in text  # round 1's energy over its devices, 11.74 + 13.14 J
    assert "no answer within the round timeout: node 4242" in text and "refused: gamma" in text
    assert "--train-layers last:2" in text and "0.0911 before, 0.4311 after" in text


def test_the_fleets_page_is_the_report_page_with_the_fleet_section(fleet_run):
    doc = json.loads((fleet_run / RESULT).read_text())
    assert doc["train_layers"] == "last:2" and [r["accuracy"] for r in doc["rounds"]] == [0.2511, 0.4311]
    page = (fleet_run / HTML).read_text()
    assert STYLE in page and html_section(doc) in page
    _check_figures(html.unescape(page))


def _recipe(folder: Path, fleet: str, fmt: str = "html") -> Path:
    recipe = folder / "recipe.yaml"
    recipe.write_text("name: fleet-report\ndevice: rpi4b-4gb\nmodel: edgetrain.nets:pretrained_digits\n"
                      f"data: builtin:digits\nsteps:\n  - report:\n      format: {fmt}\n      fleet: {fleet}\n")
    return recipe


@pytest.mark.parametrize("fmt", ["html", "md"])
def test_a_recipes_report_step_includes_a_fleet_run(fleet_run, tmp_path, fmt):
    recipe = _recipe(tmp_path, "fleet-run", fmt)  # relative to the recipe's folder
    res = run_edgetrain("run", recipe, "-o", tmp_path / "out", "--json", "-", cwd=tmp_path)
    assert res.code == 0, res.err
    step = json.loads(res.out)["steps"][-1]
    assert step["result"]["fleet"] == str(fleet_run)
    text = (tmp_path / "out" / f"report.{fmt}").read_text()
    if fmt == "html":
        assert "<section id='fleet'>" in text and "<h1>edgetrain run: fleet-report</h1>" in text and STYLE in text
        text = html.unescape(text)
    else:
        assert "## Fleet: edgetrain.nets:pretrained_digits" in text
    _check_figures(text)


def test_a_report_step_naming_no_fleet_run_is_refused_before_anything_runs(fleet_run, tmp_path):
    (tmp_path / "empty").mkdir()
    res = run_edgetrain("run", _recipe(tmp_path, "empty"), "-o", tmp_path / "out", cwd=tmp_path)
    assert_user_error(res, 2, "no fleet report", "fleet.json missing", "steps[0].report.fleet")
    (fleet_run / RESULT).write_text("{not json")
    res = run_edgetrain("run", _recipe(tmp_path, "fleet-run"), "-o", tmp_path / "out", cwd=tmp_path)
    assert_user_error(res, 2, "cannot read", "fleet.json", "steps[0].report.fleet")
    assert not (tmp_path / "out").exists()


def test_a_fleet_report_changed_after_the_run_is_refused_in_one_line(fleet_run, tmp_path):
    """A recipe's report step reads fleet.json back: every leaf of one `fleet serve` wrote, changed to a value of
    another kind or deleted, is refused (an edited fleet.json crashed the report at 18 places: 121 of 1,296 edits
    of a real loopback fleet's); the file as written, re-indented, is read."""
    from edgetrain.errors import UsageError
    from edgetrain.fleet.report import read_report
    from edgetrain.results import SEAL

    doc = json.loads((fleet_run / RESULT).read_text())
    assert read_report(fleet_run)["rounds"] == doc["rounds"] and SEAL in doc
    edited_run = tmp_path / "edited"
    edited_run.mkdir()
    (edited_run / RESULT).write_text(json.dumps(doc, indent=1))
    assert read_report(edited_run) == doc
    edits = list(edited_copies(doc, skip=(SEAL,)))
    assert len(edits) > 160
    for _path, edited in edits:
        (edited_run / RESULT).write_text(json.dumps(edited))
        with pytest.raises(UsageError, match="not as `fleet serve` wrote it"):
            read_report(edited_run)
    # through the command: one line, exit 2, before anything runs
    (fleet_run / RESULT).write_text(json.dumps({**doc, "rounds_requested": 7}))
    res = run_edgetrain("run", _recipe(tmp_path, "fleet-run"), "-o", tmp_path / "out", cwd=tmp_path)
    assert_user_error(res, 2, "not as `fleet serve` wrote it", "steps[0].report.fleet")
    assert not (tmp_path / "out").exists()
