"""`edgetrain doctor`: check the installation; --fix repairs what it can."""
from __future__ import annotations


import click

from ..results import report
from .common import json_option, quiet, say, write_json
from .render import ProgressLine


@click.command()
@click.option("--fix", is_flag=True,
              help="Repair what can be repaired: install mxnet 1.9.1 when it is missing, making this install the "
                   "host (on Python 3.12+ without its numpy<2 pin, which pip cannot resolve there; skip --fix on a "
                   "device); on aarch64 link the ARM Performance Libraries mxnet needs to OpenBLAS/LAPACKE, libm "
                   "and libc. Changes nothing when all is well.")
@json_option
def doctor(fix, json_path):
    """Check Python, numpy, mxnet (import and a computation), onnx, onnxruntime, thread settings and
    CPU features; say what is wrong and how to fix it.

    Libraries are imported in child processes, so a broken install is reported, not crashed on.
    Exit 0 when healthy, 1 when any check failed.
    """
    from ..ops.doctor import render, run_checks

    line = ProgressLine(not quiet(json_path))
    result = run_checks(fix=fix, progress=lambda name: report(line, "doctor", message=f"checking {name}"))
    say(json_path, render(result))
    write_json(json_path, result)
    return result.exit_code
