"""BatchNorm in training mode (engine_onnx.BATCH_STATS: all, last:N, lite): a training step normalises by its
batch's own statistics and differentiates through them, the running statistics are re-estimated from the weights
at each epoch's end and are what model.onnx holds, so a shift in the input distribution (which makes the file's
statistics wrong) is followed; the reported top-1 is the written model's. The other modes keep the file's
statistics as constants."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import onnx_heads as H
from clitools import run_edgetrain
from edgetrain.data import load_data
from edgetrain.models import load_onnx
from edgetrain.training.engine_onnx import settle_rows
from edgetrain.training.onnx_grad import GradGraph, softmax_cross_entropy
from edgetrain.training.ort_train import OrtTrain

sys.path.insert(0, str(Path(__file__).parent))


@pytest.fixture(scope="module")
def shifted(tmp_path_factory):
    """The digits 0-4 at a third of the contrast on a grey ground (the file's statistics are not the data's):
    train.npz (200) and val.npz (the rest); and the model: conv -> BN -> Relu -> conv -> BN -> Relu -> pool -> Gemm
    (onnx_heads, with the digits base's metadata)."""
    folder = tmp_path_factory.mktemp("bn")
    from edgetrain.preprocess import Preprocess

    ds = load_data("builtin:digits", Preprocess(input_shape=(1, 8, 8), mean=(0.0,), std=(1.0,)))
    x, y = ds.arrays()
    keep = y < 5
    x, y = 0.4 + 0.3 * x[keep, 0], y[keep]
    order = np.random.RandomState(0).permutation(len(y))[:300]
    np.savez(folder / "train.npz", data=x[order[:200]].astype(np.float32), label=y[order[:200]])
    np.savez(folder / "val.npz", data=x[order[200:]].astype(np.float32), label=y[order[200:]])
    model = folder / "bn.onnx"
    onnx.save(H.classifier("gemm", classes=5).proto, str(model))
    return folder, model


def _bn_inputs(model: Path, x: np.ndarray) -> dict:
    """Per BatchNorm (its mean's name): the per-channel mean and variance of its input over ``x``, run by ONNX
    Runtime on ``model`` (its own weights)."""
    proto = onnx.load(str(model))
    bns = [n for n in proto.graph.node if n.op_type == "BatchNormalization"]
    for n in bns:
        proto.graph.output.append(helper.make_empty_tensor_value_info(n.input[0]))
    s = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    got = s.run([n.input[0] for n in bns], {s.get_inputs()[0].name: x})
    return {n.input[3]: (v.mean(axis=(0, 2, 3)), v.var(axis=(0, 2, 3))) for n, v in zip(bns, got)}


def _stats(model: Path) -> dict:
    return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(model)).graph.initializer
            if t.name.endswith(("_mean", "_var"))}


def _recheck(model: Path, val: Path) -> float:
    x, y = load_data(str(val), load_onnx(model).preprocess).arrays()
    s = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    return float(np.mean(s.run(None, {s.get_inputs()[0].name: x})[0].argmax(axis=1) == y))


