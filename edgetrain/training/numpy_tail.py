"""The trained part ("tail") of an MXNet symbol graph, run and differentiated in NumPy.

``finetune --train-layers last:N`` runs the frozen part in ONNX Runtime; the few layers after the cut are
small enough that NumPy (matmul on the BLAS numpy links) trains them without importing mxnet at all
(~1.8 CPU-s and ~140 MB saved per run). This module imports only numpy, never mxnet.

Semantics follow MXNet 1.9.1 as the symbol JSON states them (attribute strings, op defaults when an
attribute is absent, e.g. BatchNorm fix_gamma=True). Everything is float32; 2-D layers are NCHW.
A graph using anything else raises :class:`Unsupported` naming the op or attribute.
"""
from __future__ import annotations

import ast
import math

import numpy as np
from numpy.lib.stride_tricks import as_strided

F32 = np.float32
_X = -1  # a source id: the tail's input (output 0 of the cut, or the data node)


class Unsupported(Exception):
    """The tail uses an op or attribute this engine does not implement; str() is one line naming it."""


# ---------------------------------------------------------------------------------------------- attributes
def _attrs(node: dict) -> dict:
    return node.get("attrs") or node.get("attr") or node.get("param") or {}


def _tuple(text, default=None) -> tuple:
    if text is None:
        return default
    text = str(text).strip()
    if text in ("None", ""):
        return default
    try:
        v = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        raise Unsupported(f"cannot read the tuple attribute {text!r}") from None
    if isinstance(v, (int, float)):
        return (int(v),)
    return tuple(int(e) for e in v)


def _bool(text, default: bool) -> bool:
    if text is None:
        return default
    return str(text).strip().lower() in ("true", "1")


def _float(text, default: float) -> float:
    return default if text is None else float(text)


def _pair(name: str, text, default, op: str) -> tuple:
    v = _tuple(text, default)
    if v is None or len(v) == 0:
        v = default
    if len(v) == 1:
        v = (v[0], v[0])
    if len(v) != 2:
        raise Unsupported(f"{op} with {name}={text} (only 2-D, NCHW)")
    return v


def _prod(shape) -> int:
    return int(math.prod(shape))


def _sl(start: int, n: int, step: int) -> slice:
    return slice(start, start + step * (n - 1) + 1, step)


def _channels_first(a):
    """(N, C, ...) -> contiguous (C, N * ...): the batch as the columns of one GEMM."""
    n, c = a.shape[:2]
    return np.ascontiguousarray(a.reshape(n, c, -1).transpose(1, 0, 2)).reshape(c, -1)


def _batch_first(m, n, shape):
    """(C, N * ...) -> contiguous (N, *shape) with shape[0] == C."""
    c = m.shape[0]
    return np.ascontiguousarray(m.reshape(c, n, -1).transpose(1, 0, 2)).reshape(n, *shape)


def _group_mm(a, b):
    """(G, m, k) @ (G, k, n) as G two-dimensional GEMMs (np.matmul on stacks is slower here)."""
    if a.shape[0] == 1:
        return (a[0] @ b[0])[None]
    out = np.empty((a.shape[0], a.shape[1], b.shape[2]), F32)
    for g in range(a.shape[0]):
        np.matmul(a[g], b[g], out=out[g])
    return out


# ---------------------------------------------------------------------------------------------- ops
# Each op: __init__(attrs, in_shapes (one sample, no batch), param names) sets out_shape, params {role: shape}
# (arg params, in input order after the data inputs) and aux {role: shape}; forward(ins, P, A, train, rng)
# -> (out, cache); backward(dout, cache, P, need) -> (list of d(data input) or None, {param name: grad}).
class _Op:
    """forward(..., own): own[i] says data input i is this op's alone to overwrite; backward(..., own): dout is.
    fresh_out: the output is a new array the op does not keep (a consumer may overwrite it); fresh_grads: the
    input gradients are new arrays (not dout or views of it)."""

    n_data = 1
    fresh_out = True
    fresh_grads = True
    extra_bytes = 0       # per sample, held in the tape beyond the output (train)
    transient_bytes = 0   # per sample, scratch during forward

    def check_data_inputs(self, in_shapes, op):
        if len(in_shapes) != self.n_data:
            raise Unsupported(f"{op} with {len(in_shapes)} data inputs")


