"""Energy per inference, the daily budget, battery life, the budget verdict and RAPL reading."""
from __future__ import annotations

import pytest

from edgetrain.devices import load_device
from edgetrain.energy import (daily_budget, energy_for_duration, energy_per_inference, energy_report, parse_rate,
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
