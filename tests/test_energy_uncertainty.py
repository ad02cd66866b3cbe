"""Every energy figure carries its uncertainty (issue 24, item 4): measured figures from the sensor's resolution
and the sampling, modelled ones from the timing spread and the profile's power range.

The sensors are real sysfs-layout trees (tests/fixtures/power, sources in SOURCES.md) copied into tmp_path; a
varying board is the tree's files rewritten between reads, read back by the real reader.
"""
from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from edgetrain.devices import load_device
from edgetrain.energy import measured_per_inference, sensors
from edgetrain.energy.model import energy_for_duration, energy_per_inference, energy_report, figure_text

FIXTURES = Path(__file__).parent / "fixtures" / "power" / "sysfs"
NO_VCGENCMD = "/nonexistent/vcgencmd"


def _ina3221(tmp_path: Path, name: str, shunt_uohm: int) -> tuple[sensors.Source, Path]:
    root = tmp_path / name
    shutil.copytree(FIXTURES / "ina3221-unlabelled", root)
    chip = root / "class" / "hwmon" / "hwmon2"
    for i in (1, 2, 3):
        (chip / f"shunt{i}_resistor").write_text(f"{shunt_uohm}\n")
    src = sensors.detect(root=root, vcgencmd=NO_VCGENCMD)
    assert isinstance(src, sensors.Hwmon)
    return src, chip


def _record(src, chip: Path, n: int, seconds: float = 10.0, currents_ma=(446,)) -> dict:
    """n readings of the real tree over ``seconds``, channel 1's current cycling through ``currents_ma``."""
    samples = []
    for i in range(n):
        (chip / "curr1_input").write_text(f"{currents_ma[i % len(currents_ma)]}\n")
        r = src.read()
        samples.append((i * seconds / (n - 1), r.total_w, r.rails))
    return sensors.summarise(samples, None, (0.0, seconds), src.name, src.describe(), (n - 1) / seconds,
                             resolution=src.resolution())


def test_the_uncertainty_shrinks_with_more_samples(tmp_path):
    src, chip = _ina3221(tmp_path, "board", 100000)
    few = _record(src, chip, 20, currents_ma=(300, 600))
    many = _record(src, chip, 400, currents_ma=(300, 600))
    assert few["power_sd_w"] > 0.5  # the reader saw the rewritten files: 300 and 600 mA at 4.92 V
    u_few, u_many = few["uncertainty"], many["uncertainty"]
    assert u_many["components"]["sampling_j"] < u_few["components"]["sampling_j"] / 3
    assert u_many["components"]["interval_j"] < u_few["components"]["interval_j"] / 10
    assert u_many["plus_minus_j"] < u_few["plus_minus_j"]
    assert u_few["samples"] == 20 and u_many["samples"] == 400


def test_the_uncertainty_grows_with_a_coarser_sensor(tmp_path):
    """The same board behind a 10 mΩ shunt reads current in 4 mA steps (INA3221: 40 µV shunt LSB); behind 0.1 Ω
    in the driver's 1 mA unit. A steady draw: the resolution is the whole of the uncertainty."""
    fine_src, fine_chip = _ina3221(tmp_path, "fine", 100000)
    coarse_src, coarse_chip = _ina3221(tmp_path, "coarse", 10000)
    fine, coarse = _record(fine_src, fine_chip, 50), _record(coarse_src, coarse_chip, 50)
    assert fine["joules"] == pytest.approx(coarse["joules"])
    assert fine["power_sd_w"] == 0
    assert coarse["resolution_w"] > 2 * fine["resolution_w"]
    assert coarse["uncertainty"]["plus_minus_j"] > 2 * fine["uncertainty"]["plus_minus_j"] > 0
    assert "shunt 10 mΩ" in coarse["resolution_source"] and "INA3221" in coarse["resolution_source"]


def test_a_measured_figure_reads_with_its_uncertainty_and_what_measured_it(tmp_path):
    src, chip = _ina3221(tmp_path, "board", 100000)
    rec = _record(src, chip, 120, currents_ma=(400, 500))
    rec.update(inferences=100, timed_runs=100, extra_runs=0, instrument=src.label())
    pi = measured_per_inference(rec)
    u = pi["uncertainty"]
    assert u["plus_minus_mj"] == pytest.approx(rec["uncertainty"]["plus_minus_j"] / 100 * 1000)
    text = figure_text(pi["total_mj"], pi, "mJ")
    assert text.startswith(f"{pi['total_mj']:.3g} mJ ± ") and text.endswith("(measured, hwmon ina3221, 120 samples)")


