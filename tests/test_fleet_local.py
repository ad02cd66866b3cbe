"""A device's round runs edgetrain's fine-tuning engine from the *global* weights (no Flower needed):
the output layer that trains is the one the coordinator sent, and one that does not fit is refused."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgetrain.fleet.coordinator import decode_update
from edgetrain.fleet.strategy import average
from edgetrain.fleet.codec import encode_update
from edgetrain.fleet.local import Evaluator, LocalSpec, ShapeMismatch, check_shapes, train_round

MODEL = "edgetrain.nets:pretrained_digits"


@pytest.fixture(scope="module")
def shares(tmp_path_factory):
    from edgetrain.fleet.demo import split_digits

    return split_digits(tmp_path_factory.mktemp("fleet-data"), per_device=120)


@pytest.fixture(scope="module")
def evaluator(shares, tmp_path_factory, monkeypatch_module):
    return Evaluator(LocalSpec(model=MODEL, data=shares["val"], workdir=str(tmp_path_factory.mktemp("ev")),
                               threads=1), shares["val"])


@pytest.fixture(scope="module")
def monkeypatch_module(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("EDGETRAIN_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))  # a private export cache
    yield mp
    mp.undo()


def _spec(shares, tmp_path, **kw):
    return LocalSpec(model=MODEL, data=shares["devices"][0], workdir=str(tmp_path), threads=1, **kw)


def test_the_round_starts_from_the_global_weights(shares, evaluator, tmp_path):
    """With a learning rate too small to move anything, a round returns what it was given, for any
    given weights; with a real one it returns the given weights plus a small step, not the base's head."""
    rng = np.random.RandomState(3)
    starts = [evaluator.initial,
              {k: rng.normal(size=v.shape).astype(np.float32) for k, v in evaluator.initial.items()},
              {k: np.full(v.shape, 0.25, np.float32) for k, v in evaluator.initial.items()}]
    for i, start in enumerate(starts):
        still, res = train_round(_spec(shares, tmp_path, lr=1e-12, epochs=1), start, i)
        assert res.epochs and res.epochs[-1]["samples"] > 0  # it did train (on the device's data)
        for k in start:
            np.testing.assert_allclose(still[k], start[k], atol=1e-6)
    moved, _ = train_round(_spec(shares, tmp_path, lr=0.05, epochs=1), starts[1], 9)
    for k in starts[1]:
        step = np.abs(moved[k] - starts[1][k]).max()
        assert 0 < step < 1.0, (k, step)
        assert not np.allclose(moved[k], starts[0][k], atol=0.1)


def test_the_global_weights_decide_the_devices_accuracy(shares, evaluator, tmp_path):
    """Train once on the union to get good weights; a device's round from them keeps the held-out accuracy,
    a round from the untrained head does not reach it: the device used what it was sent."""
    good, _ = train_round(LocalSpec(model=MODEL, data=shares["union"], workdir=str(tmp_path), threads=1, epochs=8),
                          evaluator.initial, 1)
    assert evaluator.top1(good) > evaluator.top1(evaluator.initial) + 0.3
    from_good, _ = train_round(_spec(shares, tmp_path, lr=1e-4, epochs=1), good, 2)
    from_initial, _ = train_round(_spec(shares, tmp_path, lr=1e-4, epochs=1), evaluator.initial, 3)
    assert evaluator.top1(from_good) > evaluator.top1(from_initial) + 0.3


@pytest.mark.parametrize("change", ["rows", "columns", "missing", "extra", "renamed"])
def test_weights_that_do_not_fit_are_refused_by_the_device(shares, evaluator, tmp_path, change):
    bad = {k: v.copy() for k, v in evaluator.initial.items()}
    w = next(k for k in bad if k.endswith("weight"))
    if change == "rows":
        bad[w] = np.zeros((5, bad[w].shape[1]), np.float32)
    elif change == "columns":
        bad[w] = np.zeros((bad[w].shape[0], 7), np.float32)
    elif change == "missing":
        del bad[w]
    elif change == "extra":
        bad["other_weight"] = np.zeros(3, np.float32)
    else:
        bad["x_" + w] = bad.pop(w)
    with pytest.raises(ShapeMismatch, match="model mismatch") as exc:
        train_round(_spec(shares, tmp_path), bad, 1)
    assert exc.value.exit_code == 2
    assert not any(tmp_path.glob("round-*"))  # nothing left behind


