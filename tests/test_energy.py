"""Energy per inference, the daily budget, battery life, the budget verdict and RAPL reading."""
from __future__ import annotations

import pytest

from edgetrain.devices import load_device
from edgetrain.energy.model import (daily_budget, energy_for_duration, energy_per_inference, energy_report, parse_rate,
                                    rapl_delta_j, read_rapl)
from edgetrain.errors import UsageError


@pytest.fixture(scope="module")
def pi4():
    return load_device("rpi4b-4gb")  # idle 2.7 W, load 6.4 W (Pi Dramble measurements)


def test_energy_per_inference_is_latency_times_power(pi4):
    e = energy_per_inference(100.0, pi4, "estimated", "scaled from the host")
    assert e["total_mj"] == pytest.approx(0.1 * 6.4 * 1000)
    assert e["above_idle_mj"] == pytest.approx(0.1 * (6.4 - 2.7) * 1000)
    assert e["provenance"] == "modelled"
    assert "estimated" in e["source"] and "pidramble" in e["source"].lower()


def test_daily_budget_counts_idle_between_inferences(pi4):
    d = daily_budget(100.0, pi4, rate_per_h=3600, battery_wh=20)
    busy = 3600 * 24 * 0.1
    joules = busy * 6.4 + (86400 - busy) * 2.7
    assert d["busy_s_per_day"] == pytest.approx(busy)
    assert d["energy_wh_per_day"] == pytest.approx(joules / 3600)
    assert d["busy_wh_per_day"] + d["idle_wh_per_day"] == pytest.approx(d["energy_wh_per_day"])
    assert d["battery_hours"] == pytest.approx(20 / (joules / 86400))
    assert d["battery_days"] == pytest.approx(d["battery_hours"] / 24)
    assert d["inferences_per_wh"] == pytest.approx(3600 * 24 / (joules / 3600))
    assert d["keeps_up"] is True


def test_a_rate_the_device_cannot_serve_is_flagged(pi4):
    d = daily_budget(100.0, pi4, rate_per_h=50000)  # 5000 s of work per hour
    assert d["keeps_up"] is False and "cannot keep up" in d["note"]
    assert d["energy_wh_per_day"] == pytest.approx(6.4 * 24)
    assert d["inferences_per_wh"] is None


def test_energy_report_budget_verdict(pi4):
    ok = energy_report(10.0, pi4, budget_mj=100)
    assert ok["budget"]["passed"] and ok["budget"]["energy_mj"] == pytest.approx(64.0)
    over = energy_report(10.0, pi4, budget_mj=50, rate_per_h="60/h", battery_wh=10)
    assert not over["budget"]["passed"]
    assert over["daily"]["rate_per_h"] == 60 and over["daily"]["battery_wh"] == 10
    cont = energy_report(10.0, pi4, battery_wh=6.4)
    assert cont["continuous"]["battery_hours"] == pytest.approx(1.0)


@pytest.mark.parametrize("text,value", [("120/h", 120.0), ("0.5/h", 0.5), (" 30 / hour ", 30.0)])
def test_parse_rate(text, value):
    assert parse_rate(text) == value


@pytest.mark.parametrize("text", ["120", "120/min", "a/h", "0/h", "-3/h", ""])
def test_parse_rate_rejects(text):
    with pytest.raises(UsageError) as exc:
        parse_rate(text)
    assert exc.value.where == "--rate"


@pytest.mark.parametrize("bad", [0, -1, float("nan")])
def test_energy_report_rejects_non_positive_battery(pi4, bad):
    with pytest.raises(UsageError, match="--battery-wh"):
        energy_report(10.0, pi4, battery_wh=bad)


def test_energy_for_duration_unchanged(pi4):
    e = energy_for_duration(10.0, pi4)
    assert e["joules"] == pytest.approx(64.0) and e["joules_above_idle"] == pytest.approx(37.0)


def _zone(root, name, uj, max_uj=1000):
    z = root / name
    z.mkdir()
    (z / "energy_uj").write_text(f"{uj}\n")
    (z / "max_energy_range_uj").write_text(f"{max_uj}\n")


def test_rapl_reads_package_zones_only_and_handles_wraparound(tmp_path):
    # This host has no powercap; the reader is exercised on the same file layout the kernel exposes.
    _zone(tmp_path, "intel-rapl:0", 900)
    (tmp_path / "intel-rapl:0" / "intel-rapl:0:0").mkdir()  # a sub-zone: part of the package
    _zone(tmp_path, "intel-rapl:1", 100)
    start = read_rapl(tmp_path)
    assert sorted(start["domains"]) == ["intel-rapl:0", "intel-rapl:1"]
    (tmp_path / "intel-rapl:0" / "energy_uj").write_text("100\n")  # wrapped past max 1000
    (tmp_path / "intel-rapl:1" / "energy_uj").write_text("400\n")
    end = read_rapl(tmp_path)
    assert rapl_delta_j(start, end) == pytest.approx((200 + 300) / 1e6)


