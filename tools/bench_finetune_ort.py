"""Benchmark: `edgetrain finetune` against a hand-written ONNX Runtime script (tools/finetune_ort_reference.py).

The job: MobileNetV2-1.0 at 160x160, 256 PNGs in 10 classes (generated here), effective
batch 32, 3 epochs, 2 threads, head only; plus `--train-layers last:2` and `--memory-budget 200MB`.
Every configuration runs as a fresh process, in interleaved rounds (A B C A B C ...). For each run:
- samples/s over the whole command = trained samples (train split x epochs) / the process's wall time,
  the same formula for every side; "x ref" divides the medians, "paired" is the median of each round's
  own ratio (reference wall / this wall, run back to back: steadier when the host's load drifts);
- CPU seconds (user + sys of the process and the children it waited for), beside the wall time: on a
  shared host the wall time swings with the other load, the CPU time much less;
- peak RSS = the largest single process of the run's tree (wait4's ru_maxrss: VmHWM of the process or
  of any child it waited for), and the peak of the tree's summed RSS, sampled every 10 ms.
`--base PATH` adds today's code (a checkout of an older commit, run with PYTHONPATH=PATH) as more
columns, and the held-out top-1 on builtin:digits with the shipped base for each code version.

    python tools/bench_finetune_ort.py [--rounds 3] [--base /tmp/base] [--keep DIR] [--configs a,b]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

# importing edgetrain names OpenBLAS's kernels for this CPU in os.environ (runtime.choose_blas_kernels); the
# children must each decide for themselves (today's code does not), so the user's own setting is noted first
USER_CORETYPE = os.environ.get("OPENBLAS_CORETYPE")

HERE = Path(__file__).resolve().parent
SHAPE = (3, 160, 160)
CLASSES = 10
THREADS = 2
EPOCHS = 3

WEIGHTS = r"""
import sys
import mxnet as mx, numpy as np
from mxnet.gluon import nn
from mxnet.gluon.model_zoo import vision
from edgetrain.compat import mxnet_onnx
from edgetrain.data import load_data
from edgetrain.preprocess import default_for_shape
mx.random.seed(0)
net = vision.get_model("mobilenetv2_1.0")
net.initialize(mx.init.Xavier())
x = load_data(sys.argv[1], default_for_shape((3, 160, 160))).shuffled(0).batch(np.arange(32))
bns = []
net.apply(lambda b: bns.append(b) if isinstance(b, nn.BatchNorm) else None)
for b in bns:
    b._kwargs["momentum"] = 0.0  # running statistics := this batch's
with mx.autograd.record(train_mode=True):
    out = net(mx.nd.array(x))
out.backward()  # MXNet 1.x updates BatchNorm's running statistics in the backward pass
mx.nd.waitall()
for b in bns:
    b._kwargs["momentum"] = 0.9
net.save_parameters(sys.argv[2])
sym = net.features(mx.sym.var("data"))
params = {p.name: p.data() for p in net.features.collect_params().values()}
proto = mxnet_onnx.translate(sym, params, "data", (1, 3, 160, 160))
open(sys.argv[3], "wb").write(proto.SerializeToString())
"""


def make_images(folder: Path, n: int, classes: int = CLASSES, seed: int = 0) -> None:
    """Textured colour PNGs whose class shows in hue and stripe direction."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(seed)
    yy, xx = np.mgrid[0:SHAPE[1], 0:SHAPE[2]].astype(np.float32)
    for i in range(n):
        c = i % classes
        (folder / f"class{c}").mkdir(parents=True, exist_ok=True)
        angle = c * np.pi / classes + rng.uniform(-0.1, 0.1)
        stripes = np.sin((xx * np.cos(angle) + yy * np.sin(angle)) / rng.uniform(3, 8))
        base = np.zeros((*SHAPE[1:], 3), np.float32)
        base[..., c % 3] = 0.5 + 0.4 * stripes
        base[..., (c + 1) % 3] = 0.2 + 0.05 * c
        base += rng.normal(0, 0.1, base.shape)
        Image.fromarray((np.clip(base, 0, 1) * 255).astype(np.uint8)).save(folder / f"class{c}" / f"{i:04d}.png")


