"""Feeding a Dataset to ONNX Runtime's calibrators, one sample per run, with progress."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from .. import _lazy
from ..data import Dataset, load_data
from ..errors import UsageError

Progress = Callable[[int, int], None]  # (done, total)


def calibration_reader(dataset: Dataset, input_name: str, progress: Progress | None = None):
    """A ``CalibrationDataReader`` over ``dataset``.

    One sample per run on purpose: ORT's histogram calibrators (entropy, percentile) stack the runs'
    outputs into one array and fail on a shorter last batch. ``set_range``/``len`` let quantize_static
    calibrate in strides (``CalibStridedMinMax``), so activations of only one stride are held in memory.
    """
    CalibrationDataReader = _lazy.from_import("onnxruntime.quantization", "CalibrationDataReader")

    class DatasetReader(CalibrationDataReader):
        def __init__(self):
            self.start, self.end = 0, len(dataset)
            self.pos = 0
            self.done = 0

        def __len__(self):
            return len(dataset)

        def set_range(self, start_index: int, end_index: int):
            self.start, self.end = start_index, min(end_index, len(dataset))
            self.pos = self.start
            if start_index == 0:
                self.done = 0  # a new pass over the data

        def rewind(self):
            self.pos = self.start

        def get_next(self):
            if self.pos >= self.end:
                return None
            x = dataset.batch([self.pos])
            self.pos += 1
            self.done += 1
            if progress is not None:
                progress(min(self.done, len(dataset)), len(dataset))
            return {input_name: x}

    return DatasetReader()


def stride_for(n: int, most: int = 32) -> int:
    """The largest stride <= ``most`` dividing ``n`` (quantize_static requires an exact division)."""
    for s in range(min(most, n), 0, -1):
        if n % s == 0:
            return s
    return 1


def check_symbol_not_quantized(symbol_file: Path, where: str) -> None:
    """An MXNet PREFIX written by MXNet's own quantization (e.g. `--backend mxnet`) cannot be quantized again."""
    try:
        nodes = json.loads(Path(symbol_file).read_text(encoding="utf-8")).get("nodes", [])
    except (OSError, ValueError, AttributeError):
        return  # models.load_gluon reports an unreadable symbol file properly
    quantized = [n.get("op", "") for n in nodes
                 if "quantize" in n.get("op", "") or str((n.get("attrs") or {}).get("quantized", "")).lower() == "true"]
    if quantized:
        raise UsageError(f"model is already quantized (it has {quantized[0]} nodes)", where,
                         "pass the fp32 model it was made from")


def load_calibration(calib: str, preprocess, samples: int):
    ds = load_data(calib, preprocess, where="--calib")
    if len(ds) == 0:
        raise UsageError("calibration data has no samples", calib, "give images (or an .npz) to calibrate on")
    return ds, ds.sample(samples)


def calibration_notes(full: Dataset, sample: Dataset, samples: int, num_classes: int | None) -> list[str]:
    """What a user must know about the data calibrated on: fewer samples than asked, and classes that are not
    the model's outputs. The latter is not refused (calibration reads inputs only, and inputs of the same kind
    calibrate well enough) but it was silent (issue 37): ranges fitted to other classes, or to some of the
    model's only, may clip what it will see."""
    notes = []
    if samples > len(full):
        notes.append(f"--calib has {len(full)} samples, fewer than --samples {samples}: calibrated on all")
    if not num_classes:
        return notes
    top = int(full.labels.max(initial=0))
    covered = len(set(sample.labels.tolist()) & set(range(num_classes)))
    if full.num_classes > num_classes or top >= num_classes:
        notes.append(f"--calib has {full.num_classes} classes (labels up to {top}) but the model has {num_classes} "
                     "outputs: the int8 ranges were fitted partly on inputs of classes the model does not know; "
                     "calibrate on inputs like those it will classify")
    elif covered < num_classes:
        notes.append(f"the calibration sample covers {covered} of the model's {num_classes} classes: ranges fitted to "
                     f"those may clip the others' activations; give --calib data of every class (and --samples at "
                     f"least {num_classes})")
    return notes


def load_validation(val: str, preprocess, num_classes: int):
    ds = load_data(val, preprocess, where="--val")
    if len(ds) == 0:
        raise UsageError("validation data has no samples", val, "give labelled images (or an .npz)")
    top = int(ds.labels.max())
    if num_classes and (ds.num_classes > num_classes or top >= num_classes):
        raise UsageError(f"--val data has {ds.num_classes} classes (labels up to {top}) but the model has "
                         f"{num_classes} outputs", val,
                         "validate on data labelled with the model's classes (0.."
                         f"{num_classes - 1}), or fine-tune the model on these classes first")
    return ds
