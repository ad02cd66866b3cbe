"""`edgetrain profile`: measure MODEL (edgetrain.profiling: fresh children, device verdict, energy) and write
its self-contained report."""
from __future__ import annotations

from pathlib import Path

from ..options import ProfileOptions
from ..profiling import ProfileResult
from ..profiling import profile as measure
from ..report import check_report_path, write_report
from ..results import ProgressFn


def profile(model: str, opts: ProfileOptions, progress: ProgressFn | None = None) -> ProfileResult:
    if opts.report:
        check_report_path(Path(opts.report))  # before the work, not after it
    res = measure(model, opts, progress=progress)
    if opts.report:
        write_report(Path(opts.report), res.to_dict())
    return res
