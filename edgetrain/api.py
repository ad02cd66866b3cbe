"""The Python API: the same commands as the CLI, as functions that return typed results.

Each function takes the same options as its command (``edgetrain.options`` declares them once; a flag
``--max-drop`` is the keyword ``max_drop``), validates them the same way, applies the device's thread
count the same way, and raises the same ``edgetrain.errors`` exceptions the CLI turns into its one-line
messages. Models, data and devices are the references the CLI takes (``"zoo:mobilenetv2_1.0"``,
``"builtin:digits"``, ``"rpi4b-4gb"``); a device may also be a loaded ``DeviceProfile``.

    import edgetrain
    res = edgetrain.quantize("edgetrain.nets:pretrained_digits", calib="builtin:digits", output="m.onnx",
                             val="builtin:digits", max_drop=1.0, device="rpi4b-4gb")
    res.passed, res.failed_checks, res.accuracy.drop

Paths (MODEL, DATA, outputs, and every option naming a file) are ``str`` or ``os.PathLike``; ``bytes`` are
decoded as the os module does (``os.fsdecode``). Anything else (None, a number) is a UsageError naming the
argument, never a file named ``None``. No output may be an input (the CLI's guard, before any work).

Progress: by default (``progress="stderr"``) long work shows the lines the command line shows, on stderr
(rewritten in place on a terminal; elsewhere only the lines that stay, such as each epoch's); ``None`` is
silent; any other value is a function called with each ``edgetrain.Progress`` event. Such a stream holds
to a contract (``tests/test_api_progress.py``): within a stage ``done`` never goes down and ``total`` stays;
a counted stage's last event has ``done == total``; an epoch's event counts epochs; and once the work is
done, the last event is stage ``"done"``, 1 of 1, ``final=True``, with the verb in its message and the
seconds it took in ``metrics``. A call that raises sends no ``"done"``.
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TypeVar

from . import runtime
from .ops import export as _export
from .ops import finetune as _finetune
from .ops import inspect as _inspect
from .ops import predict as _predict
from .ops import profile as _profile
from .ops import quantize as _quantize
from .ops import tune as _tune
from .ops.run import run_recipe
from .options import (
    ExportOptions,
    FinetuneOptions,
    InspectOptions,
    Options,
    PredictOptions,
    ProfileOptions,
    QuantizeOptions,
    RunOptions,
    TuneOptions,
)
from .fileio import check_command_outputs, check_outputs
from .fileio import path_arg as _path
from .recipes import read_recipe
from .results import Progress, ProgressFn

OptionsT = TypeVar("OptionsT", bound=Options)
STDERR = "stderr"  # the default progress: the CLI's lines on stderr


class _Stream:
    """A caller's progress function: given each event as it comes, then, when the work is done, the closing
    one (stage "done", 1 of 1, final), so every stream ends with ``final=True`` and ``done == total``."""

    def __init__(self, fn: ProgressFn, verb: str):
        self.fn, self.verb, self.t0 = fn, verb, time.monotonic()

    def __call__(self, event: Progress) -> None:
        self.fn(event)

    def close(self) -> None:
        seconds = round(time.monotonic() - self.t0, 3)
        self.fn(Progress("done", 1, 1, f"{self.verb} done in {seconds:.1f} s", {"seconds": seconds}, final=True))


def _listener(progress, verb: str) -> ProgressFn | None:
    """``progress=`` as the work takes it; anything else a UsageError (a bad value, as for every option)."""
    if isinstance(progress, str) and progress == STDERR:
        from .cli.render import ProgressLine

        return ProgressLine()  # the command line's lines, as it shows them (no closing event)
    if progress is not None and not callable(progress):
        from .errors import UsageError, clip

        raise UsageError(f"bad value {clip(repr(progress), 40)} for progress: not a function", "progress=",
                         "give a function taking an edgetrain.Progress, 'stderr' (the command line's lines) or "
                         "None (silent)")
    return _Stream(progress, verb) if progress is not None else None


def _done(listener: ProgressFn | None, result):
    """The result of work that returned; a caller's stream gets its closing event first."""
    if isinstance(listener, _Stream):
        listener.close()
    return result


def _decoded(values: dict) -> dict:
    """Options as the CLI would get them: a path given as bytes or os.PathLike becomes its str."""
    return {k: os.fsdecode(os.fspath(v)) if isinstance(v, (bytes, os.PathLike)) else v for k, v in values.items()}


# the options that name a file or folder (by the metavar their declaration shows in --help)
_PATH_METAVARS = ("DATA", "FILE", "PATH", "OUTDIR", "RUNDIR", "DIR", "PEM")


def _prepare(model: type[OptionsT], values: dict, where: str) -> OptionsT:
    values = {k: v for k, v in _decoded(values).items() if v is not None}  # None: the option's default
    for name, value in values.items():
        field = model.fields.get(name)
        if field is not None and field.metavar in _PATH_METAVARS:
            values[name] = _path(value, name, where)
    opts = model.parse(values)
    runtime.quiet_libraries()
    runtime.apply_threads(opts.thread_cap(), strict=False)
    return opts


