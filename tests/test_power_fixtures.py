"""The energy wing's readers on the formats real boards, drivers and meters write (issue 24).

Every fixture is under tests/fixtures/power, named with its public source in SOURCES.md there (what is a
verbatim capture and what was written following the writer's code). sysfs trees are copied into tmp_path
as the driver lays them out; a failing read is a real unreadable file, not a mock.
"""
from __future__ import annotations

import shutil
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from edgetrain.energy import meterlog, measured_per_inference, read_rapl, rapl_delta_j
from edgetrain.energy.model import measured_run
from edgetrain.energy import sensors as power
from edgetrain.errors import UsageError
from test_power import fake_vcgencmd

FIXTURES = Path(__file__).parent / "fixtures" / "power"
NO_VCGENCMD = "/nonexistent/vcgencmd"


def tree(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / "sysfs" / name, dst)
    return dst


def log(name: str) -> Path:
    return FIXTURES / "logs" / name


def test_every_fixture_names_its_source():
    sources = (FIXTURES / "SOURCES.md").read_text()
    names = [p.name for p in (FIXTURES / "logs").iterdir()] + [p.name for p in (FIXTURES / "pmic").iterdir()]
    names += [p.name + "/" for p in (FIXTURES / "sysfs").iterdir()]
    assert names and all(f"`{n}`" in sources or f"`{n}`," in sources for n in names), \
        [n for n in names if f"`{n}`" not in sources]


# --- Raspberry Pi 5 PMIC: a capture under load (Short-bus/pilomar) -------------------------------------

PMIC = (FIXTURES / "pmic" / "pi5-pmic-load.txt").read_text()


def test_pi5_capture_pairs_rails_by_name_and_leaves_out_the_volt_only_lines():
    rails = power.parse_pmic(PMIC)
    assert len(rails) == 12 and "EXT5V" not in rails and "BATT" not in rails
    assert rails["VDD_CORE"] == pytest.approx(5.03652 * 0.8936988)  # current(7) with volt(15): by name
    assert rails["3V3_DAC"] == pytest.approx(0.00006105 * 3.299447)  # current(17) with volt(20)
    assert sum(rails.values()) == pytest.approx(5.9216, abs=1e-4)


def test_pi5_pmic_read_failing_once_at_detection_is_retried(tmp_path, monkeypatch):
    """A vcgencmd that fails its first call (firmware busy), then prints the capture: still the PMIC."""
    out = tmp_path / "pmic.txt"
    out.write_text(PMIC)
    flag = tmp_path / "failed-once"
    prog = tmp_path / "bin" / "vcgencmd"
    fake_vcgencmd(tmp_path / "bin", out)
    body = prog.read_text().replace("sys.stdout.write(", f"import os\nif not os.path.exists({str(flag)!r}):\n"
                                    f"    open({str(flag)!r}, 'w').close(); sys.exit(1)\nsys.stdout.write(")
    prog.write_text(body)
    src = power.detect(root=tmp_path / "empty-sys", vcgencmd=str(prog))
    assert flag.exists() and isinstance(src, power.Pi5Pmic)
    assert src.read().total_w == pytest.approx(5.9216, abs=1e-4)


# --- Jetson INA3221: JetPack 4 (iio), 5/6 (hwmon) ------------------------------------------------------

def test_jetson_nano_jp4_total_is_the_input_rail_and_the_parts_are_beside_it(tmp_path):
    src = power.detect(root=tree("jetson-nano-jp4", tmp_path), vcgencmd=NO_VCGENCMD)
    assert isinstance(src, power.JetsonIna3221)
    r = src.read()
    assert r.total_w == pytest.approx(6.6)  # POM_5V_IN (mW file), not 6.6 + 0.2 + 2.48
    assert r.rails == pytest.approx({"POM_5V_IN": 6.6, "POM_5V_GPU": 0.2, "POM_5V_CPU": 2.48})
    assert src.inputs == ["POM_5V_IN"]
    assert "parts of it, shown beside it and not added: POM_5V_GPU" in src.describe()


def test_jetson_orin_nano_jp6_skips_the_sums_and_counts_vdd_in(tmp_path):
    root = tree("jetson-orin-nano-jp6", tmp_path)
    src = power.detect(root=root, vcgencmd=NO_VCGENCMD)
    assert isinstance(src, power.JetsonIna3221)
    r = src.read()
    assert set(r.rails) == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"}  # not in7 (sum of shunt voltages), not curr4
    assert r.total_w == pytest.approx(5.032 * 0.987)


