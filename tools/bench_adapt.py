"""Benchmark: adapting to a new look on the device, every --train-layers choice side by side.

The task is domain-shifted: the base (the shipped digits CNN, edgetrain.nets:pretrained_digits) learned the
digits 0-4 as written; the device must learn the digits 5-9 in a new look (inverted: white on black
becomes black on white, and turned a quarter turn), classes and look it never saw. The base goes to the
device as ONNX (edgetrain export, on the host). Configurations, each a fresh `edgetrain finetune` process
in interleaved rounds (A B C ... A B C ...):

- `head`, `last:2`, `bias`, `all` from the ONNX file, in a process where mxnet cannot be imported (the
  device's engine: NumPy from the file);
- `all (mxnet)`: the Gluon model trained whole in MXNet, today's only way to train every layer.

For each: held-out top-1 (400 digits never trained on), peak RSS (the run's own figure: the process's
VmHWM, or its export child's when that was larger), wall seconds per epoch (the command's wall time / epochs), and the
gap `bias` closes between `head` and `all (mxnet)`.

    python tools/bench_adapt.py [--rounds 3] [--epochs 10] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

CONFIGS = {  # name -> (model kind, --train-layers, mxnet allowed)
    "head": ("onnx", "head", False),
    "last:2": ("onnx", "last:2", False),
    "bias": ("onnx", "bias", False),
    "all": ("onnx", "all", False),
    "all (mxnet)": ("gluon", "all", True),
}


def make_task(folder: Path) -> None:
    """The base as ONNX and the shifted data: digits 5-9, inverted and turned, 600 to train and 400 held out."""
    from edgetrain.data import load_data
    from edgetrain.preprocess import Preprocess

    ds = load_data("builtin:digits", Preprocess(input_shape=(1, 8, 8), mean=(0.0,), std=(1.0,)))
    x, y = ds.arrays(len(ds))
    keep = y >= 5
    x, y = 1.0 - np.rot90(x[keep, 0], axes=(1, 2)), y[keep] - 5
    order = np.random.RandomState(0).permutation(len(y))
    x, y = x[order].astype(np.float32), y[order]
    np.savez(folder / "train.npz", data=x[:600], label=y[:600])
    np.savez(folder / "val.npz", data=x[600:1000], label=y[600:1000])
    subprocess.run([sys.executable, "-m", "edgetrain", "export", "edgetrain.nets:pretrained_digits", "-o",
                    str(folder / "base.onnx")], check=True, capture_output=True)
    blocker = folder / "device" / "mxnet"
    blocker.mkdir(parents=True, exist_ok=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named mxnet (the device)')\n")


def run(folder: Path, name: str, epochs: int, round_no: int) -> dict:
    kind, layers, mxnet = CONFIGS[name]
    model = str(folder / "base.onnx") if kind == "onnx" else "edgetrain.nets:pretrained_digits"
    out = folder / f"run-{name.replace(' ', '_').replace(':', '_')}-{round_no}"
    env = {**os.environ, "EDGETRAIN_CACHE_DIR": ""}
    if not mxnet:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder / "device"), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "edgetrain", "finetune", model, "--data", str(folder / "train.npz"), "--val",
           str(folder / "val.npz"), "-o", str(out), "--train-layers", layers, "--epochs", str(epochs),
           "--threads", "2", "--seed", "0", "--json", "-"]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    stdout, stderr = proc.communicate()
    wall = time.monotonic() - t0
    if proc.returncode not in (0, 3):
        raise SystemExit(f"{name} failed ({proc.returncode}): {stderr[-800:]}")
    res = json.loads(stdout)
    return {"top1": res["final_accuracy"], "peak_mb": res["peak_rss_mb"], "s_per_epoch": wall / epochs,
            "train_s_per_epoch": sum(e["seconds"] for e in res["epochs"]) / len(res["epochs"]),
            "trained": res["trained_parameters"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--keep", type=Path, help="a folder for the data and runs (default: a temporary one)")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-adapt-"))
    folder.mkdir(parents=True, exist_ok=True)
    make_task(folder)
    results: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for r in range(args.rounds):
        for name in CONFIGS:
            results[name].append(run(folder, name, args.epochs, r))
            print(f"round {r + 1} {name:12s} top-1 {results[name][-1]['top1']:.3f}", file=sys.stderr)
    med = {name: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for name, rs in results.items()}
    print(f"digits 0-4 base -> digits 5-9 inverted and turned; 600 train / 400 held out, {args.epochs} epochs, "
          f"2 threads, median of {args.rounds} interleaved rounds")
    print(f"{'configuration':14s} {'top-1':>6s} {'trained':>8s} {'peak MB':>8s} {'x head':>7s} {'x all(mx)':>9s} "
          f"{'s/epoch':>8s} {'train s/ep':>10s} {'all(mx) / this':>14s}")
    head, allmx = med["head"], med["all (mxnet)"]
    for name, m in med.items():
        print(f"{name:14s} {m['top1']:6.3f} {int(m['trained']):8d} {m['peak_mb']:8.0f} {m['peak_mb'] / head['peak_mb']:7.2f} "
              f"{m['peak_mb'] / allmx['peak_mb']:9.2f} {m['s_per_epoch']:8.2f} {m['train_s_per_epoch']:10.3f} "
              f"{allmx['s_per_epoch'] / m['s_per_epoch']:14.2f}")
    gap = allmx["top1"] - head["top1"]
    closed = (med["bias"]["top1"] - head["top1"]) / gap if gap > 0 else float("nan")
    print(f"bias closes {closed:.0%} of the gap between head ({head['top1']:.3f}) and all in MXNet "
          f"({allmx['top1']:.3f})")


if __name__ == "__main__":
    main()