def quantize(model, calib, output, *, progress: ProgressFn | str | None = STDERR, **options):
    """``edgetrain quantize``: int8 within an accuracy budget. Returns a QuantizeResult."""
    listener = _listener(progress, "quantize")
    where = "edgetrain.quantize"
    model = _path(model, "model", where)
    opts = _prepare(QuantizeOptions, dict(options, calib=_path(calib, "calib", where),
                                                output=_path(output, "output", where)), where)
    check_command_outputs(model, opts)
    return _done(listener, _quantize.quantize(model, opts, progress=listener))


def export(model, output, *, progress: ProgressFn | str | None = STDERR, **options):
    """``edgetrain export``: ONNX validated against the Gluon model. Returns an ExportResult."""
    listener = _listener(progress, "export")
    where = "edgetrain.export"
    model = _path(model, "model", where)
    opts = _prepare(ExportOptions, dict(options, output=_path(output, "output", where)), where)
    check_command_outputs(model, opts)
    return _done(listener, _export.export(model, opts, progress=listener))


def finetune(model, data, out, *, progress: ProgressFn | str | None = STDERR, **options):
    """``edgetrain finetune``: train on this device within its memory budget. Returns a FinetuneResult."""
    listener = _listener(progress, "finetune")
    where = "edgetrain.finetune"
    model = _path(model, "model", where)
    opts = _prepare(FinetuneOptions, dict(options, data=_path(data, "data", where), out=_path(out, "out", where)),
                    where)
    check_command_outputs(model, opts)
    return _done(listener, _finetune.finetune(model, opts, progress=listener))


def profile(model, *, progress: ProgressFn | str | None = STDERR, **options):
    """``edgetrain profile``: latency, peak memory and energy. Returns a ProfileResult."""
    listener = _listener(progress, "profile")
    model = _path(model, "model", "edgetrain.profile")
    opts = _prepare(ProfileOptions, options, "edgetrain.profile")
    check_command_outputs(model, opts)
    return _done(listener, _profile.profile(model, opts, progress=listener))


def inspect(model, **options):
    """``edgetrain inspect``: load MODEL (and ``data``) as the other commands would and describe them."""
    model = _path(model, "model", "edgetrain.inspect")
    opts = _prepare(InspectOptions, options, "edgetrain.inspect")
    return _inspect.inspect(model, opts.data, params=opts.params, input_shape=opts.input_shape, mean=opts.mean,
                            std=opts.std)


def run(recipe: str | Path | None = None, *, rundir: str | Path | None = None, device=None,
        threads: int | None = None, resume: bool = False, progress: ProgressFn | str | None = STDERR,
        country: str | None = None, grid_intensity: float | None = None):
    """``edgetrain run``: a recipe's steps into one run folder (``resume=True`` continues ``rundir``). Each
    line of the steps' progress reaches ``progress`` as a Progress of stage ``run`` with that ``message``.
    ``country`` / ``grid_intensity`` price the energy of every step that reports one in grams of CO2e."""
    listener = _listener(progress, "run")
    recipe = _path(recipe, "recipe", "edgetrain.run") if recipe is not None else None
    rundir = _path(rundir, "rundir", "edgetrain.run") if rundir is not None else None
    runtime.quiet_libraries()
    runtime.apply_threads(threads, strict=False)
    loaded = read_recipe(recipe, rundir if resume else None)
    opts = RunOptions.parse({k: v for k, v in {"country": country, "grid_intensity": grid_intensity}.items()
                             if v is not None})
    opts.carbon_grid()
    return _done(listener, run_recipe(loaded, rundir=rundir, device=device, threads=threads, resume=resume,
                      carbon={"country": opts.country, "grid_intensity": opts.grid_intensity},
                      progress=(lambda message: listener(Progress("run", message=message, final=True)))
                      if listener else None))


def predict(model, data, *, progress: ProgressFn | str | None = STDERR, on_rows=None, **options):
    """``edgetrain predict``: classify DATA with an ONNX model written by edgetrain (no mxnet loaded).
    Returns a PredictResult; ``on_rows(rows)`` receives each batch's predictions as they are made; with
    ``output``, the predictions are also written there in ``format`` (atomically), as ``-o`` does."""
    listener = _listener(progress, "predict")
    where = "edgetrain.predict"
    model, data = _path(model, "model", where), _path(data, "data", where)
    opts = _prepare(PredictOptions, options, where)
    outputs = {"-o": opts.output}
    check_outputs({"MODEL": model, "DATA": data}, outputs)
    if opts.output is not None:
        from .fileio import check_output_path

        check_output_path(Path(opts.output), "-o")
    return _done(listener, _predict.predict(model, data, opts, progress=listener, on_rows=on_rows, outputs=outputs))


def tune(model, data, out, *, grid, progress: ProgressFn | str | None = STDERR, **options):
    """``edgetrain tune``: search finetune's options on this device within its budgets; the best model is
    ``out``/model.onnx. ``grid`` is a mapping (``{"lr": [0.003, 0.03], "train_layers": ["head", "lite"]}``), a
    list of ``"NAME=V1,V2"`` texts, or a YAML file's path. Returns a TuneResult."""
    where = "edgetrain.tune"
    listener = _listener(progress, "tune")
    model = _path(model, "model", where)
    if isinstance(grid, (bytes, os.PathLike)):
        grid = _path(grid, "grid", where)
    opts = _prepare(TuneOptions, dict(options, data=_path(data, "data", where), out=_path(out, "out", where),
                                      grid=grid), where)
    check_command_outputs(model, opts)
    return _done(listener, _tune.tune(model, opts, progress=listener))
