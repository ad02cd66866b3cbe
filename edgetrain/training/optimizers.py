"""SGD (momentum) and Adam on NumPy float32 arrays, with state that is plain named arrays.

Gluon's Trainer keeps its state behind a pickle; a checkpoint that must be refused when corrupt, and
restored bit-for-bit after a power cut, wants arrays it can name, check and load without unpickling.
The updates are MXNet's fused ops' (sgd_mom_update, adam_update), the ones Trainer runs (a test holds them
equal, momentum and weight decay included). Weight decay is MXNet's: an L2 term, ``wd * w`` added to the gradient
before the update (for Adam too, so it is scaled by Adam's per-weight step; not AdamW's decoupled decay).
"""
from __future__ import annotations

import math

OPTIMIZERS = ("sgd", "adam")
DEFAULT_LR = {"sgd": 0.05, "adam": 0.003}
# A lone output layer on fixed features is a linear model: it tolerates, and needs, a larger step
# (digits5 -> ten digits, head only, 10 epochs: 0.84 held-out accuracy at adam 0.003, 0.93 at 0.02).
HEAD_LR = {"sgd": 0.2, "adam": 0.02}
DEFAULT_MOMENTUM = 0.9       # sgd's, when --momentum is not given (finetune's value before the option)
DEFAULT_WEIGHT_DECAY = 1e-4  # both optimizers', when --weight-decay is not given
# Every weight, with BatchNorm in training mode (engine_onnx.BATCH_STATS), on the held-out shift of issue 34
# (tools/bench_torch_peer.py: MobileNetV2-1.0, 2 epochs): held-out top-1 0.571 at adam 0.0003, 0.730 at 0.001, 0.682
# at 0.003 (PyTorch's full fine-tune at 0.0003: 0.601); the digits CNN (digits5 -> ten digits, 3 epochs): 0.23, 0.55,
# 0.75. (With BatchNorm's statistics frozen, MobileNetV2 at 0.003 collapsed to chance and 0.0003 was best: 0.457.)
# sgd's rate was not measured again.
ALL_LR = {"sgd": 0.005, "adam": 0.001}


def default_lr(name: str, head_only: bool, every_weight: bool = False) -> float:
    """The learning rate of a run without --lr: the output layer alone (``head_only``) tolerates a larger step, every
    weight (``every_weight``: --train-layers all) a smaller one, the rest (last:N, bias, lite) DEFAULT_LR."""
    return (HEAD_LR if head_only else ALL_LR if every_weight else DEFAULT_LR)[name]


class NumpyOptimizer:
    """MXNet's updates on NumPy float32 arrays.

    ``params`` maps name -> array (updated in place); ``step(grads)`` takes name -> gradient averaged
    over the effective batch. State arrays are named NAME:i.
    """

    n_states = 0   # per weight: a subclass's state arrays

    def __init__(self, params: dict, lr: float, wd: float = DEFAULT_WEIGHT_DECAY):
        import numpy as np

        self.params = params
        self.lr = np.float32(lr)
        self.wd = np.float32(wd)
        self.t = 0
        self.state: dict[str, list] = {}

    def step(self, grads: dict) -> None:
        import numpy as np

        self.t += 1
        for name, w in self.params.items():
            if name not in self.state:
                self.state[name] = [np.zeros_like(w) for _ in range(self.n_states)]
            self._update(w, grads[name].astype(np.float32, copy=False), self.state[name])

    def _update(self, w, g, state: list) -> None:
        raise NotImplementedError

    def state_arrays(self) -> dict:
        return {f"{name}:{i}": s for name, states in self.state.items() for i, s in enumerate(states)}

    def load_state_arrays(self, arrays: dict, t: int) -> None:
        import numpy as np

        self.t = t
        self.state = {}
        for name in self.params:
            got = [arrays.get(f"{name}:{i}") for i in range(self.n_states)]
            if all(a is not None for a in got):
                self.state[name] = [np.array(a, dtype=np.float32) for a in got]


class NumpySGD(NumpyOptimizer):
    n_states = 1

    def __init__(self, params: dict, lr: float, wd: float = DEFAULT_WEIGHT_DECAY, momentum: float = DEFAULT_MOMENTUM):
        super().__init__(params, lr, wd)
        self.momentum = float(momentum)

    def _update(self, w, g, state):  # sgd_mom_update: mom = m*mom - lr*(g + wd*w); w += mom
        import numpy as np

        mom = state[0]
        mom *= np.float32(self.momentum)
        mom -= self.lr * (g + self.wd * w)
        w += mom


class NumpyAdam(NumpyOptimizer):
    n_states = 2
    beta1, beta2, eps = 0.9, 0.999, 1e-8

    def _update(self, w, g, state):  # adam_update, with the bias correction folded into lr as Adam does
        import numpy as np

        lr = np.float32(self.lr * math.sqrt(1 - self.beta2 ** self.t) / (1 - self.beta1 ** self.t))
        g = g + self.wd * w
        mean, var = state
        mean *= np.float32(self.beta1)
        mean += np.float32(1 - self.beta1) * g
        var *= np.float32(self.beta2)
        var += np.float32(1 - self.beta2) * g * g
        w -= lr * mean / (np.sqrt(var) + np.float32(self.eps))


def make_numpy_optimizer(name: str, params: dict, lr: float, momentum: float | None = None,
                         weight_decay: float | None = None) -> NumpyOptimizer:
    """``name``'s optimizer over ``params``; ``momentum`` is sgd's only (None: DEFAULT_MOMENTUM), ``weight_decay``
    None: DEFAULT_WEIGHT_DECAY."""
    wd = DEFAULT_WEIGHT_DECAY if weight_decay is None else weight_decay
    if name == "sgd":
        return NumpySGD(params, lr, wd, DEFAULT_MOMENTUM if momentum is None else momentum)
    if momentum is not None:
        raise ValueError("momentum is sgd's (adam's first-moment decay is fixed at 0.9)")
    return NumpyAdam(params, lr, wd)


class Corrected:
    """An engine's optimizer, with a drift correction added to every gradient it is given (SCAFFOLD,
    Karimireddy et al. 2020: devices that each see a few classes otherwise pull the shared trainable part
    towards their own classes; None adds nothing). Counts the steps, which the new control variate needs.
    """

    def __init__(self, opt, correction: dict | None):
        self.inner, self.correction, self.steps = opt, correction or None, 0

    @property
    def momentum(self) -> float:
        return float(getattr(self.inner, "momentum", 0.0)) if isinstance(self.inner, NumpySGD) else 0.0

    def step(self, grads: dict) -> None:
        self.steps += 1
        if self.correction:
            grads = {k: g + self.correction[k] if k in self.correction else g for k, g in grads.items()}
        self.inner.step(grads)

    @property
    def t(self) -> int:
        return self.inner.t

    def state_arrays(self) -> dict:
        return self.inner.state_arrays()

    def load_state_arrays(self, arrays: dict, t: int) -> None:
        self.inner.load_state_arrays(arrays, t)
