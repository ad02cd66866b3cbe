"""--threads caps training: measured from outside as the threads of the training child that did the work."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest



def _thread_cpu(pid: int) -> dict[int, float]:
    tck = os.sysconf("SC_CLK_TCK")
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = (int(fields[11]) + int(fields[12])) / tck
    return out


def _sample(proc, seen: dict[int, float], until) -> None:
    """Each thread's CPU seconds of ``proc`` into ``seen`` (threads that exit are kept), every 10 ms, until
    ``until()`` or the process ends."""
    while proc.poll() is None and not until():
        try:
            seen.update(_thread_cpu(proc.pid))
        except OSError:
            break
        time.sleep(0.01)


def busy_worker_threads(threads: int, data: Path, out: Path, layers: str = "all", epochs: int = 2,
                        share: float = 0.2, model: str = "edgetrain.nets:pretrained_digits") -> list[float]:
    """CPU seconds of each non-main thread of a training child after its first epoch that did more than
    ``share`` of the process's work then (sorted)."""
    env = {k: v for k, v in os.environ.items() if k != "EDGETRAIN_DEBUG"}
    # 64x64 input makes the convolutions big enough for OpenMP to split them when it may (an ONNX file: its own)
    shape = () if str(model).endswith(".onnx") else ("--input-shape", "1,1,64,64")
    proc = subprocess.Popen([sys.executable, "-m", "edgetrain", "finetune", str(model),
                             "--data", str(data), "-o", str(out), "--train-layers", layers, "--epochs", str(epochs),
                             *shape, "--batch-size", "16", "--val-split", "0.1",
                             "--threads", str(threads), "--allow-chance"],  # threads, not accuracy, here
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    try:
        while not (out / "checkpoint.npz").exists():  # epoch 1 done: what follows is training only
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.02)
        before = _thread_cpu(proc.pid)
        seen = dict(before)
        _sample(proc, seen, lambda: False)
    finally:
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    work = {t: seen[t] - before.get(t, 0.0) for t in seen if t != proc.pid}
    total = sum(work.values()) + seen.get(proc.pid, 0) - before.get(proc.pid, 0)
    return sorted((v for v in work.values() if v > share * total), reverse=True)


def test_one_thread_cap_holds_during_training(digits_npz, tmp_path):
    """--train-layers all of a Gluon model (its ONNX export, every weight training): under a cap of 1 no thread
    but the main one works."""
    assert busy_worker_threads(1, digits_npz, tmp_path / "o", share=0.05) == []


def test_two_thread_cap_lets_two_threads_train(digits_npz, tmp_path):
    # the control: without it, a measurement that could only ever see the main thread would pass above
    assert len(busy_worker_threads(2, digits_npz, tmp_path / "o", share=0.05)) == 1


def test_the_thread_cap_holds_when_numpy_trains_the_tail(digits_npz, tmp_path):
    """last:3's trained part in NumPy: the main thread and, under a cap of 2, one OpenBLAS worker do the work
    (numpy's OpenBLAS is loaded before the cap is known: runtime.cap_loaded_blas caps it). The worker shares
    only the GEMMs (measured ~20% of the process's CPU; exactly 0 under a cap of 1), so 5% tells them apart."""
    assert busy_worker_threads(1, digits_npz, tmp_path / "one", "last:3", epochs=5, share=0.05) == []
    assert len(busy_worker_threads(2, digits_npz, tmp_path / "two", "last:3", epochs=5, share=0.05)) == 1


@pytest.mark.parametrize("layers", ["bias", "lite"])
def test_one_thread_cap_holds_in_every_onnx_runtime_session_of_bias_and_lite(layers, digits5_onnx, digits_npz,
                                                                            tmp_path):
    """bias/lite run their forward and each Conv's input gradient in ONNX Runtime sessions: under a cap of 1
    none of them has a worker thread (intra_op_num_threads 1), so no thread but the main one works."""
    assert busy_worker_threads(1, digits_npz, tmp_path / "o", layers, epochs=3, share=0.05,
                               model=str(digits5_onnx)) == []


def _noise_folder(root: Path, per_class: int = 120, size: int = 256) -> Path:
    """PNGs of noise (they compress badly: a real decode's cost), in two classes."""
    import numpy as np
    from PIL import Image

    rng = np.random.RandomState(0)
    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for k in range(per_class):
            Image.fromarray(rng.randint(0, 256, (size, size, 3), dtype=np.uint8)).save(root / cls / f"{k}.png")
    return root


def feature_pass_threads(threads: int, data: Path, out: Path) -> dict[int, float]:
    """CPU seconds of each thread of a head fine-tune from its start to its first checkpoint (the feature
    pass, then one short epoch of a lone output layer), main thread included."""
    env = {k: v for k, v in os.environ.items() if k not in ("EDGETRAIN_DEBUG", "OPENBLAS_NUM_THREADS")}
    proc = subprocess.Popen([sys.executable, "-m", "edgetrain", "finetune", "edgetrain.nets:pretrained_digits",
                             "--data", str(data), "-o", str(out), "--epochs", "2", "--input-shape", "1,1,64,64",
                             "--threads", str(threads), "--allow-chance"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen: dict[int, float] = {}
    try:
        _sample(proc, seen, (out / "checkpoint.npz").exists)
    finally:
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    return seen


def test_the_feature_pass_decodes_on_the_thread_caps_threads_only(tmp_path):
    """Images are decoded on the cap's threads, in turn with ONNX Runtime (whose workers stop spinning after
    each run): under a cap of 1 only the main thread works from start-up on (numpy's OpenBLAS pool, sized
    when numpy loads, is sized by --threads too: uncapped, its workers spun ~0.1 s at start-up); under 2
    others take a share (the control: the measurement sees a second thread when there is one)."""
    data = _noise_folder(tmp_path / "noise")
    one = feature_pass_threads(1, data, tmp_path / "one")
    total = sum(one.values())
    assert total > 0.2, one  # enough work to measure
    assert sorted(v for v in one.values() if v > 0.1 * total) == [max(one.values())], one
    two = feature_pass_threads(2, data, tmp_path / "two")
    total = sum(two.values())
    # the decoding helper (~40% of the decoding) and ONNX Runtime's worker, in turn with the main thread
    assert len([v for v in two.values() if v > 0.1 * total]) >= 2, two
