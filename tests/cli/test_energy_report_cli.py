"""The energy report is honest and one record (issue 37, item 3), as a user meets it: real runs of profile,
finetune and `energy attribute` on the shipped digits model and tests' models, in child processes, with meter
logs in the formats of tests/fixtures/power (the Otii 3 'Main power' export; a UM34C-style 'timestamp,power (W)'
log) and no board sensor."""
from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time

import pytest

import metertools
from clitools import CliResult, assert_user_error
from metertools import sensor_env
from test_profile_models import conv_gemm_onnx

FAST = ("--warmup", "1", "--runs", "20", "--input-shape", "1,3,16,16")
ASYMMETRIC = re.compile(r"[\d.]+ mJ \+[\d.]+/\u2212[\d.]+ mJ")


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    return conv_gemm_onnx(tmp_path_factory.mktemp("report") / "convgemm.onnx")


def no_sensor(tmp_path):
    return sensor_env(tmp_path / "empty-sys")


def otii_over(path, t0: float, seconds: float, hz: float = 1000.0):
    """An Otii 'Main power' export (tests/fixtures/power/logs/Main power - Arc.csv's readings, tiled) from t0."""
    from pathlib import Path

    fixture = Path(__file__).parents[1] / "fixtures" / "power" / "logs" / "Main power - Arc.csv"
    values = [float(ln.split(",")[1]) for ln in fixture.read_text().splitlines()[1:] if ln.strip()]
    return metertools.otii_export(path, seconds, lambda s: values[int(s * hz) % len(values)], hz), metertools.stamp(t0)


def assert_both_ends(d, where="") -> int:
    """Every interval in a result's JSON is written as its two ends, never as one "plus_minus" figure (ROUND5.md
    L7: `plus_minus_mj` 6.26 for +6.26/−0.16); the count of intervals found."""
    found = 0
    if isinstance(d, dict):
        if d.get("kind") == "interval":
            unit = "mj" if "plus_mj" in d else "j"
            assert {f"plus_{unit}", f"minus_{unit}", f"low_{unit}", f"high_{unit}"} <= d.keys(), (where, d)
            assert not [k for k in d if k.startswith("plus_minus") or k == "relative"], (where, d)
            found += 1
        for k, v in d.items():
            if k.startswith("plus_minus_") and not k.endswith("_g"):  # grams: carbon's own, symmetric only
                assert isinstance(d.get("kind"), str) and d["kind"] != "interval", (where, k, d)
            found += assert_both_ends(v, f"{where}.{k}")
    elif isinstance(d, list):
        found += sum(assert_both_ends(v, f"{where}[{i}]") for i, v in enumerate(d))
    return found


def test_an_interval_is_its_two_ends_in_the_json_and_in_a_runs_summary():
    from edgetrain.energy import uncertainty
    from edgetrain.ops.run import RunResult, StepRun, summarize

    u = uncertainty.modelled(1.0, 0.84, 7.26, "p10-p90 x power range")
    assert (u["plus_j"], u["minus_j"]) == pytest.approx((6.26, 0.16)) and assert_both_ends(u) == 1
    per = uncertainty.per_unit(u, 1)
    assert (per["plus_mj"], per["minus_mj"]) == pytest.approx((6260, 160)) and assert_both_ends(per) == 1
    profile = {"energy": {"per_inference": {"total_mj": 1000.0, "provenance": "modelled", "uncertainty": per}}}
    summary = summarize(RunResult(recipe="r", source="s", rundir="d", device="x",
                                  steps=[StepRun("profile", "done", 0, 1.0, [], "log", profile)]))
    assert (summary["energy_per_inference_plus_mj"], summary["energy_per_inference_minus_mj"]) == pytest.approx(
        (6260, 160))
    assert "energy_per_inference_uncertainty_mj" not in summary  # a "±" that was the plus end alone
    # a standard uncertainty is symmetric: its one figure means what it says
    std = uncertainty.measured(10.0, 2.0, 40, 0.5, 0.05, 0.01, "the file's unit", "a meter")
    assert std["plus_minus_j"] > 0 and assert_both_ends(std) == 0


# --- intervals: +a/−b where the ends differ, ± where they agree: one formatting function -----------------------

