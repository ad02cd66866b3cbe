"""Start-up time, CPU and peak RSS of `edgetrain predict` against a minimal hand-written ONNX Runtime loop.

    python tools/bench_predict.py MODEL.onnx IMAGE_FOLDER [--threads 1] [--batch 16] [--rounds 9]

Both classify the same images with the same model, batch size, top-k and thread cap and print one line
per image: the reference is tools/predict_ort_reference.py (onnxruntime + NumPy + Pillow, nothing else);
edgetrain is the installed console script (`edgetrain predict`, as a user types it). The bench first
checks that both printed the same top-k labels and scores for every image (the same work), then times
them. Each run is a whole fresh process, timed from fork to exit; CPU is the process's user + system time
and peak RSS its ru_maxrss, both from os.wait4. The commands take turns, each first in turn (A B, B A,
... or with --baseline A B C, B C A, ...), so a drifting machine affects all; each ratio to the
reference is taken round by round and its median (and range) printed, then the minima. The goal (issue
16): edgetrain within 10% of the reference on start-up (wall and CPU) and on peak RSS. ``--baseline DIR``
adds an older edgetrain (its package extracted into DIR) run by the same console script: before/after.

Both run in the same environment, as an installed package runs: Python's bytecode cache on (a private
PYTHONPYCACHEPREFIX, filled by the warm-up runs; with PYTHONDONTWRITEBYTECODE set, every run would
compile edgetrain and onnxruntime from source) and ONNX Runtime's telemetry log off for both (edgetrain
switches it off itself; in the reference it would add an SQLite write per run to the comparison).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
NO_TELEMETRY_CACHE = "/dev/null/bench-no-telemetry"  # a folder that can never be made
REFERENCE = "ORT reference loop"


def run(argv: list[str], out: Path, env: dict) -> tuple[float, float, float]:
    """(wall s, CPU s, peak RSS MiB) of one fresh process writing its stdout to ``out``."""
    with open(out, "w") as fh:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=fh, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - t0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... failed with exit code {code}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0


def predictions(path: Path, images: str) -> dict[str, str]:
    """{image path: its top-k text} from a run's output (the lines naming an image)."""
    rows = {}
    for line in path.read_text().splitlines():
        name, tab, top = line.partition("\t")
        if tab and name.startswith(images):
            rows[name] = top
    return rows


def same_answers(a: dict[str, str], b: dict[str, str]) -> str | None:
    """None if both gave every image the same labels, scores within 0.001; else what differs."""
    if a.keys() != b.keys() or not a:
        return f"different images: {len(a)} vs {len(b)} lines"
    for name, text in a.items():
        pa, pb = text.split("  "), b[name].split("  ")
        labels_a, labels_b = [p.rsplit(" ", 1)[0] for p in pa], [p.rsplit(" ", 1)[0] for p in pb]
        scores_a, scores_b = [float(p.rsplit(" ", 1)[1]) for p in pa], [float(p.rsplit(" ", 1)[1]) for p in pb]
        if labels_a[0] != labels_b[0] or any(abs(x - y) > 1.001e-3 for x, y in zip(scores_a, scores_b)):
            return f"{name}: {text!r} vs {b[name]!r}"
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("images")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--top-k", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--baseline", metavar="DIR", help="also time the edgetrain package in DIR (an older "
                    "version: git archive COMMIT edgetrain | tar -x -C DIR), run by the same console script")
    args = ap.parse_args()
    script = Path(sys.executable).with_name("edgetrain")
    edgetrain = ([str(script)] if script.is_file() else [sys.executable, "-m", "edgetrain"]) + [
        "predict", args.model, args.images, "--threads", str(args.threads), "--batch", str(args.batch),
        "--top-k", str(args.top_k)]
    reference = [sys.executable, str(HERE / "predict_ort_reference.py"), args.model, args.images, str(args.threads),
                 str(args.batch), str(args.top_k)]
    tmp = Path(tempfile.mkdtemp(prefix="bench-predict-"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPYCACHEPREFIX=str(tmp / "pycache"), XDG_CACHE_HOME=NO_TELEMETRY_CACHE)
    commands = {"edgetrain predict": (edgetrain, env), REFERENCE: (reference, env)}
    if args.baseline:
        commands[f"baseline ({Path(args.baseline).name})"] = (edgetrain, dict(env, PYTHONPATH=args.baseline))
    names = list(commands)
    rows: dict[str, list[tuple[float, float, float]]] = {n: [] for n in names}
    try:
        for _ in range(2):  # fills the bytecode cache, warms the page cache
            for name, (argv, e) in commands.items():
                run(argv, tmp / f"{names.index(name)}.txt", e)
        ref = predictions(tmp / f"{names.index(REFERENCE)}.txt", args.images)
        for k, name in enumerate(names):
            differ = same_answers(predictions(tmp / f"{k}.txt", args.images), ref)
            if differ:
                raise SystemExit(f"{name} and the reference disagree (not the same work): {differ}")
        load0 = os.getloadavg()
        for r in range(args.rounds):  # each command first in turn: A B [C], B [C] A, ...
            for name in names[r % len(names):] + names[:r % len(names)]:
                argv, e = commands[name]
                rows[name].append(run(argv, tmp / "out.txt", e))
        load1 = os.getloadavg()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    n_images = len(predictions_count(args.images))
    print(f"{args.rounds} rounds, interleaved (each command first in turn); model {args.model}, {n_images} images, "
          f"batch {args.batch}, {args.threads} thread(s); same top-{args.top_k} answers checked; load average "
          f"{load0[0]:.2f} before, {load1[0]:.2f} after")
    cols = ((0, 8, 3), (1, 8, 3), (2, 13, 1))
    b = rows[REFERENCE]
    for label, stat in (("median", statistics.median), ("minimum", min)):
        print(f"{label:26} {'wall s':>8} {'CPU s':>8} {'peak RSS MiB':>13}")
        for name in names:
            print(f"{name:26} " + " ".join(f"{stat(v[i] for v in rows[name]):{w}.{p}f}" for i, w, p in cols))
        for name in names:
            if name == REFERENCE:
                continue
            a = rows[name]
            if stat is min:  # the least disturbed run of each: a busy machine only ever adds time
                print(f"{'  ' + name.split()[0] + ' / ref, minima':26} " + " ".join(
                    f"{min(x[i] for x in a) / min(y[i] for y in b):{w}.3f}" for i, w, _ in cols))
                continue
            ratios = [[x[i] / y[i] for x, y in zip(a, b)] for i in range(3)]
            print(f"{'  ' + name.split()[0] + ' / reference':26} " + " ".join(f"{statistics.median(r):{w}.3f}"
                                                               for r, w in zip(ratios, (8, 8, 13)))
                  + "   median of the round-by-round ratios; goal <= 1.10"
                  + "  (range " + ", ".join(f"{min(r):.2f}-{max(r):.2f}" for r in ratios) + ")")
    return 0


def predictions_count(images: str) -> list[str]:
    return [p for p in os.listdir(images) if p.lower().endswith((".jpg", ".jpeg", ".png"))]


if __name__ == "__main__":
    sys.exit(main())
