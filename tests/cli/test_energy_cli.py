"""Energy end to end (issue 17): `edgetrain profile` and `edgetrain finetune` measuring a board through a
generated sensor tree, a fake vcgencmd on PATH and a generated USB meter log, in real child processes."""
from __future__ import annotations

import os
import time

import pytest

from clitools import assert_user_error
from test_power import fake_vcgencmd, meter_log, pmic_output, pmic_watts, write
from test_profile_models import conv_gemm_onnx, user_profile

FAST = ("--warmup", "1", "--runs", "20", "--input-shape", "1,3,16,16")


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    return conv_gemm_onnx(tmp_path_factory.mktemp("energy") / "convgemm.onnx")


@pytest.fixture(scope="module")
def this_host(tmp_path_factory):
    """A device profile that matches this machine: what is measured here is measured on the device."""
    from edgetrain.host import detect_host

    host = detect_host()
    return user_profile(tmp_path_factory.mktemp("dev"), name="this-board", arch=host.arch, cores=host.cores_usable,
                        ram_mb=host.ram_mb, default_threads=1, os_reserve_mb=256, memory_budget_mb=1024)


def hwmon_tree(root, microwatts: int):
    write(root / "class" / "hwmon" / "hwmon0" / "name", "ina219")
    write(root / "class" / "hwmon" / "hwmon0" / "power1_input", microwatts)
    return root


def sensor_env(root, **more):
    return {"EDGETRAIN_SYSFS_ROOT": str(root), "EDGETRAIN_VCGENCMD": str(root / "no-vcgencmd"), **more}


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


@pytest.mark.parametrize("command", ["finetune", "profile"])
def test_a_log_in_a_format_edgetrain_cannot_read_is_refused_before_any_work(cli, onnx_file, tmp_path, command):
    """A Joulescope statistics record in its 'relative' time format (tests/fixtures/power/SOURCES.md): refused
    in one line before the fine-tune trains or the profile runs, not after."""
    log = FIXTURE_LOGS / "joulescope-statistics-relative.csv"
    out = tmp_path / "o"
    args = (["finetune", "edgetrain.nets:pretrained_digits", "--data", "builtin:digits", "-o", out, "--epochs", "50"]
            if command == "finetune" else ["profile", onnx_file, *FAST])
    t0 = time.monotonic()
    res = cli(*args, "--power-log", log, env=no_sensor_env(tmp_path), cwd=tmp_path)
    elapsed = time.monotonic() - t0
    assert_user_error(res, 2, "count from the start of its recording", "joulescope-statistics-relative.csv:2",
                      "time format to UTC")
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
