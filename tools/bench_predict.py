"""Start-up time and peak RSS of `edgetrain predict` against a minimal hand-written ONNX Runtime loop.

    python tools/bench_predict.py MODEL.onnx IMAGE_FOLDER [--threads 1] [--rounds 7]

Both classify the same images with the same model, batch 16, the same thread cap, output to a file: the
reference is tools/predict_ort_reference.py (onnxruntime + NumPy + Pillow, nothing else). Each run is a
whole fresh process, timed from fork to exit; peak RSS is the kernel's ru_maxrss of that process
(os.wait4). The two alternate A B A B ... so a drifting machine affects both; the ratio is taken pair by
pair and its median printed. The goal (issue 16): edgetrain within 10% of the reference on both.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def run(argv: list[str], out: Path) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one fresh process."""
    with open(out, "w") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed with exit code {proc.returncode}")
    return wall, usage.ru_maxrss / 1024.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("images")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    edgetrain = [sys.executable, "-m", "edgetrain", "predict", args.model, args.images, "--threads",
                 str(args.threads), "--batch", "16", "--top-k", "5"]
    reference = [sys.executable, str(HERE / "predict_ort_reference.py"), args.model, args.images, str(args.threads),
                 "16"]
    rows = {"edgetrain predict": [], "ORT reference loop": []}
    with tempfile.TemporaryDirectory() as tmp:
        run(edgetrain, Path(tmp) / "warm.txt")  # page cache warm for both
        run(reference, Path(tmp) / "warm.txt")
        for r in range(args.rounds):
            order = [("edgetrain predict", edgetrain), ("ORT reference loop", reference)]
            for name, argv in order if r % 2 == 0 else order[::-1]:
                rows[name].append(run(argv, Path(tmp) / "out.txt"))
    a, b = rows["edgetrain predict"], rows["ORT reference loop"]
    print(f"{len(a)} rounds, interleaved; model {args.model}, {len(os.listdir(args.images))} images, "
          f"{args.threads} thread(s)")
    print(f"{'':20} {'wall s (median)':>16} {'peak RSS MiB (median)':>22}")
    for name, vals in rows.items():
        print(f"{name:20} {statistics.median(v[0] for v in vals):16.3f} {statistics.median(v[1] for v in vals):22.1f}")
    wall = statistics.median(x[0] / y[0] for x, y in zip(a, b))
    rss = statistics.median(x[1] / y[1] for x, y in zip(a, b))
    print(f"{'ratio (pairwise)':20} {wall:16.3f} {rss:22.3f}   (edgetrain / reference; goal <= 1.10)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
