"""edgetrain.energy.sensors: board power sources on generated sensor trees and a fake vcgencmd, the sampling thread,
trapezoid integration, and USB power meter logs."""
from __future__ import annotations

import math
import os
import random
import stat
import sys
import time
from pathlib import Path

import pytest

from edgetrain.energy import meterlog
from edgetrain.energy import sensors as power
from edgetrain.errors import UsageError

# The shape `vcgencmd pmic_read_adc` prints on a Raspberry Pi 5: currents first, then voltages; the number in
# brackets is the ADC channel (different for a rail's current and voltage); EXT5V_V and BATT_V have no current.
PMIC_RAILS = {"3V7_WL_SW": (0.0250, 3.71), "3V3_SYS": (0.1500, 3.31), "1V8_SYS": (0.2100, 1.80),
              "DDR_VDD2": (0.0300, 1.11), "DDR_VDDQ": (0.0000, 0.60), "1V1_SYS": (0.1900, 1.10),
              "0V8_SW": (0.3500, 0.80), "VDD_CORE": (1.9000, 0.87), "3V3_DAC": (0.0001, 3.31),
              "3V3_ADC": (0.0004, 3.31), "0V8_AON": (0.0030, 0.80), "HDMI": (0.0240, 5.09)}


def pmic_output(rails=PMIC_RAILS, scale: float = 1.0) -> str:
    lines = [f"{name + '_A':>13} current({i})={amps * scale:.8f}A" for i, (name, (amps, _)) in enumerate(rails.items())]
    lines += [f"{name + '_V':>13} volt({i + 8})={volts:.8f}V" for i, (name, (_, volts)) in enumerate(rails.items())]
    lines += ["      EXT5V_V volt(24)=5.09066000V", "       BATT_V volt(25)=0.00000000V"]
    return "\n".join(lines) + "\n"


def pmic_watts(rails=PMIC_RAILS, scale: float = 1.0) -> float:
    return sum(a * scale * v for a, v in rails.values())


def fake_vcgencmd(folder: Path, text_file: Path) -> Path:
    """A `vcgencmd` on PATH that prints TEXT_FILE for `pmic_read_adc` (the test changes the file over time)."""
    folder.mkdir(parents=True, exist_ok=True)
    prog = folder / "vcgencmd"
    prog.write_text(f"#!{sys.executable}\nimport sys\n"
                    "if sys.argv[1:] != ['pmic_read_adc']:\n"
                    "    print('error=2 error_msg=\"Invalid arguments\"'); sys.exit(2)\n"
                    f"sys.stdout.write(open({str(text_file)!r}).read())\n")
    prog.chmod(prog.stat().st_mode | stat.S_IXUSR)
    return prog


def write(path: Path, value) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{value}\n")
    return path


