"""Energy end to end (issue 17): `edgetrain profile` and `edgetrain finetune` measuring a board through a
generated sensor tree, a fake vcgencmd on PATH and a generated USB meter log, in real child processes."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

import metertools
from clitools import assert_user_error, edited_copies
from metertools import hwmon_tree, sensor_env
from test_power import fake_vcgencmd, meter_log, pmic_output, pmic_watts, write
from test_profile_models import conv_gemm_onnx

FAST = ("--warmup", "1", "--runs", "20", "--input-shape", "1,3,16,16")


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    return conv_gemm_onnx(tmp_path_factory.mktemp("energy") / "convgemm.onnx")


@pytest.fixture(scope="module")
def this_host(tmp_path_factory):
    """A device profile that matches this machine: what is measured here is measured on the device."""
    return metertools.this_host(tmp_path_factory.mktemp("dev"))


def no_sensor_env(tmp_path):
    return sensor_env(tmp_path / "empty-sys")


def test_profile_on_the_device_measures_with_its_hwmon_sensor(cli, onnx_file, this_host, tmp_path):
    root = hwmon_tree(tmp_path / "sys", 3_500_000)  # 3.5 W, constant
    res = cli("profile", onnx_file, "--device", this_host, "--rate", "720/h", "--battery-wh", "10",
              "--json", "-", *FAST, env=sensor_env(root))
    assert res.code == 0, res.err
    d = res.json()
    e = d["energy"]
    pi = e["per_inference"]
    assert pi["provenance"] == "measured" and pi["meter"] == "hwmon"
    cfg = d["configs"][0]["power"]
    assert cfg["rate_hz"] == 20.0 and cfg["samples"] >= 10  # the window was stretched to 10 sample periods
    assert cfg["inferences"] == cfg["timed_runs"] + cfg["extra_runs"] and cfg["timed_runs"] == 20
    assert pi["total_mj"] == pytest.approx(3.5 * cfg["window"]["seconds"] / cfg["inferences"] * 1000, rel=1e-6)
    assert pi["idle_w"] == pytest.approx(3.5) and abs(pi["above_idle_mj"]) < 1e-6  # a flat sensor: nothing above idle
    assert f"{cfg['samples']} samples at 20 Hz" in pi["source"] and "ina219/power1" in pi["source"]
    assert e["modelled_per_inference"]["provenance"] == "modelled"  # kept beside the measurement
    assert e["daily"]["provenance"] == "measured" and e["daily"]["idle_w"] == pytest.approx(3.5)
    assert any(f["name"] == "energy per inference (total)" and f["provenance"] == "measured" for f in d["figures"])
    # human output says so too
    human = cli("profile", onnx_file, "--device", this_host, *FAST, env=sensor_env(root))
    assert human.code == 0, human.err
    assert "(measured, hwmon ina219, " in human.out and "modelled for comparison" in human.out


def test_profile_elsewhere_keeps_the_model_and_reports_this_machines_sensor(cli, onnx_file, tmp_path):
    root = hwmon_tree(tmp_path / "sys", 2_000_000)
    res = cli("profile", onnx_file, "--device", "rpi4b-4gb", "--threads", "1", "--json", "-", *FAST,
              env=sensor_env(root))
    assert res.code == 0, res.err
    d = res.json()
    assert d["energy"]["per_inference"]["provenance"] == "modelled"  # this machine is not a Pi 4
    board = d["host_energy"]["board"][0]
    assert board["provenance"] == "measured" and board["meter"] == "hwmon" and board["samples"] >= 10


def test_profile_with_the_pi5_pmic_through_a_fake_vcgencmd(cli, onnx_file, this_host, tmp_path):
    out = write(tmp_path / "pmic.txt", pmic_output())
    prog = fake_vcgencmd(tmp_path / "bin", out)
    env = {"PATH": f"{prog.parent}{os.pathsep}{os.environ['PATH']}", "EDGETRAIN_SYSFS_ROOT": str(tmp_path / "none")}
    env_no_override = {k: v for k, v in os.environ.items() if k != "EDGETRAIN_VCGENCMD"}
    env_no_override.update(env)
    res = cli("profile", onnx_file, "--device", this_host, "--json", "-", *FAST, env=env_no_override)
    assert res.code == 0, res.err
    pi = res.json()["energy"]["per_inference"]
    assert pi["meter"] == "pi5-pmic" and pi["provenance"] == "measured"
    assert pi["average_w"] == pytest.approx(pmic_watts(), rel=1e-6)
    assert set(pi["rails_mj"]) == {"3V7_WL_SW", "3V3_SYS", "1V8_SYS", "DDR_VDD2", "DDR_VDDQ", "1V1_SYS", "0V8_SW",
                                   "VDD_CORE", "3V3_DAC", "3V3_ADC", "0V8_AON", "HDMI"}
    assert "10 Hz" in pi["source"]


def test_no_sensor_keeps_the_modelled_figure_labelled_as_today(cli, onnx_file, this_host, tmp_path):
    res = cli("profile", onnx_file, "--device", this_host, "--json", "-", *FAST, env=no_sensor_env(tmp_path))
    assert res.code == 0, res.err
    d = res.json()
    pi = d["energy"]["per_inference"]
    assert pi["provenance"] == "modelled" and "p50 latency" in pi["source"]
    assert "modelled_per_inference" not in d["energy"]
    assert "no board power source" in d["host_energy"]["board_note"]
    assert d["configs"][0]["power"] is None  # nothing sampled, no idle wait, no extra runs


@pytest.mark.slow
def test_profile_with_a_usb_meter_log(cli, onnx_file, this_host, tmp_path):
    now = time.time()
    log = meter_log(tmp_path / "meter.csv", now - 5, now + 900, hz=5, watts=lambda t: 4.0)
    res = cli("profile", onnx_file, "--device", this_host, "--power-log", log, "--json", "-", *FAST,
              env=no_sensor_env(tmp_path))
    assert res.code == 0, res.err
    d = res.json()
    pi = d["energy"]["per_inference"]
    cfg = d["configs"][0]["power"]
    assert pi["meter"] == "power-log" and pi["provenance"] == "measured"
    assert cfg["window"]["seconds"] >= 10  # a 1-10 Hz meter needs a long window: untimed runs fill it
    assert cfg["samples"] >= 50 and cfg["idle_w"] == pytest.approx(4.0)
    assert pi["total_mj"] == pytest.approx(4.0 * cfg["window"]["seconds"] / cfg["inferences"] * 1000, rel=1e-6)
    assert "meter.csv" in pi["source"]


def test_a_power_log_that_is_a_folder_fails_before_any_work(cli, onnx_file, tmp_path):
    res = cli("profile", onnx_file, "--power-log", tmp_path, *FAST, env=no_sensor_env(tmp_path))
    assert_user_error(res, 2, "the power log is a folder", str(tmp_path))


@pytest.mark.slow
@pytest.mark.parametrize("case", ["missing", "wrong clock", "bad line"])
def test_a_power_log_that_cannot_measure_the_run_is_a_usage_error(cli, onnx_file, tmp_path, case):
    log = tmp_path / "meter.csv"
    if case == "wrong clock":
        meter_log(log, 1_600_000_000.0, 1_600_000_100.0)
        frag = "the power log covers"
    elif case == "bad line":
        log.write_text("timestamp,watts\n1700000001,2\n1700000002,x\n")
        frag = "line 3"
    else:
        frag = "does not exist"
    res = cli("profile", onnx_file, "--power-log", log, *FAST, env=no_sensor_env(tmp_path))
    assert_user_error(res, 2, frag)


def test_finetune_on_the_device_measures_energy_per_epoch_and_sample(cli, this_host, tmp_path):
    # work that lasts several of the sensor's 50 ms periods even with the export cached: 1,437 samples x 6
    # epochs (~0.3 s here); 240 x 2 took ~0.1 s, and a busy host's sampler thread then saw one sample
    root = hwmon_tree(tmp_path / "sys", 5_000_000)
    res = cli("finetune", "edgetrain.nets:pretrained_digits", "--data", "builtin:digits", "-o", tmp_path / "o",
              "--epochs", "6", "--device", this_host, "--json", "-", env=sensor_env(root), cwd=tmp_path)
    assert res.code == 0, res.err
    r = res.json()
    e = r["energy"]
    assert e["provenance"] == "measured" and e["meter"] == "hwmon" and e["samples"] >= 2
    assert e["joules"] == pytest.approx(5.0 * e["seconds"], rel=1e-6) and e["idle_w"] == pytest.approx(5.0)
    assert r["joules_per_epoch"] == pytest.approx(e["joules"] / 6)
    assert r["joules_per_sample"] == pytest.approx(e["joules"] / e["samples_trained"])
    assert e["modelled"]["provenance"] == "modelled"


def test_finetune_without_a_sensor_is_modelled_at_its_busy_cores(cli, digits_npz, tmp_path):
    res = cli("finetune", "edgetrain.nets:pretrained_digits", "--data", digits_npz, "-o", tmp_path / "o",
              "--epochs", "1", "--device", "rpi4b-4gb", "--threads", "1", "--json", "-", env=no_sensor_env(tmp_path),
              cwd=tmp_path)
    assert res.code == 0, res.err
    e = res.json()["energy"]
    assert e["provenance"] == "modelled" and e["threads"] == 1
    assert e["power_w"] == pytest.approx(2.7 + (6.4 - 2.7) / 4)  # 1 of the Pi 4's 4 cores busy
    assert e["joules"] == pytest.approx(e["power_w"] * e["seconds"])


FIXTURE_LOGS = __import__("pathlib").Path(__file__).parents[1] / "fixtures" / "power" / "logs"


def _otii_case(tmp_path, case: str):
    """(log, extra flags, fragments of the one error line): the Otii 3 app's CSV export (SOURCES.md: the
    verbatim 'VBUS - Ace.csv', the written 'Main power - Arc.csv' and 'Main current - Arc.csv') and its
    hostile copies."""
    power = (FIXTURE_LOGS / "Main power - Arc.csv").read_text()
    rows = power.splitlines(keepends=True)

    def copy(text, name="Main power - Arc.csv"):
        (tmp_path / "otii").mkdir(exist_ok=True)
        p = tmp_path / "otii" / name
        p.write_text(text)
        return p

    start = ["--power-log-start", "2026-12-03T10:00:00"]
    return {
        "otii no start": (FIXTURE_LOGS / "Main power - Arc.csv", [], ("count from the start of its recording",
                                                                      "--power-log-start TIME")),
        "otii current without voltage": (FIXTURE_LOGS / "Main current - Arc.csv", start,
                                         ("'Main current' channel: current only", "--power-log-voltage V")),
        "otii wrong channel": (FIXTURE_LOGS / "VBUS - Ace.csv", start, ("'VBUS' channel (voltage, V)", "'Main power'")),
        "otii missing unit": (lambda: copy(power, "meter.csv"), start, ("column 'Value' has no unit", "meter.csv:1")),
        "otii truncated": (lambda: copy("".join(rows[:12]) + rows[12][:7]), start, ("ends inside its line 13",)),
        "otii empty": (lambda: copy(rows[0]), start, ("an Otii export with no samples",)),
    }[case]


@pytest.mark.parametrize("case", ["joulescope relative", "otii no start", "otii current without voltage",
                                  "otii wrong channel", "otii missing unit", "otii truncated", "otii empty"])
@pytest.mark.parametrize("command", ["finetune", "profile"])
def test_a_log_in_a_format_edgetrain_cannot_read_is_refused_before_any_work(cli, onnx_file, tmp_path, command, case):
    """A Joulescope statistics record in its 'relative' time format, and an Otii export that cannot give the
    run's power (tests/fixtures/power/SOURCES.md): refused in one line before the fine-tune trains or the
    profile runs, not after."""
    if case == "joulescope relative":
        log, flags = FIXTURE_LOGS / "joulescope-statistics-relative.csv", []
        frags = ("count from the start of its recording", "joulescope-statistics-relative.csv:2", "time format to UTC")
    else:
        log, flags, frags = _otii_case(tmp_path, case)
        log = log() if callable(log) else log
    out = tmp_path / "o"
    args = (["finetune", "edgetrain.nets:pretrained_digits", "--data", "builtin:digits", "-o", out, "--epochs", "50"]
            if command == "finetune" else ["profile", onnx_file, *FAST])
    t0 = time.monotonic()
    res = cli(*args, "--power-log", log, *flags, env=no_sensor_env(tmp_path), cwd=tmp_path)
    elapsed = time.monotonic() - t0
    assert_user_error(res, 2, *frags)
    assert elapsed < 30, f"refused after {elapsed:.0f} s: the work ran first"
    assert not out.exists()  # no OUTDIR half made


def test_a_unitless_power_column_is_refused_before_finetune_trains(cli, tmp_path):
    log = tmp_path / "ina219.csv"  # an INA219 library's names (mW): written here, see test_power_fixtures
    log.write_text("timestamp,current,power\n1764756000.0,812.5,4143.8\n")
    res = cli("finetune", "edgetrain.nets:pretrained_digits", "--data", "builtin:digits", "-o", tmp_path / "o",
              "--power-log", log, env=no_sensor_env(tmp_path), cwd=tmp_path)
    assert_user_error(res, 2, "the power log's column 'power' has no unit", "ina219.csv:1", "'power (mW)'")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("device", [None, "rpi4b-4gb"])
def test_profile_json_says_whether_the_host_was_quiet_and_where_every_energy_figure_comes_from(cli, onnx_file,
                                                                                                tmp_path, device):
    """The busy-host warning is a field of the JSON result (with or without a device), the same lines the human
    output prints; every energy figure carries its provenance and whether its timing is to be trusted."""
    more = ["--device", device, "--rate", "720/h", "--battery-wh", "10"] if device else []
    res = cli("profile", onnx_file, *more, "--threads", "1", "--json", "-", *FAST, env=no_sensor_env(tmp_path))
    assert res.code == 0, res.err
    d = res.json()
    rel = d["reliability"]
    assert isinstance(rel["reliable"], bool) and rel["reliable"] == (not rel["reasons"])
    assert d["warnings"] == [f"the latency and energy figures are unreliable: {r}" for r in rel["reasons"]]
    energy_figs = [f for f in d["figures"] if "energy" in f["name"] or "battery" in f["name"]]
    assert all(f["provenance"] in ("measured", "estimated", "modelled") and f["reliable"] == rel["reliable"]
               for f in energy_figs)
    if device:
        assert len(energy_figs) >= 4 and d["energy"]["reliability"] == rel
        pi = d["energy"]["per_inference"]
        assert pi["provenance"] == "modelled"
        assert pi["spread"]["p10"]["provenance"] == pi["spread"]["p90"]["provenance"] == "modelled"
        assert d["energy"]["daily"]["provenance"] == "modelled"
    assert d["host_energy"]["provenance"] == "measured"


# --- uncertainty and carbon (issue 24, items 4 and 6) ------------------------------------------------------

DE_2024 = 342.06  # edgetrain/energy/grid_intensity.csv, Ember


def test_profile_gives_the_measured_figure_its_uncertainty_and_its_grams(cli, onnx_file, this_host, tmp_path):
    root = hwmon_tree(tmp_path / "sys", 3_500_000)
    res = cli("profile", onnx_file, "--device", this_host, "--country", "DE", "--rate", "720/h", "--json", "-", *FAST,
              env=sensor_env(root))
    assert res.code == 0, res.err
    e = res.json()["energy"]
    pi = e["per_inference"]
    u = pi["uncertainty"]
    assert u["kind"] == "standard (1 sigma)" and u["resolution_w"] == pytest.approx(1e-6)  # power1_input: µW
    assert u["plus_minus_mj"] > 0 and u["samples"] == pi["samples"]
    assert pi["sampler"]["core_percent"] is not None and pi["sampler"]["rate_hz"] == 20.0
    c = e["carbon"]
    assert c["per_inference_g"] == pytest.approx(pi["total_mj"] / 1000 / 3.6e6 * DE_2024)
    assert c["per_day_g"] == pytest.approx(e["daily"]["energy_wh_per_day"] / 1000 * DE_2024)
    assert c["intensity"]["country"] == "DEU" and c["intensity"]["year"] == 2024 and "Ember" in c["intensity"]["source"]
    human = cli("profile", onnx_file, "--device", this_host, "--country", "deu", *FAST, env=sensor_env(root))
    assert human.code == 0, human.err
    line = next(ln for ln in human.out.splitlines() if ln.startswith("energy "))
    assert " mJ ± " in line and "(measured, hwmon ina219, " in line
    assert any(ln.startswith("carbon ") and "Germany 2024 grid, 342.06 g/kWh [table]" in ln and "per inference" in ln
               for ln in human.out.splitlines())
    assert any(ln.startswith("sampler ") and "% of one core at 20 Hz" in ln for ln in human.out.splitlines())


def test_finetune_modelled_carries_its_power_range_and_the_grams_of_a_given_intensity(cli, digits_npz, tmp_path):
    res = cli("finetune", "edgetrain.nets:pretrained_digits", "--data", digits_npz, "-o", tmp_path / "o",
              "--epochs", "1", "--device", "rpi4b-4gb", "--threads", "1", "--grid-intensity", "500", "--json", "-",
              env=no_sensor_env(tmp_path), cwd=tmp_path)
    assert res.code == 0, res.err
    e = res.json()["energy"]
    u = e["uncertainty"]
    assert e["provenance"] == "modelled"
    assert u["low_j"] == pytest.approx(e["seconds"] * (2.7 + (6.4 - 2.7) / 4))  # the line at 1 of 4 cores
    assert u["high_j"] == pytest.approx(e["seconds"] * 6.4)  # full load
    assert e["carbon"]["grams"] == pytest.approx(e["joules"] / 3.6e6 * 500)
    assert e["carbon"]["intensity"]["provenance"] == "given"


@pytest.mark.parametrize("command", ["profile", "finetune"])
def test_an_unknown_country_is_refused_in_one_line_before_any_work(cli, onnx_file, tmp_path, command):
    args = (["profile", onnx_file, *FAST] if command == "profile" else
            ["finetune", "edgetrain.nets:pretrained_digits", "--data", "builtin:digits", "-o", tmp_path / "o"])
    res = cli(*args, "--device", "rpi4b-4gb", "--country", "XX", env=no_sensor_env(tmp_path), cwd=tmp_path)
    assert_user_error(res, 2, "--country", "XX", "--grid-intensity")
    assert not (tmp_path / "o").exists()

# --- `edgetrain energy calibrate METER_LOG` (issue 24, item 5) ---------------------------------------------
@pytest.mark.slow
@pytest.mark.parametrize("gain,offset", [(1.13, 0.72), (0.94, 1.9)])
def test_calibrate_recovers_the_meters_line_and_later_runs_read_through_it_saying_so(
        cli, onnx_file, this_host, tmp_path, gain, offset):
    root = hwmon_tree(tmp_path / "sys", metertools.LEVELS_UW[0])
    log = metertools.um34c_log(tmp_path / "um34c.csv")
    config = tmp_path / "config"
    env = sensor_env(root, XDG_CONFIG_HOME=str(config))
    board = metertools.board_and_meter(root, log, gain, offset, seconds=7.0)
    try:
        time.sleep(0.5)  # the meter is logging before the calibration starts
        res = cli("energy", "calibrate", log, "--seconds", "5", "--phase", "0.5", "--json", "-", env=env)
    finally:
        board.wait(timeout=30)
    assert res.code == 0, res.err
    cal = res.json()
    written = config / "edgetrain" / "power-calibration.json"
    assert cal["file"] == str(written) and written.is_file()
    # the meter rounds to 1 mW and a loaded host may stall the sampler near a step: close, not exact
    assert cal["gain"] == pytest.approx(gain, rel=0.02) and cal["offset_w"] == pytest.approx(offset, abs=0.06)
    assert cal["source"] == "hwmon" and cal["meter_log"] == "um34c.csv" and cal["points"] >= 15
    lo, hi = min(metertools.LEVELS_UW) / 1e6, max(metertools.LEVELS_UW) / 1e6
    assert lo - 1e-9 <= cal["sensor_range_w"][0] < cal["sensor_range_w"][1] <= hi + 1e-9

    # a later run, with nothing but the default file, reads the sensor through the fit and says so
    sensor_w = 3.0
    (root / "class" / "hwmon" / "hwmon0" / "power1_input").write_text(f"{int(sensor_w * 1e6)}\n")
    prof = cli("profile", onnx_file, "--device", this_host, "--json", "-", *FAST, env=env)
    assert prof.code == 0, prof.err
    pi = prof.json()["energy"]["per_inference"]
    assert pi["provenance"] == "measured" and pi["calibration"]["file"] == str(written)
    assert pi["calibration"]["gain"] == cal["gain"] and pi["calibration"]["meter_log"] == "um34c.csv"
    assert pi["idle_w"] == pytest.approx(cal["gain"] * sensor_w + cal["offset_w"], rel=1e-6)
    assert "calibrated" in pi["instrument"]
    human = cli("profile", onnx_file, "--device", this_host, *FAST, env=env)
    assert human.code == 0, human.err
    assert "(measured, hwmon ina219 calibrated, " in human.out
    # and EDGETRAIN_POWER_CALIBRATION= (empty) reads the sensor as it is
    raw = cli("profile", onnx_file, "--device", this_host, "--json", "-", *FAST,
              env={**env, "EDGETRAIN_POWER_CALIBRATION": ""})
    assert raw.code == 0, raw.err
    rpi = raw.json()["energy"]["per_inference"]
    assert "calibration" not in rpi and rpi["idle_w"] == pytest.approx(sensor_w)
    # a calibration edited to a line no fit writes (here a NaN gain, read through as NaN W before): refused
    edited = tmp_path / "edited-calibration.json"
    edited.write_text(written.read_text().replace(f'"gain": {cal["gain"]!r}', '"gain": NaN'))
    assert "NaN" in edited.read_text()
    bad = cli("profile", onnx_file, "--device", this_host, *FAST,
              env={**env, "EDGETRAIN_POWER_CALIBRATION": str(edited)})
    assert_user_error(bad, 2, "the power calibration has gain nan", "edited?")


def _log(path, rows):
    path.write_text("timestamp,power (W)\n" + "".join(f"{t:.3f},{w:.3f}\n" for t, w in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("case", ["no overlap", "too few", "backwards", "no sensor", "unitless"])
def test_a_meter_log_that_cannot_calibrate_is_one_error_line_exit_2(cli, tmp_path, case):
    root = hwmon_tree(tmp_path / "sys", 2_000_000)
    now = time.time()
    if case == "no overlap":  # a log of yesterday
        log, frag = _log(tmp_path / "m.csv", [(now - 86400 + i, 2.0 + i % 3) for i in range(60)]), "do not overlap"
    elif case == "too few":  # the meter logged 3 readings during the sampling
        log, frag = _log(tmp_path / "m.csv", [(now + 0.5 * i, 2.0) for i in range(1, 4)]), "need 10"
    elif case == "backwards":  # two recordings appended: refused before any sampling
        rows = [(now + i, 2.0) for i in range(30)] + [(now - 100 + i, 2.0) for i in range(30)]
        log, frag = _log(tmp_path / "m.csv", rows), "timestamps go back"
    elif case == "unitless":
        log = tmp_path / "m.csv"
        log.write_text("timestamp,power\n1700000000,2\n1700000001,2\n")
        frag = "has no unit"
    else:
        log, frag = _log(tmp_path / "m.csv", [(now + i, 2.0) for i in range(30)]), "no board power sensor"
        root = tmp_path / "empty-sys"
    out = tmp_path / "cal.json"
    res = cli("energy", "calibrate", log, "-o", out, "--seconds", "2", "--phase", "0.5",
              env=sensor_env(root, XDG_CONFIG_HOME=str(tmp_path / "config")))
    assert_user_error(res, 2, frag)
    assert not out.exists() and not (tmp_path / "config").exists()


def test_calibrate_refuses_an_output_that_is_its_meter_log(cli, tmp_path):
    log = _log(tmp_path / "m.csv", [(time.time() + i, 2.0) for i in range(30)])
    res = cli("energy", "calibrate", log, "-o", log, env=sensor_env(hwmon_tree(tmp_path / "sys", 2_000_000)))
    assert_user_error(res, 2)
    assert log.read_text().startswith("timestamp,power (W)\n")


# --- a Nordic Power Profiler (PPK2) export: current only, timed from its recording's start ------------------

def _ppk2_export(path, seconds: float, microamps: float, hz: float = 100.0):
    """A steady current in pc-nrfconnect-ppk's export format (metertools; SOURCES.md, ppk2-export.csv), one row
    every 1/hz s (the app exports every 10 µs sample) to keep the file small."""
    return metertools.ppk2_export(path, seconds, lambda _s: microamps, hz)


def test_profile_reads_a_ppk2_export_given_its_voltage_and_start(cli, onnx_file, this_host, tmp_path):
    start = time.time() - 5
    log = _ppk2_export(tmp_path / "ppk-20261203T100000.csv", 300, microamps=606_060.0)
    stamp = metertools.stamp(start)
    res = cli("profile", onnx_file, "--device", this_host, "--power-log", log, "--power-log-voltage", "3.3",
              "--power-log-start", stamp, "--json", "-", *FAST, env=no_sensor_env(tmp_path))
    assert res.code == 0, res.err
    pi = res.json()["energy"]["per_inference"]
    cfg = res.json()["configs"][0]["power"]
    assert pi["meter"] == "power-log" and pi["provenance"] == "measured"
    assert cfg["average_w"] == pytest.approx(3.3 * 0.60606, rel=1e-6)  # V given x the export's current
    assert cfg["log_format"]["format"] == "Nordic Power Profiler export" and cfg["log_format"]["voltage_v"] == 3.3


@pytest.mark.parametrize("case", ["no voltage", "no start", "flag without a log", "unreadable start"])
def test_a_ppk2_export_without_what_it_leaves_out_is_one_error_line_before_any_work(cli, onnx_file, tmp_path, case):
    log = _ppk2_export(tmp_path / "ppk.csv", 2, microamps=1000.0)
    args = {"no voltage": ["--power-log", log, "--power-log-start", "1796300000"],
            "no start": ["--power-log", log, "--power-log-voltage", "3.3"],
            "flag without a log": ["--power-log-voltage", "3.3"],
            "unreadable start": ["--power-log", log, "--power-log-voltage", "3.3", "--power-log-start", "soon"]}[case]
    frag = {"no voltage": "--power-log-voltage V", "no start": "--power-log-start TIME",
            "flag without a log": "--power-log-voltage given without --power-log",
            "unreadable start": "cannot read the time 'soon'"}[case]
    res = cli("profile", onnx_file, *args, *FAST, env=no_sensor_env(tmp_path))
    assert_user_error(res, 2, frag)


# --- the Otii 3 app's CSV export: one channel per file, named by the channel, timed from the recording's start -

def _otii_export(path, seconds: float, watts: float, hz: float = 100.0):
    """A steady power in the Otii 3 app's channel export format (metertools; SOURCES.md, 'VBUS - Ace.csv'), one
    row every 1/hz s (the app exports every sample, 4 kHz on an Arc) to keep the file small."""
    return metertools.otii_export(path, seconds, lambda _s: watts, hz)


def test_profile_reads_an_otii_main_power_export_given_its_recordings_start(cli, onnx_file, this_host, tmp_path):
    start = time.time() - 5
    log = _otii_export(tmp_path / "Main power - Arc.csv", 300, watts=3.25)
    stamp = metertools.stamp(start)
    res = cli("profile", onnx_file, "--device", this_host, "--power-log", log, "--power-log-start", stamp,
              "--json", "-", *FAST, env=no_sensor_env(tmp_path))
    assert res.code == 0, res.err
    pi = res.json()["energy"]["per_inference"]
    cfg = res.json()["configs"][0]["power"]
    assert pi["meter"] == "power-log" and pi["provenance"] == "measured"
    assert cfg["average_w"] == pytest.approx(3.25, rel=1e-6)  # W, the Main power channel's unit
    assert cfg["log_format"]["format"] == "Otii 3 CSV export" and cfg["log_format"]["columns"] == ["Main power (W)"]


# --- a meter's export made after the run (PPK2, Otii): `edgetrain energy attribute RESULT METER_LOG` -----------

def _fixture_rows(name: str) -> list[list[str]]:
    """The rows of a meter-log fixture (tests/fixtures/power/SOURCES.md), header left out."""
    from pathlib import Path

    lines = (Path(__file__).parents[1] / "fixtures" / "power" / "logs" / name).read_text().splitlines()
    return [ln.split(",") for ln in lines[1:] if ln.strip()]


def _tiled(path, header: str, values: list[str], seconds: float, stamp, hz: float = 100.0):
    """The fixture's values repeated one row every 1/hz s over ``seconds``, in the fixture's own format: an export
    that covers a real run's windows (the app exports every sample; every 1/hz s keeps the file small)."""
    rows = [stamp(i / hz) + "," + values[i % len(values)] for i in range(int(seconds * hz) + 1)]
    path.write_text(header + "\n" + "\n".join(rows) + "\n", encoding="utf-8")
    return path