@pytest.mark.parametrize("layers", ["all", "lite", "last:2"])
def test_the_written_statistics_follow_the_data_and_the_reported_top1_is_the_written_models(shifted, tmp_path,
                                                                                              layers):
    folder, model = shifted
    out = tmp_path / "run"
    res = run_edgetrain("finetune", model, "--data", folder / "train.npz", "--val", folder / "val.npz", "-o", out,
                        "--train-layers", layers, "--epochs", "3", "--batch-size", "16", "--seed", "0",
                        "--threads", "1", "--allow-chance", "--json", "-")
    assert res.code == 0, res.err
    doc = json.loads(res.out)
    written = out / "model.onnx"
    assert _recheck(written, folder / "val.npz") == doc["final_accuracy"]
    x, _ = load_data(str(folder / "train.npz"), load_onnx(written).preprocess).arrays()
    data = _bn_inputs(written, x)   # what the data makes of each BatchNorm's input, with the trained weights
    before, after = _stats(model), _stats(written)
    trained = list(data)[-1:] if layers == "last:2" else list(data)   # last:2 holds the second BatchNorm only
    for mean in data:
        var = mean[:-len("_mean")] + "_var"
        if mean not in trained:   # frozen: the file's statistics, as they were
            assert np.array_equal(after[mean], before[mean]) and np.array_equal(after[var], before[var])
            continue
        data_mean, data_var = data[mean]
        # the file's statistics were far from the data's; the written ones are near (the weights moved meanwhile)
        assert np.abs(after[mean] - data_mean).mean() < 0.25 * np.abs(before[mean] - data_mean).mean(), mean
        assert np.abs(after[var] - data_var).mean() < 0.25 * np.abs(before[var] - data_var).mean(), var


@pytest.mark.parametrize("layers", ["all", "lite", "last:2"])
def test_the_written_statistics_are_the_final_weights_own_not_a_lagging_average(shifted, tmp_path, layers):
    """At an epoch's end the running statistics are re-estimated from the weights as they are (a forward over the
    training rows, BatchNorm on the batch's statistics, pooled), not left as the step-by-step average, which lags
    the weights. With the whole training set in one micro-batch the pass is the data's exact statistics under the
    written model in inference mode over the rows it read: every trained BatchNorm's input mean and (unbiased)
    variance."""
    folder, model = shifted
    out = tmp_path / "run"
    res = run_edgetrain("finetune", model, "--data", folder / "train.npz", "--val", folder / "val.npz", "-o", out,
                        "--train-layers", layers, "--epochs", "2", "--batch-size", "200", "--lr", "0.05", "--seed", "1",
                        "--threads", "1", "--allow-chance", "--json", "-")
    assert res.code == 0, res.err
    assert json.loads(res.out)["plan"]["micro_batch"] == 200   # one micro-batch: the pass sees its rows at once
    written = out / "model.onnx"
    x, _ = load_data(str(folder / "train.npz"), load_onnx(written).preprocess).arrays()
    x = x[settle_rows(len(x))]   # the rows the pass reads (SETTLE_ROWS of the 200)
    data = _bn_inputs(written, x)
    after = _stats(written)
    trained = list(data)[-1:] if layers == "last:2" else list(data)
    for mean in trained:
        data_mean, data_var = data[mean]
        var = mean[:-len("_mean")] + "_var"
        # the variance to 1e-3: the written one is unbiased (count/(count - 1) above numpy's, count = 128 rows x 64
        # values), and the pass normalised by the batch's; the step-by-step average was off by up to 100% here
        np.testing.assert_allclose(after[mean], data_mean, rtol=1e-4, atol=1e-5, err_msg=mean)
        np.testing.assert_allclose(after[var], data_var, rtol=1e-3, atol=1e-6, err_msg=var)


@pytest.mark.parametrize("layers", ["bias", "head"])
def test_the_other_modes_keep_the_files_statistics(shifted, tmp_path, layers):
    folder, model = shifted
    out = tmp_path / "run"
    res = run_edgetrain("finetune", model, "--data", folder / "train.npz", "--val", folder / "val.npz", "-o", out,
                        "--train-layers", layers, "--epochs", "1", "--batch-size", "16", "--threads", "1",
                        "--allow-chance", "--json", "-")
    assert res.code == 0, res.err
    before, after = _stats(model), _stats(out / "model.onnx")
    assert before.keys() == after.keys() and all(np.array_equal(before[k], after[k]) for k in before)
    assert _recheck(out / "model.onnx", folder / "val.npz") == json.loads(res.out)["final_accuracy"]


def _stack():
    from test_onnx_grad import _bias_free_front_stack

    return _bias_free_front_stack()