def test_the_generic_reader_on_a_jetson_chip_does_not_add_the_input_to_its_parts(tmp_path):
    """The same chip seen through /sys/class/hwmon: VDD_IN is the figure there too (was 13.8 W for 5.0 W)."""
    src = power.Hwmon.find(tree("jetson-orin-nano-jp6", tmp_path))
    r = src.read()
    assert r.total_w == pytest.approx(5.032 * 0.987)
    assert src.inputs == ["ina3221/VDD_IN"]


def _unreadable_for(path: Path, seconds: float | None) -> None:
    """Make a sysfs file fail to read (a folder in its place), and restore it after ``seconds`` (None: never)."""
    value = path.read_text()
    path.unlink()
    path.mkdir()

    def restore():
        path.rmdir()
        path.write_text(value)

    if seconds is not None:
        timer = threading.Timer(seconds, restore)
        timer.start()


def test_a_jetson_read_failing_at_detection_is_retried_not_a_switch_to_the_generic_reader(tmp_path, monkeypatch):
    monkeypatch.setattr(power, "DETECT_RETRY_S", 0.3)
    root = tree("jetson-orin-nano-jp6", tmp_path)
    _unreadable_for(root / "bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3/curr1_input", 0.1)
    t0 = time.monotonic()
    src = power.detect(root=root, vcgencmd=NO_VCGENCMD)
    assert time.monotonic() - t0 >= 0.3  # the first read failed and was retried
    assert isinstance(src, power.JetsonIna3221) and not src.skipped
    assert src.read().total_w == pytest.approx(5.032 * 0.987)


def test_an_input_rail_that_never_reads_is_kept_not_replaced_by_its_parts(tmp_path, monkeypatch):
    monkeypatch.setattr(power, "DETECT_RETRY_S", 0.01)
    root = tree("jetson-orin-nano-jp6", tmp_path)
    _unreadable_for(root / "bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3/curr1_input", None)
    src = power.detect(root=root, vcgencmd=NO_VCGENCMD)
    assert isinstance(src, power.JetsonIna3221) and src.inputs == ["VDD_IN"]
    assert "VDD_IN" in src.skipped[0] and "3 tries" in src.skipped[0]
    with pytest.raises(OSError):
        src.read()  # the sampler counts it as a read error; 0.55 + 1.42 W never passes for the board


def test_jetson_agx_orin_two_chips_without_an_input_rail_sum_their_rails_and_skip_nc(tmp_path):
    src = power.detect(root=tree("jetson-agx-orin-jp5", tmp_path), vcgencmd=NO_VCGENCMD)
    r = src.read()
    assert set(r.rails) == {"VDD_GPU_SOC", "VDD_CPU_CV", "VIN_SYS_5V0", "VDDQ_VDD2_1V8AO"}
    assert r.total_w == pytest.approx(19.960 * 0.640 + 19.960 * 0.120 + 5.072 * 0.512 + 5.064 * 0.208)


# --- generic hwmon: mainline drivers ------------------------------------------------------------------

def test_unlabelled_mainline_ina3221_pairs_only_its_three_channels(tmp_path):
    """in4-in7 are shunt µV and curr4 a sum: pairing curr4 with in4 by index invented 20.7 W."""
    src = power.detect(root=tree("ina3221-unlabelled", tmp_path), vcgencmd=NO_VCGENCMD)
    assert isinstance(src, power.Hwmon)
    r = src.read()
    assert set(r.rails) == {"ina3221/in1", "ina3221/in2", "ina3221/in3"}
    assert r.total_w == pytest.approx(4.920 * 0.446 + 3.288 * 0.008 + 3.296 * 0.009)


def test_two_chips_of_one_name_both_count(tmp_path):
    src = power.Hwmon.find(tree("two-ina219", tmp_path))
    r = src.read()
    assert r.rails == pytest.approx({"ina219@hwmon2/power1": 0.176, "ina219@hwmon3/power1": 0.176})  # µW ABI
    assert r.total_w == pytest.approx(0.352)


