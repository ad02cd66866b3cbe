"""finetune's --momentum and --weight-decay: the updates MXNet's fused ops make with them, each reaching the
run's optimizer (a trained model that differs where the setting differs, and is the same bits where it is the
default given explicitly), a resume with another value refused, and momentum with adam refused."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

import edgetrain
from clitools import assert_user_error, run_edgetrain
from edgetrain.training.optimizers import make_numpy_optimizer

BASE = Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx"


@pytest.mark.parametrize("name, momentum, wd", [("sgd", 0.0, 0.0), ("sgd", 0.5, 1e-3), ("sgd", 0.95, 0.0),
                                                ("adam", None, 0.0), ("adam", None, 1e-2)])
def test_momentum_and_weight_decay_update_as_mxnet_does(name, momentum, wd):
    import mxnet as mx

    rng = np.random.RandomState(4)
    w0 = rng.randn(4, 7).astype("float32")
    w, state = mx.nd.array(w0), [mx.nd.zeros(w0.shape), mx.nd.zeros(w0.shape)]
    mine = {"w": w0.copy()}
    opt = make_numpy_optimizer(name, mine, 0.05, momentum, wd)
    for t in range(1, 6):
        g = rng.randn(*w0.shape).astype("float32")
        if name == "sgd":
            mx.nd.sgd_mom_update(w, mx.nd.array(g), state[0], out=w, lr=0.05, momentum=momentum, wd=wd)
        else:
            lr = 0.05 * math.sqrt(1 - 0.999 ** t) / (1 - 0.9 ** t)
            mx.nd.adam_update(w, mx.nd.array(g), state[0], state[1], out=w, lr=lr, beta1=0.9, beta2=0.999,
                              epsilon=1e-8, wd=wd)
        opt.step({"w": g})
    np.testing.assert_allclose(mine["w"], w.asnumpy(), rtol=1e-5, atol=1e-6)


def test_momentum_is_refused_for_adam_by_the_optimizer_too():
    with pytest.raises(ValueError, match="momentum is sgd's"):
        make_numpy_optimizer("adam", {"w": np.zeros(3, np.float32)}, 0.01, momentum=0.9)


def _weights(model: Path) -> dict:
    import onnx
    from onnx import numpy_helper

    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(model)).graph.initializer}


def _finetune(data, out: Path, **kw) -> dict:
    res = edgetrain.finetune(str(BASE), str(data), out, epochs=2, seed=1, train_layers="bias", optimizer="sgd",
                             lr=0.05, allow_chance=True, progress=None, threads=1, **kw)
    return _weights(Path(res.model))


def test_each_setting_reaches_the_run(digits_npz, tmp_path):
    default = _finetune(digits_npz, tmp_path / "default")
    same = _finetune(digits_npz, tmp_path / "same", momentum=0.9, weight_decay=1e-4)
    plain = _finetune(digits_npz, tmp_path / "plain", momentum=0.0)
    no_decay = _finetune(digits_npz, tmp_path / "no-decay", weight_decay=0.0)
    assert all(np.array_equal(default[k], same[k]) for k in default)   # the defaults, given: the same bits
    for other in (plain, no_decay):
        assert any(not np.array_equal(default[k], other[k]) for k in default)
    # momentum 0: each step's change is lr x its gradient, where 0.9 accumulates them: the biases move less
    base = _weights(BASE)
    biases = [k for k in base if base[k].ndim == 1 and k in default and default[k].shape == base[k].shape]
    assert biases
    moved = lambda w: sum(float(np.abs(w[k] - base[k]).sum()) for k in biases)  # noqa: E731
    assert moved(plain) < moved(default)


def test_a_resume_with_another_momentum_is_refused(digits_npz, tmp_path):
    out = tmp_path / "out"
    args = ["finetune", BASE, "--data", digits_npz, "-o", out, "--train-layers", "bias", "--optimizer", "sgd",
            "--epochs", "1", "--threads", "1", "--allow-chance"]
    first = run_edgetrain(*args, "--momentum", "0.5")
    assert first.code == 0, first.err
    res = run_edgetrain(*[a if a != "1" else "2" for a in args], "--momentum", "0.8", "--resume")
    assert_user_error(res, 2, "--momentum differ from the checkpoint's", "checkpoint: 0.5, now: 0.8")
    res = run_edgetrain(*[a if a != "1" else "2" for a in args], "--momentum", "0.5", "--weight-decay", "0.01",
                        "--resume")
    assert_user_error(res, 2, "--weight-decay differ from the checkpoint's")


@pytest.mark.parametrize("args, fragment", [
    (["--momentum", "0.9"], "--momentum has no effect without --optimizer sgd"),
    (["--optimizer", "sgd", "--momentum", "1"], "--momentum"),
    (["--weight-decay", "-0.1"], "--weight-decay"),
])
def test_bad_optimizer_settings_are_one_line_and_exit_2(digits_npz, tmp_path, args, fragment):
    out = tmp_path / "out"
    res = run_edgetrain("finetune", BASE, "--data", digits_npz, "-o", out, *args)
    assert_user_error(res, 2, fragment)
    assert not out.exists()
