"""Small networks edgetrain ships as factories (MODEL ``edgetrain.nets:digits_cnn``).

They are what the quickstart and the tests train on ``builtin:digits``: real data, seconds of CPU.
"""
from __future__ import annotations

DIGITS_INPUT = (1, 16, 16)


def digits_cnn(classes: int = 10):
    """A two-conv CNN for 16x16 grayscale digits: 5.6k parameters, about 2 ms per batch of 32."""
    from mxnet.gluon import nn

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