def test_a_psu_that_reports_its_total_and_its_rails_counts_the_total_once(tmp_path):
    src = power.Hwmon.find(tree("corsair-psu", tmp_path))
    r = src.read()
    assert r.total_w == pytest.approx(174.0)  # not 174 + 134 + 24.5 + 11.5
    assert src.inputs == ["corsairpsu/power total"]
    assert r.rails["corsairpsu/power +12v"] == pytest.approx(134.0)


def test_a_measurement_says_which_rails_make_the_figure_and_which_are_parts(tmp_path):
    src = power.Hwmon.find(tree("corsair-psu", tmp_path))
    with power.measuring(src, rate_hz=50, idle_s=0.1) as m:
        time.sleep(0.3)
    rec = m.record
    assert rec["total_of"] == ["corsairpsu/power total"]
    assert set(rec["parts"]) == {"corsairpsu/power +12v", "corsairpsu/power +5v", "corsairpsu/power +3.3v"}
    assert rec["average_w"] == pytest.approx(174.0)
    per = measured_per_inference({**rec, "inferences": 10})
    assert per["measured_by"] == "board sensor" and per["total_of"] == rec["total_of"] and per["parts"] == rec["parts"]
    assert per["total_mj"] == pytest.approx(rec["joules"] / 10 * 1000)  # the total alone, not the rails added


def test_a_channel_label_pairs_voltage_and_current_where_the_index_does_not(tmp_path):
    hw = tree("corsair-psu", tmp_path) / "class" / "hwmon" / "hwmon5"
    for f in hw.glob("power*"):
        f.unlink()  # a PSU without power files: curr2 '+12v' has no 'curr +12v'-labelled voltage
    src = power.Hwmon.find(hw.parents[2])
    assert src is None  # in1 'v_out +12v' is not paired with curr2 'curr +12v' by guesswork


# --- hwmon energy counters (energyN_input, µJ) ------------------------------------------------------------

class _Counters:
    """Drives a tree's energyN_input files as the driver's counters would climb at set powers: each file
    rewritten in place every few ms (right-aligned in a fixed width, so no read sees half a value), from a
    start value given per file. ``wrap32`` prints it as a 32-bit kernel's long does."""

    def __init__(self, chip: Path, watts: dict[str, float], start: dict[str, int], wrap32: bool = False):
        self.files = {n: open(chip / n, "r+") for n in watts}
        self.watts, self.start, self.wrap32 = watts, start, wrap32
        self._stop = threading.Event()
        self._t0 = time.monotonic()
        self._th = threading.Thread(target=self._run, daemon=True)

    def _value(self, name: str, now: float) -> int:
        v = self.start[name] + round(self.watts[name] * (now - self._t0) * 1e6)
        if self.wrap32:
            v %= 2 ** 32
            v = v - 2 ** 32 if v >= 2 ** 31 else v
        return v

    def _run(self):
        while not self._stop.is_set():
            now = time.monotonic()
            for n, f in self.files.items():
                f.seek(0)
                f.write(f"{self._value(n, now):>24d}\n")
                f.flush()
            time.sleep(0.002)

    def __enter__(self):
        self._run_once()
        self._th.start()
        return self

    def _run_once(self):
        for n, f in self.files.items():
            f.seek(0)
            f.write(f"{self._value(n, time.monotonic()):>24d}\n")
            f.flush()

    def __exit__(self, *exc):
        self._stop.set()
        self._th.join()
        for f in self.files.values():
            f.close()


def _measure(src, seconds=1.5):
    with power.measuring(src, rate_hz=20, idle_s=0) as m:
        time.sleep(seconds)
    return m.record


def test_amd_energy_counts_the_socket_and_shows_its_cores_beside_it(tmp_path):
    root = tree("amd-energy", tmp_path)
    chip = root / "class" / "hwmon" / "hwmon3"
    watts = {"energy5_input": 42.0, **{f"energy{i}_input": 6.0 + i for i in range(1, 5)}}
    start = {n: int((chip / n).read_text()) for n in watts}
    with _Counters(chip, watts, start):
        src = power.Hwmon.find(root)
        assert src.inputs == ["amd_energy/Esocket0"]
        rec = _measure(src)
    # loose (the writer thread lags on a loaded host), and far from the socket + its cores (72 W)
    assert rec["average_w"] == pytest.approx(42.0, rel=0.2)
    assert rec["total_of"] == ["amd_energy/Esocket0"] and len(rec["parts"]) == 4
    assert rec["rails"]["amd_energy/Ecore001"]["average_w"] == pytest.approx(8.0, rel=0.2)
    assert "energy5_input counter" in src.describe() and rec["read_errors"] == 0
    assert "1 µJ over" in rec["resolution_source"]


