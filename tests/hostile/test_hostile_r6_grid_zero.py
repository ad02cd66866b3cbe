"""A grid of 0 g CO2e/kWh (an off-grid solar node, a supply bought fully renewable) is a real figure (ROUND5.md L6):
every command that takes --grid-intensity, and the API, accept 0 and write 0 grams; negative, NaN and infinite
values are still refused in one line."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from clitools import assert_user_error, cli_commands, run_edgetrain
from edgetrain.errors import UsageError

ONNX = str(Path(__file__).resolve().parents[2] / "edgetrain" / "_builtin" / "digits5.onnx")


def _takers():
    for path, cmd in cli_commands():
        model = getattr(cmd.callback, "declared_options", None)
        if model is not None and "grid_intensity" in model.fields:
            yield path, model


def test_every_command_that_takes_a_grid_intensity_takes_0_and_refuses_below_it():
    takers = list(_takers())
    assert {p[-1] for p, _ in takers} >= {"profile", "finetune", "attribute"}, takers
    for path, model in takers:
        required = {name: "x" for name, f in model.fields.items() if f.required}
        for zero in ("0", "-0", 0, 0.0):
            assert model.fields["grid_intensity"].read(zero) == 0.0, (path, zero)
        for bad in ("-1", "-1e-9", -0.5, "nan", "inf", "2000.5"):
            with pytest.raises(UsageError) as refused:
                model.parse({**required, "grid_intensity": bad})
            assert "--grid-intensity" in refused.value.line(), (path, bad)


def test_the_api_takes_a_grid_of_0():
    from edgetrain.energy import carbon

    grid = carbon.grid_intensity(grid_g_per_kwh=0)
    assert grid["g_co2e_per_kwh"] == 0.0
    assert carbon.carbon_of_run({"joules": 12.0, "uncertainty": {"plus_j": 1.0, "minus_j": 0.5}}, grid)["grams"] == 0
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(UsageError, match="--grid-intensity"):
            carbon.grid_intensity(grid_g_per_kwh=bad)


def test_a_runs_summary_keeps_a_grid_of_0():
    """The run's summary took the profile's 0 g/kWh for "none" and fell back to the finetune's (or dropped it)."""
    from edgetrain.ops.run import RunResult, StepRun, summarize

    carbon = {"g_co2e_per_kwh": 0.0, "per_inference_g": 0.0, "intensity": {"source": "--grid-intensity 0"}}
    profile = {"energy": {"per_inference": {"total_mj": 1.0, "provenance": "modelled"}, "carbon": carbon}}
    result = RunResult(recipe="r", source="s", rundir="d", device="x",
                       steps=[StepRun("profile", "done", 0, 1.0, [], "log", profile)])
    summary = summarize(result)
    assert summary["carbon_g_per_kwh"] == 0.0 and summary["carbon_intensity_source"] == "--grid-intensity 0"


def test_profile_with_a_grid_of_0_writes_0_grams(tmp_path):
    out = tmp_path / "p.json"
    res = run_edgetrain("profile", ONNX, "--device", "rpi4b-4gb", "--runs", "5", "--warmup", "1",
                        "--grid-intensity", "0", "--json", out, timeout=300)
    assert res.code == 0, res.err
    carbon = json.loads(out.read_text())["energy"]["carbon"]
    assert carbon["g_co2e_per_kwh"] == 0 and carbon["per_inference_g"] == 0
    line = next(ln for ln in res.out.splitlines() if ln.startswith("carbon "))
    assert "0 g/kWh" in line
    res = run_edgetrain("profile", ONNX, "--device", "rpi4b-4gb", "--grid-intensity", "-1", "--json", out,
                        timeout=300)
    assert_user_error(res, 2, "--grid-intensity", "0 or more")
