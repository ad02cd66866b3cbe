"""Benchmark: a large meter log read whole by `edgetrain energy attribute`, peak RSS and wall time.

Two logs are generated in a temporary folder (or --keep DIR):

- an Otii 3 ``Main power`` export at 4 kHz for one hour: 14.4 M rows, ``"Timestamp","Value"``, seconds from the
  recording's start (as the Otii app writes it);
- a generic CSV with its units in its header, ``timestamp,voltage (V),current (mA)``, Unix seconds, 2 M rows at
  1 kHz.

Each is attributed to a fine-tune's result (its ``energy.meter_windows``: an idle stretch and a timed window
inside the log) by ``edgetrain energy attribute`` in a fresh process under ``/usr/bin/time -v``, once per code
tree given (``--code DIR``, default: this checkout; give another checkout, e.g. ``--code /work/main --code .``,
to print the two side by side, interleaved round by round). A 1000-row log of the same format, attributed the
same way, is the process's baseline: bytes per reading = (peak RSS - baseline peak) / rows.

    python tools/bench_meterlog.py [--code DIR ...] [--rounds 1] [--rows-otii 14400000] [--rows-csv 2000000]
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
START = 1796292000.0  # 2026-12-03 10:00:00 UTC: the recordings' start


def _write_rows(path: Path, header: str, rows: int, row_of) -> None:
    """``rows`` lines written in blocks (the generator itself stays small)."""
    import numpy as np

    with open(path, "w", encoding="utf-8") as f:
        f.write(header + "\n")
        for a in range(0, rows, 200_000):
            i = np.arange(a, min(rows, a + 200_000))
            f.write(row_of(i))


def otii_log(folder: Path, rows: int, hz: float = 4000.0) -> Path:
    import numpy as np

    def block(i):
        s = i / hz
        w = 2.5 + 0.5 * np.sin(s * 0.7) + 0.001 * (i % 7)
        return "".join(f"{a:.6f},{b:.8f}\n" for a, b in zip(s.tolist(), w.tolist()))

    path = folder / f"Main power - Bench{rows}.csv"
    if path.exists():  # --keep: made by an earlier run
        return path
    _write_rows(path, '"Timestamp","Value"', rows, block)
    return path


def csv_log(folder: Path, rows: int, hz: float = 1000.0) -> Path:
    import numpy as np

    def block(i):
        t = START + i / hz
        ma = 400.0 + 50.0 * np.sin(i / hz * 0.3)
        return "".join(f"{a:.3f},5.08,{b:.2f}\n" for a, b in zip(t.tolist(), ma.tolist()))

    path = folder / f"meter{rows}.csv"
    if path.exists():
        return path
    _write_rows(path, "timestamp,voltage (V),current (mA)", rows, block)
    return path


def finetune_result(folder: Path, code: Path, seconds: float) -> Path:
    """A fine-tune's result as `finetune --meter-export --json` writes it, cut to what `attribute` reads."""
    version = subprocess.run([sys.executable, "-c", "import edgetrain; print(edgetrain.__version__)"],
                             env={**os.environ, "PYTHONPATH": str(code)}, capture_output=True, text=True,
                             check=True, cwd=folder).stdout.strip()
    span = seconds
    windows = {"command": "finetune", "edgetrain_version": version, "clock": "Unix seconds on this machine's clock",
               "held_for_a_meter": True, "on_device": True,
               "idle": [START + 0.1 * span, START + 0.2 * span], "timed": [START + 0.25 * span, START + 0.95 * span]}
    doc = {"trained_parameters": 1000, "joules_per_epoch": None, "joules_per_sample": None,
           "energy": {"provenance": "modelled", "joules": 1.0, "power_w": 2.0, "epochs": 1, "samples_trained": 100,
                      "meter_windows": windows}}
    path = folder / f"finetune-{abs(hash(str(code)))}-{int(span)}.json"
    path.write_text(json.dumps(doc))
    return path


def attribute(code: Path, result: Path, log: Path, out: Path) -> dict:
    """One `edgetrain energy attribute` in a fresh process: peak RSS (MB), wall and CPU s, the measured figure."""
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "edgetrain", "energy", "attribute", str(result), str(log),
           "--power-log-start", f"{START}", "-o", str(out)]
    env = {**os.environ, "PYTHONPATH": str(code), "EDGETRAIN_POWER_CALIBRATION": ""}
    t0 = time.perf_counter()
    # run from the logs' folder: `python -m` puts the working directory first on sys.path, before PYTHONPATH
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, cwd=out.parent)
    wall = time.perf_counter() - t0
    if res.returncode != 0:
        raise SystemExit(f"attribute failed ({code}, {log.name}):\n{res.stderr[-2000:]}")
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", res.stderr).group(1))
    cpu = sum(float(re.search(rf"{k} time \(seconds\): ([\d.]+)", res.stderr).group(1)) for k in ("User", "System"))
    en = json.loads(out.read_text())["energy"]
    return {"rss_mb": rss_kb / 1024.0, "wall_s": wall, "cpu_s": cpu, "joules": en.get("joules"), "power_w": en.get("power_w")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--code", action="append", type=Path, help="a checkout to run (repeat to compare)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--rows-otii", type=int, default=14_400_000)
    ap.add_argument("--rows-csv", type=int, default=2_000_000)
    ap.add_argument("--keep", type=Path, help="write the logs here (and reuse them if there)")
    args = ap.parse_args()
    codes = [c.resolve() for c in (args.code or [ROOT])]
    tmp = tempfile.TemporaryDirectory(prefix="bench-meterlog-")
    folder = args.keep or Path(tmp.name)
    folder.mkdir(parents=True, exist_ok=True)
    logs = []
    for kind, rows, make, hz in [("Otii Main power 4 kHz", args.rows_otii, otii_log, 4000.0),
                                 ("CSV V x mA 1 kHz", args.rows_csv, csv_log, 1000.0)]:
        big, small = make(folder, rows), make(folder, 1000)
        logs.append((kind, rows, hz, big, small))
    print(f"{'log':<24} {'rows':>10} {'code':<28} {'peak RSS MB':>11} {'baseline MB':>11} {'B/reading':>9} "
          f"{'wall s':>7} {'cpu s':>7} {'power W':>9}")
    for kind, rows, hz, big, small in logs:
        for _ in range(args.rounds):
            for code in codes:
                base = attribute(code, finetune_result(folder, code, 1000 / hz), small, folder / "out-small.json")
                got = attribute(code, finetune_result(folder, code, rows / hz), big, folder / "out-big.json")
                per = (got["rss_mb"] - base["rss_mb"]) * 1024 * 1024 / rows
                print(f"{kind:<24} {rows:>10} {str(code)[-28:]:<28} {got['rss_mb']:>11.1f} {base['rss_mb']:>11.1f} "
                      f"{per:>9.1f} {got['wall_s']:>7.1f} {got['cpu_s']:>7.1f} {got['power_w']:>9.5f}", flush=True)


if __name__ == "__main__":
    main()