def test_batch_statistics_gradients_equal_finite_differences():
    """Training mode's backward (through the batch's mean and variance) against central differences, float64."""
    b, model = _stack()
    graph = GradGraph(model, "bias+head", dtype=np.float64, batch_stats=True)
    graph = GradGraph(model, [n for n in graph.params if n.endswith(("_weight", "_gamma", "_beta", "_bias"))],
                      dtype=np.float64, batch_stats=True)
    assert graph.statistics() and all(n.endswith(("_mean", "_var")) for n in graph.statistics())
    rng = np.random.default_rng(7)
    x = rng.standard_normal(b.shapes["data"])
    out, tape = graph.forward(x)
    weights = rng.standard_normal(out.shape)
    grads = graph.backward(tape, weights)
    checked = 0
    for name in graph.trainable:
        p = graph.params[name]
        for flat in rng.choice(p.size, min(2, p.size), replace=False):
            idx = np.unravel_index(flat, p.shape)
            keep = p[idx]
            p[idx] = keep + 1e-6
            up = (graph.forward(x)[0] * weights).sum()
            p[idx] = keep - 1e-6
            down = (graph.forward(x)[0] * weights).sum()
            p[idx] = keep
            assert grads[name][idx] == pytest.approx((up - down) / 2e-6, rel=1e-5, abs=1e-7), (name, idx)
            checked += 1
    assert checked > 20
    # the batch's statistics normalise: the running ones do not enter a training forward, only evaluation's
    for name in graph.statistics():
        graph.params[name][...] += 1.0
    assert np.array_equal(graph.forward(x)[0], out)
    assert not np.allclose(graph.forward(x, train=False)[0], out)


def test_the_step_graph_equals_numpy_in_training_mode_and_evaluates_on_the_running_statistics():
    b, model = _stack()
    names = [n for n in GradGraph(model, "bias+head").params if n.endswith(("_weight", "_gamma", "_beta", "_bias"))]
    graph = GradGraph(model, names, batch_stats=True)
    x = np.random.default_rng(2).standard_normal(b.shapes["data"]).astype(np.float32)
    labels = np.array([0, 1, 2, 3])
    out, tape = graph.forward(x)
    _, _, dlogits = softmax_cross_entropy(out, labels)
    want = graph.backward(tape, dlogits * np.float32(0.25))
    step = OrtTrain(model, graph).start(1)
    logits, got = step.step(x, labels, 0.25)
    np.testing.assert_allclose(logits, out, rtol=1e-4, atol=1e-5)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-3, atol=1e-5, err_msg=k)
    stats = step.batch_statistics(x)   # the forward alone, BatchNorm on the batch: the step's statistics
    assert stats.keys() == tape.stats.keys() and tape.stats
    for i, (mean, var, n) in tape.stats.items():
        np.testing.assert_allclose(stats[i][0].reshape(-1), mean, rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(stats[i][1].reshape(-1), var, rtol=1e-4, atol=1e-5)
        assert stats[i][2] == n
    np.testing.assert_allclose(step.predict(x), graph.forward(x, train=False)[0], rtol=1e-4, atol=1e-5)
    # two micro-batches' statistics combine into the whole batch's: the first BatchNorm's running statistics (its
    # input does not depend on another's normalisation) are set as one batch's would be
    whole = {k: v.copy() for k, v in graph.params.items() if k in graph.statistics()}
    graph.set_statistics([(4, tape.stats)])
    moved = {k: graph.params[k].copy() for k in whole}
    for k, v in whole.items():
        graph.params[k][...] = v
    halves = [(2, graph.forward(x[:2])[1].stats), (2, graph.forward(x[2:])[1].stats)]
    graph.set_statistics(halves)
    for k in graph.statistics()[:2]:
        np.testing.assert_allclose(graph.params[k], moved[k], rtol=1e-5, atol=1e-6, err_msg=k)
        assert not np.allclose(moved[k], whole[k])