@pytest.mark.parametrize("wrap32", [False, True], ids=["64-bit", "32-bit long printed signed"])
def test_an_energy_counter_is_read_instead_of_the_power_file_and_its_wrap_is_unwrapped(tmp_path, wrap32):
    root = tree("ina238-sq52206", tmp_path)
    chip = root / "class" / "hwmon" / "hwmon1"
    fixed_w = int((chip / "power1_input").read_text()) / 1e6  # one instant; the counter holds the rest
    true_w = 9.0
    # the counter crosses 2^32 µJ about 0.4 s into the measurement
    with _Counters(chip, {"energy1_input": true_w}, {"energy1_input": 2 ** 32 - int(true_w * 0.6e6)}, wrap32):
        src = power.Hwmon.find(root)
        rec = _measure(src)
    assert src.inputs == ["sq52206/energy1"] and "energy1_input counter" in src.describe()
    # the writer thread lags the sampler by some ms, more on a loaded host (load 14 on 2 cores here): loose,
    # where a missed wrap would be 4295 J in one sample and the power file's instant is 6.5 W off
    assert rec["average_w"] == pytest.approx(true_w, rel=0.2) and abs(rec["average_w"] - fixed_w) > 4
    assert rec["joules"] == pytest.approx(true_w * rec["window"]["seconds"], rel=0.2)
    assert rec["read_errors"] == 0


def test_an_energy_counter_that_goes_back_is_a_reset_counted_as_a_read_error_never_a_huge_power(tmp_path):
    root = tree("ina238-sq52206", tmp_path)
    counter = root / "class" / "hwmon" / "hwmon1" / "energy1_input"
    counter.write_text("900000000\n")
    src = power.Hwmon.find(root)
    counter.write_text("905000000\n")
    assert src.read().total_w > 0
    counter.write_text("1000\n")  # the driver was reloaded: back to (near) zero
    with pytest.raises(ValueError, match="reset, not wrapped"):
        src.read()
    time.sleep(0.05)
    counter.write_text("51000\n")  # and the count goes on from there
    assert 0 < src.read().total_w < 5.0

# --- RAPL ---------------------------------------------------------------------------------------------

def test_rapl_psys_is_kept_apart_from_the_package_and_the_package_wraps(tmp_path):
    root = tree("rapl-psys", tmp_path)
    start = read_rapl(root)
    assert list(start["domains"]) == ["intel-rapl:0"] and start["names"]["intel-rapl:0"] == "package-0"
    assert start["platform"]["intel-rapl:1"]["name"] == "psys"
    (root / "intel-rapl:0" / "energy_uj").write_text("1000\n")  # wrapped past max_energy_range_uj
    (root / "intel-rapl:1" / "energy_uj").write_text("999999999\n")  # psys moved too: never added
    assert rapl_delta_j(start, read_rapl(root)) == pytest.approx((262143999938 - 262143000000 + 1000) / 1e6)


# --- meter logs ---------------------------------------------------------------------------------------

def test_fnirsi_logger_packets_that_overlap_are_put_in_order():
    readings, info = meterlog.parse_power_log(log("fnirsi-logger-readme.txt"))
    times = [t for t, _ in readings]
    assert len(readings) == 9 and times == sorted(times) and times[0] == pytest.approx(1657568326.775)
    assert info["columns"] == ["voltage_V", "current_A"] and all(w == 0.0 for _, w in readings)  # 0 V logged
    rec = meterlog.log_record(log("fnirsi-logger-readme.txt"), (1657568326.78, 1657568326.82))
    assert rec["available"] and rec["joules"] == 0.0


