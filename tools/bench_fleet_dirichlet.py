"""Issue 38 item 2: the fleet on harder data. A Dirichlet(alpha) split of builtin:digits over ``--devices``
devices (alpha 0.1: most devices hold one or two digits), ``--fraction`` of them asked each round, run by
tools/fleet_sim.py (the coordinator's and the ClientApp's own code in one process; Flower's simulation engine
needs Ray, which edgetrain does not install). Per seed and per --train-layers choice: the fp32 fleet, the ternary
fleet sized to ``--uplink-ratio`` (SCAFFOLD, the defaults otherwise), and a centralised fine-tune on the union of
the devices' data for the same epochs. Prints each run, then the distribution over seeds of ternary - fp32 and
ternary - centralised (points of held-out top-1) and the uplink and downlink ratios (fp32 bytes / bytes sent).

    python tools/bench_fleet_dirichlet.py --seeds 4 --modes head --rounds 10 [--downlink-ratio 16] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

MODEL = "edgetrain.nets:pretrained_digits"


def one(work: Path, seed: int, mode: str, codec: str, args) -> dict:
    import fleet_sim

    r = fleet_sim.run(work, MODEL, args.devices, args.rounds, drop_fraction=0.0, seed=seed, codec=codec,
                      aggregate="scaffold", alpha=args.alpha, fraction=args.fraction, train_layers=mode,
                      uplink_ratio=args.uplink_ratio if codec == "ternary" else 0.0,
                      downlink_ratio=args.downlink_ratio if codec == "ternary" else 0.0)
    rounds = r["rounds"]
    up, up32 = sum(x["bytes_up"] for x in rounds), sum(x["bytes_up_fp32"] for x in rounds)
    down, down32 = sum(x["bytes_down"] for x in rounds), sum(x["bytes_down_fp32"] for x in rounds)
    return {"accuracy": rounds[-1]["accuracy"], "up_ratio": up32 / max(up, 1), "down_ratio": down32 / max(down, 1),
            "data": str(work / "data"), "wall_s": r["wall_seconds"]}


def centralised(work: Path, union: str, val: str, epochs: int, mode: str) -> float:
    from edgetrain.fleet.local import Evaluator, LocalSpec, train_round

    ev = Evaluator(LocalSpec(model=MODEL, data=val, workdir=str(work / "eval"), threads=1, train_layers=mode), val)
    spec = LocalSpec(model=MODEL, data=union, workdir=str(work / "central"), epochs=epochs, threads=1,
                     train_layers=mode)
    arrays, _ = train_round(spec, ev.initial, 1)
    return ev.top1(arrays)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--modes", default="head", help="comma list of --train-layers choices")
    ap.add_argument("--devices", type=int, default=10)
    ap.add_argument("--alpha", type=float, default=0.1)
    ap.add_argument("--fraction", type=float, default=0.3, help="of the devices asked each round")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--uplink-ratio", type=float, default=100.0)
    ap.add_argument("--downlink-ratio", type=float, default=16.0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    print(f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; Dirichlet({args.alpha}) over {args.devices} "
          f"devices, {args.fraction:.0%} asked per round, {args.rounds} rounds, ternary --uplink-ratio "
          f"{args.uplink_ratio:g}, --downlink-ratio {args.downlink_ratio:g}", flush=True)
    rows = []
    t0 = time.monotonic()
    for mode in args.modes.split(","):
        for seed in range(args.seeds):
            with tempfile.TemporaryDirectory() as tmp:
                fp = one(Path(tmp) / "fp32", seed, mode, "fp32", args)
                te = one(Path(tmp) / "ternary", seed, mode, "ternary", args)
                data = Path(fp["data"])
                cen = centralised(Path(tmp) / "c", str(data / "union.npz"), str(data / "val.npz"), args.rounds, mode)
            row = {"mode": mode, "seed": seed, "fp32": fp["accuracy"], "ternary": te["accuracy"], "centralised": cen,
                   "up_ratio": te["up_ratio"], "down_ratio": te["down_ratio"]}
            rows.append(row)
            print(f"{mode:7s} seed {seed}: centralised {cen:.4f}  fp32 fleet {fp['accuracy']:.4f}  ternary "
                  f"{te['accuracy']:.4f} ({te['up_ratio']:.0f}x up, {te['down_ratio']:.1f}x down)  "
                  f"load {os.getloadavg()[0]:.1f}", flush=True)
    for mode in args.modes.split(","):
        mine = [r for r in rows if r["mode"] == mode]
        vs_fp = [100 * (r["ternary"] - r["fp32"]) for r in mine]
        vs_c = [100 * (r["ternary"] - r["centralised"]) for r in mine]
        print(f"{mode}: ternary - fp32 fleet: mean {statistics.mean(vs_fp):+.2f} pts, min {min(vs_fp):+.2f}, max "
              f"{max(vs_fp):+.2f}; ternary - centralised: mean {statistics.mean(vs_c):+.2f}, min {min(vs_c):+.2f}; "
              f"uplink {min(r['up_ratio'] for r in mine):.0f}x..{max(r['up_ratio'] for r in mine):.0f}x, downlink "
              f"{min(r['down_ratio'] for r in mine):.1f}x..{max(r['down_ratio'] for r in mine):.1f}x "
              f"({len(mine)} seeds)", flush=True)
    print(f"{time.monotonic() - t0:.0f} s in all; load {os.getloadavg()[0]:.1f}", flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