def test_the_sampler_reports_its_own_cpu_cost(tmp_path):
    src, _ = _ina3221(tmp_path, "board", 100000)
    meter = sensors.PowerMeter(src, idle_s=0).start()
    meter.begin()
    time.sleep(1.0)
    meter.end()
    rec = meter.finish()
    cost = rec["sampler"]
    assert cost["rate_hz"] == sensors.DEFAULT_RATE_HZ and cost["wall_s"] >= 0.9
    assert 0 < cost["cpu_s"] < cost["wall_s"] and cost["core_percent"] == pytest.approx(
        100 * cost["cpu_s"] / cost["wall_s"])
    assert rec["uncertainty"]["samples"] >= 10
    assert not any(c.__dict__.get("_fds") for c in src.channels)  # finish() let go of the sensor files


def test_the_samplers_cost_is_the_cpu_its_reads_take_and_no_more_than_the_process_spent(tmp_path):
    """The figure is what the sampling thread spends: each read here is the real hwmon read then 4 ms of CPU in
    that thread, so the figure holds at least that for every read the thread made, and never more than the
    whole process's CPU time over the same span."""
    src, _ = _ina3221(tmp_path, "board", 100000)
    real_read = src.read

    def costly_read():
        r = real_read()
        until = time.thread_time() + 0.004
        while time.thread_time() < until:
            pass
        return r

    src.read = costly_read
    p0 = time.process_time()
    meter = sensors.PowerMeter(src, idle_s=0).start()
    meter.begin()
    time.sleep(0.6)
    meter.end()
    rec = meter.finish()
    spent = time.process_time() - p0
    in_thread = len(meter.sampler.samples) - 2  # start() and stop() read once each in this thread
    cost = rec["sampler"]
    assert in_thread >= 5 and in_thread * 0.004 <= cost["cpu_s"] <= spent
    assert cost["core_percent"] == pytest.approx(100 * cost["cpu_s"] / cost["wall_s"])


def test_modelled_figures_carry_the_timing_spread_and_the_profiles_power_range():
    pi4 = load_device("rpi4b-4gb")  # idle 2.7 W, load 6.4 W, both measured
    narrow = energy_report(10.0, pi4, threads=1, p10_ms=9.9, p90_ms=10.1)["per_inference"]["uncertainty"]
    wide = energy_report(10.0, pi4, threads=1, p10_ms=8.0, p90_ms=14.0)["per_inference"]["uncertainty"]
    assert wide["plus_mj"] > narrow["plus_mj"] and wide["minus_mj"] > narrow["minus_mj"]
    assert wide["high_mj"] == pytest.approx(14.0 * 6.4)  # p90 x full load
    assert wide["low_mj"] == pytest.approx(8.0 * (2.7 + (6.4 - 2.7) / 4))  # p10 x the line at 1 of 4 cores
    # where the p50 estimate itself may fall (a paired timing's per-round ratios) widens the interval to it,
    # and never narrows it
    ranged = energy_report(10.0, pi4, threads=1, p10_ms=9.9, p90_ms=10.1,
                           p50_range_ms=[7.0, 13.0])["per_inference"]["uncertainty"]
    assert ranged["low_mj"] == pytest.approx(7.0 * (2.7 + (6.4 - 2.7) / 4)) and ranged["high_mj"] == pytest.approx(13.0 * 6.4)
    inside = energy_report(10.0, pi4, threads=1, p10_ms=8.0, p90_ms=14.0,
                           p50_range_ms=[9.5, 10.5])["per_inference"]["uncertainty"]
    assert (inside["low_mj"], inside["high_mj"]) == pytest.approx((wide["low_mj"], wide["high_mj"]))
    nano = load_device("jetson-nano-10w")  # 10 W is a rated budget, not a draw: down to idle
    u = energy_for_duration(100.0, nano, threads=4)["uncertainty"]
    assert u["low_j"] == pytest.approx(100 * 1.9) and u["high_j"] == pytest.approx(1000.0)
    assert "rated" in u["source"]