def test_one_function_writes_every_interval():
    from edgetrain.energy import EnergyRecord, interval_text
    from edgetrain.run_report import summary_rows

    assert interval_text(1.117, 1.77, 0.063, "mJ") == "1.12 mJ +1.77/\u22120.063 mJ"
    assert interval_text(4.1, 0.3, 0.3, "J") == "4.1 J \u00b1 0.3 J" and interval_text(4.1, None, None, "J") == "4.1 J"
    # the run's report (issue 37: '1.117 mJ ± 1.8 mJ' beside a detail line saying +1.77/−0.063)
    rows = dict(summary_rows({"energy_per_inference_mj": 1.117, "energy_per_inference_uncertainty_mj": 1.77,
                              "energy_per_inference_plus_mj": 1.77, "energy_per_inference_minus_mj": 0.063,
                              "energy_provenance": "modelled"}))
    assert rows["energy per inference"] == "1.117 mJ +1.77/\u22120.063 mJ [modelled]"
    rows = dict(summary_rows({"energy_per_inference_mj": 1.583, "energy_per_inference_plus_mj": 0.61,
                              "energy_per_inference_minus_mj": 0.61, "energy_provenance": "measured"}))
    assert rows["energy per inference"] == "1.583 mJ \u00b1 0.61 mJ [measured]"
    # a record read back from a result: the same text from its JSON as from itself
    rec = EnergyRecord.of({"total_mj": 2.0, "provenance": "modelled", "source": "s",
                           "uncertainty": {"kind": "interval", "plus_mj": 0.5, "minus_mj": 0.1}})
    assert EnergyRecord.of(json.loads(json.dumps(rec.to_dict()))).text() == rec.text()
    assert rec.text().startswith("2 mJ +0.5/\u22120.1 mJ (modelled, ")


def test_profile_writes_an_asymmetric_interval_as_plus_minus_in_every_renderer(cli, onnx_file, tmp_path):
    report, js = tmp_path / "r.html", tmp_path / "r.json"
    res = cli("profile", onnx_file, "--device", "rpi4b-4gb", "--threads", "2", "--country", "DE", "--report", report,
              "--json", js, *FAST, env=no_sensor(tmp_path))
    assert res.code == 0, res.err
    pi = json.loads(js.read_text())["energy"]["per_inference"]
    u = pi["uncertainty"]
    assert u["kind"] == "interval" and f"{u['plus_mj']:.2g}" != f"{u['minus_mj']:.2g}"  # the p10-p90 x power range
    assert pi["machine"] == "device" and pi["total_mj"] > 0  # the JSON keeps its names, and says what it is of
    assert assert_both_ends(json.loads(js.read_text())) >= 1
    line = next(ln for ln in res.out.splitlines() if ln.startswith("energy "))
    assert ASYMMETRIC.search(line) and "\u00b1" not in line
    carbon = next(ln for ln in res.out.splitlines() if ln.startswith("carbon "))
    assert "/\u2212" in carbon and " to " not in carbon  # grams: the same +a/−b
    html = report.read_text(encoding="utf-8")
    assert ASYMMETRIC.search(html) and "mJ \u00b1" not in html


# --- the thread count that ran (issue 37: 'capped to 2', then threads 4 everywhere): tests/cli/test_profile_cli.py


# --- fine-tune energy modelled from the device's speed, one-time host work left out -----------------------------

def test_finetune_energy_on_a_device_is_host_time_x_its_speed_factor_without_the_one_time_work(cli, tmp_path):
    """Two runs of the same job, the first with a cold cache (it exports the model: one-time host work, 8 s of
    it in issue 37's 20.7 J against 1.8 J): each figure is the training's host seconds x the device's speed factor
    x its power, the one-time work named beside it and not in it."""
    env = {**no_sensor(tmp_path), "EDGETRAIN_CACHE_DIR": str(tmp_path / "cold-cache")}
    runs = []
    for name in ("first", "second"):
        js = tmp_path / f"{name}.json"
        res = cli("finetune", "edgetrain.nets:pretrained_digits", "--data", "builtin:digits", "-o", tmp_path / name,
                  "--epochs", "2", "--device", "rpi4b-4gb", "--json", js, env=env, cwd=tmp_path)
        assert res.code == 0, res.err
        runs.append((json.loads(js.read_text()), res.out))
    for r, out in runs:
        e = r["energy"]
        assert e["provenance"] == "modelled" and e["machine"] == "device"
        assert assert_both_ends(r) >= 1
        ref = e["speed"]["reference"]
        assert e["speed_factor"] == pytest.approx(ref["device_ms"] / ref["host_ms"])  # as profile scales latency
        # in CPU time, which a busy host does not stretch: over the device's busy threads (all of the time, or one
        # at a time), the figure between the two
        assert e["speed"]["basis"] == "cpu" and ref["host_ms"] == ref["host_cpu_ms"]
        most, busy = e["host_cpu_seconds"] * e["speed_factor"], min(e["threads"], 4)  # a Pi 4 has 4 cores
        assert e["device_seconds_range"] == pytest.approx([most / busy, most])
        assert e["seconds"] == pytest.approx((most + most / busy) / 2)
        assert e["joules"] == pytest.approx(e["power_w"] * e["seconds"])
        assert e["uncertainty"]["low_j"] < e["joules"] < e["uncertainty"]["high_j"]
        once = e["one_time"]
        assert once["in_figure"] is False and once["seconds"] > 0
        # the figure's window is the training alone: it starts once the one-time work has ended
        assert e["meter_windows"]["timed"] == e["wall"]
        assert e["host_seconds"] == pytest.approx(e["wall"][1] - e["wall"][0])
        assert "this host's time x the device's speed factor" in out and "one-time host work" in out
        assert re.search(r"energy    [\d.]+ J \+[\d.]+/\u2212[\d.]+ J \(modelled", out)
        assert "CPU s x its speed factor" in out
    # the speed reference was timed once: the second run, minutes later at most, scales by the same factor
    assert runs[1][0]["energy"]["speed_factor"] == runs[0][0]["energy"]["speed_factor"]
    assert "kept in the per-user cache" in runs[1][0]["energy"]["speed"]["source"]
    # the cold run's export is the one-time work it left out: the second run found it in the cache
    assert runs[0][0]["energy"]["one_time"]["seconds"] > runs[1][0]["energy"]["one_time"]["seconds"]


