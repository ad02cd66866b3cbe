"""Benchmark: adapting to a new look on the device, every --train-layers choice side by side.

The task is domain-shifted: a base learned the digits 0-4 as written; the device must learn the digits 5-9
in a new look (inverted: white on black becomes black on white, and turned a quarter turn), classes and
look it never saw. The base goes to the device as ONNX (edgetrain export, on the host). Every configuration
is a fresh `edgetrain finetune` process, in interleaved rounds (A B C ... A B C ...), in a process where
mxnet cannot be imported (the device's engine: NumPy from the ONNX file) unless it says MXNet.

Two tasks:

- ``--task digits`` (default): the shipped digits CNN (edgetrain.nets:pretrained_digits, 1x16x16 input),
  600 training / 296 held-out digits; `head`, `last:2`, `bias`, `lite`, `all` from the ONNX file, and
  `all (mxnet)`: the Gluon model trained whole in MXNet.
- ``--task mobilenet``: MobileNetV2-1.0 (the Gluon zoo's, 5 outputs) trained here first, in MXNet on the host,
  on the digits 0-4 at 3x64x64 (the zoo has no trained weights offline, and random weights would make the
  frozen layers compute nothing). Then two measurements from its ONNX exports:
  *accuracy* at 64x64 (600 training / 296 held-out shifted digits; `all` also at a lower rate, as the
  default collapses), and *memory and speed* at 160x160 with
  256 training images (and 100 held out), ``--memory-budget 200MB`` for every mode but `all` (which is also
  tried once under that budget, to show the refusal).

For each: held-out top-1, peak RSS (the run's own figure: the process's VmHWM), wall seconds per epoch
(the command's wall time / epochs, start-up and feature pass included), training seconds per epoch (the
epochs' own time), and ratios against `head` and `all`; then the share of the head-to-all accuracy gap
that `bias` and `lite` close.

    python tools/bench_adapt.py [--task digits|mobilenet] [--rounds 3] [--epochs 10] [--keep DIR]
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

DIGITS = {  # name -> (model kind, --train-layers, mxnet allowed, more finetune arguments)
    "head": ("onnx", "head", False, ()),
    "last:2": ("onnx", "last:2", False, ()),
    "bias": ("onnx", "bias", False, ()),
    "lite": ("onnx", "lite", False, ()),
    "all": ("onnx", "all", False, ()),
    "all (mxnet)": ("gluon", "all", True, ()),
}
MOBILENET = {name: DIGITS[name] for name in ("head", "last:2", "bias", "lite", "all")}
# every weight of MobileNetV2 at the default rate (adam 0.003) collapsed to chance in the first epoch here
# (loss 3.9, then ln 5 for good): the accuracy runs add `all` at a rate full fine-tuning survives
MOBILENET_ACCURACY = {**MOBILENET, "all lr 3e-4": ("onnx", "all", False, ("--lr", "0.0003"))}
BUDGET = "200MB"


def shifted_digits(folder: Path, sizes: dict[str, tuple[int, int]]) -> None:
    """Digits 5-9, inverted and turned, as 8x8 arrays (finetune's preprocessing resizes them to the model's
    input); ``sizes``: file stem -> (first row, end row) of a fixed shuffle."""
    from edgetrain.data import load_data
    from edgetrain.preprocess import Preprocess

    ds = load_data("builtin:digits", Preprocess(input_shape=(1, 8, 8), mean=(0.0,), std=(1.0,)))
    x, y = ds.arrays(len(ds))
    keep = y >= 5
    x, y = 1.0 - np.rot90(x[keep, 0], axes=(1, 2)), y[keep] - 5
    order = np.random.RandomState(0).permutation(len(y))
    x, y = x[order].astype(np.float32), y[order]
    for stem, (a, b) in sizes.items():
        np.savez(folder / f"{stem}.npz", data=x[a:b], label=y[a:b])


def device_blocker(folder: Path) -> None:
    blocker = folder / "device" / "mxnet"
    blocker.mkdir(parents=True, exist_ok=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named mxnet (the device)')\n")


def edgetrain(*args, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "edgetrain", *map(str, args)], capture_output=True, text=True)
    if check and proc.returncode not in (0, 3):
        raise SystemExit(f"edgetrain {args[0]} failed ({proc.returncode}): {proc.stderr[-800:]}")
    return proc


def train_mobilenet_base(folder: Path, size: int, epochs: int) -> None:
    """The host's step (mxnet): MobileNetV2-1.0, 5 classes, trained on digits 0-4 at 3 x size x size."""
    from edgetrain import runtime

    runtime.apply_threads(2)
    import mxnet as mx
    from mxnet.gluon.model_zoo import vision

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from digits_training import train_epochs

    from edgetrain.data import load_data
    from edgetrain.models import GluonModel, parse_model_ref, save_prefix
    from edgetrain.preprocess import Preprocess

    mx.random.seed(0)
    pre = Preprocess(input_shape=(3, size, size), mean=(0.3,) * 3, std=(0.4,) * 3).with_classes(
        [str(d) for d in range(5)])
    train, held = load_data("builtin:digits", pre).select_classes(range(5)).split(0.2, seed=0)
    (xs, ys), (xh, yh) = train.arrays(), held.arrays()
    net = vision.get_model("mobilenetv2_1.0", classes=5)
    net.initialize(mx.init.Xavier(magnitude=2.0))
    net.hybridize()
    t0 = time.monotonic()
    train_epochs(net, xs, ys, epochs=epochs, lr=3e-3, batch=32, seed=0)
    acc = float((net(mx.nd.array(xh)).asnumpy().argmax(1) == yh).mean())
    print(f"host: MobileNetV2-1.0 base trained on digits 0-4 at {size}x{size} in MXNet, {epochs} epochs, "
          f"{time.monotonic() - t0:.0f} s: held-out top-1 {acc:.3f} ({len(yh)} samples)", file=sys.stderr)
    save_prefix(GluonModel(net, parse_model_ref("zoo:mobilenetv2_1.0"), pre, 5), folder / "mbv2",
                extra={"trained_by": "tools/bench_adapt.py", "data": "builtin:digits classes 0-4",
                       "held_out_accuracy": round(acc, 4)})