def test_contention_is_the_runs_lift_over_its_quiet_moments_times_its_shift_from_the_hosts_quietest(
        tmp_path, monkeypatch):
    from edgetrain.energy import reliability
    from edgetrain.measure import contention

    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", str(tmp_path))
    model, ref = [0.02] * 50 + [0.03] * 50, [4.0] * 10 + [5.0] * 10  # fastest ratio 0.005
    first = contention.measure(model, ref, 0.006, "cpu|ref")
    assert not first["quiet_known"] and first["reference_shift"] == 1.0  # the first run is the quietest seen
    assert first["in_run"] == pytest.approx(0.006 / 0.005) and first["drift"] == pytest.approx(1.2)
    drifts = []
    for slower in (1.0, 1.3, 1.6, 2.0):  # whole runs shifted: even the fastest reference run is slower
        c = contention.measure([m * slower for m in model], [r * slower for r in ref], 0.005, "cpu|ref")
        assert c["quiet_known"] and c["reference_quiet_cpu_ms"] == 4.5  # the reference's lowest median here
        assert c["reference_shift"] == pytest.approx(slower) and c["drift"] == pytest.approx(slower)
        drifts.append(c["drift"])
        rel = reliability(1.2, 0.1, 2, 1.2, contention=c)
        flagged = [r for r in rel["reasons"] if "contention on the host" in r]
        assert bool(flagged) == (c["drift"] > 1 + contention.CONTENTION_LIMIT) == (not rel["reliable"])
        if flagged:
            assert f"{c['drift']:.2f}x" in flagged[0] and "4.5 ms" in flagged[0] and rel["contention"] is c
    assert drifts == sorted(drifts)
    # a faster run becomes the host's quiet figure; another key (CPU, reference, runtime) is its own
    assert contention.measure(model, [3.0] * 5, 0.006, "cpu|ref")["reference_shift"] == 1.0
    assert contention.measure(model, ref, 0.006, "cpu|ref")["reference_quiet_cpu_ms"] == 3.0
    assert not contention.measure(model, ref, 0.006, "other|ref")["quiet_known"]
    # no cache folder: nothing remembered, the run's own figure only
    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", "")
    assert not contention.measure(model, ref, 0.006, "cpu|ref")["quiet_known"]


def test_the_modelled_interval_widens_with_the_contention_measured():
    prof = load_device("rpi4b-4gb")
    lows = []
    for drift in (1.0, 1.2, 1.5, 2.0):
        e = energy_per_inference(10.0, prof, threads=1, p10_ms=9.5, p90_ms=11.0, p50_range_ms=[10.0 / drift, 11.0])
        lows.append(e["uncertainty"]["low_mj"])
        assert e["uncertainty"]["low_mj"] <= e["total_mj"] / drift * 1.000001
    assert lows == sorted(lows, reverse=True) and lows[-1] < lows[0]


def test_a_run_where_only_the_model_slowed_is_seen_against_this_models_quietest(tmp_path, monkeypatch):
    """A memory-bound neighbour may slow a cache-resident model and not the reference: neither this run's own
    quiet moments nor the reference's shift shows it; this model's lowest median ratio on this host does."""
    from edgetrain.measure import contention

    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", str(tmp_path))
    model, ref = [0.02] * 50 + [0.021] * 50, [4.0] * 10 + [4.2] * 10
    first = contention.measure(model, ref, 0.0051, "cpu|ref", "model-a")
    assert "against_quietest" not in first  # not seen before
    for slower in (1.0, 1.2, 1.5):
        c = contention.measure([m * slower for m in model], ref, 0.0051 * slower, "cpu|ref", "model-a")
        assert c["in_run"] == pytest.approx(first["in_run"]) and c["reference_shift"] == 1.0
        assert c["against_quietest"] == pytest.approx(slower)  # over its lowest median ratio here
        assert c["drift"] == pytest.approx(max(c["in_run"], c["against_quietest"]))
        assert (c["drift"] > c["limit"]) == (slower > 1.0)
    # another model has its own memory
    assert "against_quietest" not in contention.measure(model, ref, 0.0051, "cpu|ref", "model-b")
    # a run whose own measures say it was not quiet (the reference slowed: the ratio reads low) is not remembered
    low = contention.measure(model, [r * 1.5 for r in ref], 0.0051 / 1.5, "cpu|ref", "model-a")
    assert low["reference_shift"] == pytest.approx(1.5) and low["model_quiet_ratio"] == pytest.approx(0.0051)
    assert contention.measure(model, ref, 0.0051, "cpu|ref", "model-a")["against_quietest"] == pytest.approx(1.0)
