"""doctor's inference check: a tiny fp32 and int8 model run in a child; a wheel that dies with SIGILL on this
CPU (onnxruntime 1.21 on a Pi 4) is one line naming the wheel and the fix, never a crash of doctor."""
from __future__ import annotations

from importlib import metadata

from edgetrain.ops.doctor import FAIL, OK, check_inference


def test_this_hosts_wheel_runs_fp32_and_int8():
    c = check_inference()
    assert c.status == OK, c
    assert c.details["version"] == metadata.version("onnxruntime") and c.details["int8_rel_err"] < 0.1


def test_a_child_killed_by_sigill_is_one_line_naming_the_wheel_and_the_fix():
    # the child really dies of SIGILL, as a wheel built for instructions the CPU lacks does
    c = check_inference("import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    version = metadata.version("onnxruntime")
    assert c.status == FAIL and c.details["signal"] == "SIGILL"
    assert f"onnxruntime {version} dies with SIGILL" in c.message and "\n" not in c.message
    assert "pip install" in c.fix and "\n" not in c.fix


def test_any_other_death_is_reported_with_its_signal_or_exit_code():
    c = check_inference("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)")
    assert c.status == FAIL and "SIGSEGV" in c.message
    c = check_inference("import sys; sys.stderr.write('boom\\n'); sys.exit(3)")
    assert c.status == FAIL and "exited 3: boom" in c.message
