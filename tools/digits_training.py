"""The plain training loop the tools/ scripts share: Adam on in-memory arrays, shuffled with a fixed seed.

Imported by tools/train_digits_base.py and tools/train_digits_cnn.py (run as scripts, so this folder is
on sys.path). Never imported by edgetrain.
"""
from __future__ import annotations

import numpy as np


def train_epochs(net, x: np.ndarray, y: np.ndarray, *, epochs: int, lr: float, batch: int, seed: int) -> None:
    """Train a Gluon classifier in place with softmax cross-entropy."""
    import mxnet as mx
    from mxnet import autograd, gluon

    trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": lr}, kvstore=None)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(seed)
    for _ in range(epochs):
        order = rng.permutation(len(x))
        for start in range(0, len(order), batch):
            idx = order[start:start + batch]
            with autograd.record():
                loss = loss_fn(net(mx.nd.array(x[idx])), mx.nd.array(y[idx]))
            loss.backward()
            trainer.step(len(idx))