def test_rapl_absent_or_unreadable_is_none(tmp_path):
    assert read_rapl(tmp_path / "missing") is None
    assert read_rapl(tmp_path) is None  # no zones
    (tmp_path / "intel-rapl:0").mkdir()  # a zone without a readable counter
    assert read_rapl(tmp_path) is None


# --- the steadier model (issue 17) --------------------------------------------------------------------

@pytest.mark.parametrize("threads", [None, 1, 2, 3, 4, 8])
def test_busy_power_is_interpolated_by_busy_cores(pi4, threads):
    from edgetrain.energy.model import busy_power

    watts, how = busy_power(pi4, threads)
    busy = 4 if threads is None else min(threads, 4)
    assert watts == pytest.approx(2.7 + (6.4 - 2.7) * busy / 4)
    assert (f"{busy} of 4 cores" in how) if busy < 4 else ("all 4 cores" in how)


def test_modelled_energy_uses_p50_at_the_threads_used_with_its_spread(pi4):
    e = energy_per_inference(100.0, pi4, "estimated", "scaled", threads=1, p10_ms=90.0, p90_ms=130.0)
    watts = 2.7 + 3.7 / 4
    assert e["total_mj"] == pytest.approx(0.1 * watts * 1000) and e["latency_statistic"] == "p50"
    assert e["above_idle_mj"] == pytest.approx(0.1 * (watts - 2.7) * 1000)
    assert e["spread"]["p10"]["total_mj"] == pytest.approx(0.09 * watts * 1000)
    assert e["spread"]["p90"]["total_mj"] == pytest.approx(0.13 * watts * 1000)
    assert "p50 latency" in e["source"] and "1 of 4 cores busy" in e["source"]


def test_daily_budget_at_one_busy_core(pi4):
    d = daily_budget(100.0, pi4, rate_per_h=3600, threads=1)
    busy = 3600 * 24 * 0.1
    assert d["energy_wh_per_day"] == pytest.approx((busy * (2.7 + 3.7 / 4) + (86400 - busy) * 2.7) / 3600)


@pytest.mark.parametrize("spread,load,cores,ref,reliable", [
    (1.3, 0.5, 2, None, True), (1.3, 2.0, 2, None, True), (1.3, 2.5, 2, None, False), (3.5, 0.1, 2, None, False),
    (1.3, None, 2, None, True), (None, 0.1, 4, 5.0, False), (1.3, 0.1, 4, 1.2, True)])
def test_reliability_flags_a_busy_host(spread, load, cores, ref, reliable):
    from edgetrain.energy.model import reliability

    r = reliability(spread, load, cores, ref)
    assert r["reliable"] is reliable and bool(r["reasons"]) is not reliable


def test_a_measured_figure_leads_the_report_and_the_model_stays_beside_it(pi4):
    from edgetrain.energy.model import measured_per_inference

    rec = {"available": True, "source": "hwmon", "detail": "ina219", "joules": 2.0, "joules_above_idle": 0.5,
           "average_w": 4.0, "idle_w": 3.0, "samples": 11, "rate_hz": 20.0, "inferences": 400, "timed_runs": 200,
           "extra_runs": 200, "window": {"seconds": 0.5, "samples": 11},
           "idle": {"average_w": 3.0, "samples": 20, "seconds": 1.0}, "rails": {"x": {"joules": 2.0}}}
    m = measured_per_inference(rec)
    assert m["total_mj"] == pytest.approx(5.0) and m["above_idle_mj"] == pytest.approx(1.25)
    assert "11 samples at 20 Hz" in m["source"] and "200 timed + 200 untimed" in m["source"]
    rep = energy_report(1.0, pi4, rate_per_h=60, battery_wh=10, budget_mj=4, measured=m, threads=1)
    assert rep["per_inference"].to_dict() == {**m, "machine": "device"}  # the record of it, key for key
    assert rep["modelled_per_inference"]["provenance"] == "modelled"
    assert rep["budget"]["provenance"] == "measured" and not rep["budget"]["passed"]
    d = rep["daily"]
    assert d["provenance"] == "measured"
    assert d["energy_wh_per_day"] == pytest.approx((60 * 24 * 0.005 + (86400 - 60 * 24 * 0.001) * 3.0) / 3600)
    assert measured_per_inference({"available": False}) is None and measured_per_inference(None) is None


def test_energy_meter_without_a_source_models_at_the_busy_cores(pi4):
    from edgetrain.energy.model import EnergyMeter

    m = EnergyMeter(pi4, threads=2, source=None).start()
    rec = m.stop(epochs=2, samples=100)
    assert rec["provenance"] == "modelled" and rec["power_w"] == pytest.approx(2.7 + 3.7 / 2)
    assert rec["joules_per_epoch"] == pytest.approx(rec["joules"] / 2)
    assert rec["joules_per_sample"] == pytest.approx(rec["joules"] / 100)
    assert EnergyMeter(None, source=None).start().stop() is None  # no device, nothing measures: no figure


