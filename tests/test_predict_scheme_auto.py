"""quantize --scheme auto: the int8 scheme (or fp32) chosen by timing the candidates where they will run.

Whatever wins on this machine, the promise holds: every candidate was built, checked against the budget
and timed in fresh processes with the thread cap; the one written is the fastest within the budget and
the file says which it is; an interrupted search leaves the best so far."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import edgetrain
from edgetrain.models import load_onnx
from edgetrain.runners import OrtRunner


@pytest.fixture(scope="module")
def fp32(tmp_path_factory):
    root = tmp_path_factory.mktemp("scheme")
    assert edgetrain.export("edgetrain.nets:pretrained_digits", root / "fp32.onnx").passed
    from edgetrain.data import load_data
    from edgetrain.preprocess import Preprocess

    ds = load_data("builtin:digits", Preprocess(input_shape=(1, 8, 8), mean=(0.0,), std=(1.0,)))
    keep = np.flatnonzero(ds.labels < 5)
    x = np.stack([ds._raw(int(i))[..., 0] for i in keep])
    np.savez(root / "d5.npz", data=x, label=ds.labels[keep])
    np.savez(root / "zeros.npz", data=np.zeros((20, 8, 8), np.float32), label=np.arange(20) % 2)
    return root


def _ops(path):
    import onnx

    return {n.op_type for n in onnx.load(str(path)).graph.node}


def _check_choice(res, out, allowed=("fp32", "static", "dynamic")):
    s = res.scheme
    assert s.measured is True
    cands = s.candidates
    assert cands[0].name == "fp32"
    kinds = {(c.scheme.activations, c.scheme.per_channel) for c in cands if c.kind == "static"}
    assert kinds == {("int8", True), ("int8", False), ("uint8", True), ("uint8", False)}  # S8S8/U8S8 x pc/pt
    assert sum(c.rule for c in cands) == 1 and sum(c.chosen for c in cands) == 1
    eligible = [c for c in cands if c.error is None and c.within_budget is not False and c.kind in allowed]
    chosen = next(c for c in cands if c.chosen)
    assert (chosen in eligible and chosen.p50_ms == min(c.p50_ms for c in eligible)) or (not eligible and chosen.rule)
    for c in cands:
        if c.error is None:
            assert len(c.rounds) >= 2 and c.p50_ms == min(c.rounds) and c.size_bytes > 0
            assert c.threads == 1                                    # the thread cap reached the child
            assert len(set(c.pids)) == len(c.pids) and os.getpid() not in c.pids  # fresh processes
    record = json.loads(load_onnx(out).metadata["edgetrain.quantization"])
    assert record["scheme"] == chosen.name and record["search"] == "done"
    quantized = bool(_ops(out) & {"QuantizeLinear", "DynamicQuantizeLinear", "MatMulInteger"})
    assert quantized == (chosen.name != "fp32")
    assert load_onnx(out).metadata["edgetrain.precision"] == ("fp32" if chosen.name == "fp32" else "int8")
    assert OrtRunner(out, 1).infer(np.zeros((3, 1, 16, 16), np.float32)).shape == (3, 5)  # any batch
    return chosen


def test_auto_writes_the_fastest_candidate_and_says_which(fp32, tmp_path):
    out = tmp_path / "q.onnx"
    res = edgetrain.quantize(fp32 / "fp32.onnx", calib=fp32 / "d5.npz", output=out, val=str(fp32 / "d5.npz"),
                             samples=100, threads=1)
    chosen = _check_choice(res, out)
    assert res.passed and any(c.name.startswith("dynamic") for c in res.scheme.candidates)  # Gemm: applies
    assert res.latency.int8_p50_ms == chosen.p50_ms and "fresh processes" in res.latency.measured_on
    if chosen.name == "fp32":
        assert any("fp32 was the fastest" in n for n in res.notes)
    assert res.node_errors and all(r.node and r.op and r.lost_db is not None for r in res.node_errors)


def test_candidates_over_the_budget_are_never_written(fp32, tmp_path):
    """Calibrated on black images, every static int8 model is wrecked; only those within budget compete."""
    out = tmp_path / "q.onnx"
    res = edgetrain.quantize(fp32 / "fp32.onnx", calib=fp32 / "zeros.npz", output=out, val=str(fp32 / "d5.npz"),
                             max_drop=1.0, max_fp32_nodes=0, samples=20, threads=1)
    chosen = _check_choice(res, out)
    static = [c for c in res.scheme.candidates if c.name.startswith("QDQ")]
    assert static and all(c.within_budget is False for c in static)
    assert chosen.within_budget is True and res.passed and res.accuracy.drop <= 1.0


def test_for_another_device_the_rule_is_kept_and_said_to_be_unmeasured(fp32, tmp_path):
    res = edgetrain.quantize(fp32 / "fp32.onnx", calib=fp32 / "d5.npz", output=tmp_path / "q.onnx", samples=50,
                             threads=1, device="rpi4b-4gb", latency=False)
    assert res.scheme.measured is False and res.scheme.candidates is None
    assert "S8S8" in res.scheme.name and "not measured" in res.scheme.reason
    assert any("not measured" in n and "rpi4b-4gb" in n for n in res.notes)
    res = edgetrain.quantize(fp32 / "fp32.onnx", calib=fp32 / "d5.npz", output=tmp_path / "r.onnx", samples=50,
                             threads=1, scheme="rule", latency=False)
    assert res.scheme.measured is False and any("--scheme rule" in n for n in res.notes)


def test_a_search_stopped_midway_leaves_the_best_candidate_so_far(fp32, tmp_path):
    out = tmp_path / "q.onnx"
    proc = subprocess.Popen([sys.executable, "-m", "edgetrain", "quantize", fp32 / "fp32.onnx", "--calib",
                             fp32 / "d5.npz", "-o", out, "--samples", "50", "--threads", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 300
    while not out.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    assert proc.poll() is None, "quantize ended before the search wrote a best-so-far model"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    record = json.loads(load_onnx(out).metadata["edgetrain.quantization"])
    assert record["search"].startswith("stopped before the end")
    assert OrtRunner(out, 1).infer(np.zeros((2, 1, 16, 16), np.float32)).shape == (2, 5)


def _timing_warnings_agree(res, chosen):
    """A busy host is said (human output and JSON) exactly when the timings' load says so; fp32 outrunning
    the int8 written is said exactly when it did."""
    quiet = res.scheme.host_quiet
    assert set(quiet) >= {"reliable", "reasons", "loadavg", "cores"}
    busy = [w for w in res.warnings if "busy host" in w]
    assert bool(busy) == (not quiet["reliable"])
    fp32 = next(c for c in res.scheme.candidates if c.kind == "fp32")
    faster = [w for w in res.warnings if w.startswith("fp32 ran faster")]
    assert bool(faster) == (chosen.kind != "fp32" and fp32.p50_ms is not None and fp32.p50_ms < chosen.p50_ms)


@pytest.mark.parametrize("scheme,name,allowed", [
    ("int8", "q.onnx", ("static", "dynamic")),
    ("qdq", "q.onnx", ("static",)),
    ("auto", "model_int8.onnx", ("static", "dynamic")),   # -o names int8: auto never writes fp32 there
    ("auto", "q.onnx", ("fp32", "static", "dynamic")),
])
def test_an_insisted_scheme_is_never_fp32_and_a_busy_host_is_said(fp32, tmp_path, scheme, name, allowed):
    out = tmp_path / name
    res = edgetrain.quantize(fp32 / "fp32.onnx", calib=fp32 / "d5.npz", output=out, val=str(fp32 / "d5.npz"),
                             samples=50, threads=1, scheme=scheme)
    chosen = _check_choice(res, out, allowed)
    assert chosen.kind in allowed and res.passed
    if "fp32" not in allowed:
        assert load_onnx(out).metadata["edgetrain.precision"] == "int8" and res.scheme.format != "fp32"
    _timing_warnings_agree(res, chosen)
    assert json.loads(json.dumps(res.to_dict()))["scheme"]["host_quiet"] == res.scheme.host_quiet


def test_the_cli_says_a_busy_host_and_what_it_wrote(fp32, tmp_path, cli):
    """One run, its human output and its JSON: the busy-host warning is in both or neither, and an int8 name
    never gets fp32."""
    res = cli("quantize", fp32 / "fp32.onnx", "--calib", fp32 / "d5.npz", "-o", tmp_path / "m_int8.onnx",
              "--samples", "50", "--threads", "1", "--json", tmp_path / "q.json", cwd=tmp_path)
    assert res.code == 0, res.err
    doc = json.loads((tmp_path / "q.json").read_text())
    assert doc["scheme"]["format"] != "fp32" and "the fp32 model was written" not in res.out + res.err
    busy = not doc["scheme"]["host_quiet"]["reliable"]
    assert any("busy host" in w for w in doc["warnings"]) == busy
    assert ("busy host" in res.out + res.err) == busy
