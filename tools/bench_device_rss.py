"""Benchmark: the smallest board. Peak memory of each device-loop command, imports included, on MobileNetV2-1.0 at
96x96, set against a Raspberry Pi Zero 2 W's 512 MB (issue 36, item 5).

Each command is a fresh `edgetrain` process (as on the board) in an environment where mxnet cannot be imported,
with the Zero 2 W's profile (--device rpi-zero2w: its memory budget, its 4 threads):

    finetune MODEL.onnx --train-layers lite     quantize model.onnx     predict int8.onnx     profile int8.onnx

The model is the Gluon zoo's MobileNetV2-1.0 graph written without mxnet (edgetrain/measure/reference_net.py) at
3x96x96 with random weights (memory does not depend on the values), 5 classes; the data are the built-in digits
resized to 3x96x96 by the commands' own preprocessing. Memory is read from /proc while the command runs (every
10 ms): for each process of the command (the command and the children it starts) its VmHWM (the kernel's own
peak RSS, imports included), and the sampled peak of the whole tree's PSS (each process's share of the pages
it shares: a child's libraries and the pages a fork shares with its parent counted once, as the board's RAM
holds them; a sum of RSS would count them twice). The figure set against the board is the larger of the two:
the biggest process's VmHWM, or the tree's sampled peak (a parent and its measuring child resident at once).
The Zero 2 W leaves 512 - 160 MB (its profile's OS reserve) = 352 MB to a run.

On the board itself quantize chooses its int8 scheme by timing each candidate in a child process (it does not
where the profile is another machine's, as here). The row "quantize, timed" measures that path: a profile
written for this host (its arch, cores and RAM, so that quantize times the candidates) with the Zero 2 W's
memory budget.

    python tools/bench_device_rss.py [--keep DIR] [--epochs 1] [--json out.json]
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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BOARD_MB = 512
DEVICE = "rpi-zero2w"


def _status_kb(pid: int, key: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _children(pid: int) -> list[int]:
    out: list[int] = []
    try:
        for task in Path(f"/proc/{pid}/task").iterdir():
            text = (task / "children").read_text().split()
            out += [int(c) for c in text]
    except OSError:
        pass
    return out


def _pss_kb(pid: int) -> int:
    """The process's proportional set size (Linux 4.14+), else its RSS."""
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return _status_kb(pid, "VmRSS")


