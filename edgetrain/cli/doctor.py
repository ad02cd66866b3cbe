"""`edgetrain doctor`: check the installation; --fix repairs what it can."""
from __future__ import annotations


import click

from .common import json_option, progress_lines, say, write_json


@click.command()
@click.option("--fix", is_flag=True,
              help="Repair what can be repaired (on aarch64: link the ARM Performance Libraries mxnet needs "
                   "to OpenBLAS/LAPACKE, libm and libc). Changes nothing when all is well.")
@json_option
def doctor(fix, json_path):
    """Check Python, numpy, mxnet (import and a computation), onnx, onnxruntime, thread settings and
    CPU features; say what is wrong and how to fix it.

    Libraries are imported in child processes, so a broken install is reported, not crashed on.
    Exit 0 when healthy, 1 when any check failed.
    """
    from ..doctor import render, run_checks

    progress = progress_lines(json_path, "checking {}...")
    report = run_checks(fix=fix, progress=progress)
    say(json_path, render(report))
    write_json(json_path, report)
    return report.exit_code