def test_a_result_changed_anywhere_after_the_run_no_longer_carries_its_seal(tmp_path):
    """`energy attribute` reads only a result as edgetrain wrote it: every leaf of a real profile result (and of a
    fine-tune's energy record), changed to a value of another kind or deleted, breaks the seal; the result as
    written, re-indented or with its keys reordered, keeps it."""
    import json

    from edgetrain.api import profile
    from edgetrain.results import SEAL, seal_windows, sealed_as_written

    d = json.loads(json.dumps(profile(str(conv_gemm_onnx(tmp_path / "m.onnx")), threads="1",
                                      device="x86-64-generic", input_shape=(3, 16, 16), warmup=1, runs=8).to_dict()))
    assert sealed_as_written(d) and SEAL in d["meter_windows"]
    assert sealed_as_written(json.loads(json.dumps(dict(reversed(list(d.items()))), indent=4)))
    ft = seal_windows({"trained_parameters": 1, "energy": {"joules": 3.5, "meter_windows": {"timed": [1.0, 2.0]}}})
    for doc in (d, ft):
        edits = list(edited_copies(doc, skip=(SEAL,)))
        assert len(edits) > (200 if doc is d else 6)
        for path, edited in edits:
            assert not sealed_as_written(edited), path


# Windows as an edited result may hold them (sealed again, as a forger would): each crashed with a traceback
# (IndexError, OverflowError, TypeError, ValueError from NaN) before they were checked.
EDITED_WINDOWS = ["[NaN, 1796292002]", "[1e300, 1e301]", "[-1e20, 1e20]", '["a", 1796292002]', "[1796292001]",
                  "[true, 1796292002]", "[1796292002, 1796292001]", "[1796292001, 1796292001]", "3", '"x"']