def test_pyummeter_export_reads_power_in_watts_from_its_header():
    readings, info = meterlog.parse_power_log(log("pyummeter-um34c.csv"))
    assert len(readings) == 20 and {w for _, w in readings} == {1.672} and info["columns"] == ["Power (W)"]
    t0 = datetime(2026, 12, 3, 10, 0, 5).timestamp()  # naive dates: this machine's local time
    assert readings[5][0] == pytest.approx(t0)
    rec = meterlog.log_record(log("pyummeter-um34c.csv"), (t0, t0 + 10))
    assert rec["joules"] == pytest.approx(16.72)
    assert measured_run(rec)["measured_by"] == "meter log" and "pyummeter-um34c.csv" in rec["detail"]


def test_joulescope_statistics_in_utc_read_in_si_units():
    readings, info = meterlog.parse_power_log(log("joulescope-statistics-utc.csv"))
    assert info["format"] == "Joulescope UI statistics record" and info["columns"] == ["power"]
    assert readings[0] == (datetime(2026, 12, 3, 10, 0, 0, tzinfo=timezone.utc).timestamp(), 1.9)
    assert readings[1][0] - readings[0][0] == pytest.approx(0.5) and len(readings) == 20


@pytest.mark.parametrize("name,fragment,fix", [
    ("joulescope-statistics-relative.csv", "count from the start of its recording", "time format to UTC"),
    ("witrn-wtm2csv.csv", "count from the start of its recording", "--power-log-start TIME"),
    ("ppk2-export.csv", "Nordic Power Profiler (PPK2) export: current only", "--power-log-voltage V"),
])
def test_logs_that_cannot_be_placed_against_the_run_are_refused_in_one_line(name, fragment, fix):
    with pytest.raises(UsageError) as exc:
        meterlog.check_power_log(log(name))
    e = exc.value
    assert fragment in e.what and fix in e.fix and name in e.where and "\n" not in e.line()


def test_a_ppk2_export_reads_with_the_supply_voltage_and_the_recordings_start_given():
    start = datetime(2026, 12, 3, 10, 0, 0, tzinfo=timezone.utc).timestamp()
    ppk = meterlog.PowerLog(log("ppk2-export.csv"), voltage=3.3, start=start)
    readings, info = meterlog.parse_power_log(ppk)
    rows = [ln.split(",") for ln in log("ppk2-export.csv").read_text().splitlines()[1:]]
    assert len(readings) == len(rows) == 10
    for (t, w), (ms, ua, _) in zip(readings, rows):  # V x I, at the recording's start + its ms
        assert t == pytest.approx(start + float(ms) / 1000) and w == pytest.approx(3.3 * float(ua) * 1e-6)
    assert info["format"] == "Nordic Power Profiler export" and info["voltage_v"] == 3.3
    assert "3.3 V (given)" in info["columns"]
    # the voltage alone still leaves the log unplaced: one line naming the other flag
    with pytest.raises(UsageError) as exc:
        meterlog.check_power_log(log("ppk2-export.csv"), voltage=3.3)
    assert "count from the start of its recording" in exc.value.what and "--power-log-start" in exc.value.fix


def test_a_relative_log_is_placed_by_the_start_given(tmp_path):
    start = 1_796_300_000.0
    readings, info = meterlog.parse_power_log(meterlog.PowerLog(log("witrn-wtm2csv.csv"), start=start))
    assert readings[0] == (start, pytest.approx(5.112 * 0.402)) and readings[1][0] == pytest.approx(start + 0.01)
    assert info["time"] == "from the recording's start (given)"


def test_a_unitless_current_or_power_column_is_refused_not_guessed(tmp_path):
    """A minimal table with an INA219 library's column names (its values are mA and mW): written here, not a
    published log (none was found)."""
    p = tmp_path / "ina219.csv"
    p.write_text("timestamp,bus_voltage,current,power\n1764756000.0,5.1,812.5,4143.8\n1764756001.0,5.1,810.0,4131.0\n")
    with pytest.raises(UsageError) as exc:
        meterlog.check_power_log(p)
    assert exc.value.what == "the power log's column 'power' has no unit" and "'power (mW)'" in exc.value.fix
    p.write_text(p.read_text().replace(",power\n", ",power_mW\n"))
    assert meterlog.read_power_log(p)[0][1] == pytest.approx(4.1438)  # mW as the header says: not 4143.8 W