class _Conv(_Op):
    def __init__(self, a, in_shapes, names, op="Convolution"):
        (shape,) = in_shapes
        if len(shape) != 3:
            raise Unsupported(f"{op} on a {len(shape) + 1}-D input (only 2-D NCHW)")
        if a.get("layout") not in (None, "None", "NCHW"):
            raise Unsupported(f"{op} with layout={a.get('layout')}")
        C, H, W = shape
        self.k = _pair("kernel", a.get("kernel"), None, op)
        self.s = _pair("stride", a.get("stride"), (1, 1), op)
        self.d = _pair("dilate", a.get("dilate"), (1, 1), op)
        self.p = _pair("pad", a.get("pad"), (0, 0), op)
        self.F = int(a["num_filter"])
        self.G = int(a.get("num_group", 1))
        self.bias = not _bool(a.get("no_bias"), False)
        G, F = self.G, self.F
        if C % G or F % G:
            raise Unsupported(f"{op} with num_group={G} not dividing {C} input / {F} output channels")
        (kh, kw), (sh, sw), (dh, dw), (ph, pw) = self.k, self.s, self.d, self.p
        Ho = (H + 2 * ph - dh * (kh - 1) - 1) // sh + 1
        Wo = (W + 2 * pw - dw * (kw - 1) - 1) // sw + 1
        if Ho < 1 or Wo < 1:
            raise Unsupported(f"{op} kernel {self.k} larger than its padded input {H}x{W}")
        self.C, self.H, self.W, self.Ho, self.Wo = C, H, W, Ho, Wo
        self.out_shape = (F, Ho, Wo)
        self.wname = names[0]
        self.bname = names[1] if self.bias else None
        self.params = {self.wname: (F, C // G, kh, kw)}
        if self.bias:
            self.params[self.bname] = (F,)
        self.aux = {}
        if (kh, kw) == (1, 1) and (sh, sw) == (1, 1) and (ph, pw) == (0, 0) and G == 1:
            self.mode = "mm"
        elif C // G == 1 and F == G:
            self.mode = "dw"
            self.extra_bytes = 4 * C * (H + 2 * ph) * (W + 2 * pw)
        else:
            self.mode = "col"
            self.extra_bytes = 4 * C * kh * kw * Ho * Wo
        self.transient_bytes = self.extra_bytes + 4 * F * Ho * Wo

    def _pad(self, x):
        ph, pw = self.p
        if ph == 0 and pw == 0:
            return x
        n, c, h, w = x.shape
        xp = np.zeros((n, c, h + 2 * ph, w + 2 * pw), F32)
        xp[:, :, ph:ph + h, pw:pw + w] = x
        return xp

    def _slice(self, xp, i, j):
        (sh, sw), (dh, dw) = self.s, self.d
        return xp[:, :, _sl(i * dh, self.Ho, sh), _sl(j * dw, self.Wo, sw)]

    def forward(self, ins, P, A, train, rng, own=()):
        (x,) = ins
        N = x.shape[0]
        w = P[self.wname]
        F, C, G = self.F, self.C, self.G
        if self.mode == "mm":  # one GEMM over the whole batch: (F, C) @ (C, N*H*W)
            xt = _channels_first(x)
            # back to (N, F, H, W) in memory too: ops after it mix this with C-ordered arrays (gradients)
            out = _batch_first(w.reshape(F, C) @ xt, N, self.out_shape)
            cache = xt
        elif self.mode == "dw":
            xp = self._pad(x)
            kh, kw = self.k
            out = np.zeros((N, *self.out_shape), F32)
            tmp = np.empty_like(out)
            for i in range(kh):
                for j in range(kw):
                    np.multiply(self._slice(xp, i, j), w[:, 0, i, j].reshape(1, C, 1, 1), out=tmp)
                    out += tmp
            cache = xp
        else:
            xp = self._pad(x)
            kh, kw = self.k
            Ho, Wo = self.Ho, self.Wo
            sN, sC, sH, sW = xp.strides
            (sh, sw), (dh, dw) = self.s, self.d
            view = as_strided(xp, (C, kh, kw, N, Ho, Wo), (sC, sH * dh, sW * dw, sN, sH * sh, sW * sw),
                              writeable=False)
            cols = np.ascontiguousarray(view).reshape(G, (C // G) * kh * kw, N * Ho * Wo)
            o = _group_mm(w.reshape(G, F // G, -1), cols)  # (G, F/G, N*Ho*Wo)
            out = np.ascontiguousarray(o.reshape(F, N, Ho, Wo).transpose(1, 0, 2, 3))
            cache = cols
        if self.bias:
            out += P[self.bname].reshape(1, F, 1, 1)
        return out, cache

    def backward(self, dout, cache, P, need, own=False):
        w = P[self.wname]
        F, C, G = self.F, self.C, self.G
        N = dout.shape[0]
        grads = {}
        dx = None
        if self.mode == "mm":
            xt = cache
            dt = _channels_first(dout)
            grads[self.wname] = (dt @ xt.T).reshape(w.shape)
            if need[0]:
                dx = _batch_first(w.reshape(F, C).T @ dt, N, (C, self.H, self.W))
        elif self.mode == "dw":
            xp = cache
            kh, kw = self.k
            dw_ = np.empty(w.shape, F32)
            dxp = np.zeros(xp.shape, F32) if need[0] else None
            for i in range(kh):
                for j in range(kw):
                    xs = self._slice(xp, i, j)
                    dw_[:, 0, i, j] = np.einsum("nchw,nchw->c", dout, xs)
                    if dxp is not None:
                        self._slice(dxp, i, j)[...] += dout * w[:, 0, i, j].reshape(1, C, 1, 1)
            grads[self.wname] = dw_
            if dxp is not None:
                ph, pw = self.p
                dx = dxp[:, :, ph:ph + self.H, pw:pw + self.W]
        else:
            cols = cache
            Ho, Wo = self.Ho, self.Wo
            kh, kw = self.k
            dm = np.ascontiguousarray(dout.transpose(1, 0, 2, 3)).reshape(G, F // G, N * Ho * Wo)
            grads[self.wname] = _group_mm(dm, cols.transpose(0, 2, 1)).reshape(w.shape)
            if need[0]:
                dcols = _group_mm(w.reshape(G, F // G, -1).transpose(0, 2, 1), dm)
                dcols = dcols.reshape(C, kh, kw, N, Ho, Wo)
                ph, pw = self.p
                dxp = np.zeros((C, N, self.H + 2 * ph, self.W + 2 * pw), F32)  # channels first, as dcols
                for i in range(kh):
                    for j in range(kw):
                        self._slice(dxp, i, j)[...] += dcols[:, i, j]
                dx = np.ascontiguousarray(dxp[:, :, ph:ph + self.H, pw:pw + self.W].transpose(1, 0, 2, 3))
        if self.bias:
            grads[self.bname] = dout.sum(axis=(0, 2, 3), dtype=F32)
        return [dx], grads


class _FC(_Op):
    def __init__(self, a, in_shapes, names, op="FullyConnected"):
        (shape,) = in_shapes
        self.flatten = _bool(a.get("flatten"), True)
        self.units = int(a["num_hidden"])
        self.bias = not _bool(a.get("no_bias"), False)
        if self.flatten:
            n_in = _prod(shape)
            self.out_shape = (self.units,)
        else:
            if len(shape) == 0:
                raise Unsupported(f"{op} flatten=False on a 1-D input")
            n_in = shape[-1]
            self.out_shape = (*shape[:-1], self.units)
        self.n_in = n_in
        self.wname = names[0]
        self.bname = names[1] if self.bias else None
        self.params = {self.wname: (self.units, n_in)}
        if self.bias:
            self.params[self.bname] = (self.units,)
        self.aux = {}

    def forward(self, ins, P, A, train, rng, own=()):
        (x,) = ins
        x2 = x.reshape(-1, self.n_in)
        out = x2 @ P[self.wname].T
        if self.bias:
            out += P[self.bname]
        return out.reshape(x.shape[0], *self.out_shape), x

    def backward(self, dout, x, P, need, own=False):
        d2 = dout.reshape(-1, self.units)
        x2 = x.reshape(-1, self.n_in)
        grads = {self.wname: d2.T @ x2}
        if self.bias:
            grads[self.bname] = d2.sum(axis=0, dtype=F32)
        dx = (d2 @ P[self.wname]).reshape(x.shape) if need[0] else None
        return [dx], grads


def _chan_dot(a, b):
    """sum over every axis but 1 of a * b, float32."""
    n, c = a.shape[:2]
    return np.einsum("ncp,ncp->c", a.reshape(n, c, -1), b.reshape(n, c, -1)).astype(F32, copy=False)


class _BatchNorm(_Op):
    def __init__(self, a, in_shapes, names, op="BatchNorm"):
        (shape,) = in_shapes
        axis = int(a.get("axis", 1))
        if axis < 0:
            axis += len(shape) + 1
        if axis != 1:
            raise Unsupported(f"{op} with axis={a.get('axis')} (only axis=1)")
        self.eps = _float(a.get("eps"), 1e-3)
        self.momentum = _float(a.get("momentum"), 0.9)
        self.fix_gamma = _bool(a.get("fix_gamma"), True)
        self.global_stats = _bool(a.get("use_global_stats"), False)
        C = shape[0]
        self.bshape = (1, C) + (1,) * (len(shape) - 1)
        self.red = (0,) + tuple(range(2, len(shape) + 1))
        self.out_shape = tuple(shape)
        self.gname, self.bname, self.mname, self.vname = names
        self.params = {self.gname: (C,), self.bname: (C,)}
        self.aux = {self.mname: (C,), self.vname: (C,)}
        self.extra_bytes = 4 * _prod(shape)  # xhat

    def forward(self, ins, P, A, train, rng, own=()):
        (x,) = ins
        bs = self.bshape
        gamma = np.ones(bs[1], F32) if self.fix_gamma else P[self.gname]
        beta = P[self.bname]
        batch = train and not self.global_stats
        n, c = x.shape[:2]
        x3 = x.reshape(n, c, -1)
        if batch:
            m = F32(x.size // c)
            mean = np.einsum("ncp->c", x3) / m
            if own and own[0]:
                xc = x
                xc -= mean.reshape(bs)
            else:
                xc = x - mean.reshape(bs)
            var = _chan_dot(xc, xc) / m
            invstd = (F32(1) / np.sqrt(var + F32(self.eps))).astype(F32)
            mom = F32(self.momentum)
            mm, mv = A[self.mname], A[self.vname]
            mm[...] = mm * mom + mean * (F32(1) - mom)
            mv[...] = mv * mom + var * (F32(1) - mom)
        else:
            invstd = (F32(1) / np.sqrt(A[self.vname] + F32(self.eps))).astype(F32)
            if own and own[0]:
                xc = x
                xc -= A[self.mname].reshape(bs)
            else:
                xc = x - A[self.mname].reshape(bs)
        out = np.multiply(xc, (gamma * invstd).reshape(bs))
        out += beta.reshape(bs)
        return out, (xc, invstd, gamma, batch)

    def backward(self, dout, cache, P, need, own=False):
        xc, invstd, gamma, batch = cache
        bs = self.bshape
        n, c = dout.shape[:2]
        dbeta = np.einsum("ncp->c", dout.reshape(n, c, -1))
        dgamma = _chan_dot(dout, xc) * invstd  # sum(dout * xhat)
        dx = None
        if need[0]:
            k = gamma * invstd
            dx = np.multiply(dout, k.reshape(bs), out=dout if own else None)
            if batch:  # dx = k * (dout - dbeta / m - xhat * dgamma / m)
                m = F32(dout.size // c)
                dx -= xc * (k * invstd * dgamma / m).reshape(bs)
                dx -= (k * dbeta / m).reshape(bs)
        grads = {self.gname: np.zeros_like(dgamma) if self.fix_gamma else dgamma, self.bname: dbeta}
        return [dx], grads


class _Elementwise(_Op):
    """Activation, clip, LeakyReLU(leaky): one input, same shape, no weights."""

    def __init__(self, a, in_shapes, names, op):
        (shape,) = in_shapes
        self.out_shape = tuple(shape)
        self.params, self.aux = {}, {}
        if op == "Activation":
            self.kind = a.get("act_type", "relu")
            if self.kind not in ("relu", "sigmoid", "tanh", "softrelu"):
                raise Unsupported(f"Activation act_type={self.kind}")
        elif op == "clip":
            self.kind = "clip"
            self.lo, self.hi = F32(_float(a.get("a_min"), 0.0)), F32(_float(a.get("a_max"), 0.0))
        else:  # LeakyReLU
            self.kind = a.get("act_type", "leaky")
            if self.kind != "leaky":
                raise Unsupported(f"LeakyReLU act_type={self.kind} (only leaky)")
            self.slope = F32(_float(a.get("slope"), 0.25))
        self.extra_bytes = _prod(shape) * (1 if self.kind in ("relu", "clip") else 4)
        self.fresh_out = self.kind not in ("sigmoid", "tanh")  # those keep their output for backward

    def forward(self, ins, P, A, train, rng, own=()):
        (x,) = ins
        k = self.kind
        mine = bool(own and own[0])
        if k == "relu":
            mask = x > 0
            return np.maximum(x, F32(0), out=x if mine else None), mask
        if k == "clip":
            mask = x >= self.lo
            mask &= x <= self.hi
            return np.clip(x, self.lo, self.hi, out=x if mine else None), mask
        if k == "sigmoid":
            out = (F32(1) / (F32(1) + np.exp(-x))).astype(F32, copy=False)
            return out, out
        if k == "tanh":
            out = np.tanh(x)
            return out, out
        if k == "softrelu":
            return np.logaddexp(F32(0), x), x
        out = np.where(x > 0, x, x * self.slope)
        return out, x > 0

    def backward(self, dout, c, P, need, own=False):
        if not need[0]:
            return [None], {}
        k = self.kind
        if k in ("relu", "clip"):
            dx = np.multiply(dout, c, out=dout if own else None)
        elif k == "sigmoid":
            dx = dout * c * (F32(1) - c)
        elif k == "tanh":
            dx = dout * (F32(1) - c * c)
        elif k == "softrelu":
            dx = dout / (F32(1) + np.exp(-c))
        else:
            dx = dout * np.where(c, F32(1), self.slope)
        return [dx.astype(F32, copy=False)], {}


class _Pooling(_Op):
    def __init__(self, a, in_shapes, names, op="Pooling"):
        (shape,) = in_shapes
        if len(shape) != 3:
            raise Unsupported(f"{op} on a {len(shape) + 1}-D input (only 2-D NCHW)")
        if a.get("layout") not in (None, "None", "NCHW"):
            raise Unsupported(f"{op} with layout={a.get('layout')}")
        self.type = a.get("pool_type", "max")
        if self.type not in ("max", "avg"):
            raise Unsupported(f"{op} pool_type={self.type} (only max, avg)")
        C, H, W = shape
        self.C, self.H, self.W = C, H, W
        self.glob = _bool(a.get("global_pool"), False)
        self.include_pad = _bool(a.get("count_include_pad"), True)
        conv = a.get("pooling_convention", "valid")
        if conv not in ("valid", "full"):
            raise Unsupported(f"{op} pooling_convention={conv}")
        self.params, self.aux = {}, {}
        if self.glob:
            self.k, self.s, self.p = (H, W), (1, 1), (0, 0)
            self.Ho = self.Wo = 1
        else:
            self.k = _pair("kernel", a.get("kernel"), None, op)
            self.s = _pair("stride", a.get("stride"), (1, 1), op)
            self.p = _pair("pad", a.get("pad"), (0, 0), op)
            (kh, kw), (sh, sw), (ph, pw) = self.k, self.s, self.p
            if conv == "valid":
                self.Ho = (H + 2 * ph - kh) // sh + 1
                self.Wo = (W + 2 * pw - kw) // sw + 1
            else:
                self.Ho = 1 + math.ceil((H + 2 * ph - kh) / sh)
                self.Wo = 1 + math.ceil((W + 2 * pw - kw) / sw)
            if self.Ho < 1 or self.Wo < 1:
                raise Unsupported(f"{op} kernel {self.k} larger than its padded input {H}x{W}")
        self.out_shape = (C, self.Ho, self.Wo)
        if not self.glob:
            (kh, kw), (sh, sw), (ph, pw) = self.k, self.s, self.p
            self.Hp = max(H + 2 * ph, (self.Ho - 1) * sh + kh)
            self.Wp = max(W + 2 * pw, (self.Wo - 1) * sw + kw)
            if self.type == "avg":
                self.div = (self._sizes(H, self.Ho, kh, sh, ph)[:, None]
                            * self._sizes(W, self.Wo, kw, sw, pw)[None, :]).astype(F32)
            self.extra_bytes = C * self.Ho * self.Wo * (2 if self.type == "max" else 0)
            self.transient_bytes = 4 * C * self.Hp * self.Wp

    def _sizes(self, n, no, k, s, p):
        """MXNet's window sizes along one axis (pool.h: clamped at n + pad, or at n without the pad)."""
        start = np.arange(no) * s - p
        end = np.minimum(start + k, n + p)
        if self.include_pad:
            return end - start
        return np.minimum(end, n) - np.maximum(start, 0)

    def _padded(self, x, fill):
        ph, pw = self.p
        N = x.shape[0]
        if (self.Hp, self.Wp) == (self.H, self.W):
            return x
        xp = np.full((N, self.C, self.Hp, self.Wp), fill, F32)
        xp[:, :, ph:ph + self.H, pw:pw + self.W] = x
        return xp

    def _slice(self, xp, i, j):
        return xp[:, :, _sl(i, self.Ho, self.s[0]), _sl(j, self.Wo, self.s[1])]

    def forward(self, ins, P, A, train, rng, own=()):
        (x,) = ins
        if self.glob:
            if self.type == "avg":
                n, c = x.shape[:2]
                return (np.einsum("ncp->nc", x.reshape(n, c, -1)) / F32(self.H * self.W)).reshape(n, c, 1, 1), None
            x3 = x.reshape(x.shape[0], self.C, -1)
            arg = x3.argmax(axis=2)
            return np.take_along_axis(x3, arg[..., None], axis=2).reshape(x.shape[0], self.C, 1, 1), arg
        kh, kw = self.k
        if self.type == "avg":
            xp = self._padded(x, 0.0)
            out = np.zeros((x.shape[0], *self.out_shape), F32)
            for i in range(kh):
                for j in range(kw):
                    out += self._slice(xp, i, j)
            out /= self.div
            return out, None
        xp = self._padded(x, -np.inf)
        out = None
        arg = np.zeros((x.shape[0], *self.out_shape), np.int16)
        for i in range(kh):
            for j in range(kw):
                s = self._slice(xp, i, j)
                if out is None:
                    out = s.copy()
                    continue
                better = np.greater(s, out)  # the first maximum wins, as MXNet's scan
                np.copyto(out, s, where=better)
                np.copyto(arg, i * kw + j, where=better)
        return out, arg

    def backward(self, dout, arg, P, need, own=False):
        if not need[0]:
            return [None], {}
        N = dout.shape[0]
        shape = (N, self.C, self.H, self.W)
        if self.glob:
            if self.type == "avg":
                dx = np.empty(shape, F32)
                dx[...] = dout / F32(self.H * self.W)
                return [dx], {}
            dx = np.zeros((N, self.C, self.H * self.W), F32)
            np.put_along_axis(dx, arg[..., None], dout.reshape(N, self.C, 1), axis=2)
            return [dx.reshape(shape)], {}
        kh, kw = self.k
        ph, pw = self.p
        dxp = np.zeros((N, self.C, self.Hp, self.Wp), F32)
        if self.type == "avg":
            g = dout / self.div
            for i in range(kh):
                for j in range(kw):
                    self._slice(dxp, i, j)[...] += g
        else:
            for i in range(kh):
                for j in range(kw):
                    self._slice(dxp, i, j)[...] += np.where(arg == i * kw + j, dout, F32(0))
        return [dxp[:, :, ph:ph + self.H, pw:pw + self.W]], {}


class _Flatten(_Op):
    fresh_out = fresh_grads = False  # views
    def __init__(self, a, in_shapes, names, op="Flatten"):
        (shape,) = in_shapes
        self.out_shape = (_prod(shape),)
        self.params, self.aux = {}, {}

    def forward(self, ins, P, A, train, rng, own=()):
        (x,) = ins
        return x.reshape(x.shape[0], -1), x.shape

    def backward(self, dout, shape, P, need, own=False):
        return [dout.reshape(shape) if need[0] else None], {}


def _reshape(codes: tuple, full: tuple) -> tuple:
    out, infer = [], None
    for i, c in enumerate(codes):
        if c == 0:
            if i >= len(full):
                raise Unsupported(f"Reshape shape={codes}")
            out.append(full[i])
        elif c == -1:
            if infer is not None:
                raise Unsupported(f"Reshape shape={codes} (two -1)")
            infer = len(out)
            out.append(1)
        elif c > 0:
            out.append(c)
        else:
            raise Unsupported(f"Reshape shape={codes} (special value {c}; only 0, -1 and sizes)")
    total = _prod(full)
    if infer is not None:
        rest = _prod(out)
        if rest == 0 or total % rest:
            raise Unsupported(f"Reshape shape={codes} does not fit {full}")
        out[infer] = total // rest
    if _prod(out) != total:
        raise Unsupported(f"Reshape shape={codes} does not fit {full}")
    return tuple(out)


class _Reshape(_Flatten):
    def __init__(self, a, in_shapes, names, op="Reshape"):
        (shape,) = in_shapes
        if _bool(a.get("reverse"), False):
            raise Unsupported(f"{op} reverse=True")
        if "shape" not in a and "target_shape" in a:
            raise Unsupported(f"{op} with target_shape")
        codes = _tuple(a.get("shape"), ())
        outs = [_reshape(codes, (b, *shape)) for b in (2, 3)]
        if outs[0][0] != 2 or outs[1][0] != 3 or outs[0][1:] != outs[1][1:]:
            raise Unsupported(f"{op} shape={a.get('shape')} (it does not keep the batch axis)")
        self.out_shape = outs[0][1:]
        self.params, self.aux = {}, {}

    def forward(self, ins, P, A, train, rng, own=()):
        (x,) = ins
        return x.reshape(x.shape[0], *self.out_shape), x.shape


class _Add(_Op):
    n_data = 2
    fresh_grads = False

    def __init__(self, a, in_shapes, names, op):
        self.check_data_inputs(in_shapes, op)
        s0, s1 = (tuple(s) for s in in_shapes)
        if op.startswith("broadcast"):
            try:
                self.out_shape = tuple(np.broadcast_shapes((1, *s0), (1, *s1))[1:])
            except ValueError:
                raise Unsupported(f"{op} of shapes {s0} and {s1}") from None
        elif s0 != s1:
            raise Unsupported(f"{op} of different shapes {s0} and {s1}")
        else:
            self.out_shape = s0
        self.in_shapes = (s0, s1)
        self.params, self.aux = {}, {}

    def forward(self, ins, P, A, train, rng, own=()):
        a, b = ins
        return a + b, None

    def backward(self, dout, cache, P, need, own=False):
        out = []
        for shape, n in zip(self.in_shapes, need):
            if not n:
                out.append(None)
                continue
            d = dout
            full = (dout.shape[0], *shape)
            lead = d.ndim - len(full)
            if lead:
                d = d.sum(axis=tuple(range(lead)), dtype=F32)
            axes = tuple(i for i, s in enumerate(full) if s == 1 and d.shape[i] != 1)
            if axes:
                d = d.sum(axis=axes, keepdims=True, dtype=F32)
            out.append(d)
        return out, {}


class _Concat(_Op):
    fresh_grads = False
    def __init__(self, a, in_shapes, names, op):
        self.n_data = len(in_shapes)
        ndim = len(in_shapes[0]) + 1
        dim = int(a.get("dim", 1))
        if dim < 0:
            dim += ndim
        if dim <= 0 or dim >= ndim:
            raise Unsupported(f"{op} along dim={a.get('dim')} (only a non-batch axis)")
        sd = dim - 1
        for s in in_shapes:
            if len(s) != ndim - 1 or any(s[i] != in_shapes[0][i] for i in range(ndim - 1) if i != sd):
                raise Unsupported(f"{op} of mismatched shapes {in_shapes}")
        self.dim = dim
        self.sizes = [s[sd] for s in in_shapes]
        out = list(in_shapes[0])
        out[sd] = sum(self.sizes)
        self.out_shape = tuple(out)
        self.params, self.aux = {}, {}

    def forward(self, ins, P, A, train, rng, own=()):
        return np.concatenate(ins, axis=self.dim), None

    def backward(self, dout, cache, P, need, own=False):
        parts = np.split(dout, np.cumsum(self.sizes)[:-1], axis=self.dim)
        return [p if n else None for p, n in zip(parts, need)], {}


class _Dropout(_Op):
    fresh_out = fresh_grads = False
    def __init__(self, a, in_shapes, names, op="Dropout"):
        (shape,) = in_shapes
        self.p = _float(a.get("p"), 0.5)
        self.mode = a.get("mode", "training")
        if self.mode not in ("training", "always"):
            raise Unsupported(f"{op} mode={self.mode}")
        if _tuple(a.get("axes"), ()):
            raise Unsupported(f"{op} with axes={a.get('axes')}")
        self.out_shape = tuple(shape)
        self.params, self.aux = {}, {}
        self.extra_bytes = 4 * _prod(shape)

    def forward(self, ins, P, A, train, rng, own=()):
        (x,) = ins
        if not (train or self.mode == "always") or self.p <= 0:
            return x, None
        if self.p >= 1:
            mask = np.zeros(x.shape, F32)
        else:
            draw = (rng or np.random).random_sample(x.shape)
            mask = (draw >= self.p).astype(F32)
            mask *= F32(1.0 / (1.0 - self.p))
        return x * mask, mask

    def backward(self, dout, mask, P, need, own=False):
        if not need[0]:
            return [None], {}
        return [dout if mask is None else dout * mask], {}


class _Identity(_Op):
    fresh_out = fresh_grads = False
    def __init__(self, a, in_shapes, names, op):
        (shape,) = in_shapes
        self.out_shape = tuple(shape)
        self.params, self.aux = {}, {}

    def forward(self, ins, P, A, train, rng, own=()):
        return ins[0], None

    def backward(self, dout, cache, P, need, own=False):
        return [dout if need[0] else None], {}


# op name -> (class, number of data inputs (None: all inputs are data), roles of the weight inputs that follow,
# indices of those that are aux states)
_OPS = {
    "Convolution": (_Conv, 1),
    "FullyConnected": (_FC, 1),
    "BatchNorm": (_BatchNorm, 1),
    "Activation": (_Elementwise, 1),
    "clip": (_Elementwise, 1),
    "LeakyReLU": (_Elementwise, 1),
    "Pooling": (_Pooling, 1),
    "Flatten": (_Flatten, 1),
    "flatten": (_Flatten, 1),
    "Reshape": (_Reshape, 1),
    "reshape": (_Reshape, 1),
    "elemwise_add": (_Add, 2),
    "_Plus": (_Add, 2),
    "_plus": (_Add, 2),
    "_add": (_Add, 2),
    "broadcast_add": (_Add, 2),
    "broadcast_plus": (_Add, 2),
    "Concat": (_Concat, None),
    "concat": (_Concat, None),
    "Dropout": (_Dropout, 1),
    "_copy": (_Identity, 1),
    "identity": (_Identity, 1),
}
_AUX_INPUTS = {"BatchNorm": (3, 4)}


class _Step:
    __slots__ = ("impl", "name", "nid", "op", "pnames", "srcs")

    def __init__(self, nid, name, op, impl, srcs, pnames):
        self.nid, self.name, self.op, self.impl, self.srcs, self.pnames = nid, name, op, impl, srcs, pnames


class Tail:
    """The tail of a symbol graph: every node from the cut's output (or the data node) to doc["heads"][0]."""

    def __init__(self, doc: dict, cut: str | None, input_name: str, feature_shape: tuple):
        nodes = doc["nodes"]
        self.cut, self.input_name = cut, input_name
        self.feature_shape = tuple(int(s) for s in feature_shape)
        start = cut if cut is not None else input_name
        by_name = [i for i, n in enumerate(nodes) if n["name"] == start]
        if not by_name:
            raise Unsupported(f"no node named {start} in the graph")
        start_id = by_name[-1]
        if cut is None and nodes[start_id]["op"] != "null":
            raise Unsupported(f"{input_name} is not a data node of the graph")
        head = doc["heads"][0]
        if head[1] != 0:
            raise Unsupported(f"the graph's output is output {head[1]} of {nodes[head[0]]['name']}")
        if head[0] == start_id:
            raise Unsupported("the tail is empty: the cut is the graph's output")

        # which compute nodes the output needs, stopping at the cut
        needed, stack = set(), [head[0]]
        while stack:
            i = stack.pop()
            if i in needed or i == start_id:
                continue
            n = nodes[i]
            if n["op"] == "null":
                if n["name"] == input_name:
                    raise Unsupported(f"the tail reads the data input {input_name} past the cut {cut}")
                continue
            needed.add(i)
            stack.extend(k[0] for k in n["inputs"])

        self.param_shapes: dict[str, tuple] = {}
        self.aux_shapes: dict[str, tuple] = {}
        self.has_dropout = False
        shapes = {_X: self.feature_shape}
        steps = []
        for i in sorted(needed):
            n = nodes[i]
            op = n["op"]
            if op not in _OPS:
                raise Unsupported(f"op {op} (node {n['name']}) is not supported by the NumPy engine")
            cls, n_data = _OPS[op]
            inputs = n["inputs"]
            if n_data is None:
                n_data = len(inputs)
            if len(inputs) < n_data:
                raise Unsupported(f"{op} node {n['name']} with {len(inputs)} inputs")
            srcs, pnames = [], []
            for k in inputs[:n_data]:
                src = _X if k[0] == start_id else k[0]
                if k[1] != 0:
                    raise Unsupported(f"{op} node {n['name']} reads output {k[1]} of {nodes[k[0]]['name']}")
                if src != _X and src not in needed:
                    raise Unsupported(f"{op} node {n['name']} takes a weight ({nodes[k[0]]['name']}) as data")
                srcs.append(src)
            for k in inputs[n_data:]:
                w = nodes[k[0]]
                if w["op"] != "null" or k[0] == start_id:
                    raise Unsupported(f"{op} node {n['name']} computes a weight input from {w['name']}")
                pnames.append(w["name"])
            try:
                impl = cls(_attrs(n), [shapes[s] for s in srcs], pnames, op)
            except (KeyError, IndexError, ValueError) as exc:
                raise Unsupported(f"{op} node {n['name']}: cannot read its attributes ({exc})") from None
            expected = len(impl.params) + len(impl.aux)
            if len(pnames) != expected:
                raise Unsupported(f"{op} node {n['name']} with {len(pnames)} weight inputs (expected {expected})")
            for table, new in ((self.param_shapes, impl.params), (self.aux_shapes, impl.aux)):
                for name, shape in new.items():
                    if table.get(name, shape) != shape:
                        raise Unsupported(f"weight {name} used with two shapes {table[name]} and {shape}")
                    table[name] = tuple(int(s) for s in shape)
            self.has_dropout |= op == "Dropout"
            shapes[i] = tuple(impl.out_shape)
            steps.append(_Step(i, n["name"], op, impl, srcs, pnames))
        both = set(self.param_shapes) & set(self.aux_shapes)
        if both:
            raise Unsupported(f"{min(both)} is both a weight and a BatchNorm moving statistic")
        self._steps = steps
        self._head = head[0]
        self.output_shape = shapes[head[0]]
        self._shapes = shapes
        # last step (index) that reads each source, for freeing values in eval
        self._last_use = {}
        readers: dict[int, int] = {}
        for idx, st in enumerate(steps):
            for s in st.srcs:
                self._last_use[s] = idx
                readers[s] = readers.get(s, 0) + 1
        # a step may overwrite an input that only it reads and that its producer neither keeps nor shares
        fresh = {st.nid: st.impl.fresh_out for st in steps}
        self._own = [tuple(s != _X and readers[s] == 1 and fresh[s] for s in st.srcs) for st in steps]

    # ----------------------------------------------------------------------------------- memory
    def activation_bytes(self, train: bool) -> int:
        """Bytes per sample held during forward (train: and backward), beyond the input batch itself.

        train: every step's output and what its backward keeps (im2col columns, masks, normalised
        activations), the largest step's scratch, plus the two largest gradients alive at once. eval: the peak of live outputs
        (each freed after its last reader) plus the running step's scratch.
        """
        out = {st.nid: 4 * _prod(self._shapes[st.nid]) for st in self._steps}
        if train:
            held = sum(out.values()) + sum(st.impl.extra_bytes for st in self._steps)
            top = sorted(out.values(), reverse=True)[:2]
            scratch = max(st.impl.transient_bytes for st in self._steps)
            return int(held + scratch + sum(top) + 4 * _prod(self.feature_shape))
        live, peak = 0, 0
        for idx, st in enumerate(self._steps):
            live += out[st.nid]
            peak = max(peak, live + st.impl.transient_bytes)
            for s in set(st.srcs):
                if s != _X and self._last_use.get(s) == idx and s != self._head:
                    live -= out[s]
        return int(peak)

    # ----------------------------------------------------------------------------------- run
    def forward(self, params: dict, aux: dict, x: np.ndarray, train: bool,
                rng: np.random.RandomState | None = None):
        """-> (out, tape); tape is None when train is False.

        train updates the BatchNorm moving statistics in ``aux`` in place (momentum, biased batch variance):
        the values MXNet 1.9.1 holds after the step; MXNet itself writes them in its backward pass, so a
        training forward never followed by backward leaves MXNet's unchanged but changes these.
        """
        x = np.ascontiguousarray(x, dtype=F32)
        if x.shape[1:] != self.feature_shape:
            raise ValueError(f"tail input of shape {x.shape[1:]}, expected {self.feature_shape}")
        P = {k: np.asarray(params[k], dtype=F32) for k in self.param_shapes}
        A = {}
        for k in self.aux_shapes:
            a = aux[k]
            if not isinstance(a, np.ndarray) or a.dtype != F32:
                raise TypeError(f"aux {k} must be a float32 numpy array (it is updated in place)")
            A[k] = a
        vals = {_X: x}
        tape = [] if train else None
        for idx, st in enumerate(self._steps):
            out, cache = st.impl.forward([vals[s] for s in st.srcs], P, A, train, rng, self._own[idx])
            vals[st.nid] = out
            if train:
                tape.append(cache)
            else:
                for s in set(st.srcs):
                    if self._last_use.get(s) == idx and s not in (_X, self._head):
                        del vals[s]
        out = vals[self._head]
        if train:
            tape = (tape, x.shape[0])
        return out, tape

    def backward(self, params: dict, tape, dout: np.ndarray) -> dict[str, np.ndarray]:
        """Gradients of sum(dout * out) w.r.t. every name in param_shapes (float32)."""
        return self._backward(params, tape, dout, want_input=False)[0]

    def backward_with_input(self, params: dict, tape, dout: np.ndarray):
        """(gradients as backward, d(sum(dout * out))/d(input)): for tests."""
        return self._backward(params, tape, dout, want_input=True)

    def _backward(self, params, tape, dout, want_input):
        if tape is None:
            raise ValueError("backward needs the tape of a forward with train=True")
        caches, _n = tape
        P = {k: np.asarray(params[k], dtype=F32) for k in self.param_shapes}
        grads = {self._head: np.ascontiguousarray(dout, dtype=F32)}
        owned = set()  # sources whose gradient array is new, made here: its step may overwrite it
        pgrads: dict[str, np.ndarray] = {}
        for st, cache in zip(reversed(self._steps), reversed(caches)):
            g = grads.pop(st.nid, None)
            if g is None:
                continue
            need = [s != _X or want_input for s in st.srcs]
            dins, dps = st.impl.backward(g, cache, P, need, st.nid in owned)
            for s, d in zip(st.srcs, dins):
                if d is None:
                    continue
                if s in grads:
                    grads[s] = grads[s] + d
                    owned.add(s)
                else:
                    grads[s] = d
                    if st.impl.fresh_grads:
                        owned.add(s)
            for k, d in dps.items():
                pgrads[k] = d if k not in pgrads else pgrads[k] + d
        out = {k: np.ascontiguousarray(pgrads.get(k, np.zeros(s, F32)), dtype=F32).reshape(s)
               for k, s in self.param_shapes.items()}
        return out, grads.get(_X)