@pytest.mark.parametrize("command", ["finetune", "profile"])
@pytest.mark.parametrize("where", ["timed", "idle"])
@pytest.mark.parametrize("window", EDITED_WINDOWS)
def test_a_result_whose_windows_are_not_clock_intervals_is_refused_in_one_line(cli, tmp_path, command, where, window):
    import json

    from edgetrain import __version__
    from edgetrain.results import seal_windows

    good = {"timed": [1796292001.0, 1796292002.5], "idle": [1796292000.0, 1796292001.0]}
    spans = {**good, where: "WINDOW"}
    head = {"command": command, "edgetrain_version": __version__, "held_for_a_meter": True}
    if command == "finetune":
        result = {"trained_parameters": 1, "energy": {"provenance": "modelled", "meter_windows": {**head, **spans}}}
    else:
        result = {"configs": [{"threads": 1}], "meter_windows": {**head, "configs": [{"threads": 1, **spans}]}}
    path = tmp_path / "result.json"
    path.write_text(json.dumps(seal_windows(json.loads(json.dumps(result).replace('"WINDOW"', window)))))
    # a log in Unix seconds, or (every other case) with the time of day alone, which the result's window places
    log = tmp_path / "meter.csv"
    if EDITED_WINDOWS.index(window) % 2:
        log.write_text("time,power (W)\n" + "".join(f"10:00:0{i},1.5\n" for i in range(6)))
    else:
        log.write_text("timestamp,power (W)\n" + "".join(f"{1796291999 + i},1.5\n" for i in range(6)))
    before = path.read_bytes()
    res = cli("energy", "attribute", path, log, "-o", tmp_path / "out.json")
    assert_user_error(res, 2, "edited?")
    assert path.read_bytes() == before and not (tmp_path / "out.json").exists()