def test_time_of_day_logs_are_placed_on_the_day_of_the_run_across_midnight(tmp_path):
    """A log with the time of day only (written here: no published one was found)."""
    p = tmp_path / "tod.csv"
    p.write_text("Time,Voltage (V),Current (mA)\n23:59:59.5,5.0,400\n00:00:00.5,5.0,400\n00:00:01.5,5.0,400\n")
    near = datetime(2026, 12, 3, 23, 59, 50).timestamp()
    readings = meterlog.read_power_log(p, near=near)
    assert readings[0] == (pytest.approx(datetime(2026, 12, 3, 23, 59, 59, 500000).timestamp()), pytest.approx(2.0))
    assert readings[2][0] - readings[0][0] == pytest.approx(2.0)  # past midnight, not 24 h back


def test_a_log_still_being_written_passes_the_check_before_the_run(tmp_path):
    """Before the run the meter may have written nothing yet, or half a line: neither is refused then."""
    p = tmp_path / "live.txt"
    p.write_text("")
    assert meterlog.check_power_log(p).path == p
    text = log("fnirsi-logger-readme.txt").read_text()
    p.write_text(text[: text.rindex("\n", 0, len(text) - 1) + 12])  # the last line cut after 11 characters
    assert meterlog.check_power_log(p).path == p
    assert len(meterlog.read_power_log(p)) == 8  # after the run too (the meter still logging): 8 whole lines
    p.write_text(text.replace("1657568326.804 2 0.00000", "1657568326.804 2 0.0x000"))
    with pytest.raises(UsageError, match="cannot read the power log's line 9"):
        meterlog.check_power_log(p)  # a bad line inside the log is an error, before the run as after it


# --- Otii 3 (Qoitech Otii Arc / Ace): the desktop app's CSV export, one file per channel ------------------

OTII_START = datetime(2026, 12, 3, 10, 0, 0, tzinfo=timezone.utc).timestamp()


def otii_rows(name: str) -> list[tuple[float, float]]:
    lines = log(name).read_text().splitlines()
    assert lines[0] == '"Timestamp","Value"'  # the app's header: the channel is in the file name alone
    return [(float(t), float(v)) for t, v in (ln.split(",") for ln in lines[1:])]


def test_an_otii_main_power_export_reads_its_channel_in_watts_placed_by_the_recordings_start():
    readings, info = meterlog.parse_power_log(meterlog.PowerLog(log("Main power - Arc.csv"), start=OTII_START))
    rows = otii_rows("Main power - Arc.csv")
    assert len(readings) == len(rows) == 40
    for (t, w), (s, v) in zip(readings, rows):  # W as the channel's unit, at the recording's start + its seconds
        assert t == pytest.approx(OTII_START + s) and w == v
    assert info["format"] == meterlog.OTII_FORMAT and info["columns"] == ["Main power (W)"]
    assert info["time"] == "from the recording's start (given)"
    rec = meterlog.log_record(meterlog.PowerLog(log("Main power - Arc.csv"), start=OTII_START),
                              (OTII_START + 0.001, OTII_START + 0.009))
    assert rec["available"] and rec["average_w"] == pytest.approx(sum(v for _, v in rows) / len(rows), rel=0.05)
    assert meterlog.OTII_FORMAT in rec["detail"]


def test_an_otii_main_current_export_reads_with_the_supply_voltage_given():
    readings, info = meterlog.parse_power_log(meterlog.PowerLog(log("Main current - Arc.csv"), voltage=5.1,
                                                                start=OTII_START))
    for (_, w), (_, amps) in zip(readings, otii_rows("Main current - Arc.csv")):
        assert w == pytest.approx(5.1 * amps)  # A, not mA: 5.1 V x 0.63 A is 3.2 W
    assert info["columns"] == ["Main current (A)", "5.1 V (given)"]


@pytest.mark.parametrize("name,given,fragment,fix", [
    ("Main power - Arc.csv", {}, "count from the start of its recording", "--power-log-start TIME"),
    ("Main current - Arc.csv", {"start": OTII_START}, "Otii's export of its 'Main current' channel: current only",
     "--power-log-voltage V"),
    ("VBUS - Ace.csv", {"start": OTII_START}, "Otii's export of its 'VBUS' channel (voltage, V)", "'Main power'"),
])
def test_an_otii_export_that_cannot_give_the_runs_power_is_refused_in_one_line(name, given, fragment, fix):
    with pytest.raises(UsageError) as exc:
        meterlog.check_power_log(log(name), **given)
    e = exc.value
    assert fragment in e.what and fix in e.fix and name in e.where and "\n" not in e.line()


