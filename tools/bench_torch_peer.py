"""Benchmark: `edgetrain finetune` against plain PyTorch on a held-out shift, whole commands side by side.

The task (issue 34): MobileNetV2-1.0 at 96x96, a base trained on the upright digits 0-4 (on the host, in the
peer's venv: the zoo has no trained weights offline; see setup), adapted on the device to the digits 5-9 turned
180 degrees, at low contrast, with noise: 500 training and 396 held-out samples, batch 32, 2 threads. The base
goes to both sides as the same ONNX file. The PyTorch peer (tools/torch_peer_finetune.py) runs in its own venv
(``--torch-python``; torch is never an edgetrain dependency), reads that file's weights and edgetrain's own
preprocessed arrays, and trains with the same optimizer (Adam, weight decay 1e-4), batch and epochs.

Every configuration is a fresh process, in interleaved rounds (A B C ... A B C ...); each run's line gives the
load (/proc/loadavg) before it. Per configuration: held-out top-1, the process's peak RSS (wait4's ru_maxrss),
seconds per epoch of the whole command (wall / epochs: start-up, imports, the plan's probe included) and the
epochs' own training seconds; ratios against PyTorch's full fine-tune and its bias-only run, per round (each
ratio is of two runs back to back) and their median.

    python tools/bench_torch_peer.py [--rounds 3] [--epochs 2] [--keep DIR] [--torch-python /work/venv-torch/bin/python]
        [--configs lite-200,torch-full,...]

Setting up the peer's venv (outside the repository):
    python3 -m venv /work/venv-torch && /work/venv-torch/bin/pip install torch==2.13.0 numpy onnx
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

HERE = Path(__file__).resolve().parent
SIZE = 96
THREADS = 2
TORCH_FULL_LR = 3e-4   # PyTorch full fine-tuning of MobileNetV2 at Adam 3e-3 went to chance here (issue 34)
TORCH_BIAS_LR = 3e-3

# name -> ("edgetrain", --train-layers, more arguments) or ("torch", mode, lr)
CONFIGS = {
    "lite 200MB": ("edgetrain", "lite", ("--memory-budget", "200MB")),
    "lite 1100MB": ("edgetrain", "lite", ("--memory-budget", "1100MB")),
    "bias 200MB": ("edgetrain", "bias", ("--memory-budget", "200MB")),
    "all": ("edgetrain", "all", ()),
    "head": ("edgetrain", "head", ()),
    "torch full": ("torch", "full", TORCH_FULL_LR),
    "torch bias": ("torch", "bias", TORCH_BIAS_LR),
}


def shifted(folder: Path) -> None:
    """train.npz / val.npz: the digits 5-9 (labels 0-4) turned 180 degrees, at a third of the contrast on a grey
    ground, with Gaussian noise (std 0.05), 8x8 (the preprocessing resizes them); 500 / the rest (396)."""
    from edgetrain.data import load_data
    from edgetrain.preprocess import Preprocess

    ds = load_data("builtin:digits", Preprocess(input_shape=(1, 8, 8), mean=(0.0,), std=(1.0,)))
    x, y = ds.arrays()
    keep = y >= 5
    x, y = np.rot90(x[keep, 0], 2, axes=(1, 2)), y[keep] - 5
    rng = np.random.RandomState(0)
    x = 0.35 + 0.3 * x + rng.normal(0, 0.05, x.shape)
    x = np.clip(x, 0, 1).astype(np.float32)
    order = rng.permutation(len(y))
    x, y = x[order], y[order]
    np.savez(folder / "train.npz", data=x[:500], label=y[:500])
    np.savez(folder / "val.npz", data=x[500:], label=y[500:])


def prepared(folder: Path, model: Path) -> None:
    """The peer's inputs: what edgetrain's preprocessing makes of train.npz / val.npz for the model (float32 NCHW)."""
    from edgetrain.data import load_data
    from edgetrain.models import load_onnx

    pre = load_onnx(model).preprocess
    for stem in ("train", "val"):
        x, y = load_data(str(folder / f"{stem}.npz"), pre).arrays()
        np.savez(folder / f"{stem}-{SIZE}.npz", data=np.ascontiguousarray(x, np.float32), label=y)


def base_digits(folder: Path, model: Path) -> None:
    """base-train.npz / base-val.npz: the upright digits 0-4, as edgetrain's preprocessing makes them for ``model``."""
    from edgetrain.data import load_data
    from edgetrain.models import load_onnx

    pre = load_onnx(model).preprocess.with_classes([str(d) for d in range(5)])
    train, held = load_data("builtin:digits", pre).select_classes(range(5)).split(0.2, seed=0)
    for stem, ds in (("base-train", train), ("base-val", held)):
        x, y = ds.arrays()
        np.savez(folder / f"{stem}.npz", data=np.ascontiguousarray(x, np.float32), label=y)


