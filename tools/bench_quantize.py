#!/usr/bin/env python3
"""int8 vs fp32 latency and size, MobileNetV2-1.0 at 224x224, batch 1, one thread, in one run.

    python tools/bench_quantize.py [--model zoo:mobilenetv2_1.0] [--size 224] [--rounds 3] [--keep DIR]

Builds the models with edgetrain itself (export_onnx, quantize with both backends), then times each
runtime in its own child process (so one runtime's thread pools and caches cannot slow another), in
``--rounds`` interleaved rounds; a runtime's figure is the median of its per-round p50s. Prints
side-by-side ratios. Random weights: latency and size do not depend on their values.
Goals: int8 ORT >= 1.5x faster than fp32 ORT and >= 5x faster than MXNet fp32 hybridized;
int8 .onnx >= 3.5x smaller than fp32 .onnx.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

# mxnet-fp32: plain hybridize() (what edgetrain's loaders give); mxnet-fp32-fused: hybridize with the oneDNN
# subgraph backend (Conv+BN+ReLU fused), MXNet fp32 at its fastest: the >= 5x goal is checked against it.
RUNTIMES = ("ort-fp32", "ort-int8", "mxnet-fp32", "mxnet-fp32-fused", "mxnet-int8")


def child(kind: str, path: str, shape: list[int], runs: int, warmup: int) -> dict:
    """Time one model in this (fresh) process with every pool capped at one thread."""
    from edgetrain.runtime import apply_threads

    apply_threads(1)
    x = np.random.RandomState(0).standard_normal(shape).astype(np.float32)
    t0 = time.perf_counter()
    if kind.startswith("ort"):
        import onnxruntime as ort

        from edgetrain._lazy import ort_session_options

        sess = ort.InferenceSession(path, sess_options=ort_session_options(1), providers=["CPUExecutionProvider"])
        name = sess.get_inputs()[0].name

        def run():
            sess.run(None, {name: x})
    else:
        import mxnet as mx

        from edgetrain.models import load_gluon

        block = load_gluon(path, hybridize=kind != "mxnet-fp32-fused").block
        if kind == "mxnet-fp32-fused":
            block.hybridize(backend="MKLDNN")
        data = mx.nd.array(x)

        def run():
            block(data).wait_to_read()
    load_s = time.perf_counter() - t0
    for _ in range(warmup):
        run()
    times = []
    for _ in range(runs):
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) * 1000)
    return {"kind": kind, "p50_ms": float(np.percentile(times, 50)), "p90_ms": float(np.percentile(times, 90)),
            "runs": runs, "load_s": load_s}


def build(model: str, size: int, workdir: Path, samples: int) -> dict[str, Path]:
    from edgetrain.convert import export_onnx
    from edgetrain.models import load_gluon, save_prefix
    from edgetrain.ops.quantize import quantize

    shape = (3, size, size)
    gluon_model = load_gluon(model, input_shape=shape)
    save_prefix(gluon_model, workdir / "fp32")
    export_onnx(gluon_model, workdir / "fp32.onnx", opset=13)
    # Calibrate on real images (builtin:digits, resized to the model's input), as a user would.
    ort = quantize(str(workdir / "fp32.onnx"), "builtin:digits", workdir / "int8.onnx", samples=samples, threads=1,
                   measure_latency=False)
    mxq = quantize(str(workdir / "fp32"), "builtin:digits", workdir / "mx_int8", backend="mxnet", samples=samples,
                   threads=1, input_shape=shape)
    print(f"scheme (onnxruntime): {ort.scheme.name} - {ort.scheme.reason}")
    print(f"scheme (mxnet):       {mxq.scheme.name}")
    return {"ort-fp32": workdir / "fp32.onnx", "ort-int8": workdir / "int8.onnx",
            "mxnet-fp32": workdir / "fp32", "mxnet-fp32-fused": workdir / "fp32", "mxnet-int8": workdir / "mx_int8"}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="zoo:mobilenetv2_1.0")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--runs", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--samples", type=int, default=64, help="calibration samples")
    ap.add_argument("--keep", type=Path, help="build the models here and keep them")
    ap.add_argument("--child", nargs=2, metavar=("KIND", "PATH"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    shape = [1, 3, args.size, args.size]
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], shape, args.runs, args.warmup)))
        return 0

    with tempfile.TemporaryDirectory(prefix="bench-quantize-") as tmp:
        workdir = args.keep or Path(tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        from edgetrain.runtime import apply_threads

        apply_threads(1)
        paths = build(args.model, args.size, workdir, args.samples)
        p50s: dict[str, list[float]] = {k: [] for k in RUNTIMES}
        for _ in range(args.rounds):
            for kind in RUNTIMES:
                proc = subprocess.run([sys.executable, __file__, "--child", kind, str(paths[kind]), "--size",
                                       str(args.size), "--runs", str(args.runs), "--warmup", str(args.warmup)],
                                      capture_output=True, text=True)
                if proc.returncode != 0:
                    print(proc.stderr, file=sys.stderr)
                    return 1
                p50s[kind].append(json.loads(proc.stdout.strip().splitlines()[-1])["p50_ms"])
        med = {k: statistics.median(v) for k, v in p50s.items()}
        size = {"fp32": (workdir / "fp32.onnx").stat().st_size, "int8": (workdir / "int8.onnx").stat().st_size}

        print(f"\n{args.model} {args.size}x{args.size}, batch 1, 1 thread, median of {args.rounds} rounds x "
              f"{args.runs} runs (p50 per round); measured on this host")
        print(f"{'runtime':<17} {'p50 ms':>8}   per-round p50s")
        for k in RUNTIMES:
            print(f"{k:<17} {med[k]:8.2f}   {', '.join(f'{v:.2f}' for v in p50s[k])}")
        ratio_ort = med["ort-fp32"] / med["ort-int8"]
        ratio_mx = min(med["mxnet-fp32"], med["mxnet-fp32-fused"]) / med["ort-int8"]
        size_ratio = size["fp32"] / size["int8"]
        print("\nratios")
        print(f"  int8 ORT vs fp32 ORT:            {ratio_ort:5.2f}x faster  (goal >= 1.5x) "
              f"{'OK' if ratio_ort >= 1.5 else 'MISSED'}")
        print(f"  int8 ORT vs MXNet fp32 (fastest of plain/fused hybridized):\n"
              f"                                   {ratio_mx:5.2f}x faster  (goal >= 5x)   "
              f"{'OK' if ratio_mx >= 5 else 'MISSED'}")
        print(f"  MXNet int8 vs MXNet fp32 fused:  {med['mxnet-fp32-fused'] / med['mxnet-int8']:5.2f}x faster")
        print(f"  int8 ORT vs MXNet int8:          {med['mxnet-int8'] / med['ort-int8']:5.2f}x faster")
        print(f"  size: fp32 .onnx {size['fp32'] / 1e6:.2f} MB -> int8 .onnx {size['int8'] / 1e6:.2f} MB = "
              f"{size_ratio:.2f}x smaller (goal >= 3.5x) {'OK' if size_ratio >= 3.5 else 'MISSED'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