def test_a_device_whose_classes_differ_refuses_the_fleets_weights(evaluator, tmp_path):
    """Five class names on the device, ten in the fleet: the output layers differ, refused in words."""
    from edgetrain.fleet.demo import _digits

    x, y = _digits()
    keep = y < 5
    path = tmp_path / "five.npz"
    np.savez(path, data=(x[keep][:100] * 255).round().astype(np.uint8), label=y[keep][:100],
             class_names=np.array([str(d) for d in range(5)]))
    with pytest.raises(ShapeMismatch) as exc:
        train_round(LocalSpec(model=MODEL, data=str(path), workdir=str(tmp_path), threads=1), evaluator.initial, 1)
    import re

    assert re.search(r"model mismatch: 'digits_dense0_\w+' is 10(x32)? there but 5(x32)? here", exc.value.line())


def _five(tmp_path, names):
    from edgetrain.fleet.demo import _digits

    x, y = _digits()
    keep = np.flatnonzero(y >= 5)[:100]
    path = tmp_path / "subset.npz"
    np.savez(path, data=(x[keep] * 255).round().astype(np.uint8), label=y[keep] - 5, class_names=np.array(names))
    return path, y[keep]


def test_a_device_with_some_of_the_fleets_classes_trains_on_them_by_name(evaluator, tmp_path):
    """Digits 5-9 only, labelled 0-4 with their names: seen through the fleet's class list they are labels 5-9
    of ten classes, so the device trains the fleet's output layer (and the images are copied, not decoded)."""
    from edgetrain.data import load_data
    from edgetrain.fleet.local import class_view

    path, truth = _five(tmp_path, [str(d) for d in range(5, 10)])
    view = class_view(str(path), evaluator.classes, tmp_path / "work")
    assert view != str(path)
    with np.load(view) as z, np.load(path) as raw:
        assert list(z["class_names"]) == evaluator.classes == [str(d) for d in range(10)]
        assert np.array_equal(z["label"], truth) and np.array_equal(z["data"], raw["data"])
    assert class_view(str(path), evaluator.classes, tmp_path / "work") == view  # made once
    ds = load_data(view, evaluator.job.pre)
    assert ds.class_names == evaluator.classes
    new, _ = train_round(LocalSpec(model=MODEL, data=view, workdir=str(tmp_path), threads=1), evaluator.initial, 1)
    assert {k: v.shape for k, v in new.items()} == {k: v.shape for k, v in evaluator.initial.items()}


def test_a_class_the_fleet_does_not_have_is_refused_in_words(evaluator, tmp_path):
    from edgetrain.fleet.local import class_view

    path, _ = _five(tmp_path, ["5", "6", "7", "8", "cat"])
    with pytest.raises(ShapeMismatch, match="class 'cat' is not among the fleet's 10 classes"):
        class_view(str(path), evaluator.classes, tmp_path / "work")
    folder = tmp_path / "images"
    (folder / "7").mkdir(parents=True)
    (folder / "dog").mkdir()
    with pytest.raises(ShapeMismatch, match="class 'dog' is not among the fleet's"):
        class_view(str(folder), evaluator.classes, tmp_path / "work")


def test_an_image_folder_with_some_classes_is_seen_with_all_of_them(tmp_path):
    from edgetrain.fleet.local import class_view

    folder = tmp_path / "images"
    for c in ("cat", "owl"):
        (folder / c).mkdir(parents=True)
        (folder / c / "a.png").write_bytes(b"")
    view = Path(class_view(str(folder), ["cat", "dog", "owl"], tmp_path / "work"))
    assert sorted(p.name for p in view.iterdir()) == ["cat", "dog", "owl"]
    assert (view / "cat").resolve() == (folder / "cat").resolve() and not list((view / "dog").iterdir())
    assert class_view(str(folder), ["cat", "owl"], tmp_path / "work") == str(folder)  # already the fleet's


@pytest.mark.parametrize("codec", ["fp32", "int8", "2bit"])
def test_the_coordinator_refuses_an_update_that_does_not_fit(evaluator, codec):
    good = {k: np.zeros_like(v) for k, v in evaluator.initial.items()}
    enc, _ = encode_update(good, codec)
    decoded = decode_update(enc, evaluator.initial, "device-x")
    assert all(decoded[k].shape == v.shape for k, v in evaluator.initial.items())
    w = next(k for k in good if k.endswith("weight"))
    bad, _ = encode_update({**good, w: np.zeros((5, 32), np.float32)}, codec)
    with pytest.raises(ShapeMismatch, match="device-x") as exc:
        decode_update(bad, evaluator.initial, "device-x")
    assert "is 5x32 there but 10x32 here" in exc.value.line()