def make_digits(folder: Path) -> dict:
    shifted_digits(folder, {"train": (0, 600), "val": (600, 1000)})
    edgetrain("export", "edgetrain.nets:pretrained_digits", "-o", folder / "base.onnx")
    return {"onnx": folder / "base.onnx", "gluon": "edgetrain.nets:pretrained_digits",
            "data": folder / "train.npz", "val": folder / "val.npz"}


def make_mobilenet(folder: Path, base_epochs: int) -> tuple[dict, dict]:
    shifted_digits(folder, {"train": (0, 600), "val": (600, 1000), "train256": (0, 256), "val100": (600, 700)})
    if not (folder / "mbv2-0000.params").exists():
        subprocess.run([sys.executable, __file__, "--train-base", str(folder), "--base-epochs", str(base_epochs)],
                       check=True)
    edgetrain("export", folder / "mbv2", "-o", folder / "mbv2-64.onnx")
    edgetrain("export", folder / "mbv2", "--input-shape", "3,160,160", "-o", folder / "mbv2-160.onnx")
    accuracy = {"onnx": folder / "mbv2-64.onnx", "data": folder / "train.npz", "val": folder / "val.npz"}
    memory = {"onnx": folder / "mbv2-160.onnx", "data": folder / "train256.npz", "val": folder / "val100.npz"}
    return accuracy, memory


def run(folder: Path, task: dict, configs: dict, name: str, epochs: int, tag: str, budget: str | None = None) -> dict:
    kind, layers, mxnet, more = configs[name]
    out = folder / f"run-{tag}-{name.replace(' ', '_').replace(':', '_').replace('(', '').replace(')', '')}"
    env = {**os.environ, "EDGETRAIN_CACHE_DIR": ""}
    if not mxnet:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(folder / "device"), env.get("PYTHONPATH")) if p)
    cmd = [sys.executable, "-m", "edgetrain", "finetune", str(task[kind]), "--data", str(task["data"]), "--val",
           str(task["val"]), "-o", str(out), "--train-layers", layers, "--epochs", str(epochs), "--threads", "2",
           "--seed", "0", "--json", "-", *more]
    if budget:
        cmd += ["--memory-budget", budget]
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode not in (0, 3):
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
        return {"error": lines[-1] if lines else f"exit {proc.returncode}", "exit": proc.returncode}
    res = json.loads(proc.stdout)
    return {"top1": res["final_accuracy"], "peak_mb": res["peak_rss_mb"], "s_per_epoch": wall / epochs,
            "samples": len(np.load(task["data"])["label"]), "held_out": len(np.load(task["val"])["label"]),
            "train_s_per_epoch": sum(e["seconds"] for e in res["epochs"]) / len(res["epochs"]),
            "trained": res["trained_parameters"], "micro_batch": res["plan"]["micro_batch"]}


def interleaved(folder, task, configs, epochs, rounds, tag, budgets=None) -> dict:
    results: dict[str, list[dict]] = {name: [] for name in configs}
    for r in range(rounds):
        for name in configs:
            got = run(folder, task, configs, name, epochs, f"{tag}{r}", (budgets or {}).get(name))
            if "error" in got:   # said in the table; the other configurations are still measured
                if name in ("head", "all"):
                    raise SystemExit(f"{name} failed: {got['error']}")
                print(f"{tag} round {r + 1} {name:12s} failed: {got['error']}", file=sys.stderr, flush=True)
                results[name].append(got)
                continue
            results[name].append(got)
            print(f"{tag} round {r + 1} {name:12s} top-1 {got['top1']:.3f} peak {got['peak_mb']:.0f} MB "
                  f"{got['train_s_per_epoch']:.2f} s/epoch training", file=sys.stderr, flush=True)
    return {name: ({k: statistics.median(x[k] for x in rs) for k in rs[0]} if all("error" not in x for x in rs)
                   else {"error": next(x["error"] for x in rs if "error" in x)}) for name, rs in results.items()}


