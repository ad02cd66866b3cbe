"""edgetrain.measure.profiling: real child processes, real ONNX Runtime / MXNet runs, real device profiles."""
from __future__ import annotations

import os
import statistics

import numpy as np
import pytest

from edgetrain.errors import UsageError
from edgetrain.api import profile
from edgetrain.options import parse_threads
from edgetrain.measure.profiling import latency_summary, percentile
from test_profile_models import conv_gemm_onnx, user_profile

PROVENANCES = {"measured", "estimated", "modelled", "emulated"}
FAST = dict(warmup=1, runs=8)


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    return conv_gemm_onnx(tmp_path_factory.mktemp("onnx") / "convgemm.onnx")


@pytest.fixture(scope="module")
def swept(onnx_file):
    return profile(str(onnx_file), threads="1,2", device="x86-64-generic", rate="600/h", battery_wh=20,
                   input_shape=(3, 16, 16), **FAST)


@pytest.mark.parametrize("text,expected", [("1,2,4", [1, 2, 4]), ("2", [2]), (" 4, 1 ,4", [4, 1])])
def test_parse_threads(text, expected):
    assert parse_threads(text) == expected


@pytest.mark.parametrize("text", ["0", "a,b", "1,,2", "-1", "1.5", "", "999"])
def test_parse_threads_rejects(text):
    with pytest.raises(UsageError) as exc:
        parse_threads(text)
    assert exc.value.where == "--threads"


def test_percentiles_match_numpy():
    xs = list(np.random.RandomState(1).exponential(3.0, 137))
    for q in (50, 90, 99):
        assert percentile(xs, q) == pytest.approx(np.percentile(xs, q))
    s = latency_summary(xs)
    assert s["spread_p99_p50"] == pytest.approx(s["p99_ms"] / s["p50_ms"])


def test_each_thread_count_runs_in_its_own_process(swept):
    assert [c["threads"] for c in swept.configs] == [1, 2]
    for c in swept.configs:
        assert len(c["latencies_ms"]) == 8 and c["latency"]["runs"] == 8
        assert c["first_inference_ms"] > 0 and c["load_s"] > 0
        m = c["memory"]
        assert m["runtime_mb"] + m["load_mb"] + m["inference_mb"] == pytest.approx(m["peak_rss_mb"])
        assert c["ops"]["available"] and "Conv" in {r["op"] for r in c["ops"]["table"]}
    pids = {c["pid"] for c in swept.configs}
    assert len(pids) == 2 and os.getpid() not in pids
    assert swept.best["threads"] in (1, 2)
    assert swept.input_shape == [1, 3, 16, 16]


def test_every_figure_carries_provenance_and_source(swept):
    assert swept.figures
    for f in swept.figures:
        assert f["provenance"] in PROVENANCES, f
        assert f["source"], f
    d = swept.to_dict()
    assert d["prediction"]["provenance"] == "modelled"
    assert d["verdict"]["memory"]["provenance"] == "estimated"  # measured here, not on the device


def test_estimate_is_never_presented_as_a_measurement(swept):
    lat = swept.verdict["latency"]
    # This host is not a 4-core 8 GB box: the profile's 'host' speed relation gives an estimate.
    assert lat["provenance"] == "estimated" and lat["factor"] == 1.0
    assert "as fast as this host" in lat["source"]
    e = swept.energy
    assert e["per_inference"]["provenance"] == "modelled" and "estimated" in e["per_inference"]["source"]
    assert e["daily"]["inferences_per_day"] == 600 * 24 and e["daily"]["battery_hours"] > 0
    mem = swept.verdict["memory"]
    assert mem["fits"] and mem["available_mb"] == 8192 - 1024


def test_matching_host_is_measured(onnx_file, tmp_path):
    from edgetrain.host import detect_host

    host = detect_host()
    path = user_profile(tmp_path, name="this-host", arch=host.arch, cores=host.cores_usable, ram_mb=host.ram_mb,
                        default_threads=1, os_reserve_mb=256, memory_budget_mb=512)
    res = profile(str(onnx_file), device=str(path), **FAST)
    expected = "emulated" if host.emulated else "measured"
    assert res.verdict["latency"]["provenance"] == expected
    assert res.verdict["memory"]["provenance"] == ("estimated" if host.emulated else "measured")


