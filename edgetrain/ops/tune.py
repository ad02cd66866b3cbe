"""`edgetrain tune`: search finetune's options on the device, within its budgets; the best model kept.

Orchestration only: the thread cap, the carbon/energy options checked, then the tuner (edgetrain.tuning)."""
from __future__ import annotations

from .. import runtime
from ..options import TuneOptions
from ..results import ProgressFn
from ..tuning import TuneResult
from ..tuning import tune as run_tune


def tune(model: str, opts: TuneOptions, progress: ProgressFn | None = None) -> TuneResult:
    """Run the trials of ``opts.grid`` on ``opts.data`` into ``opts.out`` (OUTDIR/model.onnx, trials.csv,
    tune.json, report.html). Every refusal (an empty grid, a name or value finetune would not take, a grid
    none of whose points fits the memory budget) comes before any training."""
    runtime.apply_threads(opts.thread_cap(), strict=False)
    return run_tune(str(model), opts, progress=progress)
