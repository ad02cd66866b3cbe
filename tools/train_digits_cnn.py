#!/usr/bin/env python3
"""Train edgetrain.nets:digits_cnn (10 classes) on builtin:digits and write what the quantize figures need.

    python tools/train_digits_cnn.py OUTDIR [--epochs 12] [--seed 0]

Writes OUTDIR/digits10 (PREFIX: symbol, params, preprocessing record), OUTDIR/calib.npz (the training
split, raw 8x8 pixels in [0, 1]) and OUTDIR/val.npz (the held-out 30%, never trained on), and prints the
held-out top-1. About 5 s on one core. The tests run it as a child process, as a user would.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("outdir", type=Path)
    ap.add_argument("--epochs", type=int, default=12)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--held-out", type=float, default=0.3)
    args = ap.parse_args(argv)

    from edgetrain.runtime import apply_threads

    apply_threads(1)  # determinism, and the shared CI box
    import mxnet as mx

    from digits_training import train_epochs

    from edgetrain.data import load_data
    from edgetrain.models import load_gluon, save_prefix
    from edgetrain.preprocess import Preprocess

    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    model = load_gluon("edgetrain.nets:digits_cnn")
    data = load_data("builtin:digits", model.preprocess)
    train, held = data.split(args.held_out, seed=args.seed)

    # The same samples as raw pixels (identity preprocessing at the native 8x8), for DATA files.
    raw = load_data("builtin:digits", Preprocess((1, 8, 8), mean=(0.0,), std=(1.0,))).split(args.held_out, args.seed)
    args.outdir.mkdir(parents=True, exist_ok=True)
    for name, split in (("calib", raw[0]), ("val", raw[1])):
        x, y = split.arrays()
        np.savez(args.outdir / f"{name}.npz", data=x[:, 0], label=y)

    x_train, y_train = train.arrays()
    x_held, y_held = held.arrays()
    train_epochs(model.block, x_train, y_train, epochs=args.epochs, lr=0.005, batch=64, seed=args.seed)
    top1 = float((model.predict(x_held).argmax(1) == y_held).mean() * 100)
    save_prefix(model, args.outdir / "digits10", extra={"trained_on": "builtin:digits",
                                                          "held_out_top1": round(top1, 2)})
    print(json.dumps({"prefix": str(args.outdir / "digits10"), "held_out_top1": top1,
                      "train_samples": len(x_train), "held_out_samples": len(x_held)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
