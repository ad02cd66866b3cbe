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


def test_blas_kernels_follow_the_cpus_flags():
    from edgetrain.runtime import blas_kernels_for

    skylakex = "processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma avx512f avx512dq avx512cd avx512bw avx512vl\n"
    assert blas_kernels_for(skylakex) == "SKYLAKEX"
    assert blas_kernels_for("flags\t\t: fpu sse2 avx avx2 fma avx512f\n") == "HASWELL"  # not SkylakeX's whole set
    assert blas_kernels_for("flags\t\t: fpu sse2 avx\n") is None
    assert blas_kernels_for("Features\t: fp asimd evtstrm\n") is None  # ARM: OpenBLAS knows its cores


BLAS_PROBE = """
import ctypes, json, os, sys
import edgetrain, numpy
libs = [ln.split()[-1] for ln in open("/proc/self/maps") if "openblas" in ln.lower() and ".so" in ln]
name = None
for sym in ("openblas_get_corename64_", "openblas_get_corename", "scipy_openblas_get_corename64_"):
    fn = getattr(ctypes.CDLL(libs[0]), sym, None) if libs else None
    if fn is not None:
        fn.restype = ctypes.c_char_p
        name = fn().decode()
        break
print(json.dumps({"env": os.environ.get("OPENBLAS_CORETYPE"), "core": name}))
"""


@pytest.mark.parametrize("user", [None, "HASWELL"])
def test_importing_edgetrain_names_the_blas_kernels_unless_the_user_did(user):
    """numpy's OpenBLAS picks its kernels when it loads; edgetrain names them from the CPU's flags first
    (OpenBLAS 0.3.20 ran its SSE3 kernels on this machine's newer Xeon), and a user's own choice stands."""
    import os
    import platform

    from edgetrain.runtime import blas_kernels_for

    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    if user:
        env["OPENBLAS_CORETYPE"] = user
    out = subprocess.run([sys.executable, "-c", BLAS_PROBE], capture_output=True, text=True, timeout=60, env=env)
    got = json.loads(out.stdout.strip().splitlines()[-1])
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    want = user or (blas_kernels_for(text) if platform.machine() in ("x86_64", "AMD64") else None)
    assert got["env"] == want
    if want and got["core"] is not None and want in ("SKYLAKEX", "HASWELL") and not (user and "avx2" not in text):
        assert got["core"].lower() == want.lower(), got  # the library really runs those kernels


THREADS_AFTER_NUMPY = """
import os, sys
from edgetrain.cli import _early_thread_cap
_early_thread_cap(sys.argv[1:])
import numpy  # its OpenBLAS starts its pool here
print(len(os.listdir("/proc/self/task")))
"""


def test_the_command_lines_thread_cap_sizes_numpys_blas_pool_before_numpy_loads():
    """numpy is imported before click reads --threads; the CLI sets the caps' variables first, so OpenBLAS
    starts no workers beyond the cap (an uncapped pool's workers spin at start-up). The control, without
    --threads, shows OpenBLAS would start one per core."""
    from edgetrain.runtime import usable_cores

    if usable_cores() < 2:
        pytest.skip("one usable core: OpenBLAS starts no workers either way")
    env = {k: v for k, v in __import__("os").environ.items() if not k.endswith("_NUM_THREADS")}

    def threads(*argv):
        out = subprocess.run([sys.executable, "-c", THREADS_AFTER_NUMPY, *argv], env=env, capture_output=True,
                             text=True, check=True)
        return int(out.stdout)

    assert threads("finetune", "m", "--threads", "1") == 1
    assert threads("finetune", "m", "--threads=1") == 1
    assert threads("finetune", "m") >= 2  # the control: one OpenBLAS worker per further core
    assert threads("profile", "m", "--threads", "1,2") >= 2  # a sweep: each child takes its own cap
    assert threads("finetune", "m", "--threads", "0") >= 2  # refused by the declaration, not applied here
