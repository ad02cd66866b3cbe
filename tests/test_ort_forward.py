"""The GradGraph forward run by ONNX Runtime (edgetrain.training.ort_forward): the tape it builds equals the one
NumPy's forward keeps, so the NumPy backward gives the same gradients (float32), for every op onnx_grad covers,
the lite modules, and the shipped digits CNN; the trained weights are fed at each run."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import edgetrain
from edgetrain.training import lite
from edgetrain.training.onnx_grad import BitMask, GradGraph, NotEmitted, softmax_cross_entropy
from edgetrain.training.ort_forward import OrtForward
from edgetrain.training.ort_train import OrtTrain
from test_onnx_grad import CASES, SHAPE, _case, _data, _differentiable_initializers, _lit, _lite_stack

SHIPPED = Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx"  # the digits base as exported


def _same_tapes(ours, ref):
    assert sorted(ours.saved) == sorted(ref.saved)
    for index, want in ref.saved.items():
        got = ours.saved[index]
        assert set(got) == set(want), index
        for key, value in want.items():
            if isinstance(value, BitMask):
                assert got[key].shape == value.shape
                assert np.array_equal(got[key].bits, value.bits), (index, key)
            elif isinstance(value, np.ndarray):
                np.testing.assert_allclose(got[key], value, rtol=1e-4, atol=1e-5, err_msg=f"{index} {key}")
            else:
                assert tuple(np.asarray(got[key], dtype=object).tolist()) == \
                    tuple(np.asarray(value, dtype=object).tolist()), (index, key)


def _same_gradients(have: dict, want: dict, rtol: float, atol: float, floor: float) -> None:
    """Each gradient equal to the reference's, the absolute tolerance scaled by its largest value (at least
    ``floor``)."""
    for name in want:
        assert have[name].shape == want[name].shape, name
        top = max(floor, float(np.abs(want[name]).max()))
        np.testing.assert_allclose(have[name], want[name], rtol=rtol, atol=atol * top, err_msg=name)


def _check(model, trainable, x, extra=(), seed=4):
    """ONNX Runtime's forward, then the backward with its ConvTranspose, against NumPy's forward and backward
    (another GradGraph of the same file: the reference has no ONNX Runtime in it)."""
    ref = GradGraph(model, trainable, extra=extra)
    graph = GradGraph(model, trainable, extra=extra)
    fwd = OrtForward(model, graph, threads=1)
    convs = [op for _, op in graph.nodes if op.op == "Conv" and op.need[0]]
    assert all(op.transposed is not None for op in convs)
    assert all(getattr(op, "transposed", None) is None for _, op in ref.nodes)
    out, tape = ref.forward(x)
    got, ours = fwd.forward(x)
    np.testing.assert_allclose(got, out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(fwd.predict(x), out, rtol=1e-4, atol=1e-5)
    _same_tapes(ours, tape)
    dout = np.random.default_rng(seed).standard_normal(out.shape).astype(np.float32)
    want, have = ref.backward(tape, dout), graph.backward(ours, dout)
    assert set(have) == set(want) == set(graph.trainable)
    _same_gradients(have, want, rtol=1e-4, atol=1e-5, floor=1.0)
    return graph, fwd


def _case_model(name: str, mode: str):
    """CASES[name]'s model and what trains in ``mode`` (explicit: every differentiable initializer)."""
    b, out = _case(CASES[name])()
    model = b.model(out)
    return model, _differentiable_initializers(model) if mode == "explicit" else mode