def setup(folder: Path, base_epochs: int, torch_python: str) -> Path:
    """The shifted data, and the base: MobileNetV2-1.0 (the Gluon zoo's graph, exported at 96x96) trained from a fresh
    initialisation on the upright digits 0-4, in the peer's venv (the host's step; the zoo has no trained weights
    offline), its weights written back into the export (edgetrain's metadata kept)."""
    if not (folder / "train.npz").exists():
        shifted(folder)
    model = folder / f"mbv2-{SIZE}.onnx"
    if not model.exists():
        blank = folder / f"zoo-{SIZE}.onnx"
        subprocess.run([sys.executable, "-m", "edgetrain", "export", "zoo:mobilenetv2_1.0", "--input-shape",
                        f"3,{SIZE},{SIZE}", "-o", str(blank)], check=True, capture_output=True)
        base_digits(folder, blank)
        t0 = time.monotonic()
        got = subprocess.run([torch_python, str(HERE / "torch_peer_finetune.py"), str(blank),
                              str(folder / "base-train.npz"), str(folder / "base-val.npz"), "--mode", "full", "--reinit",
                              "--classes", "5", "--epochs", str(base_epochs), "--lr", "1e-3", "--threads", str(THREADS),
                              "--save-onnx", str(model)], check=True, capture_output=True, text=True)
        doc = json.loads(got.stdout.strip().splitlines()[-1])
        print(f"base: MobileNetV2-1.0 trained on the digits 0-4 at {SIZE}x{SIZE}, {base_epochs} epochs, "
              f"{time.monotonic() - t0:.0f} s: held-out top-1 {doc['final_accuracy']:.3f}", flush=True)
    if not (folder / f"val-{SIZE}.npz").exists():
        prepared(folder, model)
    return model


def load() -> str:
    with open("/proc/loadavg") as fh:
        return " ".join(fh.read().split()[:3])


def measure(cmd: list[str], env: dict) -> dict:
    """Wall seconds, CPU seconds (user + sys: on a busy host the wall time swings with the other load, the CPU time
    much less; an OpenMP pool spinning while descheduled inflates it) and the output of one process."""
    import threading

    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            cwd=tempfile.gettempdir())
    chunks: dict[str, list] = {"out": [], "err": []}
    readers = [threading.Thread(target=lambda k=k, f=f: chunks[k].append(f.read()), daemon=True)
               for k, f in (("out", proc.stdout), ("err", proc.stderr))]
    for t in readers:
        t.start()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    for t in readers:
        t.join()
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "maxrss_mb": ru.ru_maxrss / 1024,
            "out": "".join(chunks["out"]), "err": "".join(chunks["err"]), "code": os.waitstatus_to_exitcode(status)}


