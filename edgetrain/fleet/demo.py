"""A fleet on one machine: builtin:digits split into non-IID device shares and a held-out set.

``split_digits(folder)`` writes ``val.npz`` (a stratified held-out quarter, all ten digits) and one
``device-K.npz`` per device holding only some of the digits (``SHARES``), each with the ten class names,
so every device trains the same ten-way output layer. Used by the one-machine script
(``python -m edgetrain.fleet.demo``), the benchmark (``tools/bench_fleet.py``) and the tests.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from ..data import load_data
from ..fileio import atomic_path
from ..preprocess import Preprocess
from .procs import free_port

# Which digits each device sees: none sees more than four, together they see all ten.
SHARES = ((0, 1, 5, 6), (2, 3, 7, 8), (4, 9, 6, 7))
CLASSES = [str(d) for d in range(10)]


def _digits():
    ds = load_data("builtin:digits", Preprocess.from_dict({"input_shape": [1, 8, 8], "mean": [0.0], "std": [1.0]}))
    raw = np.stack([ds._raw(i) for i in range(len(ds))])  # 8x8x1 in [0, 1], as shipped
    return np.round(raw * 16).astype(np.float32) / 16, np.asarray(ds.labels)


def _save(path: Path, data: np.ndarray, labels: np.ndarray) -> None:
    with atomic_path(path, "fleet demo data") as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, data=(data * 255).round().astype(np.uint8), label=labels.astype(np.int64),
                     class_names=np.array(CLASSES))


def dirichlet_parts(labels: np.ndarray, devices: int, alpha: float, rng, least: int = 10) -> list[list[int]]:
    """Each class's samples dealt to ``devices`` in proportions drawn from Dirichlet(alpha) (Hsu et al. 2019: the
    smaller alpha, the fewer classes a device sees), drawn again until every device holds at least ``least``."""
    for _ in range(1000):
        parts: list[list[int]] = [[] for _ in range(devices)]
        for c in np.unique(labels):
            idx = rng.permutation(np.flatnonzero(labels == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(devices, alpha))) * len(idx)).astype(int)[:-1]
            for d, chunk in enumerate(np.split(idx, cuts)):
                parts[d] += chunk.tolist()
        if min(map(len, parts)) >= least:
            return parts
    raise ValueError(f"no Dirichlet({alpha}) split gives each of {devices} devices {least} samples")


def split_digits(folder, shares=SHARES, val_fraction: float = 0.25, seed: int = 0,
                 per_device: int | None = None, dirichlet: tuple[int, float] | None = None) -> dict:
    """Write the held-out set and the device shares; returns their paths ({"val", "devices", "union"}).
    ``dirichlet=(devices, alpha)`` deals the training samples by a Dirichlet split instead of ``shares``."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    x, y = _digits()
    rng = np.random.RandomState(seed)
    val_idx: list[int] = []
    train_list: list[int] = []
    for c in range(10):
        idx = rng.permutation(np.flatnonzero(y == c))
        k = int(round(len(idx) * val_fraction))
        val_idx += list(idx[:k])
        train_list += list(idx[k:])
    _save(folder / "val.npz", x[val_idx], y[val_idx])
    train_idx = np.array(train_list)
    if dirichlet is not None:
        parts = [train_idx[p].tolist() for p in dirichlet_parts(y[train_idx], *dirichlet, rng)]
    else:
        owners: dict[int, list[int]] = {c: [d for d, s in enumerate(shares) if c in s] for c in range(10)}
        parts = [[] for _ in shares]
        for c in range(10):  # a digit seen by several devices is dealt out between them
            idx = rng.permutation(train_idx[y[train_idx] == c])
            for j, i in enumerate(idx):
                if owners[c]:
                    parts[owners[c][j % len(owners[c])]].append(int(i))
    paths = []
    for d, part in enumerate(parts):
        part = rng.permutation(np.array(part))[:per_device]
        _save(folder / f"device-{d}.npz", x[part], y[part])
        paths.append(str(folder / f"device-{d}.npz"))
    union = np.concatenate([rng.permutation(np.array(p))[:per_device] for p in parts])
    _save(folder / "union.npz", x[union], y[union])
    return {"val": str(folder / "val.npz"), "devices": paths, "union": str(folder / "union.npz")}


def main(argv=None) -> int:
    """``python -m edgetrain.fleet.demo FOLDER``: a whole fleet on this machine (coordinator + devices as
    separate processes on loopback), for trying it out before the devices are real."""
    import argparse
    import os
    import signal
    import subprocess
    import sys
    import time

    ap = argparse.ArgumentParser(prog="python -m edgetrain.fleet.demo", description=main.__doc__)
    ap.add_argument("folder", help="where the data shares, the run and the devices' folders go")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--codec", default="int8", choices=("fp32", "int8", "2bit", "ternary"))
    ap.add_argument("--train-layers", default="head", help="what the devices train and send: head or last:N")
    ap.add_argument("--device", default="rpi4b-4gb", help="device profile the devices report energy for")
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    folder = Path(a.folder).resolve()
    paths = split_digits(folder / "data")
    port = free_port()
    edgetrain = [sys.executable, "-m", "edgetrain"]
    started = []

    def start(*args):
        p = subprocess.Popen([*edgetrain, *map(str, args)], start_new_session=True)
        started.append(p)
        return p

    serve = start("fleet", "serve", "edgetrain.nets:pretrained_digits", "--val", paths["val"], "-o", folder / "run",
                  "--rounds", a.rounds, "--min-clients", len(paths["devices"]), "--codec", a.codec, "--port", port,
                  "--threads", a.threads, "--train-layers", a.train_layers)
    time.sleep(2)
    for i, data in enumerate(paths["devices"]):
        start("fleet", "join", f"127.0.0.1:{port}", "--data", data, "-o", folder / f"device-{i}", "--name",
              f"device-{i}", "--device", a.device, "--threads", a.threads)
    try:
        code = serve.wait()
        for p in started[1:]:
            p.wait(timeout=120)
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        code = 130
    finally:
        for p in started:  # each stops its own Flower processes on SIGTERM
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in started:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
    print(f"report: {folder / 'run' / 'fleet-report.html'}")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