@pytest.mark.parametrize("mode", ["bias", "bias+head", "explicit"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_tape_and_gradients_equal_numpy_forward(name, mode):
    model, trainable = _case_model(name, mode)
    _check(model, trainable, _data(shape=SHAPE))


def test_lite_modules_tape_and_gradients_equal_numpy_forward():
    model, names, _ = _lit(_lite_stack(shape=(3, 3, 9, 9)))
    _check(model, "bias+head", _data(shape=(3, 3, 9, 9)), extra=names)


def _lite_graphs():
    """A lite stack's model (its modules' weights not at zero), the graph a runtime feeds, a NumPy reference
    graph, and a batch of two."""
    model, names, _ = _lit(_lite_stack(), live=False)
    return (model, GradGraph(model, "bias+head", extra=names), GradGraph(model, "bias+head", extra=names),
            _data(shape=(2, 3, 9, 9)))


def _move_trained(graph, ref) -> None:
    """Move every trained weight of ``graph`` in place (as an optimizer does), and give ``ref`` the same."""
    rng = np.random.default_rng(1)
    for name in graph.trainable:
        graph.params[name][...] += 0.2 * rng.standard_normal(graph.params[name].shape).astype(np.float32)
        ref.params[name][...] = graph.params[name]


def test_trained_weights_are_fed_at_each_run():
    model, graph, ref, x = _lite_graphs()
    fwd = OrtForward(model, graph, threads=1)
    before = fwd.predict(x)
    _move_trained(graph, ref)
    after = fwd.predict(x)
    assert not np.allclose(before, after)
    np.testing.assert_allclose(after, ref.forward(x)[0], rtol=1e-4, atol=1e-5)
    out, tape = ref.forward(x)   # a trained Conv weight (the lite modules') is fed to its ConvTranspose too
    got, ours = fwd.forward(x)
    dout = np.random.default_rng(2).standard_normal(out.shape).astype(np.float32)
    want, have = ref.backward(tape, dout), graph.backward(ours, dout)
    _same_gradients(have, want, rtol=1e-4, atol=1e-5, floor=1.0)


@pytest.mark.parametrize("batch", [4, 1])
@pytest.mark.parametrize("layers", ["bias", "lite"])
def test_digits_cnn_gradients_equal_numpy_forward(layers, batch):
    """The exported file's batch is dynamic: one session runs every micro-batch size. The file is the shipped
    export of the digits base (held equal to a fresh export by test_device_loop), so this runs where the
    device runs: without mxnet."""
    proto = onnx.load(str(SHIPPED))
    extra = ()
    if layers == "lite":
        proto, extra, _ = lite.insert(proto, 0)
        for t in proto.graph.initializer:   # trained modules: not the zero output they start from
            if t.name in extra:
                value = onnx.numpy_helper.to_array(t)
                t.CopyFrom(onnx.numpy_helper.from_array(
                    value + 0.1 * np.random.default_rng(2).standard_normal(value.shape).astype(np.float32), t.name))
    shape = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim][1:]
    graph, fwd = _check(proto, "bias+head", np.random.default_rng(0).uniform(-1, 1, (4, *shape)).astype(np.float32),
                        extra=extra)
    x = np.random.default_rng(batch).uniform(-1, 1, (batch, *shape)).astype(np.float32)
    out, tape = GradGraph(proto, "bias+head", extra=extra).forward(x)
    got, ours = fwd.forward(x)
    np.testing.assert_allclose(got, out, rtol=1e-4, atol=1e-5)
    _same_tapes(ours, tape)


@pytest.mark.timing
def test_speed_mobilenet_v2_160_batch_8_numpy_against_ort(capsys):
    """One bias/lite step of MobileNetV2-1.0 at 160x160, batch 8: NumPy's forward and backward against ONNX
    Runtime's forward and the backward with ORT's ConvTranspose, and against the whole step as one ONNX Runtime
    graph (ort_train) (figures printed, best of 3)."""
    import time

    from onnx_models import mobilenet_v2

    model = onnx.load_from_string(mobilenet_v2((8, 3, 160, 160)))
    x = _data(shape=(8, 3, 160, 160))
    for mode in ("bias", "lite"):
        proto, extra = (model, ()) if mode == "bias" else lite.insert(model, 0)[:2]
        ref = GradGraph(proto, "bias+head", extra=extra)
        graph = GradGraph(proto, "bias+head", extra=extra)
        fwd = OrtForward(proto, graph, threads=2)
        step = OrtTrain(proto, GradGraph(proto, "bias+head", extra=extra)).start(threads=2)
        labels = np.arange(8) % 10
        times = {k: [] for k in ("numpy forward", "numpy backward", "ort forward", "backward, ort ConvTranspose",
                                 "one ort step")}
        for _ in range(3):
            t0 = time.perf_counter()
            out, tape = ref.forward(x)
            t1 = time.perf_counter()
            ref.backward(tape, np.ones_like(out))
            t2 = time.perf_counter()
            out, tape = fwd.forward(x)
            t3 = time.perf_counter()
            graph.backward(tape, np.ones_like(out))
            t4 = time.perf_counter()
            step.step(x, labels, 1.0)
            t5 = time.perf_counter()
            for k, v in zip(times, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4)):
                times[k].append(v)
        best = {k: min(v) * 1000 for k, v in times.items()}
        with capsys.disabled():
            print(f"\n{mode}: " + ", ".join(f"{k} {v:.0f} ms" for k, v in best.items()) +
                  f"; step {best['numpy forward'] + best['numpy backward']:.0f} -> "
                  f"{best['ort forward'] + best['backward, ort ConvTranspose']:.0f} -> {best['one ort step']:.0f} ms")
        assert all(v > 0 for v in best.values())


