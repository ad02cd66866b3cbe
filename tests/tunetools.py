"""What the tune tests share: the shipped digits CNN as ONNX (no mxnet), a small domain-shifted task, and
reading a tune run's outputs back."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

import edgetrain

SHIPPED = Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx"


def digits_task(folder: Path, train: int = 200, val: int = 100, test: int = 0) -> dict:
    """The digits 5-9, inverted and turned (a look the base never saw), as .npz files, and the base as ONNX."""
    from edgetrain.data import load_data
    from edgetrain.preprocess import Preprocess

    folder.mkdir(parents=True, exist_ok=True)
    ds = load_data("builtin:digits", Preprocess(input_shape=(1, 8, 8), mean=(0.0,), std=(1.0,)))
    x, y = ds.arrays(len(ds))
    keep = y >= 5
    x, y = 1.0 - np.rot90(x[keep, 0], axes=(1, 2)), y[keep] - 5
    order = np.random.RandomState(0).permutation(len(y))
    x, y = x[order].astype(np.float32), y[order]
    out = {"model": folder / "base.onnx"}
    shutil.copyfile(SHIPPED, out["model"])
    start = 0
    for name, n in (("train", train), ("val", val), ("test", test)):
        if n:
            np.savez(folder / f"{name}.npz", data=x[start:start + n], label=y[start:start + n])
            out[name] = folder / f"{name}.npz"
            start += n
    return out


def trials_of(outdir: Path) -> list[dict]:
    return json.loads((outdir / "tune.json").read_text())["trials"]


def what_was_decided(outdir: Path) -> dict:
    """The run's decisions and figures that must not depend on interruptions: each trial's configuration,
    status, epochs and accuracy at each rung, and the choice."""
    doc = json.loads((outdir / "tune.json").read_text())
    keep = ("trial", "lr", "optimizer", "batch_size", "train_layers", "epochs", "status", "epochs_run",
            "accuracy_by_rung", "val_accuracy", "lr_used")
    trials = [{k: t[k] for k in keep} for t in doc["trials"]]
    for t in trials:  # its seconds are the run's own
        t["accuracy_by_rung"] = [(a["epochs"], a["val_accuracy"]) for a in t["accuracy_by_rung"]]
    return {"trials": trials, "chosen": doc["chosen"]["trial"], "rungs": doc["rungs"]}


def model_weights(path: Path) -> dict:
    import onnx
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(path)).graph.initializer}
