"""Train the shipped base model: digits_cnn(classes=5) on builtin:digits classes 0-4 (fixed seed).

Writes edgetrain/_builtin/digits5-symbol.json, -0000.params and -edgetrain.json (MODEL
``edgetrain.nets:pretrained_digits``). It is the "pretrained on the factory's data" starting point that
`edgetrain finetune` then extends on the device to all ten digits. Seconds of CPU:

    python tools/train_digits_base.py [--epochs 30] [--out edgetrain/_builtin/digits5]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--out", default=str(ROOT / "edgetrain" / "_builtin" / "digits5"))
    args = ap.parse_args(argv)

    from edgetrain import runtime

    runtime.apply_threads(2)
    import mxnet as mx
    import numpy as np

    from digits_training import train_epochs

    from edgetrain.data import load_data
    from edgetrain.models import GluonModel, parse_model_ref, save_prefix
    from edgetrain.nets import digits_cnn
    from edgetrain.preprocess import Preprocess

    mx.random.seed(args.seed)
    np.random.seed(args.seed)
    net = digits_cnn(classes=5)
    pre = Preprocess.from_dict(net.edgetrain_preprocess).with_classes([str(d) for d in range(5)])
    ds = load_data("builtin:digits", pre).select_classes(range(5))
    train, held = ds.split(0.2, seed=args.seed)
    xs, ys = train.arrays()
    xh, yh = held.arrays()
    net.initialize(mx.init.Xavier(magnitude=2.0))
    net.hybridize()
    train_epochs(net, xs, ys, epochs=args.epochs, lr=3e-3, batch=32, seed=args.seed)
    acc = float((net(mx.nd.array(xh)).asnumpy().argmax(1) == yh).mean())
    print(f"held-out accuracy on digits 0-4: {acc:.3f} ({len(yh)} samples)")
    ref = parse_model_ref("edgetrain.nets:digits_cnn")
    out = save_prefix(GluonModel(net, ref, pre, 5), args.out,
                      extra={"trained_by": "tools/train_digits_base.py", "data": "builtin:digits classes 0-4",
                             "epochs": args.epochs, "seed": args.seed, "held_out_accuracy": round(acc, 4)})
    for path in out.values():
        print(f"wrote {path} ({path.stat().st_size} bytes)")
    return 0 if acc > 0.95 else 1


if __name__ == "__main__":
    sys.exit(main())