def jetson_iio_tree(root: Path, power_files: bool = True) -> Path:
    """Jetson Nano on L4T 32: ina3221x, iio:device0, rail_name_N, in_powerN_input mW (or V and I)."""
    d = root / "bus" / "i2c" / "drivers" / "ina3221x" / "6-0040" / "iio:device0"
    for i, (name, mv, ma) in enumerate([("POM_5V_IN", 5000, 800), ("POM_5V_GPU", 5000, 40), ("POM_5V_CPU", 5000, 300)]):
        write(d / f"rail_name_{i}", name)
        if power_files:
            write(d / f"in_power{i}_input", mv * ma // 1000)
        write(d / f"in_voltage{i}_input", mv)
        write(d / f"in_current{i}_input", ma)
    return d


def jetson_hwmon_tree(root: Path) -> Path:
    """Newer kernels: ina3221, hwmon/hwmonN/inN_label, inN_input mV, currN_input mA."""
    d = root / "bus" / "i2c" / "drivers" / "ina3221" / "1-0040" / "hwmon" / "hwmon3"
    for i, (name, mv, ma) in enumerate([("VDD_IN", 5080, 600), ("VDD_CPU_GPU_CV", 5080, 100), ("VDD_SOC", 5080, 150)],
                                       start=1):
        write(d / f"in{i}_label", name)
        write(d / f"in{i}_input", mv)
        write(d / f"curr{i}_input", ma)
    write(d / "in7_input", 1234)  # a voltage with no current: not a power channel
    return d


# --- the Pi 5 PMIC ------------------------------------------------------------------------------------

def test_pmic_rails_are_paired_by_name_not_by_channel():
    rails = power.parse_pmic(pmic_output())
    assert set(rails) == set(PMIC_RAILS)  # EXT5V and BATT have a voltage only: not rails with power
    for name, (amps, volts) in PMIC_RAILS.items():
        assert rails[name] == pytest.approx(amps * volts, abs=1e-7)


@pytest.mark.parametrize("text", ["", "error=1 error_msg=\"Command not registered\"\n",
                                  "  VDD_CORE_A current(7)=0.50000000A\n",  # a current without its voltage
                                  "  VDD_CORE_V volt(15)=0.87000000V\n",
                                  "VDD_CORE_A current(7)=abcA\nVDD_CORE_V volt(15)=0.8V\n",
                                  "VDD_CORE_A current(7)=nanA\nVDD_CORE_V volt(15)=0.8V\n"])
def test_pmic_without_a_complete_rail_gives_nothing(text):
    assert power.parse_pmic(text) == {}


def test_pmic_garbage_lines_are_skipped_and_order_does_not_matter():
    lines = pmic_output().splitlines()
    random.Random(3).shuffle(lines)
    text = "\n".join(lines[:5] + ["some banner", "  = junk", ""] + lines[5:])
    assert sum(power.parse_pmic(text).values()) == pytest.approx(pmic_watts(), abs=1e-6)


def test_fake_vcgencmd_on_path_is_detected_as_the_pi5_pmic(tmp_path, monkeypatch):
    out = write(tmp_path / "pmic.txt", pmic_output())
    fake_vcgencmd(tmp_path / "bin", out)
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv(power.ENV_VCGENCMD, raising=False)
    src = power.detect(root=tmp_path / "empty-sys")
    assert isinstance(src, power.Pi5Pmic) and src.rate_hz == power.PMIC_RATE_HZ
    r = src.read()
    assert r.total_w == pytest.approx(pmic_watts(), abs=1e-6) and set(r.rails) == set(PMIC_RAILS)


def test_a_pi_without_the_pmic_command_falls_through_to_sysfs(tmp_path, monkeypatch):
    out = write(tmp_path / "pmic.txt", "error=1 error_msg=\"Command not registered\"\n")
    monkeypatch.setenv(power.ENV_VCGENCMD, str(fake_vcgencmd(tmp_path / "bin", out)))
    assert power.detect(root=tmp_path / "empty-sys") is None
    write(tmp_path / "sys" / "class" / "hwmon" / "hwmon0" / "power1_input", 2_500_000)
    assert isinstance(power.detect(root=tmp_path / "sys"), power.Hwmon)


# --- Jetson INA3221 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("power_files", [True, False])
def test_jetson_iio_layout_total_is_the_input_rail(tmp_path, power_files):
    jetson_iio_tree(tmp_path, power_files)
    src = power.detect(root=tmp_path, vcgencmd=str(tmp_path / "no-such-program"))
    assert isinstance(src, power.JetsonIna3221)
    r = src.read()
    assert r.rails == pytest.approx({"POM_5V_IN": 4.0, "POM_5V_GPU": 0.2, "POM_5V_CPU": 1.5})
    assert r.total_w == pytest.approx(4.0)  # the input rail, not the sum (the others are parts of it)
    assert "POM_5V_IN" in src.describe()


def test_jetson_hwmon_layout_reads_millivolts_times_milliamps(tmp_path):
    jetson_hwmon_tree(tmp_path)
    src = power.JetsonIna3221.find(tmp_path)
    r = src.read()
    assert r.rails == pytest.approx({"VDD_IN": 5.08 * 0.6, "VDD_CPU_GPU_CV": 0.508, "VDD_SOC": 5.08 * 0.15})
    assert r.total_w == pytest.approx(5.08 * 0.6)


def test_jetson_sensor_root_comes_from_the_environment(tmp_path, monkeypatch):
    jetson_iio_tree(tmp_path)
    monkeypatch.setenv(power.ENV_SYSFS, str(tmp_path))
    monkeypatch.setenv(power.ENV_VCGENCMD, str(tmp_path / "no-such-program"))
    assert isinstance(power.detect(), power.JetsonIna3221)


# --- generic hwmon ------------------------------------------------------------------------------------

def test_hwmon_power_microwatts_and_voltage_current_pairs(tmp_path):
    hw = tmp_path / "class" / "hwmon"
    write(hw / "hwmon0" / "name", "ina219")
    write(hw / "hwmon0" / "power1_input", 3_200_000)  # µW
    write(hw / "hwmon0" / "in1_input", 5000)  # the same chip's voltage: not counted again
    write(hw / "hwmon0" / "curr1_input", 640)
    write(hw / "hwmon1" / "name", "ina226")
    write(hw / "hwmon1" / "in1_input", 12000)  # mV
    write(hw / "hwmon1" / "curr1_input", 250)  # mA
    write(hw / "hwmon1" / "curr1_label", "fan")
    write(hw / "hwmon1" / "in1_label", "fan")  # the hwmon ABI pairs a voltage and a current by label, not index
    write(hw / "hwmon2" / "name", "coretemp")
    write(hw / "hwmon2" / "temp1_input", 40000)
    src = power.Hwmon.find(tmp_path)
    r = src.read()
    assert r.rails == pytest.approx({"ina219/power1": 3.2, "ina226/fan": 3.0})
    assert r.total_w == pytest.approx(6.2)


def test_no_sensor_anywhere_is_none(tmp_path):
    write(tmp_path / "class" / "hwmon" / "hwmon0" / "temp1_input", 40000)
    write(tmp_path / "class" / "hwmon" / "hwmon0" / "in0_input", 900)  # a voltage alone is not power
    assert power.detect(root=tmp_path, vcgencmd=str(tmp_path / "nothing")) is None


def test_power_off_switch(tmp_path, monkeypatch):
    write(tmp_path / "class" / "hwmon" / "hwmon0" / "power1_input", 1_000_000)
    monkeypatch.setenv("EDGETRAIN_POWER", "off")
    assert power.detect(root=tmp_path) is None


# --- integration --------------------------------------------------------------------------------------

def _times(n, rng, t0=1000.0):
    ts = [t0]
    for _ in range(n - 1):
        ts.append(ts[-1] + rng.uniform(0.01, 0.2))
    return ts


@pytest.mark.parametrize("seed", range(5))
def test_constant_power_integrates_to_power_times_time_over_any_window(seed):
    rng = random.Random(seed)
    ts = _times(50, rng)
    for _ in range(20):
        a, b = sorted(rng.uniform(ts[0], ts[-1]) for _ in range(2))
        r = power.integrate(ts, [4.5] * len(ts), a, b)
        assert r["joules"] == pytest.approx(4.5 * (b - a)) and r["average_w"] == pytest.approx(4.5)
        assert r["samples"] == sum(a < t < b for t in ts) + sum(t in (a, b) for t in ts)


@pytest.mark.parametrize("seed", range(5))
def test_a_linear_ramp_integrates_exactly(seed):
    rng = random.Random(seed)
    ts = _times(40, rng)
    watts = [1.0 + 0.5 * (t - ts[0]) for t in ts]
    a, b = sorted(rng.uniform(ts[0], ts[-1]) for _ in range(2))
    exact = (b - a) * (1.0 + 0.5 * ((a + b) / 2 - ts[0]))
    assert power.integrate(ts, watts, a, b)["joules"] == pytest.approx(exact)


def test_a_window_the_samples_do_not_cover_is_none():
    ts, w = [10.0, 11.0, 12.0], [1.0, 1.0, 1.0]
    assert power.integrate(ts, w, 9.5, 11.0) is None
    assert power.integrate(ts, w, 11.0, 12.5) is None
    assert power.integrate(ts, w, 11.5, 11.0) is None
    assert power.integrate([10.0], [1.0], 10.0, 10.0) is None


class Stepped(power.Source):
    """A source whose power the test sets: the sampler reads it like a sensor."""

    name = "test-source"
    covers = "a power the test sets"
    rate_hz = 100.0

    def __init__(self, watts):
        self.watts = watts

    def read(self):
        return power.Reading(self.watts, {"a": self.watts * 0.25, "b": self.watts * 0.75})


def test_meter_measures_idle_then_work_and_the_energy_above_idle():
    src = Stepped(2.0)
    meter = power.PowerMeter(src, idle_s=0.3).start()
    meter.idle()
    src.watts = 5.0
    time.sleep(0.05)  # let a sample at the new level in before the window opens
    t0 = meter.begin()
    time.sleep(0.5)
    t1 = meter.end()
    rec = meter.finish()
    assert rec["available"] and rec["provenance"] == "measured" and rec["source"] == "test-source"
    assert rec["joules"] == pytest.approx(5.0 * (t1 - t0), rel=1e-6)
    assert rec["idle_w"] == pytest.approx(2.0, rel=0.1)  # the last idle samples may straddle the step
    assert rec["joules_above_idle"] == pytest.approx(3.0 * (t1 - t0), rel=0.1)
    assert rec["rails"]["a"]["joules"] == pytest.approx(0.25 * rec["joules"])
    assert rec["samples"] >= 10 and rec["idle"]["samples"] >= 5
    assert rec["rate_hz"] == 100.0


def test_sampler_read_errors_are_counted_not_fatal():
    class Flaky(Stepped):
        n = 0

        def read(self):
            self.n += 1
            if self.n % 2:
                raise OSError("sensor busy")
            return super().read()

    s = power.Sampler(Flaky(1.0), rate_hz=200).start()
    time.sleep(0.1)
    samples = s.stop()
    assert s.errors > 0 and len(samples) > 0 and all(w == 1.0 for _, w, _ in samples)


def test_sampling_a_generated_sysfs_tree_in_a_thread(tmp_path):
    f = write(tmp_path / "class" / "hwmon" / "hwmon0" / "power1_input", 3_000_000)
    src = power.Hwmon.find(tmp_path)
    with power.measuring(src, idle_s=0.2) as m:
        f.write_text("6000000\n")
        time.sleep(0.6)
    rec = m.record
    assert rec["available"] and rec["source"] == "hwmon" and rec["samples"] >= 5
    assert 3.0 < rec["average_w"] <= 6.0 and rec["idle_w"] == pytest.approx(3.0)
    assert rec["window"]["t1"] > rec["window"]["t0"] >= rec["idle"]["t1"]


# --- USB power meter logs -----------------------------------------------------------------------------

def meter_log(path: Path, t0: float, t1: float, hz: float = 10.0, watts=lambda t: 4.0, kind: str = "watts",
              sep: str = ",", iso: bool = False) -> Path:
    rows = []
    n = int((t1 - t0) * hz) + 1
    for i in range(n):
        t = t0 + i / hz
        ts = _iso(t) if iso else f"{t:.3f}"
        if kind == "watts":
            rows.append(f"{ts}{sep}{watts(t):.4f}")
        else:
            rows.append(f"{ts}{sep}5.0{sep}{watts(t) / 5.0 * (1000 if kind == 'mA' else 1):.5f}")
    header = {"watts": f"timestamp{sep}watts", "amps": f"Time{sep}Voltage (V){sep}Current (A)",
              "mA": f"unix{sep}V{sep}mA"}[kind]
    path.write_text(header + "\n" + "\n".join(rows) + "\n")
    return path


def _iso(t: float) -> str:
    from datetime import datetime

    return datetime.fromtimestamp(t).isoformat(timespec="milliseconds")


@pytest.mark.parametrize("kind,sep,iso", [("watts", ",", False), ("amps", ",", True), ("mA", ";", False),
                                          ("watts", "\t", True)])
def test_power_log_formats(tmp_path, kind, sep, iso):
    t0 = 1_700_000_000.0
    log = meter_log(tmp_path / "m.csv", t0, t0 + 30, watts=lambda t: 3.0 + 0.1 * (t - t0), kind=kind, sep=sep, iso=iso)
    rec = meterlog.log_record(log, (t0 + 10, t0 + 20), (t0 + 2, t0 + 5))
    assert rec["available"] and rec["source"] == "power-log"
    assert rec["joules"] == pytest.approx(10 * (3.0 + 0.1 * 15), rel=1e-3)
    assert rec["idle_w"] == pytest.approx(3.0 + 0.1 * 3.5, rel=1e-3)
    assert rec["samples"] == 101 and rec["rate_hz"] == pytest.approx(10.0, rel=1e-3)


def test_power_log_in_unix_milliseconds(tmp_path):
    p = tmp_path / "ms.csv"
    p.write_text("time_ms_is_not_a_name,x\n")  # no recognised time column
    with pytest.raises(UsageError, match="no time column"):
        meterlog.read_power_log(p)
    p.write_text("timestamp,power (W)\n1700000000000,2.0\n1700000001000,4.0\n")
    assert meterlog.read_power_log(p) == [(1700000000.0, 2.0), (1700000001.0, 4.0)]


BAD_LOGS = {
    "empty": ("", "is empty"),
    "comments only": ("# nothing\n\n", "is empty"),
    "no time column": ("watts,volts\n1700000001,2\n", "no time column"),
    "no power column": ("timestamp,temperature\n1700000001,2\n1700000002,3\n", "no power column"),
    "volts without amps": ("timestamp,volts\n1700000001,5\n1700000002,5\n", "no current column"),
    "text value": ("timestamp,watts\n1700000001,2.0\n1700000002,abc\n", "line 3"),
    "bad time": ("timestamp,watts\n1700000001,2.0\nyesterday,2.0\n", "line 3"),
    "short row": ("timestamp,volts,amps\n1700000001,5,0.5\n1700000002,5\n", "line 3"),
    "negative watts": ("timestamp,watts\n1700000001,2.0\n1700000002,-1\n", "below the meter's zero"),
    "infinite watts": ("timestamp,watts\n1700000001,2.0\n1700000002,inf\n", "impossible value"),
    "backwards": ("timestamp,watts\n1700000005,2.0\n1700000004,2.0\n", "go back 1 s at line 3"),
    "one reading": ("timestamp,watts\n1700000001,2.0\n", "1 reading"),
    "relative times": ("timestamp,watts\n0.0,2.0\n0.5,2.0\n", "count from the start of its recording"),
    "unitless power": ("timestamp,power\n1700000001,2.0\n", "column 'power' has no unit"),
    "unknown unit": ("timestamp,power (hp)\n1700000001,2.0\n", "unit edgetrain does not know"),
    "binary": (b"\xff\xfe\x00garbage", "cannot read"),
}


@pytest.mark.parametrize("case", sorted(BAD_LOGS))
def test_bad_power_logs_are_one_line_usage_errors(tmp_path, case):
    content, fragment = BAD_LOGS[case]
    p = tmp_path / "bad.csv"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(UsageError) as exc:
        meterlog.read_power_log(p)
    assert fragment in exc.value.what and str(p) in exc.value.where and exc.value.fix
    assert "\n" not in exc.value.what


def test_missing_or_folder_power_log(tmp_path):
    with pytest.raises(UsageError, match="does not exist"):
        meterlog.read_power_log(tmp_path / "nope.csv")
    with pytest.raises(UsageError, match="is a folder"):
        meterlog.read_power_log(tmp_path)
    with pytest.raises(UsageError, match="is a folder"):
        meterlog.check_power_log(tmp_path)
    assert meterlog.check_power_log(tmp_path / "later.csv").path == tmp_path / "later.csv"  # may be written during the run


def test_a_log_that_misses_the_run_is_refused(tmp_path):
    t0 = 1_700_000_000.0
    log = meter_log(tmp_path / "m.csv", t0, t0 + 30)
    for window in [(t0 - 5, t0 + 5), (t0 + 25, t0 + 35), (t0 + 100, t0 + 110)]:
        with pytest.raises(UsageError, match="the power log covers") as exc:
            meterlog.log_record(log, window)
        assert "clock" in exc.value.fix
    rec = meterlog.log_record(log, (t0 + 1, t0 + 2), (t0 - 10, t0 - 1))  # an idle stretch outside the log: no idle
    assert rec["available"] and "idle_w" not in rec and not math.isnan(rec["joules"])