def test_average_is_weighted_by_samples():
    a, b = {"w": np.zeros(3, np.float32)}, {"w": np.ones(3, np.float32)}
    np.testing.assert_allclose(average([(a, 1), (b, 3)])["w"], 0.75)


def test_check_shapes_accepts_exactly_the_same_arrays():
    check_shapes({"a": np.zeros((2, 3))}, {"a": (2, 3)}, "here", "fix")
    with pytest.raises(ShapeMismatch):
        check_shapes({"a": np.zeros((2, 3))}, {"a": (3, 2)}, "here", "fix")


@pytest.mark.skipif(__import__("importlib.util").util.find_spec("flwr") is not None, reason="Flower is installed here")
def test_without_flower_the_fleet_commands_say_what_to_install(tmp_path):
    from clitools import assert_user_error, run_edgetrain

    for argv in (["serve", MODEL, "--val", "builtin:digits", "-o", tmp_path / "r"],
                 ["join", "127.0.0.1:9092", "--data", "builtin:digits", "-o", tmp_path / "s"]):
        assert_user_error(run_edgetrain("fleet", *argv), 2, "Flower (flwr) is not installed", "edgetrain[fleet]")
    assert not (tmp_path / "r").exists() and not (tmp_path / "s").exists()


# --- --train-layers last:2: the tail trains (in NumPy), every array of the tail travels ---------------------

TAIL = {"digits_conv2_weight": (32, 32, 3, 3), "digits_batchnorm2_gamma": (32,), "digits_batchnorm2_beta": (32,),
        "digits_batchnorm2_running_mean": (32,), "digits_batchnorm2_running_var": (32,),
        "digits_dense0_weight": (10, 32), "digits_dense0_bias": (10,)}
STATS = {"digits_batchnorm2_running_mean", "digits_batchnorm2_running_var"}


@pytest.fixture(scope="module")
def tail_evaluator(shares, tmp_path_factory, monkeypatch_module):
    return Evaluator(LocalSpec(model=MODEL, data=shares["val"], workdir=str(tmp_path_factory.mktemp("ev2")), threads=1,
                               train_layers="last:2"), shares["val"])


def _tail(shares, tmp_path, data=None, **kw):
    return LocalSpec(model=MODEL, data=data or shares["devices"][0], workdir=str(tmp_path), threads=1,
                     train_layers="last:2", **kw)


def test_last2_the_arrays_that_travel_are_the_tails(tail_evaluator):
    """The last conv layer, its BatchNorm (gamma, beta and running statistics) and the output layer: by
    name and shape, nothing of the frozen part; the running statistics are named as such."""
    assert {k: v.shape for k, v in tail_evaluator.initial.items()} == TAIL
    assert tail_evaluator.statistics == STATS


def test_last2_the_round_starts_from_the_global_arrays(shares, tail_evaluator, tmp_path):
    """A learning rate too small to move anything returns the given trainable arrays, for any given arrays
    (the running statistics move with the device's data, as BatchNorm does in training)."""
    rng = np.random.RandomState(5)
    start = {k: (np.abs(rng.normal(size=v.shape)) + 0.5 if k in STATS else rng.normal(size=v.shape)).astype(np.float32)
             for k, v in tail_evaluator.initial.items()}
    still, res = train_round(_tail(shares, tmp_path, lr=1e-12), start, 1)
    assert set(still) == set(TAIL) and res.fleet_statistics == STATS
    for k in start:
        if k not in STATS:
            np.testing.assert_allclose(still[k], start[k], atol=1e-6)
    assert not np.allclose(still["digits_batchnorm2_running_mean"], start["digits_batchnorm2_running_mean"])


def test_last2_the_global_arrays_decide_the_devices_accuracy(shares, tail_evaluator, tmp_path):
    good, _ = train_round(_tail(shares, tmp_path, data=shares["union"], epochs=6), tail_evaluator.initial, 1)
    assert tail_evaluator.top1(good) > tail_evaluator.top1(tail_evaluator.initial) + 0.3
    from_good, _ = train_round(_tail(shares, tmp_path, lr=1e-4), good, 2)
    from_initial, _ = train_round(_tail(shares, tmp_path, lr=1e-4), tail_evaluator.initial, 3)
    assert tail_evaluator.top1(from_good) > tail_evaluator.top1(from_initial) + 0.3


