"""Benchmark: a naive eager Gluon training loop vs `edgetrain finetune`, MobileNetV2-1.0 at 160x160.

Effective batch 32, two threads, the same synthetic-but-real JPEG folder (256 images, 4 classes) read
by the same data reader. Each side runs in its own child process; peak RSS is that process's VmHWM.
Prints the figures side by side with ratios (targets: peak RSS <= 35% of naive, samples/s >= 4x), then
the same job under --memory-budget 512MB (target: under 512 MB, or refused up front with the reason).

    python tools/bench_finetune.py [--samples 256] [--naive-steps 3] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SHAPE = (3, 160, 160)
THREADS = 2
BATCH = 32

NAIVE = r"""
import json, sys, time
from edgetrain import runtime
runtime.apply_threads(int(sys.argv[2]))
import mxnet as mx, numpy as np
from mxnet import autograd, gluon
from mxnet.gluon.model_zoo import vision
from edgetrain.data import load_data
from edgetrain.preprocess import default_for_shape
from edgetrain.procmem import peak_rss_mb
folder, steps, batch, features = sys.argv[1], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
ds = load_data(folder, default_for_shape((3, 160, 160)))
net = vision.get_model("mobilenetv2_1.0", classes=ds.num_classes)
net.initialize(mx.init.Xavier())
net.features.load_parameters(features)  # the same backbone weights edgetrain starts from
trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.003})
loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
order = np.random.RandomState(0).permutation(len(ds))
times = []
for step in range(steps + 1):  # step 0 warms up (shape inference, first allocation)
    idx = order[(step * batch) % len(ds):][:batch]
    t0 = time.perf_counter()
    x, y = mx.nd.array(ds.batch(idx)), mx.nd.array(ds.labels[idx])
    with autograd.record():
        loss = loss_fn(net(x), y)
    loss.backward()
    trainer.step(batch)
    mx.nd.waitall()
    times.append(time.perf_counter() - t0)
timed = times[1:]
print(json.dumps({"peak_rss_mb": peak_rss_mb(), "s_per_step": sum(timed) / len(timed),
                  "samples_per_s": batch * len(timed) / sum(timed), "warmup_s": times[0]}))
"""


def make_images(folder: Path, n: int, classes: int = 4, seed: int = 0) -> None:
    """Textured colour images whose class shows in colour and stripe direction, saved as JPEG."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(seed)
    yy, xx = np.mgrid[0:SHAPE[1], 0:SHAPE[2]].astype(np.float32)
    for i in range(n):
        c = i % classes
        (folder / f"class{c}").mkdir(parents=True, exist_ok=True)
        angle = c * np.pi / classes + rng.uniform(-0.2, 0.2)
        stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) / rng.uniform(3, 8))
        base = np.zeros((*SHAPE[1:], 3), np.float32)
        base[..., c % 3] = 0.5 + 0.4 * stripes
        base += rng.normal(0, 0.15, base.shape)
        img = (np.clip(base, 0, 1) * 255).astype(np.uint8)
        Image.fromarray(img).save(folder / f"class{c}" / f"{i:04d}.jpg", quality=90)


WEIGHTS = r"""
import sys
import mxnet as mx, numpy as np
from mxnet.gluon import nn
from mxnet.gluon.model_zoo import vision
from edgetrain.data import load_data
from edgetrain.preprocess import default_for_shape
mx.random.seed(0)
net = vision.get_model("mobilenetv2_1.0")
net.initialize(mx.init.Xavier())
x = load_data(sys.argv[1], default_for_shape((3, 160, 160))).shuffled(0).batch(np.arange(32))
bns = []
net.apply(lambda b: bns.append(b) if isinstance(b, nn.BatchNorm) else None)
for b in bns:
    b._kwargs["momentum"] = 0.0  # running statistics := this batch's
with mx.autograd.record(train_mode=True):
    out = net(mx.nd.array(x))
out.backward()  # MXNet 1.x updates BatchNorm's running statistics in the backward pass
mx.nd.waitall()
for b in bns:
    b._kwargs["momentum"] = 0.9
net.save_parameters(sys.argv[2])
net.features.save_parameters(sys.argv[3])
"""


def make_weights(root: Path, folder: Path) -> tuple[Path, Path]:
    """One MobileNetV2 for both sides: the whole net (edgetrain's --params), its backbone (the naive loop's).

    No pretrained weights without a network, so: Xavier weights with BatchNorm statistics taken from one
    batch of the data. With the zoo's untouched initial statistics (mean 0, variance 1) this net's
    inference-mode features vanish (~1e-12) and a head trained on them learns nothing.
    """
    full, backbone = root / "mobilenetv2-bench.params", root / "mobilenetv2-bench-features.params"
    if not full.exists():
        subprocess.run([sys.executable, "-c", WEIGHTS, str(folder), str(full), str(backbone)], check=True,
                       capture_output=True)
    return full, backbone


