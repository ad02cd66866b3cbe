#!/usr/bin/env python3
"""Export and validate every image-classification network of the Gluon model zoo; print a table.

Each model runs in its own child process (`edgetrain export zoo:NAME --params ... --json -`), one thread,
so one failure or one memory peak does not affect the next. The zoo's default initialisation gives
outputs near 1e-20, against which any absolute tolerance passes trivially, so each model first gets
He-initialised weights and BatchNorm statistics measured on image-like inputs, as training would leave
them (saved with save_parameters, given as --params): logits of order 1-10, like a trained network's,
which make atol 1e-4 / rtol 1e-3 a real test.

    python tools/export_zoo.py                 # the whole zoo at its native input size
    python tools/export_zoo.py --only resnet18_v1,mobilenetv2_1.0 --size 96
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

ZOO = (
    ["alexnet"]
    + [f"vgg{d}{bn}" for bn in ("", "_bn") for d in (11, 13, 16, 19)]
    + [f"resnet{d}_v{v}" for v in (1, 2) for d in (18, 34, 50, 101, 152)]
    + [f"mobilenet{w}" for w in ("1.0", "0.75", "0.5", "0.25")]
    + [f"mobilenetv2_{w}" for w in ("1.0", "0.75", "0.5", "0.25")]
    + ["squeezenet1.0", "squeezenet1.1"]
    + [f"densenet{d}" for d in (121, 161, 169, 201)]
    + ["inceptionv3"]
)


def make_params(name: str, size: int, path: Path) -> None:
    """He-initialised weights with BatchNorm statistics measured on image-like data, saved for --params.

    Why measured statistics: a trained network's BatchNorm layers hold the mean/variance its activations
    really have, which keeps every layer near unit scale and the logits of order 1-10. Made-up statistics
    let activations grow layer after layer (logits in the hundreds for ResNet v1), and float32 rounding
    grows with them, which would test the weights rather than the export.
    """
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import mxnet as mx
    import numpy as np
    from mxnet import autograd
    from mxnet.gluon import nn
    from mxnet.gluon.model_zoo import vision

    net = vision.get_model(name, pretrained=False)
    net.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2))
    rng = np.random.RandomState(0)
    mean = np.array([0.485, 0.456, 0.406]).reshape(1, 3, 1, 1)
    std = np.array([0.229, 0.224, 0.225]).reshape(1, 3, 1, 1)
    x = mx.nd.array((rng.rand(8, 3, size, size) - mean) / std)
    net(x[:1])  # resolve deferred shapes
    # gamma is perturbed in fix_gamma layers too: MXNet ignores it there, and so must the export.
    for pname, p in net.collect_params().items():
        if pname.endswith("gamma"):
            p.set_data(mx.nd.array(rng.uniform(0.8, 1.2, p.shape)))
        elif pname.endswith("beta"):
            p.set_data(mx.nd.array(rng.normal(0, 0.1, p.shape)))

    def momentum_zero(block):  # running statistics := this batch's statistics
        if isinstance(block, nn.BatchNorm):
            block._kwargs["momentum"] = 0.0
    net.apply(momentum_zero)
    with autograd.record(train_mode=True):
        net(x)
    # The classifier is scaled so the logits have std 3 on this batch, as a trained ImageNet
    # classifier's roughly do; an absolute tolerance means nothing without a realistic output scale.
    *_, (w_name, w), (b_name, b) = [(n, p) for n, p in net.collect_params().items()
                                    if n.endswith("weight") or n.endswith("bias")]
    with autograd.predict_mode():
        scale = 3.0 / float(net(x).asnumpy().std())
    w.set_data(w.data() * scale)
    b.set_data(b.data() * scale)
    net.save_parameters(str(path))


def run_one(name: str, size: int, folder: Path, atol: str, rtol: str) -> dict:
    params = folder / f"{name}.params"
    t0 = time.perf_counter()
    gen = subprocess.run([sys.executable, __file__, "--make-params", name, "--size", str(size), "--out", str(params)],
                         capture_output=True, text=True)
    if gen.returncode != 0:
        return {"model": name, "error": gen.stderr.strip().splitlines()[-1][:120]}
    t1 = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "edgetrain", "export", f"zoo:{name}", "--params", str(params),
                          "--input-shape", f"1,3,{size},{size}", "-o", str(folder / f"{name}.onnx"),
                          "--atol", atol, "--rtol", rtol, "--threads", "1", "--json", "-"],
                         capture_output=True, text=True)
    seconds = time.perf_counter() - t1
    (folder / f"{name}.onnx").unlink(missing_ok=True)
    params.unlink(missing_ok=True)
    if res.returncode not in (0, 3):
        err = [ln for ln in res.stderr.splitlines() if ln.strip()]
        return {"model": name, "error": (err[-1] if err else f"exit {res.returncode}")[:160], "seconds": seconds}
    out = json.loads(res.stdout)
    return {"model": name, "size": size, "nodes": sum(out["ops"].values()), "op_types": len(out["ops"]),
            "max_abs": out["comparison"]["max_abs"], "max_rel": out["comparison"]["max_rel"],
            "out_mag": max(o["expected_max_abs"] for o in out["comparison"]["outputs"]),
            "passed": out["passed"], "seconds": seconds, "mb": out["size_bytes"] / 1e6,
            "params_seconds": t1 - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", help="comma-separated zoo names (default: the whole zoo)")
    ap.add_argument("--size", type=int, help="input H=W for every model (default: 224, inception 299)")
    ap.add_argument("--atol", default="1e-4")
    ap.add_argument("--rtol", default="1e-3")
    ap.add_argument("--make-params", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.make_params:
        make_params(args.make_params, args.size, Path(args.out))
        return 0
    names = args.only.split(",") if args.only else ZOO
    print(f"{'model':<16} {'input':>5} {'nodes':>5} {'types':>5} {'max abs err':>11} {'max rel err':>11} "
          f"{'max |y|':>8} {'MB':>6} {'result':>6} {'seconds':>7}", flush=True)
    failures = 0
    with tempfile.TemporaryDirectory(prefix="export_zoo.") as tmp:
        for name in names:
            size = args.size or (299 if name.startswith("inception") else 224)
            r = run_one(name, size, Path(tmp), args.atol, args.rtol)
            if "error" in r:
                failures += 1
                print(f"{name:<16} {size:>5} ERROR {r['error']}", flush=True)
                continue
            failures += not r["passed"]
            print(f"{name:<16} {size:>5} {r['nodes']:>5} {r['op_types']:>5} {r['max_abs']:>11.3g} "
                  f"{r['max_rel']:>11.3g} {r['out_mag']:>8.3g} {r['mb']:>6.1f} {'pass' if r['passed'] else 'FAIL':>6} "
                  f"{r['seconds']:>7.1f}", flush=True)
    print(f"{len(names) - failures}/{len(names)} passed at atol {args.atol}, rtol {args.rtol} "
          "(seconds: export + validation, in a child process, 1 thread)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