@pytest.mark.parametrize("threads", [1, 2])
def test_reference_latency_scales_the_host_measurement(onnx_file, tmp_path, threads):
    ref = {"model": "edgetrain.nets:digits_cnn", "input": 16, "threads": threads, "runtime": "mxnet",
           "latency_ms": 50.0, "source": "a made-up figure for the test, 50 ms on the board"}
    path = user_profile(tmp_path, name="slowboard", speed={"method": "reference_latency", "reference": ref})
    res = profile(str(onnx_file), device=str(path), threads=str(threads), **FAST)
    lat = res.verdict["latency"]
    assert lat["provenance"] == "estimated"
    if threads == 1:  # the model and the reference timed in turns in one process, in CPU time
        pr = lat["paired"]
        assert lat["basis"] == "paired_cpu_time" and "timed in turns" in lat["source"]
        assert pr["rounds"] == 60 and 1 <= pr["per_round"] <= 10
        # each round's model/reference ratio is recorded; the device's p50 is its figure x their median
        ratio = pr["ratio"]
        assert len(ratio["by_round"]) == 60 and all(r > 0 for r in ratio["by_round"])
        assert ratio["p50"] == pytest.approx(statistics.median(ratio["by_round"]))
        assert lat["p50_ms"] == pytest.approx(50.0 * ratio["p50"])
        assert lat["p50_ms"] == pytest.approx(pr["model_cpu_p50_ms"] * lat["factor"])
        assert ratio["ratio_of_medians"] == pytest.approx(pr["model_cpu_p50_ms"] / pr["reference_cpu_p50_ms"])
        # the modelled interval holds the figure at every per-round ratio from the p10 to the p90 (not shrunk to
        # the spread of the model's own runs)
        # ... and reaching down to the figure the host's measured contention would leave (contention.py)
        drift = pr["contention"]["drift"]
        assert drift >= 1.0
        assert lat["p50_range_ms"] == pytest.approx([50.0 * min(ratio["p10"], ratio["p50"] / drift), 50.0 * ratio["p90"]])
        e = res.energy["per_inference"]
        u = e["uncertainty"]
        assert u["low_mj"] <= 50.0 * ratio["p10"] * e["power_w"] and u["high_mj"] >= 50.0 * ratio["p90"] * e["power_w"]
        assert "per-round ratios" in u["source"]
    else:  # several threads' CPU time is not a latency: wall clock on both sides
        assert lat["basis"] == "wall_clock"
        assert lat["factor"] == pytest.approx(50.0 / lat["reference"]["host_ms"])
        assert lat["p50_ms"] == pytest.approx(lat["host_p50_ms"] * lat["factor"])
    assert "50.0 ms" in lat["source"] and "mxnet" in lat["reference"]["host_runtime"]


def test_unknown_speed_gives_no_latency_and_refuses_an_energy_budget(onnx_file):
    res = profile(str(onnx_file), device=_unknown_profile(onnx_file), **FAST)
    assert res.verdict["latency"]["mean_ms"] is None and "no speed figure" in res.verdict["latency"]["note"]
    assert res.energy["available"] is False
    with pytest.raises(UsageError, match="--budget-mj"):
        profile(str(onnx_file), device=_unknown_profile(onnx_file), budget_mj=5, **FAST)


def _unknown_profile(onnx_file):
    folder = onnx_file.parent
    path = folder / "noclue.yaml"
    if not path.exists():
        user_profile(folder, name="noclue", speed={"method": "unknown", "note": "nothing published"})
    return str(path)


def test_model_that_does_not_fit_fails_the_check(onnx_file, tmp_path):
    path = user_profile(tmp_path, name="tiny-ram", ram_mb=64, os_reserve_mb=32, memory_budget_mb=16)
    res = profile(str(onnx_file), device=str(path), **FAST)
    assert res.verdict["memory"]["fits"] is False
    assert any("does not fit the 32 MB" in f for f in res.failed_checks)
    assert res.to_dict()["passed"] is False


def test_gluon_prefix_exported_for_onnxruntime(tiny_prefix):
    res = profile(str(tiny_prefix), runtime="onnxruntime", threads="1", **FAST)
    assert res.runtime == "onnxruntime" and res.input_shape == [1, 1, 16, 16]
    assert res.configs[0]["memory"]["runtime_mb"] < 100  # no mxnet in the timed child


def test_onnx_file_cannot_run_in_mxnet(onnx_file):
    with pytest.raises(UsageError, match="cannot run in MXNet"):
        profile(str(onnx_file), runtime="mxnet", **FAST)


@pytest.mark.parametrize("kwargs,where", [({"runs": 0}, "--runs"), ({"warmup": -1}, "--warmup"),
                                          ({"batch": 0}, "--batch"), ({"threads": "0"}, "--threads")])
def test_bad_counts_fail_before_any_work(onnx_file, kwargs, where):
    with pytest.raises(UsageError) as exc:
        profile(str(onnx_file), **{**FAST, **kwargs})
    assert exc.value.where == where


def test_energy_options_need_a_device(onnx_file):
    with pytest.raises(UsageError, match="power figures"):
        profile(str(onnx_file), battery_wh=10, **FAST)

# A model that crashes or hangs its child: tests/cli/test_profile_cli.py, end to end.