@pytest.mark.slow
def test_a_meter_export_made_after_the_run_is_attributed_to_the_results_windows(cli, onnx_file, this_host, tmp_path):
    import json

    result = tmp_path / "profile.json"
    res = cli("profile", onnx_file, "--device", this_host, "--meter-export", "--country", "DE", "--json", str(result),
              *FAST, env=no_sensor_env(tmp_path))
    assert res.code == 0, res.err
    before = result.read_bytes()
    d = json.loads(before)
    w = d["meter_windows"]
    assert w["held_for_a_meter"] and w["on_device"] and w["command"] == "profile"
    cw = w["configs"][0]
    assert cw["timed"][1] - cw["timed"][0] >= 10 and cw["idle"][1] > cw["idle"][0]  # as --power-log would hold
    assert d["energy"]["per_inference"]["provenance"] == "modelled"
    assert "edgetrain energy attribute" in d["host_energy"]["board_note"]
    t0 = cw["idle"][0] - 2.0
    span = cw["timed"][1] + 2.0 - t0
    start = metertools.stamp(t0)

    # the PPK2 fixture's currents, tiled over the run and scaled x300 (to about 0.97 A, inside the PPK2's 1 A): its
    # 10.6 mW would be refused as a unit mistake on this profile's board (x86-64-generic's 10-30 W; issue 37)
    ppk = [[r[0], f"{float(r[1]) * 300:.3f}", r[2]] for r in _fixture_rows("ppk2-export.csv")]
    ppk_log = _tiled(tmp_path / "ppk-20261203T100000.csv", "Timestamp(ms),Current(uA),D0-D7",
                     [f"{r[1]},{r[2]}" for r in ppk], span, lambda s: f"{s * 1000:g}")
    otii = _fixture_rows("Main power - Arc.csv")
    otii_log = _tiled(tmp_path / "Main power - Arc.csv", '"Timestamp","Value"', [r[1] for r in otii], span,
                      lambda s: f"{s:.6f}")
    cases = [(ppk_log, ["--power-log-voltage", "3.3"], 3.3 * sum(float(r[1]) for r in ppk) / len(ppk) / 1e6),
             (otii_log, [], sum(float(r[1]) for r in otii) / len(otii))]
    for log, more, watts in cases:
        out = tmp_path / f"measured-{log.stem}.json"
        res = cli("energy", "attribute", result, log, *more, "--power-log-start", start, "-o", out, "--json", "-")
        assert res.code == 0, res.err
        m = res.json()
        assert json.loads(out.read_text()) == m and result.read_bytes() == before  # written beside, never over
        cfg = m["configs"][0]["power"]
        assert cfg["available"] and cfg["source"] == "power-log"
        assert cfg["average_w"] == pytest.approx(watts, rel=0.02) and cfg["idle_w"] == pytest.approx(watts, rel=0.02)
        assert cfg["inferences"] == cw["inferences"] and log.name in cfg["instrument"]
        pi = m["energy"]["per_inference"]  # on the device: the measured figure leads, as with --power-log
        assert pi["provenance"] == "measured" and pi["meter"] == "power-log"
        assert pi["total_mj"] == pytest.approx(cfg["joules"] / cfg["inferences"] * 1000)
        assert pi["uncertainty"]["kind"] == "standard (1 sigma)"
        assert m["energy"]["modelled_per_inference"]["provenance"] == "modelled"
        assert m["energy"]["carbon"]["energy_provenance"] == "measured"
        assert m["host_energy"]["board"][0]["total_mj"] == pytest.approx(pi["total_mj"])
        assert any(f.get("provenance") == "measured" for f in m["figures"])

    # refused in one line, exit 2, nothing written: a log that does not cover the windows, a result without
    # windows, one from another version, one whose run held no windows for a meter, -o over RESULT
    no_windows = tmp_path / "old.json"
    no_windows.write_text(json.dumps({k: v for k, v in d.items() if k != "meter_windows"}))
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**d, "meter_windows": {**w, "edgetrain_version": "0.0.1"}}))
    unheld = tmp_path / "unheld.json"
    unheld.write_text(json.dumps({**d, "meter_windows": {**w, "held_for_a_meter": False}}))
    edited = tmp_path / "edited.json"  # a figure changed by hand: it would be carried into the measured result
    edited.write_text(json.dumps({**d, "configs": [{**d["configs"][0], "threads": 4}]}))
    for args, frag in [((result, ppk_log, "--power-log-voltage", "3.3", "--power-log-start", "2026-01-01T00:00:00"),
                        "the power log covers"),
                       ((result, otii_log, "--power-log-start", start, "-o", result), "would overwrite the input"),
                       ((no_windows, otii_log, "--power-log-start", start), "records no measured windows"),
                       ((other, otii_log, "--power-log-start", start), "edgetrain 0.0.1"),
                       ((unheld, otii_log, "--power-log-start", start), "not held for a meter"),
                       ((edited, otii_log, "--power-log-start", start), "not as edgetrain wrote it"),
                       ((result, otii_log), "--power-log-start TIME")]:
        res = cli("energy", "attribute", *args)
        assert_user_error(res, 2, frag)
    assert result.read_bytes() == before
    assert not (tmp_path / "profile-measured.json").exists()


