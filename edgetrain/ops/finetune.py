"""`edgetrain finetune`: train MODEL on the device within its memory budget and thread cap, resumable.

Orchestration: check the options and OUTDIR, run the job (edgetrain.training), which holds the engine.
"""
from __future__ import annotations

from pathlib import Path

from .. import runtime
from ..errors import UsageError
from ..options import FinetuneOptions
from ..results import ProgressFn
from ..training import DEFAULT_VAL_SPLIT, FinetuneJob, FinetuneResult, prepare_outdir, progress_events


def finetune(model: str, opts: FinetuneOptions, progress: ProgressFn | None = None) -> FinetuneResult:
    """Train MODEL on ``opts.data`` into ``opts.out`` (PREFIX ``OUT/model`` + metrics.json + checkpoint.npz)."""
    threads = runtime.apply_threads(opts.thread_cap(), strict=False)
    if opts.val is not None and opts.val_split is not None:
        raise UsageError("--val and --val-split both given", "--val", "give held-out data or a split fraction, not both")
    grid = opts.carbon_grid()  # an unknown country or both figures: refused before the work
    opts.power_log_spec()  # a log that exists is read now: an unknown format costs seconds, not a fine-tune
    _check_energy_options(opts, grid)
    if str(model).lower().endswith(".onnx"):  # the file fixes both: given, they were silently ignored
        for flag, value, why in (("--params", opts.params, "its weights are in the file"),
                                 ("--input-shape", opts.input_shape, "its graph fixes the input shape")):
            if value is not None:
                raise UsageError(f"{flag} does not apply to an ONNX MODEL: {why}", flag,
                                 f"leave {flag} out (it is for a PREFIX, zoo: or factory model)")
    from ..fileio import check_folder_outside_data

    check_folder_outside_data(opts.out, "-o", {"--data": opts.data, "--val": opts.val})
    has_checkpoint = prepare_outdir(Path(opts.out), opts.resume)
    val_split = DEFAULT_VAL_SPLIT if opts.val is None and opts.val_split is None else opts.val_split
    job = FinetuneJob(model, opts, budget_mb=opts.budget_mb(), threads=threads, profile=opts.profile(),
                      val_split=val_split, progress=progress_events(progress), resume=opts.resume)
    result = job.run(has_checkpoint)
    if grid is not None and result.energy is not None:
        from ..energy import carbon_of_run

        result.energy["carbon"] = carbon_of_run(result.energy, grid)
    return result


def _check_energy_options(opts: FinetuneOptions, grid) -> None:
    """--meter-export, --country and --grid-intensity act on the run's energy record; without --device, a
    --power-log or a power sensor on this machine there is none (the result said `energy: null` and the meter's
    recording was wasted): refused before the work, not ignored."""
    if opts.profile() is not None or opts.power_log is not None:
        return
    given = [flag for flag, on in (("--meter-export", opts.meter_export), ("--country", opts.country is not None),
                                   ("--grid-intensity", opts.grid_intensity is not None)) if on]
    if not given:
        return
    from ..energy import detect

    if detect() is None:
        raise UsageError(f"{given[0]} has no effect without --device: this machine has no power sensor and no "
                         "--power-log was given, so the fine-tune has no energy record to keep the meter's windows "
                         "or the grams in", given[0],
                         f"give --device NAME (see `edgetrain devices list`), or leave {given[0]} out")