# ------------------------------------------------------------------ the whole step in one ONNX Runtime graph
NOT_EMITTED = {"maxpool_3x3_s2_p1", "maxpool_dilated",
               "maxpool_ceil_3x3_s2_p1"}   # windows that share inputs: MaxUnpool cannot add


def _check_train(model, trainable, x, extra=(), seed=4):
    """OrtTrain's step (forward, the loss's gradient and the backward in one ONNX Runtime run) against NumPy's
    forward, softmax cross-entropy and backward on another GradGraph of the same file."""
    ref = GradGraph(model, trainable, extra=extra)
    graph = GradGraph(model, trainable, extra=extra)
    step = OrtTrain(model, graph).start(threads=1)
    out, tape = ref.forward(x)
    labels = np.random.default_rng(seed).integers(0, out.reshape(len(x), -1).shape[1], len(x))
    _, _, dlogits = softmax_cross_entropy(out.reshape(len(x), -1), labels)
    scale = 1.0 / (len(x) + 1)
    want = ref.backward(tape, (dlogits * np.float32(scale)).reshape(out.shape))
    logits, have = step.step(x, labels, scale)
    np.testing.assert_allclose(logits, out, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(step.predict(x), out, rtol=1e-4, atol=1e-5)
    assert set(have) == set(want) == set(graph.trainable)
    _same_gradients(have, want, rtol=1e-3, atol=1e-4, floor=1e-3)
    return graph, step


@pytest.mark.parametrize("mode", ["bias", "bias+head", "explicit"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_one_graph_step_equals_numpy(name, mode):
    model, trainable = _case_model(name, mode)
    if name in NOT_EMITTED:   # refused at build, in one line: the engine trains these with NumPy's backward
        with pytest.raises(NotEmitted, match=r"^cannot differentiate MaxPool node '[^']+': overlapping windows"):
            OrtTrain(model, GradGraph(model, trainable))
        return
    _check_train(model, trainable, _data(shape=SHAPE))


def test_one_graph_step_at_opset_18_equals_numpy():
    """From opset 18 ReduceMean takes its axes as an input: InstanceNorm's backward writes the model's opset's form
    (ort_train's reduce_mean, as training-mode BatchNorm's does); the attribute form is refused there."""
    b, out = _case(CASES["instancenorm"])()
    model = b.model(out, opset=18)
    _check_train(model, _differentiable_initializers(model), _data(shape=SHAPE))


def test_one_graph_step_lite_modules_equal_numpy():
    model, names, _ = _lit(_lite_stack(shape=(3, 3, 9, 9)))
    _check_train(model, "bias+head", _data(shape=(3, 3, 9, 9)), extra=names)


@pytest.mark.parametrize("layers", ["bias", "lite", "all"])
def test_one_graph_step_mobilenet_v2_blocks_equal_numpy(layers):
    """MobileNetV2's blocks (stem, inverted residuals with and without their skip, strides 1 and 2, depthwise,
    ReLU6, the 1280-wide last conv's shape scaled down), at a size that leaves odd rows (17 -> 9 -> 5 -> 3)."""
    from onnx_models import mobilenet_v2

    stages = ((1, 8, 1, 1), (6, 12, 2, 2), (6, 16, 2, 2), (4, 24, 1, 2))
    model = onnx.load_from_string(mobilenet_v2((2, 3, 33, 33), classes=5, stages=stages, last=64))
    extra = ()
    if layers == "lite":
        model, names, _ = _lit(model.SerializeToString())
        model, extra = onnx.load_from_string(model), names
    if layers == "all":   # every weight: a trained depthwise kernel is turned in the graph for its input gradient
        from edgetrain.training.engine_onnx import _weights_of

        _check_train(model, _weights_of(model.graph), _data(shape=(2, 3, 33, 33)))
        return
    _check_train(model, "bias+head", _data(shape=(2, 3, 33, 33)), extra=extra)


def test_one_graph_trained_weights_are_fed_at_each_step():
    model, graph, ref, x = _lite_graphs()
    step = OrtTrain(model, graph).start(threads=1)
    before = step.predict(x)
    _move_trained(graph, ref)
    assert not np.allclose(before, step.predict(x))
    out, tape = ref.forward(x)
    labels = np.array([0, 2])
    want = ref.backward(tape, softmax_cross_entropy(out, labels)[2])
    logits, have = step.step(x, labels, 1.0)
    np.testing.assert_allclose(logits, out, rtol=1e-4, atol=1e-5)
    _same_gradients(have, want, rtol=1e-3, atol=1e-4, floor=1e-3)


@pytest.mark.parametrize("batch", [4, 1])
@pytest.mark.parametrize("layers", ["bias", "lite"])
def test_one_graph_step_digits_cnn_equals_numpy(layers, batch):
    """The shipped digits CNN (2x2 max-pools: MaxUnpool's case), every micro-batch size from one session."""
    proto = onnx.load(str(SHIPPED))
    extra = ()
    if layers == "lite":
        proto, extra, _ = lite.insert(proto, 0)
        for t in proto.graph.initializer:
            if t.name in extra:
                value = onnx.numpy_helper.to_array(t)
                t.CopyFrom(onnx.numpy_helper.from_array(
                    value + 0.1 * np.random.default_rng(2).standard_normal(value.shape).astype(np.float32), t.name))
    shape = [d.dim_value for d in proto.graph.input[0].type.tensor_type.shape.dim][1:]
    _check_train(proto, "bias+head", np.random.default_rng(batch).uniform(-1, 1, (batch, *shape)).astype(np.float32),
                 extra=extra)


def test_a_model_written_a_weight_at_a_time_is_the_model(tmp_path):
    """write_streamed (the fine-tuned file, each weight serialized alone) parses to the model it was given, with
    the arrays given in place of its initializers, also from a copy whose weights were dropped (without_weights)."""
    from edgetrain.training.onnx_layers import without_weights, write_streamed

    proto, names, _ = lite.insert(onnx.load(str(SHIPPED)), 0)
    arrays = {t.name: onnx.numpy_helper.to_array(t) for t in proto.graph.initializer if t.data_type == 1}
    trained = {n: arrays[n] + 1 for n in names}
    want = onnx.ModelProto()
    want.CopyFrom(proto)
    for t in want.graph.initializer:
        if t.name in trained:
            t.CopyFrom(onnx.numpy_helper.from_array(trained[t.name], t.name))
    dropped = [n for n in arrays if n not in trained]
    for source, values in ((proto, trained), (without_weights(proto, dropped), {**arrays, **trained})):
        write_streamed(tmp_path / "m.onnx", source, values, "model")
        got = onnx.load(str(tmp_path / "m.onnx"))
        assert got == want
