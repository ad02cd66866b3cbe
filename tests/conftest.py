"""Shared fixtures: tiny models built in code, real image files, and a CLI runner in a child process."""
from __future__ import annotations

import signal
from pathlib import Path

import numpy as np
import pytest

from clitools import run_edgetrain

# Ctrl-C as a terminal sends it. A suite started as a background job of a non-interactive shell (`cmd &` in a CI
# script) inherits SIGINT ignored, and every child would too: Python then installs no KeyboardInterrupt handler,
# and the tests of what a SIGINT does (exit 130, no process left behind) would test an ignored signal. A Python
# handler here becomes the default disposition in each child at exec.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory):
    """The fine-tune engine's per-user cache (exports, templates) is this session's own, never the HOME of
    whoever runs the tests: what one run left there must not decide what another test sees."""
    import os

    os.environ["EDGETRAIN_CACHE_DIR"] = str(tmp_path_factory.mktemp("edgetrain-cache"))
    # nor the power calibration `edgetrain energy calibrate` left in ~/.config: tests that calibrate set their own
    os.environ["XDG_CONFIG_HOME"] = str(tmp_path_factory.mktemp("edgetrain-config"))
    os.environ.pop("EDGETRAIN_POWER_CALIBRATION", None)
    yield


@pytest.fixture
def cli():
    return run_edgetrain


@pytest.fixture(scope="session")
def tiny_prefix(tmp_path_factory) -> Path:
    """A small digits CNN with random weights, exported as PREFIX (symbol.json + params + preprocessing)."""
    from edgetrain.models import load_gluon, save_prefix

    folder = tmp_path_factory.mktemp("tiny")
    model = load_gluon("edgetrain.nets:digits_cnn")
    save_prefix(model, folder / "digits")
    return folder / "digits"


@pytest.fixture(scope="session")
def layernorm_prefix(tmp_path_factory) -> Path:
    """A digits CNN with a LayerNorm before the output layer, as PREFIX: its ONNX export's trained part (last:2)
    holds the ops a LayerNorm becomes (ReduceMean, Sub, Pow, Sqrt, Div...)."""
    from mxnet.gluon import nn

    from edgetrain.models import load_gluon, save_prefix

    folder = tmp_path_factory.mktemp("lntail")
    model = load_gluon("edgetrain.nets:digits_cnn")
    net = nn.HybridSequential(prefix="lndigits_")
    with net.name_scope():
        net.add(nn.Conv2D(8, 3, padding=1, use_bias=False), nn.BatchNorm(), nn.Activation("relu"), nn.MaxPool2D(2),
                nn.Conv2D(16, 3, padding=1), nn.Activation("relu"), nn.GlobalAvgPool2D(), nn.Flatten(),
                nn.LayerNorm(), nn.Dense(10))
    net.initialize()
    model.block = net
    save_prefix(model, folder / "lndigits")
    return folder / "lndigits"


@pytest.fixture(scope="session")
def digits_folder(tmp_path_factory) -> Path:
    """A real image folder: 3 digit classes as PNG (grayscale) and JPEG (colour), plus a stray text file."""
    from PIL import Image

    from edgetrain.data import load_data
    from edgetrain.preprocess import default_for_shape

    root = tmp_path_factory.mktemp("images")
    ds = load_data("builtin:digits", default_for_shape((1, 8, 8)))
    for cls in (0, 1, 2):
        (root / f"digit{cls}").mkdir()
        idx = np.flatnonzero(ds.labels == cls)[:12]
        for k, i in enumerate(idx):
            pix = (ds._raw(int(i))[..., 0] * 255).astype(np.uint8)
            img = Image.fromarray(pix, mode="L").resize((24, 24))
            if k % 2:
                img.convert("RGB").save(root / f"digit{cls}" / f"{k}.jpg", quality=95)
            else:
                img.save(root / f"digit{cls}" / f"{k}.png")
    (root / "digit0" / "notes.txt").write_text("not an image")
    return root


@pytest.fixture(scope="session")
def digits5_onnx(tmp_path_factory) -> Path:
    """The shipped digits base (trained on 0-4) as the ONNX file `edgetrain export` writes: the device's input."""
    from clitools import run_edgetrain

    out = tmp_path_factory.mktemp("onnx") / "digits5.onnx"
    res = run_edgetrain("export", "edgetrain.nets:pretrained_digits", "-o", out)
    assert res.code == 0, res.err
    return out


@pytest.fixture(scope="session")
def digits_npz(tmp_path_factory) -> Path:
    """300 real digits (all ten classes, 8x8 in 0..1) as an .npz: small enough for several training runs."""
    from edgetrain.data import load_data
    from edgetrain.preprocess import Preprocess

    ds = load_data("builtin:digits", Preprocess(input_shape=(1, 8, 8), mean=(0.0,), std=(1.0,)))
    x, y = ds.arrays(300)
    path = tmp_path_factory.mktemp("npz") / "digits300.npz"
    np.savez(path, data=x[:, 0], label=y)
    return path
