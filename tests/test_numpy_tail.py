"""edgetrain.training.numpy_tail against real MXNet 1.9.1: per op and on the trained parts of real graphs.

Forward (train and eval), gradients w.r.t. every weight and the input, and the BatchNorm moving statistics
after one training step must match MXNet autograd on the same symbol and weights.
"""
from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

from edgetrain import _lazy
from edgetrain.training import netsplit
from edgetrain.options import parse_train_layers
from edgetrain.training.numpy_tail import Tail, Unsupported

mx = _lazy.mxnet()
gluon = _lazy.from_import("mxnet", "gluon")

TOL = 1e-4
S = mx.sym


def _close(got, want, what, tol=TOL, atol=1e-6):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert got.dtype == np.float32, f"{what}: dtype {got.dtype}"
    scale = float(np.abs(want).max()) if want.size else 0.0
    err = float(np.abs(got.astype(np.float64) - want).max()) if want.size else 0.0
    assert err <= tol * scale + atol, f"{what}: max error {err:.3g} at scale {scale:.3g}"


def _block(sym, input_name, values):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        block = gluon.SymbolBlock(sym, S.var(input_name))
    for p in block.collect_params().values():
        p._load_init(mx.nd.array(values[p.name]), mx.cpu())
    return block


def _mx_run(block, x, train, dout=None):
    """MXNet autograd: (out, {param: grad}, d input, {aux: value after})."""
    xd = mx.nd.array(x)
    xd.attach_grad()
    with mx.autograd.record(train_mode=train):
        out = block(xd)
    grads, dx = {}, None
    if dout is not None:
        out.backward(mx.nd.array(dout))
        grads = {p.name: p.grad().asnumpy() for p in block.collect_params().values() if p.grad_req != "null"}
        dx = xd.grad.asnumpy()
    aux = {p.name: p.data().asnumpy() for p in block.collect_params().values() if p.grad_req == "null"}
    return out.asnumpy(), grads, dx, aux


def _random_weights(tail, rng):
    params = {k: (rng.standard_normal(s) * 0.5).astype(np.float32) for k, s in tail.param_shapes.items()}
    aux = {}
    for k, s in tail.aux_shapes.items():
        if k.endswith("var"):
            aux[k] = rng.uniform(0.5, 2.0, s).astype(np.float32)
        else:
            aux[k] = (rng.standard_normal(s) * 0.3).astype(np.float32)
    return params, aux


def _check_against_mxnet(sym, in_shape, batch=3, seed=0, input_name="data", check_dx=True):
    doc = json.loads(sym.tojson())
    tail = Tail(doc, None, input_name, in_shape)
    arg_shapes, out_shapes, aux_shapes = sym.infer_shape(**{input_name: (batch, *in_shape)})
    names = [n for n in sym.list_arguments() if n != input_name]
    assert tail.param_shapes == {n: tuple(s) for n, s in zip(sym.list_arguments(), arg_shapes) if n != input_name}
    assert tail.aux_shapes == {n: tuple(s) for n, s in zip(sym.list_auxiliary_states(), aux_shapes)}
    assert tail.output_shape == tuple(out_shapes[0][1:])
    rng = np.random.RandomState(seed)
    params, aux = _random_weights(tail, rng)
    assert set(names) == set(params)
    x = rng.standard_normal((batch, *in_shape)).astype(np.float32)
    dout = rng.standard_normal((batch, *tail.output_shape)).astype(np.float32)

    # eval: moving statistics, no tape, aux untouched
    block = _block(sym, input_name, {**params, **aux})
    want, _, _, _ = _mx_run(block, x, train=False)
    mine_aux = {k: v.copy() for k, v in aux.items()}
    got, tape = tail.forward(params, mine_aux, x, train=False)
    _close(got, want, "eval forward")
    for k in aux:
        np.testing.assert_array_equal(mine_aux[k], aux[k])

    # train: batch statistics, gradients, moving statistics updated
    block = _block(sym, input_name, {**params, **aux})
    want, wgrads, wdx, waux = _mx_run(block, x, train=True, dout=dout)
    got, tape = tail.forward(params, mine_aux, x, train=True)
    _close(got, want, "train forward")
    grads, dx = tail.backward_with_input(params, tape, dout)
    assert set(grads) == set(tail.param_shapes)
    for k in tail.param_shapes:
        _close(grads[k], wgrads[k], f"grad {k}")
    if check_dx:
        _close(dx, wdx, "grad input")
    for k in tail.aux_shapes:
        _close(mine_aux[k], waux[k], f"aux {k}")
    plain = tail.backward(params, tape, dout)
    for k in grads:
        np.testing.assert_allclose(plain[k], grads[k], rtol=1e-6, atol=1e-7)
    assert tail.activation_bytes(True) > tail.activation_bytes(False) > 0
    return tail


