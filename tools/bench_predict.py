"""Start-up time, CPU and peak RSS of `edgetrain predict` against a minimal hand-written ONNX Runtime loop.

    python tools/bench_predict.py MODEL.onnx IMAGE_FOLDER [--threads 1] [--batch 16] [--rounds 9]

Both classify the same images with the same model, batch size, top-k and thread cap and print one line
per image: the reference is tools/predict_ort_reference.py (onnxruntime + NumPy + Pillow, nothing else);
edgetrain is the installed console script (`edgetrain predict`, as a user types it: its light parser,
no click), and the same command line through click (``main(light_predict=False)``, what every other
command does), so one run shows both ratios side by side and what the light parser saves. The bench first
checks that both printed the same top-k labels and scores for every image (the same work), then times
them. Each run is a whole fresh process, timed from fork to exit; CPU is the process's user + system time
and peak RSS its ru_maxrss, both from os.wait4. The commands take turns, each first in turn (A B, B A,
... or with --baseline A B C, B C A, ...), so a drifting machine affects all; each ratio to the
reference is taken round by round and its median (and range) printed, then the minima. The goal:
`edgetrain predict` within 10% of the reference's CPU time (and wall time and peak RSS). ``--baseline DIR``
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
LIGHT, CLICK = "edgetrain predict", "edgetrain, click path"
VIA_CLICK = "import sys; from edgetrain.cli import main; main(sys.argv[1:], light_predict=False)"


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
    line = ["predict", args.model, args.images, "--threads", str(args.threads), "--batch", str(args.batch),
            "--top-k", str(args.top_k)]
    edgetrain = ([str(script)] if script.is_file() else [sys.executable, "-m", "edgetrain"]) + line
    reference = [sys.executable, str(HERE / "predict_ort_reference.py"), args.model, args.images, str(args.threads),
                 str(args.batch), str(args.top_k)]
    tmp = Path(tempfile.mkdtemp(prefix="bench-predict-"))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPYCACHEPREFIX=str(tmp / "pycache"), XDG_CACHE_HOME=NO_TELEMETRY_CACHE)
    commands = {LIGHT: (edgetrain, env), CLICK: ([sys.executable, "-c", VIA_CLICK, *line], env),
                REFERENCE: (reference, env)}
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
    width = max(map(len, names)) + 2
    for label, stat in (("median", statistics.median), ("minimum", min)):
        print(f"{label:{width}} {'wall s':>8} {'CPU s':>8} {'peak RSS MiB':>13}")
        for name in names:
            print(f"{name:{width}} " + " ".join(f"{stat(v[i] for v in rows[name]):{w}.{p}f}" for i, w, p in cols))
    others = [n for n in names if n != REFERENCE]
    print(f"\nagainst the reference, the median of the {args.rounds} round-by-round ratios (range); goal <= 1.10:")
    print(f"{'':{width}} " + " ".join(f"{n:>24}" for n in others))
    for i, what in ((1, "CPU time"), (0, "wall time"), (2, "peak RSS")):
        cells = []
        for name in others:
            r = [x[i] / y[i] for x, y in zip(rows[name], b)]
            cells.append(f"{statistics.median(r):.3f} ({min(r):.2f}-{max(r):.2f})")
        print(f"{what:{width}} " + " ".join(f"{c:>24}" for c in cells))
    minima = [min(x[1] for x in rows[n]) / min(y[1] for y in b) for n in others]
    print(f"{'CPU time, minima':{width}} " + " ".join(f"{m:>24.3f}" for m in minima))
    saved = [c[1] / x[1] for c, x in zip(rows[CLICK], rows[LIGHT])]
    print(f"\nclick path / light parser, CPU time: {statistics.median(saved):.3f} (median of the paired rounds; "
          f"range {min(saved):.2f}-{max(saved):.2f}); what the light parser saves a run")
    return 0


def predictions_count(images: str) -> list[str]:
    return [p for p in os.listdir(images) if p.lower().endswith((".jpg", ".jpeg", ".png"))]


if __name__ == "__main__":
    sys.exit(main())
