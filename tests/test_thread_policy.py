"""Issue 26: thread pools do not spin against each other on a busy machine. The policy (runtime.ThreadPolicy)
over generated loads, cores and thread counts, and the settings it applies in real processes: OpenMP's
wait policy before mxnet loads and ONNX Runtime's spinning in the sessions edgetrain makes; and the thread
count a device's default gives (capped to the cores, never lowered: 1 thread was no faster on a loaded host)."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from edgetrain.host import oversubscribed
from edgetrain.runtime import ThreadPolicy

LOADS = [None, 0.0, 0.3, 0.49, 0.5, 0.9, 1.0, 1.2, 1.5, 1.99, 2.0, 2.5, 3.0, 7.9, 16.6, 64.0]


@pytest.mark.parametrize("cores", [1, 2, 4, 8])
def test_the_policy_over_loads_cores_and_counts(cores):
    for load in LOADS:
        for threads in range(1, cores + 1):
            p = ThreadPolicy(threads, load, cores)
            assert p.threads == threads                                   # the count is never changed
            assert p.spin == (load is None or load + threads <= cores)    # no spinning once over the cores
            assert p.spin == (not oversubscribed(load, cores, threads))


PROBE = """
import json, os, sys
from edgetrain import runtime, _lazy
from edgetrain.runtime import ThreadPolicy
load, threads = json.loads(sys.argv[1])
runtime.apply_policy(ThreadPolicy(threads, load, 2))
so = _lazy.ort_session_options(threads, spinning=True)
try:
    spin = so.get_session_config_entry("session.intra_op.allow_spinning")
except Exception:  # not set: ONNX Runtime's default, spinning
    spin = None
print(json.dumps({"omp": os.environ.get("OMP_WAIT_POLICY"), "ort_spin": spin}))
"""


@pytest.mark.parametrize("load,threads", [(0.0, 1), (0.5, 1), (0.5, 2), (1.5, 1), (3.0, 1), (16.0, 2)])
def test_the_settings_a_busy_host_gets_in_a_real_process(load, threads):
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps([load, threads])], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    busy = oversubscribed(load, 2, threads)
    assert got == {"omp": "PASSIVE" if busy else None, "ort_spin": "0" if busy else None}
    assert "warning:" not in done.stderr  # not spinning changes no figure: said nowhere


def test_a_users_wait_policy_is_kept():
    env = {**os.environ, "OMP_WAIT_POLICY": "ACTIVE"}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps([16.0, 2])], env=env, capture_output=True,
                          text=True, timeout=120)
    assert json.loads(done.stdout.strip().splitlines()[-1])["omp"] == "ACTIVE", done.stderr


@pytest.mark.parametrize("given", [False, True])
def test_the_sessions_get_the_applied_cap_not_the_devices_number(cli, tmp_path, digits5_onnx, given):
    """predict with the device's default (4 on rpi4b-4gb) and with --threads: the runtime gets the cap in
    force (the device's number capped to this host's cores), never more threads than cores."""
    from edgetrain.runtime import usable_cores

    default = min(4, usable_cores())
    extra = ["--threads", str(default)] if given else []
    res = cli("predict", digits5_onnx, "builtin:digits", "--device", "rpi4b-4gb", *extra, "--format", "csv",
              "-o", tmp_path / "p.csv", "--json", tmp_path / "p.json", cwd=tmp_path)
    assert res.code == 0, res.err
    assert json.loads((tmp_path / "p.json").read_text())["threads"] == default
    assert res.err.count("warning:") <= 1
