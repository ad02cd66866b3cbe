#!/usr/bin/env python
"""Predicted vs measured peak RSS for Gluon model-zoo networks of different sizes, in one run.

For each model and runtime, `edgetrain.profile.profile` predicts the peak RSS from the graph before
running (memory_model.py) and then measures VmHWM in a fresh child. The goal: every row within +-20%.
Models marked "held out" were not among those the memory model's coefficients were fitted on.

    python tools/memory_prediction.py [--runtime onnxruntime|mxnet|both] [--models a,b,c] [--quick]
"""
from __future__ import annotations

import argparse
import sys
import time

# name -> in the fit set of edgetrain/memory_model.py's coefficients
MODELS = {
    "mobilenet0.25": True, "mobilenetv2_0.25": False, "squeezenet1.1": True, "mobilenet0.5": False,
    "mobilenetv2_1.0": True, "densenet121": True, "resnet18_v1": True, "densenet169": False,
    "resnet50_v1": True, "resnet101_v1": False, "alexnet": True, "vgg13": False,
}
QUICK = ["mobilenet0.25", "mobilenetv2_0.25", "mobilenet0.5", "mobilenetv2_1.0", "resnet18_v1", "densenet169"]
TOLERANCE_PCT = 20.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runtime", default="both", choices=["onnxruntime", "mxnet", "both"])
    ap.add_argument("--models", help="comma-separated zoo names (default: all in the table)")
    ap.add_argument("--quick", action="store_true", help="six smaller models only")
    args = ap.parse_args()
    from edgetrain.profile import profile

    names = args.models.split(",") if args.models else (QUICK if args.quick else list(MODELS))
    runtimes = ["onnxruntime", "mxnet"] if args.runtime == "both" else [args.runtime]
    print(f"{'model':<18}{'runtime':<13}{'fit set':<9}{'weights MB':>11}{'predicted MB':>14}{'VmHWM MB':>10}"
          f"{'error':>9}  within +-{TOLERANCE_PCT:g}%", flush=True)
    rows, t0 = [], time.time()
    for name in names:
        for rt in runtimes:
            res = profile(f"zoo:{name}", runtime_name=rt, threads="1", warmup=1, runs=3, op_profile=False)
            p = res.prediction
            ok = abs(p["error_pct"]) <= TOLERANCE_PCT
            rows.append(ok)
            fit = "fit" if MODELS.get(name) else "held out"
            print(f"{name:<18}{rt:<13}{fit:<9}{p['stats']['weights_bytes'] / 2**20:>11.1f}{p['peak_rss_mb']:>14.1f}"
                  f"{p['measured_peak_rss_mb']:>10.1f}{p['error_pct']:>+8.1f}%  {'yes' if ok else 'NO'}", flush=True)
    print(f"{sum(rows)}/{len(rows)} within +-{TOLERANCE_PCT:g}% ({time.time() - t0:.0f} s; 1 thread, batch 1, "
          "random weights, default input size)")
    return 0 if all(rows) else 1


if __name__ == "__main__":
    sys.exit(main())