# --- an off-device measurement: shown as "host, measured", never in the device's place ---------------------------

def test_a_meter_log_on_a_host_finetune_stays_beside_the_devices_modelled_figure(cli, tmp_path):
    t0 = math.floor(time.time()) - 5
    log, start = otii_over(tmp_path / "Main power - Arc.csv", t0, 400.0, hz=100.0)  # covers the run (from t0)
    js = tmp_path / "ft.json"
    # an audit hook in the real child counts the opens of the log: checked before the work and read after it, a
    # log that has not changed since is parsed once (it was three times: two checks and the read)
    hook = ("import runpy, sys\n"
            "log = sys.argv.pop(1)\n"
            "sys.addaudithook(lambda e, a: e == 'open' and str(a[0]) == log and print('OPENED', file=sys.__stderr__))\n"
            "sys.argv[0] = 'edgetrain'\n"
            "runpy.run_module('edgetrain', run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", hook, str(log), "finetune", "edgetrain.nets:pretrained_digits",
                           "--data", "builtin:digits", "-o", str(tmp_path / "o"), "--epochs", "2", "--device",
                           "rpi4b-4gb", "--power-log", str(log), "--power-log-start", start, "--json", str(js)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path,
                          env={**os.environ, **no_sensor(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("OPENED") == 1, proc.stderr
    res = CliResult(proc.returncode, proc.stdout, proc.stderr)
    e = json.loads(js.read_text())["energy"]
    assert e["provenance"] == "modelled" and e["machine"] == "device"  # the device's headline
    here = e["measured_here"]
    assert here["provenance"] == "measured" and here["machine"] == "host" and here["meter"] == "power-log"
    readings = [float(ln.split(",")[1]) for ln in log.read_text().splitlines()[1:]]
    assert min(readings) <= here["power_w"] <= max(readings)  # the log's power, not the device's model
    head, beside = [ln for ln in res.out.splitlines() if ln.startswith("energy ")]
    assert "(modelled, " in head and "(host, measured, meter log Main power - Arc.csv" in beside
    assert "which is not the device" in beside


@pytest.mark.slow
def test_attribute_shows_the_devices_headline_its_interval_and_grams_and_the_meter_as_host_measured(
        cli, onnx_file, tmp_path):
    result = tmp_path / "profile.json"
    res = cli("profile", onnx_file, "--device", "rpi4b-4gb", "--threads", "2", "--meter-export", "--json", result,
              *FAST, env=no_sensor(tmp_path))
    assert res.code == 0, res.err
    d = json.loads(result.read_text())
    assert d["meter_windows"]["on_device"] is False
    t0, seconds = metertools.recording(result)
    log, start = otii_over(tmp_path / "Main power - Arc.csv", t0, seconds)
    for grid, where in ((("--country", "DE"), "Germany"), (("--grid-intensity", "500"), "the grid you gave")):
        out = tmp_path / f"m-{grid[0][2:]}.json"
        res = cli("energy", "attribute", result, log, "--power-log-start", start, *grid, "-o", out)
        assert res.code == 0, res.err
        m = json.loads(out.read_text())
        pi = m["energy"]["per_inference"]
        assert pi["provenance"] == "modelled" and pi["machine"] == "device"  # the device's figure stays the headline
        assert m["energy"]["carbon"]["intensity"]["g_co2e_per_kwh"] > 0
        board = m["host_energy"]["board"][0]
        assert board["machine"] == "host" and board["provenance"] == "measured"
        lines = res.out.splitlines()
        head = next(ln for ln in lines if ln.startswith("device "))
        assert "rpi4b-4gb" in head and ASYMMETRIC.search(head) and "(modelled, " in head
        carbon = next(ln for ln in lines if ln.startswith("carbon "))
        assert where in carbon and "CO2e" in carbon
        host = next(ln for ln in lines if ln.startswith("host "))
        assert "[host, measured, this machine is not the device]" in host and " mJ \u00b1 " in host
    # the grid's options are profile's and finetune's: refused as there, in one line, nothing written
    for args, frag in ((("--country", "XX"), "--country"),
                       (("--country", "DE", "--grid-intensity", "300"), "--country"),
                       (("--grid-intensity", "nan"), "--grid-intensity")):
        res = cli("energy", "attribute", result, log, "--power-log-start", start, *args, "-o", tmp_path / "bad.json")
        assert_user_error(res, 2, frag)
        assert not (tmp_path / "bad.json").exists()