def run(name: str, folder: Path, model: Path, epochs: int, torch_python: str, tag: str) -> dict:
    kind, what, more = CONFIGS[name]
    env = {**os.environ, "EDGETRAIN_CACHE_DIR": ""}
    if kind == "torch":
        cmd = [torch_python, str(HERE / "torch_peer_finetune.py"), str(model), str(folder / f"train-{SIZE}.npz"),
               str(folder / f"val-{SIZE}.npz"), "--mode", what, "--epochs", str(epochs), "--lr", str(more),
               "--threads", str(THREADS)]
        env.pop("PYTHONPATH", None)
    else:
        out = folder / f"run-{tag}-{name.replace(' ', '_')}"
        import shutil

        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, "-m", "edgetrain", "finetune", str(model), "--data", str(folder / "train.npz"),
               "--val", str(folder / "val.npz"), "-o", str(out), "--train-layers", what, "--epochs", str(epochs),
               "--threads", str(THREADS), "--batch-size", "32", "--seed", "0", "--json", "-", *more]
    before = load()
    m = measure(cmd, env)
    if m["code"] not in (0, 3):
        lines = [ln for ln in m["err"].splitlines() if ln.strip()]
        return {"error": lines[-1] if lines else f"exit {m['code']}", "load": before}
    doc = json.loads(m["out"].strip().splitlines()[-1] if kind == "torch" else m["out"])
    train_s = (sum(doc["train_seconds"]) if kind == "torch" else sum(e["seconds"] for e in doc["epochs"])) / epochs
    got = {"top1": doc["final_accuracy"], "peak_mb": doc["peak_rss_mb"], "s_per_epoch": m["wall"] / epochs,
           "cpu_per_epoch": m["cpu"] / epochs, "train_s_per_epoch": train_s, "load": before}
    if kind == "edgetrain":
        got["micro_batch"] = doc["plan"]["micro_batch"]
        got["plan_estimate_mb"] = doc["plan"]["estimate_mb"]
        got["lr"] = next((n for n in doc.get("notes", []) if "learning rate" in n), "")
    return got


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--base-epochs", type=int, default=6, help="the MobileNetV2 base's epochs (host, PyTorch)")
    ap.add_argument("--keep", type=Path, help="a folder for the data, base and runs (default: a temporary one)")
    ap.add_argument("--torch-python", default="/work/venv-torch/bin/python",
                    help="the Python of a venv with torch, numpy and onnx (never edgetrain's)")
    ap.add_argument("--configs", help="comma-separated subset of: " + ", ".join(CONFIGS))
    ap.add_argument("--model", type=Path, help="an exported ONNX base instead of training one (its top-1 figures then "
                                               "say nothing of adaptation: times and memory only)")
    args = ap.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-torch-peer-"))
    folder.mkdir(parents=True, exist_ok=True)
    if args.model:
        if not (folder / "train.npz").exists():
            shifted(folder)
        model = args.model
        prepared(folder, model)
    else:
        model = setup(folder, args.base_epochs, args.torch_python)
    names = [c.strip() for c in args.configs.split(",")] if args.configs else list(CONFIGS)
    results: dict[str, list[dict]] = {n: [] for n in names}
    print(f"MobileNetV2-1.0 {SIZE}x{SIZE}: base on digits 0-4 -> digits 5-9 turned 180 degrees, low contrast, noisy; "
          f"{len(np.load(folder / 'train.npz')['label'])} train / {len(np.load(folder / 'val.npz')['label'])} held out, "
          f"batch 32, {THREADS} threads, {args.epochs} epochs; {args.rounds} interleaved rounds ({folder})", flush=True)
    for r in range(args.rounds):
        for name in names:
            got = run(name, folder, model, args.epochs, args.torch_python, str(r))
            results[name].append(got)
            if "error" in got:
                print(f"  round {r + 1} {name:12s} load {got['load']}: failed: {got['error']}", flush=True)
                continue
            extra = f" micro-batch {got['micro_batch']} plan {got['plan_estimate_mb']:.0f} MB" if "micro_batch" in got else ""
            print(f"  round {r + 1} {name:12s} load {got['load']}: top-1 {got['top1']:.3f} peak {got['peak_mb']:.0f} MB "
                  f"{got['s_per_epoch']:.2f} s/epoch whole ({got['train_s_per_epoch']:.2f} training, "
                  f"cpu {got['cpu_per_epoch']:.2f}){extra}", flush=True)

    def paired(name: str, ref: str, key: str) -> float | None:
        pairs = [b[key] / a[key] for a, b in zip(results[name], results.get(ref, [])) if "error" not in a and "error" not in b]
        return statistics.median(pairs) if pairs else None

    print(f"\n{'configuration':13s} {'top-1':>6s} {'peak MB':>8s} {'s/epoch':>8s} {'train s/ep':>10s} {'cpu s/ep':>8s} "
          f"{'speed x torch full':>19s} {'cpu x full':>10s} {'x torch bias':>13s} {'peak x torch full':>18s}   (medians; "
          "speed = torch's s/epoch / this one's, pair by pair)")
    for name in names:
        ok = [g for g in results[name] if "error" not in g]
        if not ok:
            print(f"{name:13s} failed: {results[name][-1]['error']}")
            continue
        med = {k: statistics.median(g[k] for g in ok)
               for k in ("top1", "peak_mb", "s_per_epoch", "train_s_per_epoch", "cpu_per_epoch")}
        full = paired(name, "torch full", "s_per_epoch") if "torch full" in results else None
        full_cpu = paired(name, "torch full", "cpu_per_epoch") if "torch full" in results else None
        bias = paired(name, "torch bias", "s_per_epoch") if "torch bias" in results else None
        tf = [g for g in results.get("torch full", []) if "error" not in g]
        peak_x = med["peak_mb"] / statistics.median(g["peak_mb"] for g in tf) if tf else None
        fmt = lambda v, w: f"{v:{w}.2f}" if v is not None else f"{'-':>{w}s}"  # noqa: E731
        print(f"{name:13s} {med['top1']:6.3f} {med['peak_mb']:8.0f} {med['s_per_epoch']:8.2f} "
              f"{med['train_s_per_epoch']:10.2f} {med['cpu_per_epoch']:8.2f} {fmt(full, 19)} {fmt(full_cpu, 10)} "
              f"{fmt(bias, 13)} {fmt(peak_x, 18)}")
    print(f"load after: {load()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