def test_last2_the_drift_correction_reaches_the_gradients(shares, tail_evaluator, tmp_path):
    """SCAFFOLD's correction c is added to every trainable array's gradient: the weights end up
    fleet_scale * c further along -c than without it (to first order: a small step, a small c)."""
    c = {k: np.full(v.shape, 1e-2, np.float32) for k, v in tail_evaluator.initial.items() if k not in STATS}
    plain, res = train_round(_tail(shares, tmp_path, lr=1e-3), tail_evaluator.initial, 1)
    corrected, res_c = train_round(_tail(shares, tmp_path, lr=1e-3), tail_evaluator.initial, 2, c)
    assert res.fleet_scale == res_c.fleet_scale > 0
    for k in c:  # the rest of the difference: the corrected weights' own gradients differ a little
        ratio = (corrected[k] - plain[k]) / (-res.fleet_scale * c[k])
        assert abs(ratio.mean() - 1) < 0.02 and 0.8 < ratio.min() and ratio.max() < 1.2, (k, ratio.min(), ratio.max())


def test_last2_a_device_refuses_arrays_that_are_not_its_tails(shares, evaluator, tail_evaluator, tmp_path):
    """A head-only fleet's arrays sent to a last:2 device (and a tail with a wrong shape) are refused."""
    with pytest.raises(ShapeMismatch, match="not in this model|missing") as exc:
        train_round(_tail(shares, tmp_path), evaluator.initial, 1)
    assert "digits_conv2_weight" in exc.value.line() and exc.value.exit_code == 2
    bad = {**tail_evaluator.initial, "digits_conv2_weight": np.zeros((16, 32, 3, 3), np.float32)}
    with pytest.raises(ShapeMismatch, match="'digits_conv2_weight' is 16x32x3x3 there but 32x32x3x3 here"):
        train_round(_tail(shares, tmp_path), bad, 2)
    assert not any(tmp_path.glob("round-*"))


def test_last2_the_coordinator_averages_every_array_and_refuses_a_misfit(tail_evaluator):
    """Every array of the tail is averaged weighted by samples (running statistics too); an update
    without the tail's arrays is refused."""
    a = {k: np.zeros(v.shape, np.float32) for k, v in tail_evaluator.initial.items()}
    b = {k: np.ones(v.shape, np.float32) for k, v in tail_evaluator.initial.items()}
    avg = average([(a, 1), (b, 3)])
    assert set(avg) == set(TAIL) and all(np.allclose(v, 0.75) for v in avg.values())
    enc, _ = encode_update(a, "int8", exact=STATS)
    decode_update(enc, tail_evaluator.initial, "device-x")
    head_only, _ = encode_update({"digits_dense0_weight": a["digits_dense0_weight"]}, "int8")
    with pytest.raises(ShapeMismatch, match="device-x"):
        decode_update(head_only, tail_evaluator.initial, "device-x")


def test_all_every_array_of_the_model_travels(shares, tmp_path, monkeypatch_module):
    """--train-layers all: the whole model is the trainable part (three BatchNorms' statistics among it)."""
    ev = Evaluator(LocalSpec(model=MODEL, data=shares["val"], workdir=str(tmp_path / "ev"), threads=1,
                             train_layers="all"), shares["val"])
    assert set(TAIL) < set(ev.initial) and "digits_conv0_weight" in ev.initial and len(ev.initial) == 17
    assert ev.statistics == {f"digits_batchnorm{i}_running_{s}" for i in range(3) for s in ("mean", "var")}
    still, res = train_round(LocalSpec(model=MODEL, data=shares["devices"][0], workdir=str(tmp_path), threads=1,
                                       train_layers="all", lr=1e-12), ev.initial, 1)
    assert set(still) == set(ev.initial) and res.fleet_statistics == ev.statistics
    np.testing.assert_allclose(still["digits_conv0_weight"], ev.initial["digits_conv0_weight"], atol=1e-6)


# --- which engine trains a round: NumPy (no mxnet in the process), else MXNet, with the same arrays ---------

