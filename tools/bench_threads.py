"""1 thread against 2 on a quiet and on a busy host: does a thread pool spin against other work?

    python tools/bench_threads.py [--rounds 3] [--epochs 3] [--baseline DIR] [--load N]

Issue 26: on a loaded 2-core machine the device's default `--threads 2` trained 10x slower than 1 thread.
The workloads are `edgetrain finetune` (the quickstart's model and data: the digits base, head, a few
epochs; its own "seconds" of training from --json, start-up excluded) and `edgetrain predict` (the same
model as ONNX over the 1,797 digits; wall time of the whole process). Each runs with `--threads 1` and
`--threads 2`, on the host as it is ("quiet") and with a competing load ("loaded": N busy-loop processes,
default one per usable core, started before and stopped after each run). Every configuration takes its
turn in each round (interleaved, the order rotated every round), so a drifting machine touches all; the
table gives the median of the rounds and the ratios side by side: 2 threads / 1 thread under each load,
and loaded / quiet. ``--baseline DIR`` (another checkout of edgetrain, e.g. /work/main before a change)
adds its rows, run in the same rounds: before/after. The host's 1-minute load average is printed with the
figures: on a shared machine "quiet" is only as quiet as the others let it be.
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

ROOT = Path(__file__).resolve().parents[1]
MODEL = "edgetrain.nets:pretrained_digits"


def busy_loops(n: int) -> list[subprocess.Popen]:
    """``n`` processes that each keep a core busy until killed."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(n)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def run(code: Path, args: list[str], json_path: Path | None) -> float:
    """Seconds of one fresh `python -m edgetrain ARGS` run from checkout ``code``: the training seconds
    its --json reports when there is one, else the process's wall time."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    env.pop("OMP_NUM_THREADS", None)
    t0 = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "edgetrain", *args], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if done.returncode not in (0, 3):
        raise SystemExit(f"edgetrain {' '.join(args)} exited {done.returncode}: {done.stderr[-800:]}")
    if json_path is not None:
        return float(json.loads(json_path.read_text())["seconds"])
    return wall


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--load", type=int, default=len(os.sched_getaffinity(0)),
                    help="busy-loop processes in the loaded runs (default: one per usable core)")
    ap.add_argument("--baseline", type=Path, help="another edgetrain checkout to run in the same rounds")
    ap.add_argument("--workloads", default="finetune,predict")
    a = ap.parse_args(argv)

    codes = [("this", ROOT)] + ([("baseline", a.baseline.resolve())] if a.baseline else [])
    tmp = Path(tempfile.mkdtemp(prefix="bench-threads-"))
    onnx = tmp / "digits5.onnx"
    subprocess.run([sys.executable, "-m", "edgetrain", "export", MODEL, "-o", str(onnx)], check=True,
                   env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True)

    def job(workload: str, threads: int, k: int):
        if workload == "finetune":
            out = tmp / f"ft{k}"
            j = tmp / f"ft{k}.json"
            return ["finetune", MODEL, "--data", "builtin:digits", "-o", str(out), "--epochs", str(a.epochs),
                    "--threads", str(threads), "--json", str(j)], j
        return ["predict", str(onnx), "builtin:digits", "--threads", str(threads), "--format", "csv",
                "-o", str(tmp / f"p{k}.csv")], None

    configs = [(w, code, load, t) for w in a.workloads.split(",") for code in codes
               for load in ("quiet", "loaded") for t in (1, 2)]
    times: dict = {c[:1] + (c[1][0],) + c[2:]: [] for c in configs}
    loads = []
    k = 0
    for r in range(a.rounds):
        order = configs[r % len(configs):] + configs[:r % len(configs)]
        for w, (name, code), load, t in order:
            k += 1
            args, j = job(w, t, k)
            hogs = busy_loops(a.load) if load == "loaded" else []
            try:
                time.sleep(0.2 if hogs else 0.0)
                loads.append(os.getloadavg()[0])
                times[(w, name, load, t)].append(run(code, args, j))
            finally:
                stop(hogs)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)

    med = {key: statistics.median(v) for key, v in times.items()}
    print(f"host: {len(os.sched_getaffinity(0))} usable cores; 1-minute load average during the runs "
          f"{min(loads):.1f}-{max(loads):.1f}; loaded = {a.load} busy-loop process(es); median of {a.rounds} "
          "interleaved rounds")
    print(f"{'workload':<9} {'code':<9} {'load':<7} {'1 thread s':>11} {'2 threads s':>12} {'2t/1t':>7} "
          f"{'1t loaded/quiet':>16} {'2t loaded/quiet':>16}")
    for w in a.workloads.split(","):
        for name, _ in codes:
            for load in ("quiet", "loaded"):
                one, two = med[(w, name, load, 1)], med[(w, name, load, 2)]
                q1, q2 = med[(w, name, "quiet", 1)], med[(w, name, "quiet", 2)]
                print(f"{w:<9} {name:<9} {load:<7} {one:>11.2f} {two:>12.2f} {two / one:>7.2f} "
                      f"{one / q1:>16.2f} {two / q2:>16.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
