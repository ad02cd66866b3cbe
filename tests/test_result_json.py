"""The JSON every result writes (``--json``, a recipe's steps/VERB.json, result.json) keeps its shape: the
keys, in order, and the kind of each value, of real results on tiny inputs, against result_shapes.json
(recorded from the results before their nested figures were typed). Users' scripts and `edgetrain run`
read these keys back."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from edgetrain import api

SHAPES = Path(__file__).with_name("result_shapes.json")
MODEL = "edgetrain.nets:pretrained_digits"  # the shipped base: digits 0-4


def shape(value):
    """Keys in order and the JSON kind of every value; a list by the distinct shapes of its objects (how
    many there are, and a list of plain values, depend on the host: a warning, a note)."""
    if isinstance(value, dict):
        return [[k, shape(v)] for k, v in value.items()]
    if isinstance(value, list):
        items = []
        for s in (shape(v) for v in value if isinstance(v, dict)):
            if s not in items:
                items.append(s)
        return items or "list"
    return "null" if value is None else {bool: "bool", int: "int", float: "float", str: "str"}[type(value)]


def as_json(result) -> dict:
    d = json.loads(json.dumps(result.to_dict(), default=str))
    for check in d.get("checks", []) if isinstance(d.get("checks"), list) else []:
        check["details"] = {}  # doctor's: what each probe found on this host
    return _energy_elided(d)


def _energy_elided(value):
    """Energy figures (and their provenance) are shaped by the energy work, not here: kept as {} or None."""
    if isinstance(value, dict):
        return {k: ({} if k == "energy" and v is not None else _energy_elided(v)) for k, v in value.items()}
    return [_energy_elided(v) for v in value] if isinstance(value, list) else value


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    from edgetrain.data import load_data
    from edgetrain.ops.doctor import run_checks
    from edgetrain.preprocess import Preprocess

    tmp = tmp_path_factory.mktemp("shapes")
    x, y = load_data("builtin:digits", Preprocess(input_shape=(1, 8, 8), mean=(0.0,), std=(1.0,))).arrays()
    d5 = str(tmp / "d5.npz")  # the base model's classes only
    np.savez(d5, data=x[y < 5][:120, 0], label=y[y < 5][:120])
    images = tmp / "images"
    images.mkdir()
    from PIL import Image

    for i in range(3):
        Image.fromarray((np.random.RandomState(i).rand(8, 8) * 255).astype("uint8")).save(images / f"{i}.png")
    out = {
        "export_data": api.export(MODEL, tmp / "m.onnx", data=d5, progress=None),
        "export": api.export(MODEL, tmp / "m2.onnx", progress=None),
        "quantize": api.quantize(MODEL, d5, tmp / "q.onnx", val=d5, samples=50, threads=1, scheme="rule",
                                 progress=None),
        "quantize_no_val": api.quantize(MODEL, d5, tmp / "qn.onnx", samples=20, threads=1, latency=False,
                                        scheme="rule", progress=None),
        "quantize_mxnet": api.quantize(MODEL, d5, tmp / "qmx", val=d5, samples=50, backend="mxnet", threads=1,
                                       progress=None),
        "inspect": api.inspect(MODEL, data=d5),
        "inspect_no_data": api.inspect(MODEL),
        "doctor": run_checks(),
    }
    out["predict"] = api.predict(tmp / "q.onnx", d5, top_k=3, progress=None)
    out["predict_unlabelled"] = api.predict(tmp / "m.onnx", images, progress=None)
    recipe = tmp / "r.yaml"
    recipe.write_text(f"name: shapes\ndevice: rpi4b-4gb\nmodel: {MODEL}\ndata: {d5}\nval_split: 0.3\nseed: 0\n"
                      "steps:\n  - quantize:\n      samples: 50\n  - export:\n  - report:\n")
    out["run"] = api.run(recipe, rundir=tmp / "run", progress=None)
    out_of_tolerance = tmp / "r2.yaml"  # exit 3: the export step's check fails, the run goes on
    out_of_tolerance.write_text(recipe.read_text().replace("  - export:\n", "  - export:\n      atol: 1.0e-12\n"
                                                                            "      rtol: 1.0e-12\n"))
    out["run_check_failed"] = api.run(out_of_tolerance, rundir=tmp / "run2", progress=None)
    bad = tmp / "r3.yaml"  # exit 2: ten classes of data for a five-class model
    bad.write_text(recipe.read_text().replace(d5, "builtin:digits"))
    out["run_bad_input"] = api.run(bad, rundir=tmp / "run3", progress=None)
    return {name: as_json(res) for name, res in out.items()}


def test_every_result_keeps_the_keys_and_kinds_it_had(results):
    expected = json.loads(SHAPES.read_text())
    assert sorted(results) == sorted(expected)
    for name, got in results.items():
        assert shape(got) == expected[name], name


def test_the_recipe_runs_cover_pass_check_failed_and_bad_input(results):
    assert [results[k]["exit_code"] for k in ("run", "run_check_failed", "run_bad_input")] == [0, 3, 2]
    assert results["run_check_failed"]["failed_step"] == "export"
    assert results["run_check_failed"]["failed_checks"][0].startswith("step 'export' budget not met (exit 3): ONNX output")
    assert results["run_bad_input"]["failed_checks"] == [
        f"step 'quantize' bad input (exit 2): {results['run_bad_input']['steps'][0]['error']}"]
    assert results["run"]["passed"] and results["run"]["failed_checks"] == []
    assert results["doctor"]["healthy"] is True and results["doctor"]["exit_code"] == 0
    assert results["doctor"]["passed"] is True and results["doctor"]["failed_checks"] == []


def test_doctor_lists_each_failed_check_and_keeps_exit_1():
    from edgetrain.ops.doctor import FAIL, OK, Check, DoctorReport

    report = DoctorReport([Check("python", OK, "3.11"), Check("onnx", FAIL, "onnx is not installed", "pip install onnx")])
    assert not report.healthy and not report.passed and report.exit_code == 1
    assert report.failed_checks == ["check 'onnx' failed: onnx is not installed"]
    d = report.to_dict()
    assert (d["healthy"], d["exit_code"], d["passed"]) == (False, 1, False) and d["failed_checks"] == report.failed_checks


def measured_cases():
    """The measured scheme record and latency for each kind of winner, on candidates as the search leaves them
    (fp32 is timed as the reference and never wins: issue 37)."""
    from types import SimpleNamespace

    from edgetrain.int8.scheme import choose_scheme
    from edgetrain.int8.search import Candidate
    from edgetrain.ops.quantize import _measured_latency, _measured_scheme

    rule = choose_scheme("x86_64", {"avx2": True, "vnni": True}, "this host")
    host = SimpleNamespace(cpu="Some CPU", arch="x86_64")
    out = {}
    for winner in ("static", "dynamic"):
        cands = [Candidate("fp32", "fp32", None, size_bytes=4000, top1=90.0, drop=0.0, within_budget=True, p50_ms=2.0,
                           p90_ms=2.5, rounds=[2.0, 2.1], pids=[1, 2], threads=1,
                           excluded="the fp32 reference: quantize writes an int8 model"),
                 Candidate(rule.name, "static", rule, size_bytes=1000, top1=89.5, drop=0.5, within_budget=True,
                           p50_ms=1.0, p90_ms=1.2, rounds=[1.0, 1.1], pids=[3, 4], threads=1, rule=True),
                 Candidate("dynamic (MatMul/Gemm int8)", "dynamic", size_bytes=2000, top1=None, error="quantizing "
                           "failed: no" if winner != "dynamic" else None, p50_ms=0.5 if winner == "dynamic" else None)]
        chosen = next(c for c in cands if c.kind == winner)
        chosen.chosen = True
        out[winner] = {"scheme": _measured_scheme(chosen, cands, rule, host, 1).to_dict(),
                       "latency": _measured_latency(cands, 1, None, host).to_dict()}
    return json.loads(json.dumps(out))


def test_the_measured_scheme_and_latency_records_are_as_before():
    got, expected = measured_cases(), json.loads(SHAPES.with_name("result_measured.json").read_text())
    assert got == expected and shape(got) == shape(expected)  # the values, and the keys in order
