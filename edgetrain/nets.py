"""Small networks edgetrain ships as factories (MODEL ``edgetrain.nets:digits_cnn``).

They are what the quickstart and the tests train on ``builtin:digits``: real data, seconds of CPU.
"""
from __future__ import annotations

from . import _lazy

DIGITS_INPUT = (1, 16, 16)


def digits_cnn(classes: int = 10):
    """A two-conv CNN for 16x16 grayscale digits: 5.6k parameters, about 2 ms per batch of 32."""
    nn = _lazy.from_import("mxnet.gluon", "nn")

    net = nn.HybridSequential(prefix="digits_")
    with net.name_scope():
        net.add(nn.Conv2D(16, 3, padding=1, use_bias=False), nn.BatchNorm(), nn.Activation("relu"),
                nn.MaxPool2D(2),
                nn.Conv2D(32, 3, padding=1, use_bias=False), nn.BatchNorm(), nn.Activation("relu"),
                nn.MaxPool2D(2),
                nn.Conv2D(32, 3, padding=1, use_bias=False), nn.BatchNorm(), nn.Activation("relu"),
                nn.GlobalAvgPool2D(), nn.Flatten(),
                nn.Dense(classes))
    net.edgetrain_preprocess = {"input_shape": list(DIGITS_INPUT), "mean": [0.3], "std": [0.4]}
    return net


def pretrained_digits():
    """``digits_cnn(classes=5)`` trained on builtin:digits 0-4 (tools/train_digits_base.py), as shipped.

    The starting point for on-device fine-tuning demos and tests: it knows five digits; `edgetrain
    finetune` teaches it the other five.
    """
    import json
    import warnings
    from importlib import resources

    gluon = _lazy.from_import("mxnet", "gluon")

    root = resources.files("edgetrain._builtin")
    with resources.as_file(root.joinpath("digits5-symbol.json")) as sym, \
            resources.as_file(root.joinpath("digits5-0000.params")) as params:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            net = gluon.SymbolBlock.imports(str(sym), ["data"], str(params))
    record = json.loads(root.joinpath("digits5-edgetrain.json").read_text(encoding="utf-8"))
    net.edgetrain_preprocess = record["preprocess"]
    return net