def setup(root: Path, samples: int) -> tuple[Path, Path, Path]:
    folder, full, backbone = root / "images", root / "mobilenetv2-bench.params", root / "backbone.onnx"
    if not folder.exists():
        make_images(folder, samples)
    if not full.exists() or not backbone.exists():
        subprocess.run([sys.executable, "-c", WEIGHTS, str(folder), str(full), str(backbone)], check=True,
                       capture_output=True)
    return folder, full, backbone


def _tree_rss_kb(pid: int) -> int:
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as fh:
                total += next((int(ln.split()[1]) for ln in fh if ln.startswith("VmRSS:")), 0)
            for tid in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{tid}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError):
            continue
    return total


def _inherited_env() -> dict:
    env = dict(os.environ)
    if USER_CORETYPE is None:
        env.pop("OPENBLAS_CORETYPE", None)
    return env


def measure(cmd: list[str], env: dict | None = None) -> dict:
    """Run ``cmd``; wall seconds, largest single process's peak RSS, peak of the tree's summed RSS, stdout."""
    t0 = time.perf_counter()
    # cwd: not a source tree, so `python -m edgetrain` imports the code PYTHONPATH / the install names
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tempfile.gettempdir(),
                            env={**_inherited_env(), **(env or {})})
    peak_sum = [0]
    done = threading.Event()

    def sample():
        while not done.is_set():
            peak_sum[0] = max(peak_sum[0], _tree_rss_kb(proc.pid))
            time.sleep(0.01)

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    out_chunks = []
    err_chunks = []
    t_out = threading.Thread(target=lambda: out_chunks.append(proc.stdout.read()), daemon=True)
    t_err = threading.Thread(target=lambda: err_chunks.append(proc.stderr.read()), daemon=True)
    t_out.start(), t_err.start()
    _, status, ru = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    th.join(), t_out.join(), t_err.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return {"wall": wall, "cpu": ru.ru_utime + ru.ru_stime, "max_rss_mb": ru.ru_maxrss / 1024, "tree_rss_mb": peak_sum[0] / 1024,
            "code": proc.returncode, "out": "".join(out_chunks), "err": "".join(err_chunks)}


