"""The thread cap holds: measured as the number of threads that actually did the work in a child."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROBE = Path(__file__).parent / "probes" / "thread_probe.py"


def busy_threads(threads: int, runtime: str) -> int:
    out = subprocess.run([sys.executable, str(PROBE), str(threads), runtime], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])["busy"]


@pytest.mark.parametrize("runtime", ["mxnet", "ort"])
def test_cap_of_one_thread_leaves_one_thread_working(runtime):
    assert busy_threads(1, runtime) == 1


@pytest.mark.parametrize("runtime", ["mxnet", "ort"])
def test_cap_of_two_lets_two_threads_work(runtime):
    # the control: without it, a probe that could only ever see one busy thread would pass the test above
    assert busy_threads(2, runtime) == 2


def test_help_imports_no_heavy_library():
    code = ("import runpy, sys\nsys.argv = ['edgetrain', '--help']\n"
            "try:\n    runpy.run_module('edgetrain', run_name='__main__')\nexcept SystemExit as e:\n    code = e.code\n"
            "print('HEAVY', [m for m in ('mxnet', 'onnxruntime', 'onnx') if m in sys.modules], code)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "HEAVY [] 0" in out.stdout, out.stdout + out.stderr
    assert "Usage: edgetrain" in out.stdout


def test_apply_threads_after_mxnet_import_is_refused():
    code = ("from edgetrain import runtime\nimport mxnet\n"
            "try:\n    runtime.apply_threads(1)\nexcept RuntimeError as e:\n    print('REFUSED', e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert "REFUSED" in out.stdout, out.stdout + out.stderr
