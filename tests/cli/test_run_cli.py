"""`edgetrain run`: the quickstart end to end (reduced for speed), resume, and a failing step."""
from __future__ import annotations

import json

import pytest
import yaml

from clitools import run_edgetrain


def reduced_quickstart(tmp_path, **profile_changes):
    """The bundled quickstart with fewer epochs, samples and timed runs: same steps, same data."""
    res = run_edgetrain("recipes", "show", "quickstart", cwd=tmp_path)
    recipe = yaml.safe_load(res.out)
    for step in recipe["steps"]:
        name, opts = next(iter(step.items()))
        if name == "finetune":
            opts["epochs"] = 4
        if name == "quantize":
            opts["samples"] = 100
        if name == "profile":
            opts.update({"warmup": 3, "runs": 20, **profile_changes})
    path = tmp_path / "quick.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False))
    return path


def quickstart_variant(tmp_path, steps, **profile_changes):
    """The reduced quickstart with other steps: a step name keeps its reduced options, a dict replaces it."""
    recipe = reduced_quickstart(tmp_path, **profile_changes)
    data = yaml.safe_load(recipe.read_text())
    reduced = {next(iter(step)): step for step in data["steps"]}
    data["steps"] = [reduced[step] if isinstance(step, str) else step for step in steps]
    recipe.write_text(yaml.safe_dump(data))
    return recipe


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    recipe = reduced_quickstart(tmp)
    res = run_edgetrain("run", recipe, "-o", tmp / "out", cwd=tmp)
    return tmp, recipe, res


def test_quickstart_runs_every_step_and_meets_its_budgets(quick_run):
    tmp, _, res = quick_run
    assert res.code == 0, res.err[-3000:]
    result = json.loads((tmp / "out" / "result.json").read_text())
    assert [s["name"] for s in result["steps"]] == ["finetune", "quantize", "export", "profile", "report"]
    assert all(s["status"] == "done" for s in result["steps"]), result["steps"]
    summary = result["summary"]
    assert summary["finetune_accuracy_pct"] >= 85  # 0-4 base model taught all ten digits on held-out data
    assert summary["accuracy_fp32_pct"] - summary["accuracy_int8_pct"] <= 1.0
    assert summary["size_int8_bytes"] < summary["size_fp32_bytes"]
    assert summary["export_passed"] is True
    assert summary["latency_provenance"] == "estimated"  # this host is not a Pi 4
    assert summary["energy_per_inference_mj"] > 0 and summary["battery_life_days"] > 0
    assert result["device"] == "rpi4b-4gb"


def test_quickstart_run_folder_holds_artifacts_logs_and_report(quick_run):
    tmp, _, res = quick_run
    out = tmp / "out"
    for name in ("model.onnx", "model_int8.onnx", "report.html", "profile.html", "recipe.yaml",
                 "finetune/model-symbol.json", "data/val.npz", "logs/quantize.log", "steps/export.json"):
        assert (out / name).is_file(), name
    assert "report: " in res.out and "battery life" in res.out
    html = (out / "report.html").read_text()
    assert "rpi4b-4gb" in html and "profile.html" in html


def test_resume_skips_complete_steps(quick_run):
    tmp, recipe, _ = quick_run
    res = run_edgetrain("run", recipe, "--resume", tmp / "out", "--json", "-", cwd=tmp)
    assert res.code == 0, res.err[-2000:]
    steps = res.json()["steps"]
    assert [s["status"] for s in steps[:4]] == ["skipped (complete)"] * 4


def test_budget_failure_is_exit_3_with_the_report_written(tmp_path):
    recipe = quickstart_variant(tmp_path, ["export", "profile", "report"], budget_mj=0.000001)
    res = run_edgetrain("run", recipe, "-o", tmp_path / "out", "--json", "-", cwd=tmp_path)
    assert res.code == 3, res.err[-2000:]
    out = res.json()
    assert out["failed_step"] == "profile"
    assert [s["status"] for s in out["steps"]] == ["done", "budget not met", "done"]
    assert (tmp_path / "out" / "report.html").is_file()