def run_measured(argv: list[str], env: dict) -> dict:
    """Run ``argv``; sample its process tree's memory every 10 ms until it ends."""
    t0 = time.monotonic()
    out_f, err_f = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")   # files: a full pipe would stall it
    proc = subprocess.Popen(argv, env=env, stdout=out_f, stderr=err_f, text=True)
    hwm: dict[int, int] = {}
    tree_peak = 0
    while proc.poll() is None:
        pids, todo = [], [proc.pid]
        while todo:
            pid = todo.pop()
            pids.append(pid)
            todo += _children(pid)
        total = 0
        for pid in pids:
            hwm[pid] = max(hwm.get(pid, 0), _status_kb(pid, "VmHWM"))
            total += _pss_kb(pid)
        tree_peak = max(tree_peak, total)
        time.sleep(0.01)
    out_f.seek(0)
    err_f.seek(0)
    out, err = out_f.read(), err_f.read()
    return {"code": proc.returncode, "seconds": time.monotonic() - t0, "processes": len(hwm),
            "largest_process_mb": max(hwm.values(), default=0) / 1024, "tree_peak_mb": tree_peak / 1024,
            "stdout": out, "stderr": err}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keep", type=Path, help="work in this folder and keep it")
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--side", type=int, default=96)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    from edgetrain.devices import load_device
    from edgetrain.measure import reference_onnx

    folder = args.keep or Path(tempfile.mkdtemp(prefix="edgetrain-rss-"))
    folder.mkdir(parents=True, exist_ok=True)
    base = folder / f"mobilenetv2_1.0-{args.side}.onnx"
    base.write_bytes(reference_onnx("mobilenetv2_1.0", side=args.side, classes=5, dynamic_batch=True))
    blocker = folder / "no-mxnet" / "mxnet"
    blocker.mkdir(parents=True, exist_ok=True)
    (blocker / "__init__.py").write_text("raise ImportError('No module named mxnet (this is the device)')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(blocker.parent), os.environ.get("PYTHONPATH"))
                                                       if p), "EDGETRAIN_CACHE_DIR": ""}
    env.pop("EDGETRAIN_DEBUG", None)
    prof = load_device(DEVICE)
    available = prof.ram_mb - prof.os_reserve_mb
    here = folder / "zero-budget-here.yaml"
    _profile_for_this_host(here, prof)

    edgetrain = [sys.executable, "-m", "edgetrain"]
    run_dir = folder / "run"
    steps = [
        ("finetune lite", ["finetune", base, "--data", "builtin:digits", "-o", run_dir, "--train-layers", "lite",
                           "--epochs", str(args.epochs), "--device", DEVICE, "--json", folder / "finetune.json"]),
        ("quantize", ["quantize", run_dir / "model.onnx", "--calib", "builtin:digits", "-o", folder / "int8.onnx",
                      "--device", DEVICE, "--json", folder / "quantize.json"]),
        ("quantize, timed", ["quantize", run_dir / "model.onnx", "--calib", "builtin:digits", "-o",
                             folder / "int8-timed.onnx", "--device", here, "--json", folder / "quantize-timed.json"]),
        ("predict", ["predict", folder / "int8.onnx", "builtin:digits", "--device", DEVICE, "--json",
                     folder / "predict.json"]),
        ("profile", ["profile", folder / "int8.onnx", "--device", DEVICE, "--runs", "20", "--json",
                     folder / "profile.json"]),
    ]
    print(f"MobileNetV2-1.0 at 3x{args.side}x{args.side}, no mxnet, --device {DEVICE}: {prof.ram_mb} MB RAM, "
          f"{available} MB after its {prof.os_reserve_mb} MB OS reserve, memory budget {prof.memory_budget_mb} MB")
    print(f"{'command':<16} {'exit':>4} {'largest process MB':>18} {'tree PSS MB':>12} {'of 512 MB':>9} "
          f"{'fits ' + str(available):>9} {'seconds':>8}")
    rows = {}
    for name, argv in steps:
        r = run_measured([*edgetrain, *map(str, argv)], env)
        peak = max(r["largest_process_mb"], r["tree_peak_mb"])
        r.update(peak_mb=peak, share_of_board=peak / BOARD_MB, fits=peak <= available)
        rows[name] = r
        print(f"{name:<16} {r['code']:>4} {r['largest_process_mb']:>18.1f} {r['tree_peak_mb']:>12.1f} "
              f"{100 * peak / BOARD_MB:>8.0f}% {'yes' if r['fits'] else 'NO':>9} {r['seconds']:>8.1f}", flush=True)
        if r["code"] != 0:
            print("   " + (r["stderr"].strip().splitlines() or ["(no stderr)"])[-1][:300])
    if args.json:
        args.json.write_text(json.dumps({k: {kk: vv for kk, vv in v.items() if kk not in ("stdout", "stderr")}
                                         for k, v in rows.items()}, indent=2))
    return 0 if all(r["code"] == 0 for r in rows.values()) else 1


def _profile_for_this_host(path: Path, zero) -> None:
    """A device profile that this host matches (quantize then times its scheme candidates, as on the board),
    with the Zero 2 W's memory budget and what it leaves a run."""
    import yaml

    from edgetrain.devices import load_device
    from edgetrain.host import detect_host

    host = detect_host()
    data = load_device("x86-64-generic" if host.arch == "x86_64" else "rpi4b-4gb").model_dump(mode="json",
                                                                                             exclude_none=True)
    data.update(name="zero-budget-here", title="this host, with the Pi Zero 2 W's memory budget", cores=host.cores_usable,
                ram_mb=host.ram_mb, default_threads=min(zero.default_threads, host.cores_usable),
                os_reserve_mb=host.ram_mb - (zero.ram_mb - zero.os_reserve_mb), memory_budget_mb=zero.memory_budget_mb)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


if __name__ == "__main__":
    sys.exit(main())
