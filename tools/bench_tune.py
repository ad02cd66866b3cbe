"""Benchmark: `edgetrain tune`'s default (successive halving over epochs) against the full grid (issue 35, item 3).

The task is bench_adapt.py's ``--task digits``: the shipped digits CNN (digits 0-4, as written) must learn the
digits 5-9 inverted and turned a quarter turn. The base goes to the device as the shipped ONNX export
(edgetrain/_builtin/digits5.onnx, what `edgetrain export edgetrain.nets:pretrained_digits` writes), so no mxnet
is needed. Per seed, the 896 shifted digits are shuffled and split 450 training / 200 held-out (the trials are
ranked on these) / 246 test (never seen by the tuner). The grid is issue 35's: 5 learning rates x head/bias/lite,
6 epochs, 15 points. Each seed runs, as fresh `edgetrain tune` processes on 1 thread, ``--strategy grid`` (every
point to 6 epochs: the reference) and the default, then scores each run's OUTDIR/model.onnx on the test set.

The goal: the default picks a model within 1 point of the grid's pick on the test set, in <= 25% of the grid's
device time, for every seed. The device time is the trials' CPU seconds (every job's set-up, feature pass,
epochs, held-out checks and checkpoints, on the 1 thread a trial runs on): what the trials cost a device that runs
nothing else. Their wall seconds on a shared machine are the CPU seconds plus the waits for the other processes'
turns (at load 10 on 2 cores, a lite trial's 0.10 CPU s took 0.9-1.7 s of wall), so a wall ratio measures the
load as much as the tuner; it is printed beside (`wall`), with the whole-run wall ratio (start-up, decoding and
the memory pre-check included) and the ratio in epochs.

    python tools/bench_tune.py [--seeds 10] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

LRS = "0.001,0.003,0.01,0.03,0.1"
MODES = "head,bias,lite"
EPOCHS = 6
SPLIT = (450, 200)  # training, held-out; the rest is the test set


def shifted_digits(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """The digits 5-9, inverted and turned (labels 0-4), as 8x8 arrays in [0, 1], shuffled by ``seed``."""
    from edgetrain.data import load_data
    from edgetrain.preprocess import Preprocess

    ds = load_data("builtin:digits", Preprocess(input_shape=(1, 8, 8), mean=(0.0,), std=(1.0,)))
    x, y = ds.arrays(len(ds))
    keep = y >= 5
    x, y = 1.0 - np.rot90(x[keep, 0], axes=(1, 2)), y[keep] - 5
    order = np.random.RandomState(seed).permutation(len(y))
    return x[order].astype(np.float32), y[order]


def make_task(folder: Path, seed: int) -> dict:
    import edgetrain

    folder.mkdir(parents=True, exist_ok=True)
    x, y = shifted_digits(seed)
    a, b = SPLIT
    parts = {"train": (0, a), "val": (a, a + b), "test": (a + b, len(y))}
    for name, (lo, hi) in parts.items():
        np.savez(folder / f"{name}.npz", data=x[lo:hi], label=y[lo:hi])
    shutil.copyfile(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx", folder / "base.onnx")
    return {name: folder / f"{name}.npz" for name in parts} | {"model": folder / "base.onnx"}


def tune(task: dict, out: Path, seed: int, strategy: str, *more: str) -> dict:
    cmd = [sys.executable, "-m", "edgetrain", "tune", str(task["model"]), "--data", str(task["train"]), "--val",
           str(task["val"]), "--grid", f"lr={LRS}", "--grid", f"train_layers={MODES}", "--epochs", str(EPOCHS),
           "--strategy", strategy, "--seed", str(seed), "--threads", "1", "-o", str(out), "--json", "-", *more]
    proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout)


def test_top1(model: Path, data: Path) -> float:
    import onnxruntime as ort

    from edgetrain.data import load_data
    from edgetrain.models import load_onnx

    x, y = load_data(str(data), load_onnx(model).preprocess).arrays()
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
    return 100.0 * float(np.mean(np.argmax(sess.run(None, {sess.get_inputs()[0].name: x})[0], axis=1) == y))


def dist(values: list[float], fmt: str = "{:.3f}") -> str:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return (f"min {fmt.format(min(values))}  q1 {fmt.format(q[0])}  median {fmt.format(statistics.median(values))}  "
            f"q3 {fmt.format(q[2])}  max {fmt.format(max(values))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--keep", type=Path, help="keep the runs here (default: a temporary folder)")
    ap.add_argument("--eta", type=int, nargs="+", default=[3], help="halving's --eta values to compare (3: the default)")
    args = ap.parse_args()
    root = args.keep or Path(tempfile.mkdtemp(prefix="bench-tune-"))
    rows = {eta: [] for eta in args.eta}
    print(f"grid: lr {LRS} x train_layers {MODES}, {EPOCHS} epochs (15 points); {SPLIT[0]} train / {SPLIT[1]} "
          f"held-out / rest test; 1 thread; runs in {root}")
    print(f"uptime: {uptime()}", flush=True)
    print("seed  eta  grid pick (test%)            default pick (test%)          d pts  device  wall   train  run    "
          "epochs overhead")
    short = lambda label: label.replace("optimizer=adam batch_size=32 ", "").replace(" epochs=6", "")  # noqa: E731
    for seed in range(args.first_seed, args.first_seed + args.seeds):
        task = make_task(root / f"seed{seed}", seed)
        grid = tune(task, root / f"seed{seed}" / "grid", seed, "grid")
        g_test = test_top1(Path(grid["model"]), task["test"])
        oracle = max(test_top1(Path(grid["outdir"]) / "trials" / f"{t['trial']:03d}" / "model.onnx", task["test"])
                     for t in grid["trials"])
        for eta in args.eta:
            sh = tune(task, root / f"seed{seed}" / f"halving-eta{eta}", seed, "halving", "--eta", str(eta))
            s_test = test_top1(Path(sh["model"]), task["test"])
            row = {"seed": seed, "eta": eta, "grid_pick": grid["chosen"]["label"], "grid_test": g_test,
                   "pick": sh["chosen"]["label"], "test": s_test, "drop": g_test - s_test, "oracle": oracle,
                   "device": sh["trial_cpu_seconds"] / grid["trial_cpu_seconds"],
                   "trial_wall": sh["trial_seconds"] / grid["trial_seconds"], "train": _train_s(sh) / _train_s(grid),
                   "wall": sh["seconds"] / grid["seconds"], "cpu_s": sh["trial_cpu_seconds"],
                   "grid_cpu_s": grid["trial_cpu_seconds"],
                   "epochs": sh["epochs_run"] / grid["epochs_run"], "overhead_pct": sh["overhead_pct"],
                   "grid_overhead_pct": grid["overhead_pct"], "features": sh["features"]}
            rows[eta].append(row)
            print(f"{seed:4d}  {eta:3d}  {short(row['grid_pick']):22s} {g_test:5.1f}  {short(row['pick']):22s} "
                  f"{s_test:5.1f}  {row['drop']:+5.1f}  {row['device']:.3f}   {row['trial_wall']:.3f}  {row['train']:.3f}  "
                  f"{row['wall']:.3f}  {row['epochs']:.3f}  {row['overhead_pct']:.2f}%  load {os.getloadavg()[0]:.1f}",
                  flush=True)
    for eta, rs in rows.items():
        print()
        print(f"--eta {eta}: {len(rs)} seeds")
        print(f"  test points below the grid's pick    {dist([r['drop'] for r in rs], '{:+.2f}')}")
        print(f"  device (trial CPU) time, default/grid {dist([r['device'] for r in rs])}")
        print(f"    default's trial CPU seconds        {dist([r['cpu_s'] for r in rs], '{:.2f}')}")
        print(f"    grid's trial CPU seconds           {dist([r['grid_cpu_s'] for r in rs], '{:.2f}')}")
        print(f"  trial wall time, default / grid      {dist([r['trial_wall'] for r in rs])}")
        print(f"  training wall (epochs + feature pass) {dist([r['train'] for r in rs])}")
        print(f"  whole-run wall time, default / grid  {dist([r['wall'] for r in rs])}")
        print(f"  epochs, default / grid               {dist([r['epochs'] for r in rs])}")
        print(f"  tuner overhead (% of the run)        {dist([r['overhead_pct'] for r in rs], '{:.2f}')}"
              f"  (grid's: {dist([r['grid_overhead_pct'] for r in rs], '{:.2f}')})")
        print(f"  grid's best trial on test - its pick {dist([r['oracle'] - r['grid_test'] for r in rs], '{:+.2f}')}")
        ok = [r for r in rs if r["drop"] <= 1.0 and r["device"] <= 0.25]
        print(f"  goal (within 1 point, <= 25% of the grid's device time): {len(ok)} of {len(rs)} seeds")
    print(f"uptime: {uptime()}")
    (root / "bench_tune.json").write_text(json.dumps(rows, indent=2) + "\n")


def uptime() -> str:
    """`uptime`'s line (the machine's load beside the timings), or the load averages where it is missing."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "load average: " + ", ".join(f"{v:.2f}" for v in os.getloadavg())


def _train_s(res: dict) -> float:
    return sum(t["train_seconds"] + t["feature_seconds"] for t in res["trials"])


if __name__ == "__main__":
    main()