def otii_copy(tmp_path, text: str, name: str = "Main power - Arc.csv") -> Path:
    p = tmp_path / name
    p.write_bytes(text.encode())
    return p


@pytest.mark.parametrize("case", ["renamed", "other channels", "truncated", "half a row", "header only", "empty"])
def test_a_hostile_otii_export_is_refused_before_the_run_in_one_line(tmp_path, case):
    text = log("Main power - Arc.csv").read_text()
    rows = text.splitlines(keepends=True)
    made, frag, fix = {
        # the app's layout under a name that names no channel: the unit is nowhere, so not guessed
        "renamed": (lambda: otii_copy(tmp_path, text, "meter.csv"), "the power log's column 'Value' has no unit",
                    "'Main power - Arc.csv'"),
        "other channels": (lambda: otii_copy(tmp_path, text, "Temperature - Arc.csv"), "'Temperature' channel",
                           "Main power"),
        # the copy stopped inside a row: the app ends every line with a line break
        "truncated": (lambda: otii_copy(tmp_path, "".join(rows[:12]) + rows[12][:7]), "ends inside its line 13",
                      "export the channel from Otii again"),
        "half a row": (lambda: otii_copy(tmp_path, "".join(rows[:12]) + rows[12][:9] + "\n" + "".join(rows[13:])),
                       "cannot read the power log's line 13", "give the meter's log"),
        "header only": (lambda: otii_copy(tmp_path, rows[0]), "an Otii export with no samples", "export the recording"),
        "empty": (lambda: otii_copy(tmp_path, ""), "the power log is empty", "give the meter's log"),
    }[case]
    path = made()
    with pytest.raises(UsageError) as exc:
        meterlog.check_power_log(path, start=OTII_START)  # before the run: nothing of it is a meter still logging
    e = exc.value
    assert frag in e.what and fix in e.fix and path.name in e.where and "\n" not in e.line()


def otii_current(tmp_path, amps: list[float]) -> Path:
    """An Otii 'Main current' export in the app's format (as the fixture) with the given currents at 4 kHz."""
    rows = "".join(f"{i / 4000:.6f},{a:.9g}\n" for i, a in enumerate(amps))
    return otii_copy(tmp_path, '"Timestamp","Value"\n' + rows, "Main current - Arc.csv")


def test_a_sleeping_boards_small_negative_currents_are_the_meters_noise_counted_as_read(tmp_path):
    # Otii's Main current of a board asleep reads around 0: a few tens of µA either side
    amps = [0.0004 if i % 3 else -0.00003 for i in range(40)] + [0.6] * 40
    log_ = meterlog.PowerLog(otii_current(tmp_path, amps), voltage=5.0, start=OTII_START)
    readings, info = meterlog.parse_power_log(log_)
    neg = info["negative_readings"]
    assert neg["count"] == sum(a < 0 for a in amps) and neg["of"] == len(amps)
    assert [w for _, w in readings] == pytest.approx([5.0 * a for a in amps])  # as read: not clamped to 0
    assert neg["lowest_w"] == pytest.approx(5.0 * min(amps)) and "not clamped" in neg["rule"]
    rec = meterlog.log_record(log_, (OTII_START + 0.001, OTII_START + 0.019))
    assert rec["available"] and "below 0 W" in rec["note"] and "offset noise" in rec["note"]
    assert "below 0 W" in measured_per_inference({**rec, "inferences": 3})["source"]


@pytest.mark.parametrize("amps,fragment,fix", [
    ([-0.6] * 30 + [0.0001] * 10, "below 0 W in 30 of its 40 readings", "swap the shunt's leads"),
    ([0.6] * 39 + [-0.05], "below the meter's zero by more than its noise", "zero the meter"),
])
def test_a_reversed_shunt_or_a_negative_beyond_the_noise_is_refused_in_one_line(tmp_path, amps, fragment, fix):
    with pytest.raises(UsageError) as exc:
        meterlog.check_power_log(otii_current(tmp_path, amps), voltage=5.0, start=OTII_START)
    e = exc.value
    assert fragment in e.what and fix in e.fix and "\n" not in e.line()