def _json_of(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    try:
        return json.loads(text)
    except ValueError:
        return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=256)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--base", help="a checkout of today's code (e.g. git worktree add /tmp/base 74bffa0)")
    ap.add_argument("--keep", help="keep the images, weights and outputs in this folder")
    ap.add_argument("--configs", help="comma-separated subset of the configuration names")
    ap.add_argument("--no-digits", action="store_true", help="skip the builtin:digits accuracy check")
    args = ap.parse_args(argv)
    root = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="bench-finetune-ort-"))
    root.mkdir(parents=True, exist_ok=True)
    folder, full, backbone = setup(root, args.samples)
    n_train = sum(len(list(d.iterdir())) - max(1, round(0.2 * len(list(d.iterdir())))) for d in folder.iterdir())
    print(f"MobileNetV2-1.0 {'x'.join(map(str, SHAPE))}, {args.samples} PNGs in {CLASSES} classes, batch 32, "
          f"{EPOCHS} epochs, {THREADS} threads; {n_train} training samples x {EPOCHS} epochs per run ({root})")

    def edgetrain(tag, code_env, *extra):
        def cmd(out):
            return [sys.executable, "-m", "edgetrain", "finetune", "zoo:mobilenetv2_1.0", "--input-shape",
                    ",".join(map(str, (1, *SHAPE))), "--params", str(full), "--data", str(folder), "-o", str(out),
                    "--batch-size", "32", "--epochs", str(EPOCHS), "--threads", str(THREADS), "--json", "-", *extra]
        return tag, cmd, code_env

    # a base model is loaded, checked and exported once (head: in an mxnet child; last:N: its template and
    # its frozen part) and cached: the warm configurations use a cache filled by a first run; "cold" turns
    # the cache off (every run is a first run)
    new_env = {"PYTHONPATH": "", "EDGETRAIN_CACHE_DIR": str(root / "cache")}
    # the OpenBLAS kernels edgetrain names for this CPU (runtime.choose_blas_kernels) when the user has not:
    # the reference script's NumPy head gets them too (the strongest peer)
    from edgetrain.runtime import blas_kernels_for

    core = None
    if USER_CORETYPE is None and Path("/proc/cpuinfo").exists():
        core = blas_kernels_for(Path("/proc/cpuinfo").read_text())
    configs = [
        ("reference (ORT script)", lambda out: [sys.executable, str(HERE / "finetune_ort_reference.py"),
                                                str(backbone), str(folder), str(out) + ".npz", "--epochs",
                                                str(EPOCHS), "--threads", str(THREADS)],
         {**new_env, **({"OPENBLAS_CORETYPE": core} if core else {})}),
        edgetrain("edgetrain head", new_env),
        edgetrain("edgetrain head cold", {**new_env, "EDGETRAIN_CACHE_DIR": ""}),
        edgetrain("edgetrain head 200MB", new_env, "--memory-budget", "200MB"),
        edgetrain("edgetrain last:2", new_env, "--train-layers", "last:2"),
        edgetrain("edgetrain last:2 cold", {**new_env, "EDGETRAIN_CACHE_DIR": ""}, "--train-layers", "last:2"),
    ]
    if args.base:
        base_env = {"PYTHONPATH": str(Path(args.base).resolve())}
        configs += [edgetrain("today head", base_env), edgetrain("today last:2", base_env, "--train-layers", "last:2")]
        # today's code with the BLAS kernels edgetrain now names for this CPU: how much of the gain is only that
        if core:
            configs.append(edgetrain(f"today last:2 {core}", {**base_env, "OPENBLAS_CORETYPE": core},
                                     "--train-layers", "last:2"))
    if args.configs:
        wanted = [c.strip() for c in args.configs.split(",")]
        configs = [c for c in configs if any(w in c[0] for w in wanted)]
    results: dict[str, list[dict]] = {c[0]: [] for c in configs}
    # an installed package has its bytecode compiled (pip does it); a source tree under PYTHONDONTWRITEBYTECODE
    # would compile every edgetrain module in every timed run (~0.1 s here): compile both trees first
    import edgetrain

    for tree in [Path(edgetrain.__file__).parent] + ([Path(args.base) / "edgetrain"] if args.base else []):
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree)], stdout=subprocess.DEVNULL, check=False)
    import shutil

    for tag, cmd, env in configs:  # fill the export cache (not timed): the head's and last:2's
        if env is new_env and tag in ("edgetrain head", "edgetrain last:2"):
            import shutil

            shutil.rmtree(root / "warm-cache", ignore_errors=True)
            measure(cmd(root / "warm-cache"), env)
    for r in range(args.rounds):
        for tag, cmd, env in configs:
            out = root / f"out-{tag.replace(' ', '_').replace(':', '').replace('(', '').replace(')', '')}"
            shutil.rmtree(out, ignore_errors=True)
            m = measure(cmd(out), env)
            doc = _json_of(m["out"])
            m["doc"] = doc
            if m["code"] != 0 or doc is None:
                tail = (m["err"].strip().splitlines() or [""])[-1]
                print(f"  round {r + 1} {tag}: exit {m['code']}: {tail[:300]}")
            else:
                print(f"  round {r + 1} {tag}: {m['wall']:.2f}s (cpu {m['cpu']:.2f}s), max RSS {m['max_rss_mb']:.0f} MiB, "
                      f"tree {m['tree_rss_mb']:.0f} MiB")
            results[tag].append(m)
            sys.stdout.flush()

    ref = results.get("reference (ORT script)", [])
    ref_ok = [m for m in ref if m["code"] == 0]
    ref_rate = statistics.median(n_train * EPOCHS / m["wall"] for m in ref_ok) if ref_ok else None
    ref_rss = statistics.median(m["max_rss_mb"] for m in ref_ok) if ref_ok else None
    print(f"\n{'configuration':26}{'samples/s':>10}{'x ref':>7}{'paired':>8}{'peak RSS':>10}{'x ref':>7}{'tree RSS':>10}"
          f"{'wall s':>8}{'cpu s':>7}{'top-1':>7}  (medians of {args.rounds} interleaved rounds)")
    for tag, runs in results.items():
        ok = [m for m in runs if m["code"] == 0]
        if not ok:
            print(f"{tag:26}  failed: {(runs[-1]['err'].strip().splitlines() or [''])[-1][:120]}")
            continue
        rate = statistics.median(n_train * EPOCHS / m["wall"] for m in ok)
        rss = statistics.median(m["max_rss_mb"] for m in ok)
        tree = statistics.median(m["tree_rss_mb"] for m in ok)
        wall = statistics.median(m["wall"] for m in ok)
        cpu = statistics.median(m["cpu"] for m in ok)
        doc = ok[-1]["doc"] or {}
        acc = doc.get("final_accuracy", doc.get("accuracy"))
        xr = f"{rate / ref_rate:7.2f}" if ref_rate else f"{'':7}"
        # paired: the median of each round's own ratio (the reference's wall / this one's, run back to back),
        # steadier than the ratio of medians when the host's load drifts between rounds
        pairs = [a["wall"] / b["wall"] for a, b in zip(ref, runs) if a["code"] == 0 and b["code"] == 0]
        xp = f"{statistics.median(pairs):8.2f}" if pairs and ref_rate else f"{'':8}"
        xm = f"{rss / ref_rss:7.2f}" if ref_rss else f"{'':7}"
        shown_acc = acc if acc is None else round(acc, 3)
        print(f"{tag:26}{rate:10.1f}{xr}{xp}{rss:10.0f}{xm}{tree:10.0f}{wall:8.2f}{cpu:7.2f}{shown_acc:>7}"
              + ("" if len(ok) == len(runs) else f"  ({len(runs) - len(ok)} failed)"))
    for today in [t for t in results if t.startswith("today last:2")]:
        a = [m for m in results.get("edgetrain last:2", []) if m["code"] == 0]
        b = [m for m in results[today] if m["code"] == 0]
        if a and b:
            wall_speedup = statistics.median(x['wall'] for x in b) / statistics.median(x['wall'] for x in a)
            print(f"last:2 speed-up over {today}: {wall_speedup:.2f}x "
                  f"wall, {statistics.median(x['cpu'] for x in b) / statistics.median(x['cpu'] for x in a):.2f}x CPU time "
                  "(user+sys of the process tree: less sensitive to a busy host)")

    if not args.no_digits:
        print("\nbuiltin:digits, shipped base (edgetrain.nets:pretrained_digits), defaults (head, 10 epochs):")
        versions = [("new", new_env)] + ([("today", {"PYTHONPATH": str(Path(args.base).resolve())})] if args.base else [])
        for name, env in versions:
            out = root / f"digits-{name}"
            shutil.rmtree(out, ignore_errors=True)
            m = measure([sys.executable, "-m", "edgetrain", "finetune", "edgetrain.nets:pretrained_digits", "--data",
                         "builtin:digits", "-o", str(out), "--threads", str(THREADS), "--json", "-"], env)
            doc = _json_of(m["out"]) or {}
            print(f"  {name:6} held-out top-1 {doc.get('final_accuracy')}  ({m['wall']:.1f}s, "
                  f"peak RSS {m['max_rss_mb']:.0f} MiB, exit {m['code']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