D = S.var("data")


def conv(x, name, **kw):
    return S.Convolution(x, name=name, **kw)


def _shared(x):
    """x read by a BatchNorm, a clip and an add: none may overwrite it."""
    bn = S.BatchNorm(x, name="b", fix_gamma=False)
    return S.elemwise_add(S.elemwise_add(bn, S.clip(x, a_min=-0.2, a_max=0.3)), S.Activation(bn, act_type="relu"))


OP_CASES = {
    "conv1x1": (lambda: conv(D, "c", kernel=(1, 1), num_filter=6, no_bias=True), (4, 3, 3)),
    "conv1x1_bias": (lambda: conv(D, "c", kernel=(1, 1), num_filter=5), (4, 3, 2)),
    "conv3x3_pad": (lambda: conv(D, "c", kernel=(3, 3), pad=(1, 1), num_filter=4), (3, 5, 5)),
    "conv_stride_dilate": (lambda: conv(D, "c", kernel=(3, 2), stride=(2, 1), dilate=(2, 1), pad=(2, 1),
                                        num_filter=4, no_bias=True), (2, 7, 6)),
    "conv1x1_stride2": (lambda: conv(D, "c", kernel=(1, 1), stride=(2, 2), num_filter=3), (4, 5, 5)),
    "conv_groups": (lambda: conv(D, "c", kernel=(3, 3), pad=(1, 1), num_group=2, num_filter=6), (4, 4, 4)),
    "conv_depthwise": (lambda: conv(D, "c", kernel=(3, 3), stride=(2, 2), pad=(1, 1), num_group=4,
                                    num_filter=4, no_bias=True), (4, 6, 6)),
    "conv_depthwise_x2": (lambda: conv(D, "c", kernel=(3, 3), pad=(1, 1), num_group=3, num_filter=6), (3, 4, 4)),
    "fc": (lambda: S.FullyConnected(D, name="f", num_hidden=5), (2, 3, 3)),
    "fc_no_bias": (lambda: S.FullyConnected(D, name="f", num_hidden=4, no_bias=True), (7,)),
    "fc_no_flatten": (lambda: S.FullyConnected(D, name="f", num_hidden=4, flatten=False), (3, 5)),
    "bn_default_fix_gamma": (lambda: S.BatchNorm(D, name="b"), (3, 4, 4)),
    "bn": (lambda: S.BatchNorm(D, name="b", fix_gamma=False, eps=1e-5, momentum=0.8), (3, 4, 4)),
    "bn_global_stats": (lambda: S.BatchNorm(D, name="b", fix_gamma=False, use_global_stats=True), (3, 2, 2)),
    "bn_2d": (lambda: S.BatchNorm(S.FullyConnected(D, name="f", num_hidden=6), name="b", fix_gamma=False),
              (5,)),
    "relu": (lambda: S.Activation(D, act_type="relu"), (3, 4, 4)),
    "sigmoid": (lambda: S.Activation(D, act_type="sigmoid"), (3, 4)),
    "tanh": (lambda: S.Activation(D, act_type="tanh"), (3, 4)),
    "softrelu": (lambda: S.Activation(D, act_type="softrelu"), (3, 4)),
    "clip": (lambda: S.clip(D, a_min=-0.5, a_max=0.7), (3, 4, 4)),
    "leaky": (lambda: S.LeakyReLU(D, act_type="leaky", slope=0.1), (3, 4)),
    "maxpool": (lambda: S.Pooling(D, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="max"), (2, 7, 7)),
    "maxpool_full": (lambda: S.Pooling(D, kernel=(3, 3), stride=(2, 2), pool_type="max",
                                       pooling_convention="full"), (2, 6, 6)),
    "maxpool_2": (lambda: S.Pooling(D, kernel=(2, 2), stride=(2, 2), pool_type="max"), (2, 4, 6)),
    "avgpool_pad": (lambda: S.Pooling(D, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="avg"), (2, 7, 7)),
    "avgpool_exclude_pad": (lambda: S.Pooling(D, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="avg",
                                              count_include_pad=False), (2, 7, 7)),
    "avgpool_full": (lambda: S.Pooling(D, kernel=(3, 3), stride=(2, 2), pad=(1, 1), pool_type="avg",
                                       pooling_convention="full"), (2, 6, 6)),
    "global_avg": (lambda: S.Pooling(D, kernel=(1, 1), global_pool=True, pool_type="avg"), (3, 5, 4)),
    "global_max": (lambda: S.Pooling(D, kernel=(1, 1), global_pool=True, pool_type="max"), (3, 5, 4)),
    "flatten": (lambda: S.Flatten(D), (3, 2, 2)),
    "reshape": (lambda: S.Reshape(D, shape=(0, -1)), (3, 2, 2)),
    "reshape_split": (lambda: S.Reshape(D, shape=(0, 2, -1)), (4, 3)),
    "elemwise_add": (lambda: S.elemwise_add(S.Activation(D, act_type="relu"),
                                            conv(D, "c", kernel=(1, 1), num_filter=3)), (3, 3, 3)),
    "plus_same_input": (lambda: D + D, (2, 3)),
    "broadcast_add": (lambda: S.broadcast_add(D, S.Pooling(D, kernel=(1, 1), global_pool=True, pool_type="avg")),
                      (3, 4, 4)),
    "concat": (lambda: S.Concat(S.Activation(D, act_type="tanh"), conv(D, "c", kernel=(1, 1), num_filter=2),
                                dim=1), (3, 3, 3)),
    "dropout_p0": (lambda: S.Dropout(D, p=0.0), (3, 4)),
    # steps that overwrite their input must not when another step reads it or its producer keeps it
    "shared_conv_out": (lambda: _shared(conv(D, "c", kernel=(1, 1), num_filter=3)), (2, 3, 3)),
    "sigmoid_then_bn": (lambda: S.BatchNorm(S.Activation(D, act_type="sigmoid"), name="b", fix_gamma=False),
                        (3, 2, 2)),
    "flatten_then_relu": (lambda: S.Activation(S.Flatten(conv(D, "c", kernel=(1, 1), num_filter=2)),
                                               act_type="relu"), (2, 3, 3)),
    "copy": (lambda: S._internal._copy(D), (3, 4)),
    "identity": (lambda: S.identity(D), (3, 4)),
}


