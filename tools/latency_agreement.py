#!/usr/bin/env python
"""Does `edgetrain profile`'s p50 agree with an independent plain loop over InferenceSession.run?

For each ONNX model, in one run: `edgetrain.profile.profile` (fresh child, its own timing code) and a
separate fresh Python process that only does `sess.run` in a `time.perf_counter` loop, with the same
thread count and input shape. They alternate ROUNDS times, each round a profile run then a plain run
back to back, so that load from other processes on this machine hits both alike; the figure is the
median over rounds of each round's ratio (profile p50 / plain p50). The best-of-rounds ratio (each
side's lowest p50, the least disturbed) is printed beside it. Goal: within 10%.

    python tools/latency_agreement.py [--threads 1] [--runs 60] [--rounds 9] [MODEL.onnx ...]
With no model given, exports zoo:mobilenetv2_1.0 (224x224) and zoo:resnet18_v1 and uses them.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

PLAIN_LOOP = r'''
import json, sys, time
import numpy as np
import onnxruntime as ort
path, threads, warmup, runs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
opts = ort.SessionOptions()
opts.intra_op_num_threads = threads
opts.inter_op_num_threads = 1
opts.add_session_config_entry("session.intra_op.allow_spinning", "0")  # as edgetrain's sessions
sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
inp = sess.get_inputs()[0]
shape = [d if isinstance(d, int) else 1 for d in inp.shape]
x = np.random.RandomState(0).standard_normal(shape).astype("float32")
for _ in range(warmup):
    sess.run(None, {inp.name: x})
lat = []
for _ in range(runs):
    t0 = time.perf_counter()
    sess.run(None, {inp.name: x})
    lat.append((time.perf_counter() - t0) * 1000)
print(json.dumps({"p50_ms": float(np.percentile(lat, 50)), "mean_ms": float(np.mean(lat))}))
'''
GOAL_PCT = 10.0


def plain_p50(path: Path, threads: int, warmup: int, runs: int) -> float:
    from edgetrain.runtime import thread_env

    env = {**os.environ, **thread_env(threads)}
    out = subprocess.run([sys.executable, "-c", PLAIN_LOOP, str(path), str(threads), str(warmup), str(runs)],
                         capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])["p50_ms"]


def export_zoo(name: str, folder: Path) -> Path:
    """Export in a child so this process stays free of mxnet."""
    path = folder / f"{name}.onnx"
    code = ("from edgetrain.models import load_gluon; from edgetrain.convert import export_onnx; "
            f"export_onnx(load_gluon('zoo:{name}'), {str(path)!r}, opset=13)")
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--runs", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=9)
    args = ap.parse_args()
    from edgetrain.profile import profile

    with tempfile.TemporaryDirectory(prefix="latency-agreement-") as tmp:
        models = [Path(m) for m in args.models] or [export_zoo(n, Path(tmp)) for n in ("mobilenetv2_1.0", "resnet18_v1")]
        print(f"load average at the start: {os.getloadavg()[0]:.1f} (1 min) on {os.cpu_count()} cores")
        print(f"{'model':<22}{'profile p50 ms':>15}{'plain p50 ms':>13}{'median ratio':>13}{'best-of ratio':>14}"
              f"  within {GOAL_PCT:g}%   (threads {args.threads}, {args.runs} runs x {args.rounds} alternating rounds)")
        ok_all = True
        for path in models:
            ours, plain = [], []
            for i in range(args.rounds):
                # Alternate which side goes first: a burst of load from elsewhere then favours neither.
                for side in (("ours", "plain") if i % 2 == 0 else ("plain", "ours")):
                    if side == "ours":
                        res = profile(str(path), threads=str(args.threads), warmup=args.warmup, runs=args.runs,
                                      op_profile=False)
                        ours.append(res.best["p50_ms"])
                    else:
                        plain.append(plain_p50(path, args.threads, args.warmup, args.runs))
            ratio = statistics.median(a / b for a, b in zip(ours, plain))
            best_of = min(ours) / min(plain)
            ok = abs(ratio - 1) * 100 <= GOAL_PCT
            ok_all &= ok
            print(f"{path.name:<22}{statistics.median(ours):>15.3f}{statistics.median(plain):>13.3f}{ratio:>13.3f}"
                  f"{best_of:>14.3f}  {'yes' if ok else 'NO'}   rounds: profile "
                  f"{', '.join(f'{v:.2f}' for v in ours)} | plain {', '.join(f'{v:.2f}' for v in plain)}", flush=True)
    load = os.getloadavg()
    print(f"load average at the end: {load[0]:.1f} (1 min) on {os.cpu_count()} cores; other processes share them")
    return 0 if ok_all else 1


if __name__ == "__main__":
    sys.exit(main())
