"""`edgetrain profile` end to end, as a user runs it: real child processes, real files, exit codes."""
from __future__ import annotations

import pytest

from clitools import assert_user_error
from test_profile_models import bad_factories, conv_gemm_onnx

FAST = ("--warmup", "1", "--runs", "6")


@pytest.fixture(scope="module")
def onnx_file(tmp_path_factory):
    return conv_gemm_onnx(tmp_path_factory.mktemp("cli") / "convgemm.onnx")


def test_profile_json_to_stdout(cli, onnx_file):
    res = cli("profile", onnx_file, "--threads", "1,2", "--input-shape", "1,3,16,16", "--json", "-", *FAST)
    assert res.code == 0, res.err
    d = res.json()
    assert [c["threads"] for c in d["configs"]] == [1, 2]
    assert d["best"]["provenance"] in ("measured", "emulated")
    assert d["prediction"]["provenance"] == "modelled" and d["passed"] is True
    assert d["host_energy"]["provenance"] == "measured"  # RAPL: read, or said to be unreadable
    assert "model " not in res.out.splitlines()[0]  # human output stays off stdout with --json -


def test_profile_with_device_energy_and_report(cli, onnx_file, tmp_path):
    report, js = tmp_path / "r.html", tmp_path / "r.json"
    res = cli("profile", onnx_file, "--device", "x86-64-generic", "--threads", "1", "--rate", "120/h",
              "--battery-wh", "20", "--budget-mj", "500", "--report", report, "--json", js, *FAST)
    assert res.code == 0, res.err
    assert "fits in 7168 MB (RAM 8192 - OS reserve 1024 MB)" in res.out
    assert "[estimated:" in res.out and "PASS" in res.out and "battery    20 Wh lasts" in res.out
    assert report.read_text().startswith("<!doctype html>") and js.exists()


def test_over_budget_exits_3_and_keeps_the_report(cli, onnx_file, tmp_path):
    report, js = tmp_path / "r.md", tmp_path / "r.json"
    res = cli("profile", onnx_file, "--device", "x86-64-generic", "--threads", "1", "--budget-mj", "0.000001",
              "--report", report, "--json", js, *FAST)
    assert_user_error(res, 3, "over the budget of 1e-06 mJ")
    assert "OVER BUDGET" in report.read_text()
    assert '"passed": false' in js.read_text()


def test_gluon_prefix_in_mxnet(cli, tiny_prefix, tmp_path):
    import json

    res = cli("profile", tiny_prefix, "--runtime", "mxnet", "--threads", "1", "--report", tmp_path / "r.md",
              "--json", tmp_path / "r.json", *FAST)
    assert res.code == 0, res.err
    assert "(mxnet, input 1x1x16x16" in res.out and "Convolution" in res.out
    c = json.loads((tmp_path / "r.json").read_text())["configs"][0]
    assert c["memory"]["runtime_mb"] > 100  # import mxnet alone is ~140 MB
    # mx.profiler works in the PyPI 1.9.1 wheel although mx.runtime.Features() lists PROFILER as off.
    assert c["ops"]["available"] and "Convolution" in {r["op"] for r in c["ops"]["table"]}


@pytest.mark.parametrize("args,fragments", [
    (("--threads", "0"), ("thread count must be between 1",)),
    (("--threads", "a,b"), ("cannot read thread count 'a'", "--threads")),
    (("--runs", "0"), ("--runs", "greater than or equal to 1")),
    (("--device", "x86-64-generic", "--battery-wh", "0"), ("--battery-wh", "greater than 0")),
    (("--device", "x86-64-generic", "--rate", "120"), ("cannot read rate '120'", "N/h")),
    (("--device", "x86-64-generic", "--rate", "2/min"), ("cannot read rate",)),
    (("--report", "no/such/folder/r.html"), ("--report folder does not exist",)),
    (("--report", "r.pdf"), ("unknown report format",)),
    (("--device", "no-such-board"), ("unknown device 'no-such-board'",)),
    (("--runtime", "mxnet"), ("cannot run in MXNet",)),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(cli, onnx_file, tmp_path, args, fragments):
    res = cli("profile", onnx_file, *FAST, *args, "--json", tmp_path / "out.json", cwd=tmp_path)
    assert_user_error(res, 2, *fragments)
    assert list(tmp_path.iterdir()) == []


def test_missing_model(cli, tmp_path):
    res = cli("profile", tmp_path / "nope.onnx")
    assert_user_error(res, 2, "ONNX file not found")


def test_crashing_model_exits_1_without_hanging(cli, tmp_path):
    module = bad_factories(tmp_path)
    res = cli("profile", f"{module}:crashing_net", "--input-shape", "3,8,8", "--report", tmp_path / "r.html",
              *FAST, cwd=tmp_path, timeout=120)
    assert_user_error(res, 1, "the model analysis", "Segmentation fault")
    assert not (tmp_path / "r.html").exists()


def test_hanging_model_is_stopped_by_timeout(cli, tmp_path):
    module = bad_factories(tmp_path)
    res = cli("profile", f"{module}:hanging_net", "--input-shape", "3,8,8", "--timeout", "4", *FAST,
              cwd=tmp_path, timeout=120)
    assert_user_error(res, 1, "did not finish within 4 s")


def test_mxnet_int8_prefix_from_quantize_runs_in_mxnet(cli, tiny_prefix, tmp_path):
    q = cli("quantize", tiny_prefix, "--calib", "builtin:digits", "--backend", "mxnet", "-o", tmp_path / "int8",
            "--samples", "20")
    assert q.code == 0, q.err
    res = cli("profile", tmp_path / "int8", "--runtime", "mxnet", "--threads", "1", "--json", "-", *FAST)
    assert res.code == 0, res.err
    ops = {r["op"] for r in res.json()["configs"][0]["ops"]["table"]}
    assert any("quantize" in op or "mkldnn" in op for op in ops), ops  # the int8 graph, not an fp32 one


def test_the_thread_count_reported_is_the_one_that_ran_after_the_cap(cli, onnx_file, tmp_path):
    """A device whose default thread count is above this machine's cores (issue 37: 'capped to 2', then 'threads
    4', 'best 4 threads', 'at 4 of 4 cores busy' and threads 4 in the JSON): every figure is of the count that ran."""
    import os

    from test_profile_models import user_profile

    cores = len(os.sched_getaffinity(0))
    big = user_profile(tmp_path, name="many-cores", cores=cores + 6, default_threads=cores + 2)
    js = tmp_path / "p.json"
    res = cli("profile", onnx_file, "--device", big, "--input-shape", "1,3,16,16", "--json", js, *FAST)
    assert res.code == 0, res.err
    assert f"capped to {cores}" in res.err
    d = __import__("json").loads(js.read_text())
    assert [c["threads"] for c in d["configs"]] == [cores] and d["best"]["threads"] == cores
    assert d["verdict"]["latency"]["threads"] == cores and d["energy"]["per_inference"]["threads"] == cores
    assert any(f"{cores + 2} asked for, {cores} ran" in n for n in d["notes"])
    assert f"threads {cores} " in res.out and f"best       {cores} thread(s)" in res.out
    assert f"at {cores} of {cores + 6} cores busy" in res.out
    assert not [line for line in res.out.splitlines() if line.startswith(f"threads {cores + 2}")]
    # a sweep past the cores runs each count once
    res = cli("profile", onnx_file, "--threads", f"1,{cores + 1},{cores + 3}", "--input-shape", "1,3,16,16",
              "--json", "-", *FAST)
    assert res.code == 0, res.err
    assert [c["threads"] for c in res.json()["configs"]] == list(dict.fromkeys([1, cores]))