@pytest.mark.parametrize("case", sorted(OP_CASES))
def test_op_matches_mxnet(case):
    build, shape = OP_CASES[case]
    _check_against_mxnet(build(), shape)


def test_chain_of_ops_matches_mxnet():
    x = conv(D, "c1", kernel=(3, 3), pad=(1, 1), num_filter=6, no_bias=True)
    x = S.BatchNorm(x, name="b1", fix_gamma=False)
    x = S.clip(x, a_min=0, a_max=6)
    x = conv(x, "dw", kernel=(3, 3), pad=(1, 1), stride=(2, 2), num_group=6, num_filter=6, no_bias=True)
    x = S.BatchNorm(x, name="b2")
    x = S.LeakyReLU(x, act_type="leaky", slope=0.2)
    x = S.Pooling(x, kernel=(1, 1), global_pool=True, pool_type="avg")
    x = S.FullyConnected(S.Flatten(x), name="fc", num_hidden=4)
    _check_against_mxnet(x, (3, 6, 6), batch=4)


def test_dropout_scales_kept_units_and_is_identity_in_eval():
    tail = Tail(json.loads(S.Dropout(D, p=0.25).tojson()), None, "data", (200, 50))
    assert tail.has_dropout
    x = np.ones((4, 200, 50), np.float32)
    out, _ = tail.forward({}, {}, x, train=False)
    np.testing.assert_array_equal(out, x)
    rng = np.random.RandomState(3)
    out, tape = tail.forward({}, {}, x, train=True, rng=rng)
    assert out.dtype == np.float32
    kept = out != 0
    assert abs(kept.mean() - 0.75) < 0.01
    np.testing.assert_allclose(out[kept], 1 / 0.75, rtol=1e-6)
    # the same rng state draws the same mask; the gradient goes through exactly the kept units, scaled
    again, _ = tail.forward({}, {}, x, train=True, rng=np.random.RandomState(3))
    np.testing.assert_array_equal(again, out)
    dout = np.full(out.shape, 2.0, np.float32)
    _, dx = tail.backward_with_input({}, tape, dout)
    np.testing.assert_allclose(dx, out * 2.0, rtol=1e-6)
    # MXNet's training-mode dropout keeps the same share at the same scale
    with mx.autograd.train_mode():
        want = mx.nd.Dropout(mx.nd.array(x), p=0.25).asnumpy()
    assert abs((want != 0).mean() - kept.mean()) < 0.01
    np.testing.assert_allclose(want[want != 0], 1 / 0.75, rtol=1e-6)