@pytest.mark.slow
def test_a_meter_export_made_after_a_finetune_is_attributed_to_its_run(cli, this_host, tmp_path):
    import json

    result = tmp_path / "finetune.json"
    res = cli("finetune", "edgetrain.nets:pretrained_digits", "--data", "builtin:digits", "-o", tmp_path / "o",
              "--epochs", "2", "--device", this_host, "--meter-export", "--country", "DE", "--json", result,
              env=no_sensor_env(tmp_path), cwd=tmp_path)
    assert res.code == 0, res.err
    before = result.read_bytes()
    d = json.loads(before)
    w = d["energy"]["meter_windows"]
    assert w["command"] == "finetune" and w["held_for_a_meter"] and w["idle"][1] > w["idle"][0]
    assert d["energy"]["provenance"] == "modelled"
    t0 = w["idle"][0] - 2.0
    start = metertools.stamp(t0)
    otii = _fixture_rows("Main power - Arc.csv")
    log = _tiled(tmp_path / "Main power - Arc.csv", '"Timestamp","Value"', [r[1] for r in otii],
                 w["timed"][1] + 2.0 - t0, lambda s: f"{s:.6f}")
    watts = sum(float(r[1]) for r in otii) / len(otii)
    res = cli("energy", "attribute", result, log, "--power-log-start", start, "--json", "-")
    assert res.code == 0, res.err
    m = res.json()
    assert json.loads((tmp_path / "finetune-measured.json").read_text()) == m and result.read_bytes() == before
    e = m["energy"]  # on the device: the meter's figure leads, the modelled one beside it, as with --power-log
    assert e["provenance"] == "measured" and e["meter"] == "power-log" and e["modelled"]["provenance"] == "modelled"
    assert e["power_w"] == pytest.approx(watts, rel=0.02) and e["idle_w"] == pytest.approx(watts, rel=0.02)
    assert e["joules"] == pytest.approx(watts * (w["timed"][1] - w["timed"][0]), rel=0.02)
    assert m["joules_per_epoch"] == pytest.approx(e["joules"] / 2)
    assert m["joules_per_sample"] == pytest.approx(e["joules"] / e["samples_trained"])
    assert e["carbon"]["energy_provenance"] == "measured" and e["uncertainty"]["kind"] == "standard (1 sigma)"
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**d, "energy": {**d["energy"], "meter_windows": {**w, "command": "profile"}}}))
    assert_user_error(cli("energy", "attribute", other, log, "--power-log-start", start), 2, "written by profile")

    # A log with the time of day alone, copied off the meter's PC three days later (its mtime is not the run's
    # day): placed on the day of the result's windows. The log is read once: an audit hook in the real child
    # process counts the opens of it (it was read twice, the check before the work placing it on the wrong day).
    from datetime import datetime

    tod = _tiled(tmp_path / "meter-time-of-day.csv", "time,power (W)", [r[1] for r in otii], w["timed"][1] + 2.0 - t0,
                 lambda s: datetime.fromtimestamp(t0 + s).strftime("%H:%M:%S.%f")[:-3])
    os.utime(tod, (t0 + 3 * 86400, t0 + 3 * 86400))
    hook = ("import runpy, sys\n"
            "log = sys.argv.pop(1)\n"
            "sys.addaudithook(lambda e, a: e == 'open' and str(a[0]) == log and print('OPENED', file=sys.__stderr__))\n"
            "sys.argv[0] = 'edgetrain'\n"
            "runpy.run_module('edgetrain', run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", hook, str(tod), "energy", "attribute", str(result), str(tod), "-o",
                           str(tmp_path / "tod.json"), "--json", "-"], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("OPENED") == 1, proc.stderr
    e = json.loads(proc.stdout)["energy"]
    assert e["joules"] == pytest.approx(watts * (w["timed"][1] - w["timed"][0]), rel=0.02)
    assert tod.name in e["instrument"] and e["provenance"] == "measured"