def test_a_runs_cpu_time_is_read_at_a_fine_resolution_for_the_process_and_its_children(pi4):
    """os.times counts the kernel's 10 ms ticks: about ±5% of a tiny fine-tune's 0.2 s (ROUND5.md L10). The meter's
    host CPU seconds, this process's and its waited-for children's, resolve far finer than a tick."""
    import subprocess
    import sys
    import time

    from edgetrain.energy.model import EnergyMeter

    tick = 0.01
    readings = []
    for _ in range(3):
        m = EnergyMeter(pi4, threads=1, source=None).start()
        end = time.process_time() + 0.003  # 3 ms of this process's CPU...
        while time.process_time() < end:
            pass
        subprocess.run([sys.executable, "-c", "pass"], check=True)  # ...and a child's start-up
        readings.append(m.stop()["host_cpu_seconds"])
    assert all(r > 0.003 for r in readings), readings  # the child's CPU time is in it: more than this process's
    # whole ticks only, three times over, is what a 10 ms clock reads (a fine clock: about never)
    assert any(abs(r / tick - round(r / tick)) > 1e-3 for r in readings), readings


def test_energy_meter_with_a_source_measures(pi4, tmp_path):
    from edgetrain.energy import sensors as power
    from edgetrain.energy.model import EnergyMeter

    f = tmp_path / "class" / "hwmon" / "hwmon0" / "power1_input"
    f.parent.mkdir(parents=True)
    f.write_text("4000000\n")
    meter = EnergyMeter(None, source=power.Hwmon.find(tmp_path)).start()
    import time

    time.sleep(0.3)
    rec = meter.stop(epochs=3, samples=30)
    assert rec["provenance"] == "measured" and rec["meter"] == "hwmon"
    assert rec["joules"] == pytest.approx(4.0 * rec["seconds"]) and rec["joules_per_epoch"] == pytest.approx(
        rec["joules"] / 3)


def test_the_report_lines_say_measured_or_modelled_the_spread_and_when_not_to_trust_it(pi4):
    from edgetrain.energy.model import measured_per_inference, reliability
    from edgetrain.measure import energy_lines

    busy = reliability(1.2, 9.5, 2)
    modelled = energy_report(0.5, pi4, threads=1, p10_ms=0.4, p90_ms=0.8, reliable=busy)
    modelled["reliability"] = busy
    lines = energy_lines(modelled)
    assert "[modelled: p50 latency x 3.62 W at 1 of 4 cores busy]" in lines[0] and "p10-p90 latency" in lines[0]
    assert any(ln.startswith("warning") and "unreliable" in ln and "9.50" in ln for ln in lines)
    assert not any("unreliable" in ln for ln in energy_lines(energy_report(0.5, pi4, threads=1)))
    rec = {"available": True, "source": "pi5-pmic", "detail": "PMIC", "joules": 1.0, "average_w": 5.0, "idle_w": 3.0,
           "joules_above_idle": 0.4, "samples": 12, "rate_hz": 10.0, "inferences": 100, "timed_runs": 100,
           "extra_runs": 0, "window": {"seconds": 0.2, "samples": 12}}
    lines = energy_lines(energy_report(0.5, pi4, measured=measured_per_inference(rec)))
    assert "(measured, pi5-pmic, 12 samples) per inference" in lines[0] and "[100 inferences" in lines[0]
    assert "modelled for comparison" in lines[1]


def test_the_profiles_busy_host_warnings_print_once_from_the_result_field(pi4):
    """``warnings`` is a field of the profile's result; the human output prints it once, with or without the
    device's energy (whose own reliability line is then not repeated)."""
    from edgetrain.energy.model import reliability
    from edgetrain.measure import energy_lines
    from edgetrain.measure.report import text_summary

    busy = reliability(3.4, 9.5, 2)
    e = energy_report(0.5, pi4, threads=1, reliable=busy)
    e["reliability"] = busy
    warnings = [f"the latency and energy figures are unreliable: {r}" for r in busy["reasons"]]
    assert len(warnings) == 2
    config = {"threads": 1, "latency": {"p50_ms": 0.5, "p90_ms": 0.9, "p99_ms": 1.7, "spread_p99_p50": 3.4},
              "memory": {"peak_rss_mb": 61.0}, "load_s": 0.1, "first_inference_ms": 2.0, "provenance": "measured"}
    d = {"model": "m.onnx", "runtime": "onnxruntime", "input_shape": [1, 3, 8, 8], "batch": 1, "configs": [config],
         "best": {"threads": 1, "p50_ms": 0.5, "spread_p99_p50": 3.4},
         "prediction": {"peak_rss_mb": 60.0, "measured_peak_rss_mb": 61.0, "error_pct": -1.6}, "verdict": {},
         "energy": e, "host_energy": {}, "notes": [], "warnings": warnings, "reliability": busy}
    lines = [ln for ln in text_summary(d) if ln.startswith("warning")]
    assert lines == [f"warning    {w}" for w in warnings]
    assert not any("unreliable" in ln for ln in energy_lines(e, warn=False))