# ----------------------------------------------------------------------------------- real graphs
def _zoo(name, **kw):
    from mxnet.gluon.model_zoo import vision

    net = vision.get_model(name, pretrained=False, **kw)
    net.initialize(mx.init.Xavier(magnitude=2.0))
    return net


def _digits():
    from edgetrain.nets import digits_cnn

    net = digits_cnn(10)
    net.initialize(mx.init.Xavier(magnitude=2.0))
    return net


def _check_trained_part(net, input_shape, layers, batch=4, seed=1):
    net(mx.nd.zeros((1, *input_shape)))
    g = netsplit.graph_of(net, "data")
    cut = netsplit.cut_for(g, parse_train_layers(layers))
    sp = netsplit.split(g, cut, input_shape)
    tail = Tail(g.doc, sp.cut_name, "data", sp.feature_shape)
    rng = np.random.RandomState(seed)
    # features as the frozen part makes them (or the images themselves when everything trains)
    images = rng.standard_normal((batch, *input_shape)).astype(np.float32)
    feats = images if sp.frozen is None else sp.frozen(mx.nd.array(images)).asnumpy()
    trained = sp.trained
    values = {p.name: p.data().asnumpy() for p in trained.collect_params().values()}
    aux_names = {p.name for p in trained.collect_params().values() if p.grad_req == "null"}
    params = {k: v for k, v in values.items() if k not in aux_names}
    aux = {k: v.copy() for k, v in values.items() if k in aux_names}
    assert tail.param_shapes == {k: v.shape for k, v in params.items()}
    assert tail.aux_shapes == {k: v.shape for k, v in aux.items()}

    want_eval = trained(mx.nd.array(feats)).asnumpy()
    got_eval, _ = tail.forward(params, aux, feats, train=False)
    _close(got_eval, want_eval, "eval logits")

    xd = mx.nd.array(feats)
    xd.attach_grad()
    with mx.autograd.record(train_mode=True):
        logits = trained(xd)
    z = logits.asnumpy()
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    labels = rng.randint(0, z.shape[1], batch)
    dout = p.copy()
    dout[np.arange(batch), labels] -= 1
    dout = (dout / batch).astype(np.float32)
    logits.backward(mx.nd.array(dout))

    got, tape = tail.forward(params, aux, feats, train=True)
    _close(got, z, "train logits")
    grads, dx = tail.backward_with_input(params, tape, dout)
    # a bias followed by a linear layer and BatchNorm has a zero gradient in exact arithmetic: what both
    # engines give there is float32 summation noise (seen up to ~1e-4 of the largest gradient), so errors
    # also count against the largest gradient of the part
    gscale = max(float(np.abs(p.grad().asnumpy()).max()) for p in trained.collect_params().values()
                 if p.name not in aux_names)
    for prm in trained.collect_params().values():
        if prm.name in aux_names:
            _close(aux[prm.name], prm.data().asnumpy(), f"aux {prm.name}")
        else:
            _close(grads[prm.name], prm.grad().asnumpy(), f"grad {prm.name}", tol=2e-4, atol=1e-3 * gscale)
    _close(dx, xd.grad.asnumpy(), "grad features", tol=2e-4)
    return tail


