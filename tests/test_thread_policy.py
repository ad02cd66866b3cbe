"""Issue 26: thread pools do not spin against each other on a busy machine. The policy (runtime.ThreadPolicy)
over generated loads, cores and thread counts, and the settings it applies in a real process: OpenMP's
wait policy before mxnet loads and ONNX Runtime's spinning in the sessions edgetrain makes."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from edgetrain.host import oversubscribed
from edgetrain.runtime import ThreadPolicy

LOADS = [None, 0.0, 0.3, 0.49, 0.5, 0.9, 1.0, 1.2, 1.5, 1.99, 2.0, 2.5, 3.0, 7.9, 16.6, 64.0]


@pytest.mark.parametrize("cores", [1, 2, 4, 8])
@pytest.mark.parametrize("explicit", [True, False])
def test_the_policy_over_loads_cores_and_counts(cores, explicit):
    for load in LOADS:
        for threads in range(1, cores + 1):
            p = ThreadPolicy(threads, explicit, load, cores)
            if explicit or load is None or not oversubscribed(load, cores, threads):
                assert p.threads == threads                      # the user's number, or room for it
            else:                                                # a default: what the others leave free
                assert p.threads == min(threads, max(1, cores - int(load + 0.5)))
            assert 1 <= p.threads <= threads
            assert p.spin == (not oversubscribed(load, cores, p.threads))   # never spin when over the cores
            if load is None:
                assert p.spin and p.note is None
            assert (p.note is None) == (p.threads == threads and p.spin)
            if p.threads != threads:
                assert f"--threads {threads} insists" in p.note


PROBE = """
import json, sys
from edgetrain import runtime, _lazy
from edgetrain.runtime import ThreadPolicy
load, threads = json.loads(sys.argv[1])
runtime.apply_policy(ThreadPolicy(threads, True, load, 2))
import os
so = _lazy.ort_session_options(threads, spinning=True)
try:
    spin = so.get_session_config_entry("session.intra_op.allow_spinning")
except Exception:  # not set: ONNX Runtime's default, spinning
    spin = None
print(json.dumps({"omp": os.environ.get("OMP_WAIT_POLICY"), "ort_spin": spin}))
"""


@pytest.mark.parametrize("load,threads", [(0.0, 1), (0.5, 1), (0.5, 2), (1.5, 1), (3.0, 1), (16.0, 2)])
def test_the_settings_a_busy_host_gets_in_a_real_process(load, threads):
    env = {k: v for k, v in __import__("os").environ.items() if k != "OMP_WAIT_POLICY"}
    done = subprocess.run([sys.executable, "-c", PROBE, json.dumps([load, threads])], env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    busy = oversubscribed(load, 2, threads)
    assert got == {"omp": "PASSIVE" if busy else None, "ort_spin": "0" if busy else None}
    assert ("warning: the host is busy" in done.stderr) == busy and done.stderr.count("warning:") <= 1
