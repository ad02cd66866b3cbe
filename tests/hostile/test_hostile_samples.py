"""Issue 26: every check that samples data samples every class. A source sorted by class (an image folder,
an .npz written class by class) is the case that broke: the first 16 samples were all class 0 and a correct
model was called "at chance". Generated sources, sorted by class, for every command that samples."""
from __future__ import annotations

import numpy as np
import pytest

from edgetrain.data import load_data, stratified
from edgetrain.preprocess import Preprocess


def _label_sets():
    rng = np.random.RandomState(26)
    yield np.repeat(np.arange(5), 40)                      # sorted, balanced
    yield np.repeat(np.arange(3), [200, 5, 1])             # sorted, one class far larger, one singleton
    yield np.repeat(np.arange(40), 2)                      # many small classes
    yield np.sort(rng.randint(0, 7, 300))                  # sorted, uneven
    yield rng.randint(0, 4, 50)                            # shuffled
    yield np.repeat([9, 3], [10, 10])                      # class ids not 0..K-1
    yield np.zeros(12, dtype=np.int64)                     # one class


@pytest.mark.parametrize("labels", list(_label_sets()))
@pytest.mark.parametrize("n", [0, 1, 2, 3, 5, 8, 16, 39, 40, 81, 1000])
def test_stratified_sample_covers_every_class_in_proportion(labels, n):
    idx = stratified(labels, n, seed=3)
    total, classes = len(labels), np.unique(labels)
    assert len(idx) == min(n, total) and len(np.unique(idx)) == len(idx)
    assert np.array_equal(idx, stratified(labels, n, seed=3))          # deterministic
    got = labels[idx]
    if len(idx) >= len(classes):
        assert set(got) == set(classes)                                  # every class represented
        for c in classes:                                                # in proportion otherwise
            ideal = len(idx) * np.sum(labels == c) / total
            assert abs(np.sum(got == c) - ideal) < 2 + 1e-9, (c, np.sum(got == c), ideal)
    else:
        assert len(np.unique(got)) == len(idx)                          # n < classes: n distinct classes
    k = min(len(idx), len(classes))                                      # any prefix is spread too
    assert len(np.unique(got[:k])) == k


def _sorted_npz(tmp_path, classes=5, per_class=30):
    ds = load_data("builtin:digits", Preprocess(input_shape=(1, 16, 16), mean=(0.0,), std=(1.0,)))
    idx = np.concatenate([np.flatnonzero(ds.labels == c)[:per_class] for c in range(classes)])
    path = tmp_path / "sorted.npz"
    np.savez(path, data=ds.batch(idx)[:, 0], label=ds.labels[idx])
    return path


def _sorted_folder(tmp_path, classes=5, per_class=10):
    from PIL import Image

    ds = load_data("builtin:digits", Preprocess(input_shape=(1, 16, 16), mean=(0.0,), std=(1.0,)))
    root = tmp_path / "images"
    for c in range(classes):
        (root / str(c)).mkdir(parents=True)
        for k, i in enumerate(np.flatnonzero(ds.labels == c)[:per_class]):
            pix = (ds.raw_batch([int(i)])[0, ..., 0] * 255).round().astype(np.uint8)
            Image.fromarray(pix, mode="L").save(root / str(c) / f"{k:03d}.png")
    return root


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["npz", "folder"])
def test_export_checks_a_correct_model_on_every_class_of_sorted_data(cli, tmp_path, kind):
    data = _sorted_npz(tmp_path) if kind == "npz" else _sorted_folder(tmp_path)
    res = cli("export", "edgetrain.nets:pretrained_digits", "-o", tmp_path / "m.onnx", "--data", data,
              "--json", "-", cwd=tmp_path)
    assert res.code == 0, res.err + res.out
    acc = res.json()["accuracy"]
    chance = acc["chance"]
    # 16 samples over 5 classes: guessing is near 100/5, never the 100% of one class alone
    assert chance["baseline"] < 100.0 * 4 / 16 + 1e-9 and not chance["at_chance"]
    assert acc["top1"] > chance["baseline"] + chance["margin"]


def test_calibration_and_ranking_samples_draw_every_class(tmp_path):
    from edgetrain.int8.calibration import load_calibration

    pre = Preprocess(input_shape=(1, 16, 16), mean=(0.0,), std=(1.0,))
    for data in (_sorted_npz(tmp_path), _sorted_folder(tmp_path)):
        for n in (5, 8, 16, 300):
            ds, picked = load_calibration(str(data), pre, n)
            assert len(picked) == min(n, len(ds)) and set(picked.labels) == set(ds.labels)
        x, y = ds.arrays(8)                                  # the checks' fixed-size samples
        assert len(x) == 8 and set(y) == set(ds.labels)