def test_mobilenet_v2_last2_matches_mxnet():
    tail = _check_trained_part(_zoo("mobilenetv2_1.0", classes=10), (3, 64, 64), "last:2")
    assert tail.output_shape == (10,) and not tail.has_dropout
    assert [s.op for s in tail._steps] == ["Convolution", "BatchNorm", "clip", "Pooling", "Convolution",
                                           "Flatten"]


def test_mobilenet_v2_last3_matches_mxnet():
    _check_trained_part(_zoo("mobilenetv2_1.0", classes=10), (3, 64, 64), "last:3")


def test_resnet18_v1_last2_matches_mxnet():
    tail = _check_trained_part(_zoo("resnet18_v1", classes=10), (3, 64, 64), "last:2")
    assert "elemwise_add" in {s.op for s in tail._steps} or "_plus" in {s.op for s in tail._steps}


@pytest.mark.parametrize("layers", ["last:2", "all"])
def test_digits_cnn_matches_mxnet(layers):
    _check_trained_part(_digits(), (1, 16, 16), layers, batch=5)


# ----------------------------------------------------------------------------------- what it refuses
@pytest.mark.parametrize("build, names", [
    (lambda: S.Deconvolution(D, kernel=(2, 2), num_filter=2, name="up"), "Deconvolution"),
    (lambda: S.softmax(S.Flatten(D)), "softmax"),
    (lambda: D * 2.0, "_mul_scalar"),
    (lambda: S.LeakyReLU(D, act_type="elu"), "act_type=elu"),
    (lambda: S.Activation(D, act_type="softsign"), "act_type=softsign"),
    (lambda: S.Pooling(D, kernel=(2, 2), pool_type="lp"), "pool_type=lp"),
    (lambda: S.BatchNorm(D, axis=2), "axis=2"),
    (lambda: S.Reshape(D, shape=(-3, 0)), "Reshape"),
    (lambda: S.Concat(D, D, dim=0), "dim=0"),
])
def test_unsupported_op_names_it(build, names):
    sym = S.Flatten(S.Activation(build(), act_type="relu"))
    with pytest.raises(Unsupported) as info:
        Tail(json.loads(sym.tojson()), None, "data", (2, 4, 4))
    text = str(info.value)
    assert names in text and "\n" not in text


def test_tail_reaching_past_the_cut_is_unsupported():
    a = S.Activation(D, act_type="relu", name="cutme")
    sym = S.Flatten(S.elemwise_add(S.Activation(a, act_type="tanh"), D))
    with pytest.raises(Unsupported, match="past the cut cutme"):
        Tail(json.loads(sym.tojson()), "cutme", "data", (2, 3, 3))
    tail = Tail(json.loads(S.Flatten(S.Activation(a, act_type="tanh")).tojson()), "cutme", "data", (2, 3, 3))
    assert [s.op for s in tail._steps] == ["Activation", "Flatten"]


def test_numpy_tail_runs_without_importing_mxnet(tmp_path):
    x = conv(D, "c", kernel=(3, 3), pad=(1, 1), num_filter=4, no_bias=True)
    x = S.Pooling(S.Activation(S.BatchNorm(x, name="b"), act_type="relu"), kernel=(2, 2), stride=(2, 2))
    sym = S.FullyConnected(S.Dropout(x, p=0.3), name="fc", num_hidden=3)
    (tmp_path / "g.json").write_text(sym.tojson())
    code = f"""
import json, sys
import numpy as np
import edgetrain.training.numpy_tail as nt
t = nt.Tail(json.load(open({str(tmp_path / 'g.json')!r})), None, "data", (2, 6, 6))
P = {{k: np.full(s, 0.1, np.float32) for k, s in t.param_shapes.items()}}
A = {{k: np.ones(s, np.float32) for k, s in t.aux_shapes.items()}}
out, tape = t.forward(P, A, np.ones((2, 2, 6, 6), np.float32), True, np.random.RandomState(0))
g = t.backward(P, tape, np.ones_like(out))
assert out.shape == (2, 3) and sorted(g) == sorted(P)
assert "mxnet" not in sys.modules, "mxnet was imported"
print("ok")
"""
    res = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "ok"