def run_child(args: list[str], env=None) -> tuple[dict | None, str, float]:
    t0 = time.perf_counter()
    proc = subprocess.run(args, capture_output=True, text=True, env={**os.environ, **(env or {})})
    wall = time.perf_counter() - t0
    out = proc.stdout.strip().splitlines()
    try:
        return json.loads("\n".join(out) if out and out[0].startswith("{") else out[-1]), proc.stderr, wall
    except (ValueError, IndexError):
        return None, f"exit {proc.returncode}: {proc.stderr.strip().splitlines()[-1:] }", wall


def finetune_child(folder: Path, outdir: Path, params: Path, extra: list[str]) -> tuple[dict | None, str, float]:
    import shutil

    shutil.rmtree(outdir, ignore_errors=True)  # a fresh run each time, not a refused one
    return run_child([sys.executable, "-m", "edgetrain", "finetune", "zoo:mobilenetv2_1.0",
                      "--input-shape", ",".join(map(str, (1, *SHAPE))), "--params", str(params), "--data", str(folder),
                      "-o", str(outdir),
                      "--batch-size", str(BATCH), "--threads", str(THREADS), "--json", "-", *extra])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--naive-steps", type=int, default=3)
    ap.add_argument("--keep", help="keep the images and outputs in this folder")
    args = ap.parse_args(argv)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-finetune-"))
    folder = root / "images"
    if not folder.exists():
        make_images(folder, args.samples)
    print(f"MobileNetV2-1.0, input {'x'.join(map(str, SHAPE))}, effective batch {BATCH}, {THREADS} threads, "
          f"{args.samples} JPEGs in 4 classes ({folder})")

    full, backbone = make_weights(root, folder)
    naive, err, naive_wall = run_child([sys.executable, "-c", NAIVE, str(folder), str(THREADS),
                                        str(args.naive_steps), str(BATCH), str(backbone)])
    if naive is None:
        print(f"naive loop failed: {err}")
        return 1
    ours, err, ours_wall = finetune_child(folder, root / "out-default", full, [])
    if ours is None:
        print(f"edgetrain finetune failed: {err}")
        return 1
    first = ours["epochs"][0]
    n_train = first["samples"]
    first_epoch_rate = n_train / (ours["feature_seconds"] + first["seconds"])
    rows = [
        ("peak RSS (MB)", naive["peak_rss_mb"], ours["peak_rss_mb"], "<= 0.35"),
        ("samples/s, whole run", naive["samples_per_s"], ours["samples_per_s"], ">= 4"),
        ("samples/s, feature pass + epoch 1", naive["samples_per_s"], first_epoch_rate, ""),
    ]
    print(f"\n{'':36}{'naive eager':>14}{'edgetrain':>14}{'ratio':>9}  target")
    for name, a, b, target in rows:
        print(f"{name:36}{a:14.1f}{b:14.1f}{b / a:9.2f}  {target}")
    print(f"{'s per step of 32 (naive)':36}{naive['s_per_step']:14.2f}")
    print(f"\nedgetrain defaults: train {ours['train_layers']}, {len(ours['epochs'])} epochs, plan {ours['plan']['method']}:"
          f" feature batch {ours['plan']['feature_batch']}, micro-batch {ours['plan']['micro_batch']}, "
          f"cache {ours['plan']['cache']}; feature pass {ours['feature_seconds']:.1f}s, whole child {ours_wall:.1f}s "
          f"(naive child {naive_wall:.1f}s for {args.naive_steps}+1 steps); held-out accuracy "
          f"{ours['final_accuracy']:.3f}")

    budget, err, _ = finetune_child(folder, root / "out-512", full, ["--memory-budget", "512MB", "--epochs", "3"])
    print("\nwith --memory-budget 512MB:")
    if budget is None:
        print(f"  refused: {err}")
    else:
        plan = budget["plan"]
        verdict = "under" if budget["peak_rss_mb"] <= 512 else "OVER"
        print(f"  peak RSS {budget['peak_rss_mb']:.0f} MB ({verdict} 512 MB); plan: feature batch "
              f"{plan['feature_batch']}, micro-batch {plan['micro_batch']}, cache {plan['cache']}, probe peak "
              f"{plan['probe_peak_mb']} MB; {budget['samples_per_s']:.1f} samples/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