ROUND_CHILD = """
import json, sys
import numpy as np
from edgetrain.fleet.local import LocalSpec, train_round
start = dict(np.load(sys.argv[3]))
out, res = train_round(LocalSpec(model=sys.argv[1], data=sys.argv[2], workdir=sys.argv[4], threads=1,
                                 train_layers=sys.argv[5]), start, 1)
print(json.dumps({"mxnet_imported": "mxnet" in sys.modules, "arrays": sorted(out), "notes": res.notes}))
"""


@pytest.mark.parametrize("layers", ["head", "last:2"])
def test_a_round_trains_in_numpy_with_no_mxnet_in_the_process(layers, shares, evaluator, tail_evaluator, tmp_path):
    """A device's round of head or last:N runs the NumPy engine: once the export is cached (the evaluator
    made it), mxnet is never imported, and the arrays that travel are the same as the coordinator's."""
    import json
    import subprocess
    import sys

    ev = evaluator if layers == "head" else tail_evaluator
    np.savez(tmp_path / "start.npz", **ev.initial)
    out = subprocess.run([sys.executable, "-c", ROUND_CHILD, MODEL, shares["devices"][0], str(tmp_path / "start.npz"),
                          str(tmp_path / "dev"), layers], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    assert doc["mxnet_imported"] is False, doc["notes"]
    assert doc["arrays"] == sorted(ev.initial)
    assert not any((tmp_path / "dev").glob("round-*"))  # nothing of the round is left behind


def test_a_layernorm_tail_trains_from_the_same_arrays(shares, tmp_path, layernorm_prefix, monkeypatch_module):
    """last:2 through a LayerNorm (before the output layer; with head it stays frozen): the coordinator's
    check and the device's round start from (and return) the global arrays by name."""
    layers = "last:2"
    ev = Evaluator(LocalSpec(model=str(layernorm_prefix), data=shares["val"], workdir=str(tmp_path / "ev"),
                             threads=1, train_layers=layers), shares["val"])
    rng = np.random.RandomState(2)
    start = {k: (np.abs(rng.normal(size=v.shape)) + 0.5 if k in ev.statistics else rng.normal(size=v.shape))
             .astype(np.float32) for k, v in ev.initial.items()}
    still, res = train_round(LocalSpec(model=str(layernorm_prefix), data=shares["devices"][0],
                                       workdir=str(tmp_path / "dev"), threads=1, train_layers=layers, lr=1e-12),
                             start, 1)
    assert set(still) == set(start) and res.fleet_statistics == ev.statistics
    for k in start:
        if k not in ev.statistics:
            np.testing.assert_allclose(still[k], start[k], atol=1e-6)


def test_a_fraction_of_the_fleet_is_a_seeded_sample_that_reaches_every_device():
    """--fraction 0.3 of 10 devices: 3 asked a round, not the same 3 every round (the first k by name were, and
    the others never trained); the same seed and round give the same sample (a resumed round asks the same)."""
    from edgetrain.fleet.coordinator import sample

    present = [f"device-{k:02d}" for k in range(10)]
    rounds = [sample(present, 3, seed=0, round_no=r) for r in range(1, 11)]
    assert all(len(x) == 3 == len(set(x)) and set(x) <= set(present) for x in rounds)
    assert set().union(*rounds) == set(present), rounds
    assert sample(present, 3, 0, 4) == rounds[3] and sample(present, 3, 1, 4) != rounds[3]
    assert sample(present, 10, 0, 1) == present and sample(present, 12, 0, 1) == present


def test_a_dirichlet_split_deals_every_sample_once_and_skews_the_classes(tmp_path):
    """tools/bench_fleet_dirichlet.py's split: alpha 0.1 over 10 devices gives each device few classes, alpha
    100 nearly all ten; every training sample is on exactly one device, each device holds at least 10."""
    from edgetrain.fleet.demo import dirichlet_parts

    labels = np.repeat(np.arange(10), 100)
    for alpha, most in ((0.1, 5.0), (100.0, 10.0)):
        parts = dirichlet_parts(labels, 10, alpha, np.random.RandomState(0))
        flat = sorted(i for p in parts for i in p)
        assert flat == list(range(1000)) and min(map(len, parts)) >= 10
        classes = [len(set(labels[p])) for p in parts]
        assert np.mean(classes) <= most, (alpha, classes)
    assert np.mean([len(set(labels[p])) for p in dirichlet_parts(labels, 10, 100.0, np.random.RandomState(0))]) == 10
    with pytest.raises(ValueError, match="no Dirichlet"):
        dirichlet_parts(labels, 10, 0.1, np.random.RandomState(0), least=101)