def test_batch_fills_a_dynamic_batch_dimension(onnx_file):
    res = profile(str(onnx_file), batch=3, threads="1", input_shape=(3, 16, 16), **FAST)
    assert res.input_shape == [3, 3, 16, 16] and res.configs[0]["input"]["shape"] == [3, 3, 16, 16]
    assert res.prediction["stats"]["input_bytes"] == 4 * 3 * 3 * 16 * 16


def test_fixed_batch_or_shape_mismatch_is_a_usage_error(tmp_path):
    fixed = conv_gemm_onnx(tmp_path / "fixed.onnx", batch=1)
    with pytest.raises(UsageError, match="fixed batch of 1, not 2"):
        profile(str(fixed), batch=2, threads="1", **FAST)
    with pytest.raises(UsageError, match="contradicts"):
        profile(str(fixed), threads="1", input_shape=(3, 32, 32), **FAST)


def test_timings_under_emulation_are_labelled_emulated_and_not_scaled(swept):
    from edgetrain.devices import load_device
    from edgetrain.host import HostInfo
    from edgetrain.measure.profiling import _latency_verdict, _timing_label

    host = HostInfo(arch="aarch64", cores_logical=4, cores_usable=4, ram_mb=4096, cpu="Cortex-A72", isa={},
                    os="test", python="3.11", emulated=True,
                    emulation_evidence=["/proc/sys/kernel/arch is x86_64 but the process reports aarch64"])
    label, source = _timing_label(host)
    assert label == "emulated" and "x86_64" in source
    pi4 = load_device("rpi4b-4gb")
    assert not host.matches(pi4)  # an emulated host never counts as the device
    lat = _latency_verdict(swept.configs[0], swept.configs, pi4, host, label, 60, None)
    assert lat["provenance"] == "emulated" and lat["mean_ms"] is None


@pytest.mark.slow
def test_a_run_slower_than_the_host_has_been_widens_its_interval_and_is_flagged_with_the_reason(
        onnx_file, tmp_path, monkeypatch):
    """The whole-run shift a busy neighbour causes: the reference's median CPU time against the lowest this host
    has given it. The host's memory says it once ran the reference 8x and 16x faster than the run before (far
    enough that this run's own load, up to 7x lighter than the run before's, still reads as contention): the
    interval reaches down by the drift measured (it widens with the contention) and the figure is flagged, the
    reason in the JSON result."""
    import json

    from edgetrain.measure import contention

    monkeypatch.setenv("EDGETRAIN_CACHE_DIR", str(tmp_path / "cache"))
    ref = {"model": "edgetrain.nets:digits_cnn", "input": 16, "threads": 1, "runtime": "mxnet",
           "latency_ms": 50.0, "source": "a made-up figure for the test, 50 ms on the board"}
    path = user_profile(tmp_path, name="slowboard", speed={"method": "reference_latency", "reference": ref})
    memory = tmp_path / "cache" / contention.QUIET_FILE
    lows, fast = {}, 0.0
    for faster in (1, 8, 16):  # 2x failed once under the slow stage's load: the run before was 1.8x slower
        if faster > 1:  # what this host gave before, made `faster` times quicker than this run saw
            seen = json.loads(memory.read_text())
            memory.write_text(json.dumps({k: (v if "|model ratio " in k else fast / faster) for k, v in seen.items()}))
        res = profile(str(onnx_file), device=str(path), threads="1", **FAST)
        lat, e = res.verdict["latency"], res.energy
        c = lat["paired"]["contention"]
        assert c["quiet_known"] == (faster > 1)
        fast = c["reference_cpu_p50_ms"]
        assert c["reference_shift"] == pytest.approx(max(fast / c["reference_quiet_cpu_ms"], 1.0))
        u = e["per_inference"]["uncertainty"]
        assert u["low_mj"] <= e["per_inference"]["total_mj"] / c["drift"] * 1.000001
        lows[faster] = (u["low_mj"] / e["per_inference"]["total_mj"], c["drift"])
        payload = json.loads(json.dumps(res.to_dict()))
        reasons = payload["reliability"]["reasons"]
        flagged = [r for r in reasons if r.startswith("contention on the host")]
        if c["drift"] > c["limit"]:
            assert flagged and f"{c['drift']:.2f}x" in flagged[0] and payload["reliability"]["reliable"] is False
            assert payload["reliability"]["contention"]["drift"] == pytest.approx(c["drift"])
            assert any("contention on the host" in w for w in payload["warnings"])
        else:
            assert not flagged
        assert c["drift"] == pytest.approx(max(c["in_run"] * c["reference_shift"], c.get("against_quietest", 0)))
        assert c["in_run"] >= 1.0 and ("against_quietest" not in c or faster > 1)  # only once timed here before
        if faster > 1:
            assert c["reference_shift"] > c["limit"] and flagged
    # the interval widens with the contention measured: its low end is at most the figure / drift in every run
    assert all(low <= 1.0 / d * 1.000001 for low, d in lows.values())
