"""The end of a fleet run (`edgetrain fleet serve`): the global model as files a device deploys (RUNDIR/model/).

The last global arrays are put into the base model by the same fine-tune job the devices run (its engine's
``start_from`` and ``write_model``: what ``edgetrain finetune`` writes), then converted by the same code the
commands use:

- ``model-symbol.json`` + ``model-0000.params`` (a PREFIX, with its preprocessing record and class names) when
  the fleet's base is a Gluon model (PREFIX, zoo: or a factory);
- ``model.onnx``: ONNX fp32 with edgetrain's metadata (class names, preprocessing): ``edgetrain export`` of
  that PREFIX (validated against Gluon), or, for a fleet of an ``.onnx`` base, the engine's own ONNX file;
- ``model-int8.onnx`` with ``--export int8``: ``edgetrain quantize`` of model.onnx, calibrated on --val.

Everything is written into a temporary folder beside RUNDIR/model and renamed over it in one step: a kill
leaves the previous RUNDIR/model (or none), never a half-written one.
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from ..fileio import fsync_dir
from ..fleet.local import Evaluator, LocalSpec
from ..fleet.store import ServeSpec

FOLDER = "model"
PREFIX = "model"  # RUNDIR/model/model-symbol.json, model-0000.params
ONNX = "model.onnx"
INT8 = "model-int8.onnx"


def write_models(rundir: Path, spec: ServeSpec, arrays: dict[str, np.ndarray], round_no: int,
                 export: str) -> tuple[dict, list[str], list[str]]:
    """Write RUNDIR/model/ for ``arrays`` (the global arrays after ``round_no``). Returns (the files by kind:
    prefix, onnx, int8; notes; failed checks: an int8 model over quantize's accuracy budget is kept, and said)."""
    final = rundir / FOLDER
    tmp = rundir / f".{FOLDER}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    for stale in rundir.glob(f".{FOLDER}.tmp-*"):  # a killed run's
        shutil.rmtree(stale, ignore_errors=True)
    tmp.mkdir()
    notes: list[str] = []
    failed: list[str] = []
    try:
        ev = Evaluator(LocalSpec(model=spec.model, data=spec.val, workdir=str(rundir / "work"), threads=spec.threads,
                                 seed=spec.seed, params=spec.params, train_layers=spec.train_layers), spec.val)
        engine_file = ev.write_model(arrays, tmp, {"finetuned_from": spec.model, "fleet_rundir": str(rundir),
                                                   "fleet_round": round_no, "train_layers": spec.train_layers})
        files: dict[str, str] = {}
        if engine_file.suffix == ".onnx":  # a fleet of an .onnx base: the engine wrote the ONNX file itself
            engine_file.rename(tmp / ONNX)
        else:
            files["prefix"] = PREFIX
            _export_onnx(tmp / PREFIX, tmp / ONNX, notes, failed)
        files["onnx"] = ONNX
        if export == "int8":
            _quantize(tmp / ONNX, tmp / INT8, spec, notes, failed)
            files["int8"] = INT8
        fsync_dir(tmp)
        if final.exists():  # a resumed run's earlier model: replaced whole
            old = rundir / f".{FOLDER}.old-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, final)
        fsync_dir(rundir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # the PREFIX is named as MODEL is given (RUNDIR/model/model), the others as files
    return {kind: str(final / name) for kind, name in files.items()}, notes, failed


def _export_onnx(prefix: Path, onnx_path: Path, notes: list, failed: list) -> None:
    from .export import export
    from ..options import ExportOptions

    res = export(str(prefix), ExportOptions(output=str(onnx_path)))
    failed += [f"ONNX export of the global model: {c}" for c in res.checks()]
    notes += [f"ONNX export: {n}" for n in res.notes if "random weights" not in n]


def _quantize(onnx_path: Path, int8_path: Path, spec: ServeSpec, notes: list, failed: list) -> None:
    from .quantize import quantize
    from ..options import QuantizeOptions

    res = quantize(str(onnx_path), QuantizeOptions(calib=spec.val, output=str(int8_path), val=spec.val,
                                                   latency=False))
    a = res.accuracy
    if a.int8_top1 is not None and a.fp32_top1 is not None:
        notes.append(f"int8 model: top-1 {a.int8_top1:.2f}% against fp32 {a.fp32_top1:.2f}% on --val (calibrated on it)")
    failed += [f"int8 model: {c}" for c in res.checks()]
