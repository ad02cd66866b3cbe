#!/usr/bin/env python3
"""Benchmark: the exported model in ONNX Runtime vs the same Gluon model hybridized in MXNet.

MobileNetV2-1.0 at 224x224, batch 1, one thread. Each runtime runs in its own child process with the
thread cap applied before the library is imported; each child loads, runs a first inference, warms up,
then times single-batch runs. Goal: ONNX Runtime at least 3x faster than MXNet.

A third column shows the export *without* the weights-as-inputs repair (every weight also a graph
input, as mxnet 1.9.1's exporter writes it): ONNX Runtime then cannot fold BatchNorm into the
convolutions. Weights are He-initialised with measured BatchNorm statistics (tools/export_zoo.py):
the zoo's default initialisation drives activations into float32 denormals, which would time the
CPU's denormal handling instead of the runtimes.

    python tools/bench_export.py [--model mobilenetv2_1.0] [--size 224] [--runs 100] [--rounds 2]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def child(kind: str, args) -> dict:
    """Runs in a fresh process: cap threads, import, load, first run, warm-up, timed runs."""
    from edgetrain.runtime import apply_threads

    apply_threads(args.threads)
    import numpy as np

    x = np.random.RandomState(0).rand(1, 3, args.size, args.size).astype(np.float32)
    t0 = time.perf_counter()
    if kind == "mxnet":
        from edgetrain.models import load_gluon

        model = load_gluon(f"zoo:{args.model}", params=args.params, input_shape=(3, args.size, args.size))
        run = lambda: model.predict(x)  # noqa: E731  (hybridized; asnumpy waits for the result)
    else:
        import onnx
        import onnxruntime as ort

        from edgetrain._lazy import ort_session_options

        proto = onnx.load(args.onnx)
        if kind == "ort-weights-as-inputs":
            from onnx import helper

            proto.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                                     for t in proto.graph.initializer)
        sess = ort.InferenceSession(proto.SerializeToString(), ort_session_options(args.threads),
                                    providers=["CPUExecutionProvider"])
        run = lambda: sess.run(None, {"data": x})  # noqa: E731
    load_s = time.perf_counter() - t0
    t = time.perf_counter()
    run()
    first_ms = (time.perf_counter() - t) * 1e3
    for _ in range(10):
        run()
    times = []
    for _ in range(args.runs):
        t = time.perf_counter()
        run()
        times.append((time.perf_counter() - t) * 1e3)
    times.sort()
    return {"kind": kind, "load_s": load_s, "first_ms": first_ms, "p50_ms": times[len(times) // 2],
            "p90_ms": times[int(len(times) * 0.9)], "min_ms": times[0]}


def spawn(kind: str, args, extra: list[str]) -> dict:
    cmd = [sys.executable, __file__, "--child", kind, "--model", args.model, "--size", str(args.size),
           "--runs", str(args.runs), "--threads", str(args.threads), *extra]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        sys.exit(f"{kind} child failed:\n{res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="mobilenetv2_1.0")
    ap.add_argument("--size", type=int, default=224)
    ap.add_argument("--runs", type=int, default=100)
    ap.add_argument("--rounds", type=int, default=2, help="alternate the children this many times (noisy host)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--params", help=argparse.SUPPRESS)
    ap.add_argument("--onnx", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.child, args)))
        return 0

    with tempfile.TemporaryDirectory(prefix="bench_export.") as tmp:
        params, onnx_path = Path(tmp) / "m.params", Path(tmp) / "m.onnx"
        subprocess.run([sys.executable, str(HERE / "export_zoo.py"), "--make-params", args.model,
                        "--size", str(args.size), "--out", str(params)], check=True)
        t = time.perf_counter()
        exp = subprocess.run([sys.executable, "-m", "edgetrain", "export", f"zoo:{args.model}", "--params", str(params),
                              "--input-shape", f"1,3,{args.size},{args.size}", "-o", str(onnx_path),
                              "--threads", str(args.threads), "--json", "-"], capture_output=True, text=True)
        export_s = time.perf_counter() - t
        if exp.returncode not in (0, 3):
            sys.exit(f"export failed:\n{exp.stderr}")
        result = json.loads(exp.stdout)
        rows: dict[str, list[dict]] = {}
        kinds = {"ort": ["--onnx", str(onnx_path)], "mxnet": ["--params", str(params)],
                 "ort-weights-as-inputs": ["--onnx", str(onnx_path)]}
        for _ in range(args.rounds):
            for kind, extra in kinds.items():
                rows.setdefault(kind, []).append(spawn(kind, args, extra))

    best = {k: min(v, key=lambda r: r["p50_ms"]) for k, v in rows.items()}
    print(f"{args.model} {args.size}x{args.size}, batch 1, {args.threads} thread(s), {args.runs} timed runs x "
          f"{args.rounds} rounds (best round's p50 shown); export+validation {export_s:.1f} s, "
          f"max abs err {result['comparison']['max_abs']:.3g}, {'pass' if result['passed'] else 'FAIL'}")
    names = {"ort": "ONNX Runtime (exported)", "mxnet": "MXNet hybridized",
             "ort-weights-as-inputs": "ORT, weights as inputs"}
    print(f"{'':<26}" + "".join(f"{names[k]:>26}" for k in kinds))
    for field, label in (("load_s", "load (s)"), ("first_ms", "first inference (ms)"), ("p50_ms", "p50 (ms)"),
                         ("p90_ms", "p90 (ms)"), ("min_ms", "min (ms)")):
        print(f"{label:<26}" + "".join(f"{best[k][field]:>26.2f}" for k in kinds))
    speedup = best["mxnet"]["p50_ms"] / best["ort"]["p50_ms"]
    folding = best["ort-weights-as-inputs"]["p50_ms"] / best["ort"]["p50_ms"]
    print(f"ONNX Runtime vs MXNet: {speedup:.2f}x faster (goal >= 3x: {'met' if speedup >= 3 else 'NOT met'}); "
          f"dropping weights from the inputs: {folding:.2f}x")
    return 0 if speedup >= 3 else 1


if __name__ == "__main__":
    sys.exit(main())