def table(med: dict, ref_all: str, budgets: dict | None = None) -> None:
    head, full = med["head"], med[ref_all]
    print(f"{'configuration':14s} {'top-1':>6s} {'trained':>8s} {'micro':>5s} {'peak MB':>8s} {'x head':>7s} "
          f"{'x ' + ref_all:>9s} {'s/epoch':>8s} {'train s/ep':>10s} {ref_all + ' / this':>14s}"
          + (" budget" if budgets else ""))
    for name, m in med.items():
        if "error" in m:
            print(f"{name:14s} failed: {m['error']}")
            continue
        print(f"{name:14s} {m['top1']:6.3f} {int(m['trained']):8d} {int(m['micro_batch']):5d} {m['peak_mb']:8.0f} "
              f"{m['peak_mb'] / head['peak_mb']:7.2f} {m['peak_mb'] / full['peak_mb']:9.2f} {m['s_per_epoch']:8.2f} "
              f"{m['train_s_per_epoch']:10.2f} {full['train_s_per_epoch'] / m['train_s_per_epoch']:14.2f}"
              + (f" {(budgets or {}).get(name) or 'none'}" if budgets else ""))


def gap(med: dict, ref_all: str) -> None:
    # the better of `all` at the default rate and at a lower one (its variants named "all lr ...")
    ref_all = max((name for name in med if name == ref_all or name.startswith(f"{ref_all} lr")),
                  key=lambda name: med[name]["top1"])
    head, full = med["head"], med[ref_all]
    width = full["top1"] - head["top1"]
    for name in ("bias", "lite"):
        closed = (med[name]["top1"] - head["top1"]) / width if width > 0 else float("nan")
        print(f"{name} closes {closed:.0%} of the gap between head ({head['top1']:.3f}) and {ref_all} "
              f"({full['top1']:.3f})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--task", choices=("digits", "mobilenet"), default="digits")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=10, help="fine-tuning epochs of the accuracy runs")
    ap.add_argument("--memory-epochs", type=int, default=2, help="epochs of the 160x160 runs (--task mobilenet)")
    ap.add_argument("--base-epochs", type=int, default=15, help="the MobileNetV2 base's epochs on the host")
    ap.add_argument("--keep", type=Path, help="a folder for the data and runs (default: a temporary one)")
    ap.add_argument("--parts", default="accuracy,memory", help="--task mobilenet: which measurements to run")
    ap.add_argument("--train-base", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.train_base:
        train_mobilenet_base(args.train_base, 64, args.base_epochs)
        return
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-adapt-"))
    folder.mkdir(parents=True, exist_ok=True)
    device_blocker(folder)
    if args.task == "digits":
        task = make_digits(folder)
        med = interleaved(folder, task, DIGITS, args.epochs, args.rounds, "digits")
        m = med["head"]
        print(f"digits CNN: digits 0-4 base -> digits 5-9 inverted and turned; {m['samples']:.0f} train / "
              f"{m['held_out']:.0f} held out, "
              f"{args.epochs} epochs, 2 threads, median of {args.rounds} interleaved rounds")
        table(med, "all (mxnet)")
        gap(med, "all")
        gap(med, "all (mxnet)")
        return
    accuracy, memory = make_mobilenet(folder, args.base_epochs)
    parts = args.parts.split(",")
    print(f"MobileNetV2-1.0, base trained on digits 0-4 (host, MXNet, 3x64x64) -> digits 5-9 inverted and turned; "
          f"2 threads, median of {args.rounds} interleaved rounds")
    if "accuracy" in parts:
        acc = interleaved(folder, accuracy, MOBILENET_ACCURACY, args.epochs, args.rounds, "mbv2-64-")
        print(f"\naccuracy at 64x64: {acc['head']['samples']:.0f} train / {acc['head']['held_out']:.0f} held out, "
              f"{args.epochs} epochs, no budget")
        table(acc, "all")
        gap(acc, "all")
    if "memory" in parts:
        budgets = {name: None if name == "all" else BUDGET for name in MOBILENET}
        mem = interleaved(folder, memory, MOBILENET, args.memory_epochs, args.rounds, "mbv2-160-", budgets)
        refused = run(folder, memory, MOBILENET, "all", 1, "mbv2-160-all-budget", BUDGET)
        print(f"\nmemory and speed at 160x160: {mem['head']['samples']:.0f} train / {mem['head']['held_out']:.0f} held "
              f"out, {args.memory_epochs} epochs, --memory-budget {BUDGET} but for all (top-1 here: too few epochs "
              "to compare)")
        table(mem, "all", budgets)
        print(f"all under --memory-budget {BUDGET}: " + (f"exit {refused['exit']}: {refused['error']}"
                                                       if "error" in refused else f"ran, peak {refused['peak_mb']:.0f} MB"))

if __name__ == "__main__":
    main()