def test_failed_step_stops_the_run_and_keeps_earlier_work(tmp_path):
    recipe = quickstart_variant(tmp_path, [{"export": {}}, {"finetune": {"epochs": 1, "memory_budget": "1MB"}},
                                           {"profile": {}}])
    res = run_edgetrain("run", recipe, "-o", tmp_path / "out", "--json", "-", cwd=tmp_path)
    assert res.code == 2, res.err[-2000:]
    out = res.json()
    assert out["failed_step"] == "finetune"
    assert [s["name"] for s in out["steps"]] == ["export", "finetune"]  # profile never ran
    assert out["steps"][1]["error"] and "budget" in out["steps"][1]["error"].lower()
    assert (tmp_path / "out" / "model.onnx").is_file()
    assert res.err == ""  # --json - is quiet: the JSON on stdout says it all


def test_failed_step_is_named_on_the_terminal(tmp_path):
    recipe = quickstart_variant(tmp_path, [{"finetune": {"epochs": 1, "memory_budget": "1MB"}}, {"export": {}}])
    res = run_edgetrain("run", recipe, "-o", tmp_path / "out", cwd=tmp_path)
    assert res.code == 2
    assert "step 'finetune' bad input (exit 2)" in res.out
    assert "[1/2] finetune: edgetrain finetune" in res.err  # progress on stderr


def test_default_run_folder_never_clashes(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"name": "tiny", "device": "rpi5-8gb", "model": "edgetrain.nets:digits_cnn",
                                      "data": "builtin:digits", "steps": [{"report": {"format": "md"}}]}))
    for _ in range(2):
        res = run_edgetrain("run", recipe, cwd=tmp_path)
        assert res.code == 0, res.err
    assert (tmp_path / "edgetrain-run-tiny" / "report.md").is_file()
    assert (tmp_path / "edgetrain-run-tiny-2" / "report.md").is_file()
    assert "| step | status |" in (tmp_path / "edgetrain-run-tiny-2" / "report.md").read_text()


def test_device_on_the_command_line_overrides_the_recipe(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text(yaml.safe_dump({"name": "tiny", "device": "rpi4b-4gb", "model": "edgetrain.nets:pretrained_digits",
                                      "data": "builtin:digits", "steps": [{"export": {}}, {"report": {}}]}))
    res = run_edgetrain("run", recipe, "-o", tmp_path / "out", "--device", "jetson-nano-10w", "--json", "-",
                        cwd=tmp_path)
    assert res.code == 0, res.err[-2000:]
    out = res.json()
    assert out["device"] == "jetson-nano-10w"
    assert out["steps"][0]["result"]["device"] == "jetson-nano-10w"
    assert "--device" in out["steps"][0]["command"] and "jetson-nano-10w" in out["steps"][0]["command"]
    assert run_edgetrain("run", recipe, "-o", tmp_path / "o2", "--device", "nope", cwd=tmp_path).code == 2


def test_resume_reruns_a_step_that_did_not_pass_and_needs_no_recipe(tmp_path):
    """A step that exits 3 (a check failed: here an export held to zero tolerance) is not 'complete':
    `run --resume RUNDIR` runs it again, with the recipe kept in the run folder (no RECIPE argument)."""
    recipe = quickstart_variant(tmp_path, ["finetune", {"export": {"atol": 0.0, "rtol": 0.0}}])
    first = run_edgetrain("run", recipe, "-o", tmp_path / "out", cwd=tmp_path)
    step = json.loads((tmp_path / "out" / "steps" / "export.json").read_text())
    assert first.code == 3 and step["passed"] is False and step["failed_checks"], first.err[-2000:]
    again = run_edgetrain("run", "--resume", tmp_path / "out", cwd=tmp_path)
    assert again.code == 3, again.err[-2000:]
    assert "finetune: already complete, skipped" in again.err
    assert "export: edgetrain export" in again.err  # run again, not skipped
