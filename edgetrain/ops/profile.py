"""`edgetrain profile`: measure MODEL (edgetrain.measure: fresh children, device verdict, energy) and write
its self-contained report."""
from __future__ import annotations

from pathlib import Path

from ..measure import ProfileResult, check_report_path, write_report
from ..measure import profile as measure
from ..options import ProfileOptions
from ..results import ProgressFn


def profile(model: str, opts: ProfileOptions, progress: ProgressFn | None = None) -> ProfileResult:
    if opts.report:
        check_report_path(Path(opts.report))  # before the work, not after it
    res = measure(model, opts, progress=progress)
    if opts.report:
        write_report(Path(opts.report), res.to_dict())
    return res
