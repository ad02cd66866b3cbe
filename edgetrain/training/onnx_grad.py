"""Gradients of chosen initializers of an ONNX inference graph, in NumPy, keeping only what backward needs.

Fine-tuning on the device starts from the ONNX file ``edgetrain export`` writes (opset 13, weights as
initializers, NCHW float32) and must not need MXNet or onnxruntime-training there. This module runs that
graph forward in NumPy and back-propagates dL/d(output) to the initializers that train.

What the forward keeps (the *tape*) is decided per node by what its backward needs for the trainable set,
following TinyTL (Cai et al., "TinyTL: Reduce Memory, Not Parameters for Efficient On-Device Learning",
NeurIPS 2020) and MobileTL (Chiang et al., "MobileTL: On-device Transfer Learning with Inverted Residual
Blocks", AAAI 2023):

- the gradient of a bias (Conv/Gemm ``B``/``C``, BatchNorm shift ``B``) is a sum of the output gradient:
  nothing is kept for it;
- the input gradient of a frozen Conv is a transposed convolution with its weight, of a frozen BatchNorm a
  per-channel multiply by scale/sqrt(var + eps): the weights are the model, not the tape;
- ReLU and Clip (ReLU6) pass the gradient where the input was inside the range: a 1-bit mask
  (``np.packbits``), not the float activation;
- MaxPool keeps which tap of its window won (one byte per output element);
- only a layer whose *weight* trains (a Conv/Gemm weight, a BatchNorm scale) keeps its float input, and a
  Mul or MatMul of two activations keeps the operand the other's gradient is multiplied by;
- nodes no trainable initializer feeds are not differentiated at all and keep nothing.

So in ``bias`` mode the tape is 1 bit per ReLU/ReLU6 activation plus a byte per MaxPool output, far below
the float activations autograd would store; :attr:`Tape.bytes_per_sample` measures it for the memory planner.

Everything is float32 unless ``dtype=np.float64`` is asked (the finite-difference tests). A graph with an op
or attribute value this engine cannot differentiate raises :class:`Unsupported` with one line naming the op,
the node and why. Unnamed nodes (the exporter leaves Conv unnamed) are named by their first output.
"""
from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .. import _lazy
from ..errors import UsageError
from . import roles

MODES = ("bias", "head", "bias+head")


class Unsupported(UsageError):
    """The graph has an op or attribute value this engine cannot run or differentiate (one line, exit 2)."""

    def __init__(self, op: str, node: str, why: str):
        self.op, self.node, self.why = op, node, why
        super().__init__(f"cannot differentiate {op} node {node!r}: {why}")


class NotEmitted(Unsupported):
    """An op whose backward has no ONNX form here (ort_train): its graph trains with NumPy's backward instead."""


# ------------------------------------------------------------------------------------------------ the tape
class BitMask:
    """A boolean array packed 8 to a byte: all that ReLU/Clip need for backward."""

    __slots__ = ("bits", "shape")

    def __init__(self, mask: np.ndarray):
        self.shape = mask.shape
        self.bits = np.packbits(mask, axis=None)

    @property
    def nbytes(self) -> int:
        return self.bits.nbytes

    @property
    def dtype(self) -> str:
        return "bit"

    def unpack(self) -> np.ndarray:
        return np.unpackbits(self.bits, count=int(np.prod(self.shape))).reshape(self.shape).view(bool)


@dataclass(frozen=True)
class Kept:
    """One thing the tape holds for backward: which node, what it is, how big."""

    node: str
    op: str
    kind: str        # "mask", "argmax", "input", "operand", "output"
    dtype: str
    shape: tuple
    nbytes: int


class Tape:
    """What one forward kept for its backward, per node (shapes are metadata and cost no bytes)."""

    def __init__(self, batch: int):
        self.batch = batch
        self.saved: dict[int, dict] = {}
        self.activation_bytes = 0   # every value the forward produced: what storing activations would cost
        self.tape_bytes = 0         # what the forward kept, as it ended (backward then releases it node by node)
        self.largest_bytes = 0      # the largest single value the forward produced
        self.peak_bytes = 0         # the most held at once (live values + the tape), forward or backward
        self.labels: dict[int, tuple] = {}
        self.stats: dict[int, tuple] = {}   # batch_stats: per BatchNorm node, the batch's (mean, var, values)

    @property
    def nbytes(self) -> int:
        """What the tape holds now."""
        return sum(k.nbytes for k in self.kept())

    @property
    def bytes_per_sample(self) -> float:
        return self.tape_bytes / self.batch

    def kept(self) -> list[Kept]:
        found = []
        for index, saved in self.saved.items():
            node, op = self.labels[index]
            for kind, value in saved.items():
                if hasattr(value, "nbytes"):
                    found.append(Kept(node, op, kind, str(value.dtype), tuple(value.shape), int(value.nbytes)))
        return found


# --------------------------------------------------------------------------------------------- small maths
def _unbroadcast(g: np.ndarray, shape: tuple) -> np.ndarray:
    """The gradient of an operand numpy broadcast to ``g.shape``: summed back over the broadcast axes."""
    if g.shape == tuple(shape):
        return g
    g = g.sum(axis=tuple(range(g.ndim - len(shape))))
    for axis in (i for i, s in enumerate(shape) if s == 1 and g.shape[i] != 1):
        if g.shape[axis] <= 4:   # a few slices added: ~4x faster than a reduction along an inner axis
            parts = [g[(slice(None),) * axis + (slice(k, k + 1),)] for k in range(g.shape[axis])]
            g = parts[0] + parts[1] if len(parts) > 1 else parts[0]
            for part in parts[2:]:
                g += part
        else:
            g = g.sum(axis=axis, keepdims=True)
    return g


def _per_channel(v: np.ndarray, ndim: int) -> np.ndarray:
    return v.reshape((-1,) + (1,) * (ndim - 2))


def _normalised_backward(dy, scale, xhat, inv, over: tuple, need: tuple) -> list:
    """The gradients of x, the scale and the shift of y = xhat scale + shift, xhat = (x - mean) inv by x's own
    statistics over the axes ``over`` (BatchNorm in training mode: the batch and space; InstanceNorm: space)."""
    sums, grads = (0,) + tuple(range(2, dy.ndim)), [None, None, None]
    if need[2]:
        grads[2] = dy.sum(axis=sums)
    if need[1]:
        grads[1] = (dy * xhat).sum(axis=sums)
    if need[0]:
        g = dy * _per_channel(scale, dy.ndim)
        grads[0] = inv * (g - g.mean(axis=over, keepdims=True) - xhat * (g * xhat).mean(axis=over, keepdims=True))
    return grads


def _emit_normalised(e, dy: str, d: str | None, inv: str | None, gain: str | None, over: list, rank: int,
                     need: tuple) -> list:
    """:func:`_normalised_backward` as ONNX nodes (ort_train's emitter ``e``), from the centred input ``d`` (xhat
    is d inv), ``inv`` (1/deviation, constant over ``over``) and ``gain`` (scale inv): with ga = dy gain,
    dx = ga - mean(ga) - d (inv^2 mean(ga d)), five passes over the values where the normalised input's form took
    six, and the forward makes no xhat."""
    grads: list = [None, None, None]
    if need[2]:
        grads[2] = e.channel_sum(dy, rank)
    if need[1]:
        if 0 in over:   # one 1/deviation per channel (BatchNorm): summed first, then scaled
            grads[1] = e.node("Mul", [e.channel_sum(e.node("Mul", [dy, d]), rank),
                                      e.node("Reshape", [inv, e.ints([-1])])])
        else:
            grads[1] = e.channel_sum(e.node("Mul", [dy, e.node("Mul", [d, inv])]), rank)
    if need[0]:
        ga = e.node("Mul", [dy, gain])
        k = e.node("Mul", [e.reduce_mean(e.node("Mul", [ga, d]), over), e.node("Mul", [inv, inv])])
        grads[0] = e.node("Sub", [e.node("Sub", [ga, e.node("Mul", [d, k])]), e.reduce_mean(ga, over)])
    return grads


@dataclass(frozen=True)
class _Window:
    """The sliding window of a 2-D Conv or pool: kernel taps, strides, pads (top, left, bottom, right)."""

    kernel: tuple
    strides: tuple
    pads: tuple
    dilations: tuple

    def padded(self, h: int, w: int) -> tuple:
        top, left, bottom, right = self.pads
        return h + top + bottom, w + left + right

    def out_hw(self, h: int, w: int) -> tuple:
        (kh, kw), (sh, sw), (dh, dw), (hp, wp) = self.kernel, self.strides, self.dilations, self.padded(h, w)
        return (hp - dh * (kh - 1) - 1) // sh + 1, (wp - dw * (kw - 1) - 1) // sw + 1

    def output_padding(self, h: int, w: int) -> list:
        """A ConvTranspose's output_padding that gives back an (h, w) input from this window's output (a strided
        window drops the last rows and columns it does not reach)."""
        (kh, kw), (sh, sw), (dh, dw) = self.kernel, self.strides, self.dilations
        top, left, bottom, right = self.pads
        ho, wo = (int(v) for v in self.out_hw(h, w))
        return [h - (sh * (ho - 1) + dh * (kh - 1) + 1 - top - bottom),
                w - (sw * (wo - 1) + dw * (kw - 1) + 1 - left - right)]

    def transpose_attrs(self, h: int, w: int) -> dict:
        """ConvTranspose's attributes for the transposed window back onto an (h, w) input."""
        return {"kernel_shape": list(self.kernel), "strides": list(self.strides), "pads": list(self.pads),
                "dilations": list(self.dilations), "output_padding": self.output_padding(h, w)}

    def pad(self, x: np.ndarray, fill: float = 0.0) -> np.ndarray:
        top, left, bottom, right = self.pads
        if not any(self.pads):
            return x
        return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=fill)

    def unpad(self, gp: np.ndarray, h: int, w: int) -> np.ndarray:
        top, left = self.pads[:2]
        return gp[:, :, top:top + h, left:left + w]

    def taps(self):
        for i in range(self.kernel[0]):
            for j in range(self.kernel[1]):
                yield i * self.kernel[1] + j, i, j

    def view(self, xp: np.ndarray, i: int, j: int, out_hw: tuple) -> np.ndarray:
        """The strided view of the padded input that tap (i, j) meets at every output position."""
        (sh, sw), (dh, dw), (ho, wo) = self.strides, self.dilations, out_hw
        return xp[:, :, i * dh:i * dh + sh * (ho - 1) + 1:sh, j * dw:j * dw + sw * (wo - 1) + 1:sw]

    def im2col(self, xp: np.ndarray, groups: int, out_hw: tuple) -> np.ndarray:
        """(G, Cg*kh*kw, N*Ho*Wo) columns, contiguous: one BLAS matmul per group then does the convolution
        for the whole batch (a matmul broadcast over the batch ran ~16x slower here: no BLAS for it)."""
        n, c = xp.shape[:2]
        sn, sc, sh_, sw_ = xp.strides
        (kh, kw), (sh, sw), (dh, dw), (ho, wo) = self.kernel, self.strides, self.dilations, out_hw
        cg = c // groups
        view = as_strided(xp, (groups, cg, kh, kw, n, ho, wo),
                          (cg * sc, sc, dh * sh_, dw * sw_, sn, sh * sh_, sw * sw_), writeable=False)
        return np.ascontiguousarray(view).reshape(groups, cg * kh * kw, n * ho * wo)


# ------------------------------------------------------------------------------------------------ the ops
class _Op:
    """One node: attributes read and checked at load; forward keeps what backward needs for ``self.need``.

    ``need[i]`` says the gradient of input i is wanted (a trainable initializer or an activation a trainable
    initializer feeds). ``backward`` gets the output gradient, what forward kept and the constant inputs
    (current initializer values; None for activations) and returns one gradient (or None) per input.
    """

    attrs: dict = {}           # attribute name -> accepted values (None: any)
    differentiable: tuple[int, ...] = (0,)   # input positions a gradient can flow to
    constant_inputs: tuple[int, ...] = ()    # input positions that must be initializers or Constant outputs

    def __init__(self, node, label: str, consts: dict):
        self.op, self.label = node.op_type, label
        self.a: dict = {}
        for attr in node.attribute:
            value = _lazy.from_import("onnx", "helper").get_attribute_value(attr)
            if attr.name not in self.attrs:
                raise Unsupported(self.op, label, f"attribute {attr.name} is not implemented")
            if self.attrs[attr.name] is not None and value not in self.attrs[attr.name]:
                raise Unsupported(self.op, label, f"{attr.name}={value!r} is not implemented "
                                                  f"(only {', '.join(map(repr, self.attrs[attr.name]))})")
            self.a[attr.name] = value
        for i in self.constant_inputs:
            if i < len(node.input) and node.input[i] and node.input[i] not in consts:
                raise Unsupported(self.op, label, f"input {i} ({node.input[i]}) is computed by the graph; "
                                                  "it must be an initializer")
        self.need = (False,) * len(node.input)
        self.is_const = tuple(bool(name) and name in consts for name in node.input)

    def refuse(self, why: str):
        raise Unsupported(self.op, self.label, why)

    def forward(self, xs: list) -> tuple:
        raise NotImplementedError

    def backward(self, dy, saved: dict, consts: list) -> list:
        raise NotImplementedError

    # -- the tape from a forward run elsewhere (ONNX Runtime: ort_forward)
    def kept_inputs(self) -> tuple | None:
        """Which inputs' values the tape needs when another engine ran the forward; None: all of them, and
        :meth:`keep` runs this op's forward in NumPy (an op whose tape is not simply some of its inputs)."""
        return None

    def keep(self, xs: list, shapes: list) -> dict:
        """What :meth:`forward` would have kept, from the inputs :meth:`kept_inputs` names (others None) and
        every input's shape."""
        return self.forward(xs)[1]

    # -- the backward as ONNX nodes (ort_train: forward and backward in one ONNX Runtime graph)
    def emit(self, e, node, dy: str) -> list:
        """:meth:`backward` written as ONNX nodes through ``e`` (ort_train's emitter: ``e.node``, ``e.const``,
        ``e.dims``, ``e.shape``, ``e.mask``, ``e.unbroadcast``), from the value ``dy``; one gradient value name
        (or None) per input. What the NumPy backward keeps on the tape, this reads from the forward's values
        (masks computed beside the node, kept inputs by name). An op with no ONNX form raises NotEmitted."""
        raise NotEmitted(self.op, self.label, "no ONNX form of its backward")


class _ShapeOnly(_Op):
    """An op whose backward needs only its first input's shape."""

    def kept_inputs(self):
        return ()

    def keep(self, xs, shapes):
        return {"shape": tuple(shapes[0])}


def _window_of(op: _Op, kernel) -> _Window:
    kernel = tuple(op.a.get("kernel_shape", kernel))
    if len(kernel) != 2:
        op.refuse(f"a {len(kernel)}-D window (only 2-D, NCHW)")
    pads = tuple(op.a.get("pads", (0, 0, 0, 0)))
    return _Window(kernel, tuple(op.a.get("strides", (1, 1))), pads, tuple(op.a.get("dilations", (1, 1))))


class _Conv(_Op):
    attrs = {"auto_pad": (b"NOTSET",), "dilations": None, "group": None, "kernel_shape": None, "pads": None,
             "strides": None}
    differentiable = (0, 1, 2)
    constant_inputs = (1, 2)

    def __init__(self, node, label, consts):
        super().__init__(node, label, consts)
        w = consts[node.input[1]]
        if w.ndim != 4:
            self.refuse(f"a {w.ndim - 2}-D convolution (only 2-D, NCHW)")
        self.win = _window_of(self, w.shape[2:])
        self.groups = int(self.a.get("group", 1))
        self.depthwise = _Depthwise(self.win) if w.shape[1] == 1 else None
        # the input gradient (a transposed convolution) by another engine: (dy, w, input shape) -> dx; None:
        # NumPy's, below (ort_forward sets ONNX Runtime's ConvTranspose, tested equal to this one)
        self.transposed = None

    def kept_inputs(self):
        return (0,) if self.need[1] else ()

    def keep(self, xs, shapes):
        return {"input": xs[0], "shape": tuple(shapes[0])} if self.need[1] else {"shape": tuple(shapes[0])}

    def _geometry(self, shape, w):
        n, c, h, wd = shape
        return n, self.groups, w.shape[0] // self.groups, c // self.groups, self.win.out_hw(h, wd)

    def forward(self, xs):
        x, w, b = (xs + [None])[:3]
        n, g, mg, cg, out_hw = self._geometry(x.shape, w)
        xp = self.win.pad(x)
        if self.depthwise:
            y = self.depthwise.forward(self._repeat(xp, mg), w, out_hw)
        else:
            y = np.matmul(w.reshape(g, mg, -1), self.win.im2col(xp, g, out_hw))  # (G, mg, N*Ho*Wo)
            y = y.reshape(g * mg, n, *out_hw).transpose(1, 0, 2, 3)
        if b is not None:
            y += _per_channel(b, 4)
        saved = {"input": x} if self.need[1] else {}
        saved["shape"] = x.shape
        return y, saved

    @staticmethod
    def _repeat(xp, mg):
        """A depthwise multiplier as plain depthwise: input channel c feeds outputs c*mg .. c*mg+mg-1."""
        return xp if mg == 1 else np.repeat(xp, mg, axis=1)

    def backward(self, dy, saved, consts):
        w = consts[1]
        shape = saved["shape"]
        n, g, mg, cg, out_hw = self._geometry(shape, w)
        grads = [None, None, None]
        if len(self.need) > 2 and self.need[2]:
            grads[2] = dy.sum(axis=(0, 2, 3))
        if self.need[1]:
            xp = self.win.pad(saved["input"])
            grads[1] = (self.depthwise.weight_grad(dy, self._repeat(xp, mg), out_hw) if self.depthwise else
                        self._weight_grad(dy, xp, w, g, mg, out_hw))
        if self.need[0]:
            grads[0] = self._input_grad(dy, w, shape, g, mg, cg, out_hw)
        return grads

    @staticmethod
    def _by_group(dy, g, mg):
        """dy (N, G*mg, Ho, Wo) as (G, mg, N*Ho*Wo), the layout of im2col's columns."""
        return np.ascontiguousarray(dy.transpose(1, 0, 2, 3)).reshape(g, mg, -1)

    def _weight_grad(self, dy, xp, w, g, mg, out_hw):
        cols = self.win.im2col(xp, g, out_hw)
        return np.matmul(self._by_group(dy, g, mg), cols.transpose(0, 2, 1)).reshape(w.shape)

    def _input_grad(self, dy, w, shape, g, mg, cg, out_hw):
        """The transposed convolution: each tap's contribution scattered back onto the padded input."""
        if self.transposed is not None:
            return self.transposed(dy, w, shape)
        n, c, h, wd = shape
        padded = self.win.padded(h, wd)
        if self.depthwise:
            dxp = self.depthwise.input_grad(dy, w, padded, out_hw)
            dxp = dxp if mg == 1 else dxp.reshape(n, c, mg, *padded).sum(axis=2)
        else:
            kh, kw = self.win.kernel
            dcols = np.matmul(w.reshape(g, mg, -1).transpose(0, 2, 1), self._by_group(dy, g, mg))
            dcols = dcols.reshape(g * cg, kh, kw, n, *out_hw)  # (C, kh, kw, N, Ho, Wo)
            dxp = np.zeros((n, c) + padded, dy.dtype)
            for _, i, j in self.win.taps():
                self.win.view(dxp, i, j, out_hw)[...] += dcols[:, i, j].transpose(1, 0, 2, 3)
        return self.win.unpad(dxp, h, wd)

    def emit(self, e, node, dy):
        grads = [None] * len(node.input)
        x, w = node.input[:2]
        _, h, wd = e.dims(x)[1:]
        if len(self.need) > 2 and self.need[2]:
            grads[2] = e.channel_sum(dy, 4)
        if self.need[0]:
            grads[0] = self._emit_input_grad(e, dy, w, h, wd)
        if self.need[1]:
            grads[1] = self._emit_weight_grad(e, x, dy, e.const_shape(w))
        return grads

    def _emit_input_grad(self, e, dy, w, h, wd):
        """A depthwise Conv of stride 1 (one input channel per output channel) goes back as the same depthwise Conv
        with the kernel turned 180° and the pads k-1-p: ORT's ConvTranspose loops over the groups one small GEMM at a
        time; its depthwise Conv was 1.4-24x faster (32 samples of 96x48x48: 26.1 ms -> 18.7; of 960x3x3: 13.2 ->
        0.5). A pointwise one: a Conv of the transposed weight. Any other Conv: ConvTranspose with the forward's weight."""
        wshape = e.const_shape(w)
        kh, kw = self.win.kernel
        pads = [kh - 1 - self.win.pads[0], kw - 1 - self.win.pads[1], kh - 1 - self.win.pads[2],
                kw - 1 - self.win.pads[3]]
        if (self.depthwise and wshape[0] == self.groups and self.win.strides == (1, 1)
                and self.win.dilations == (1, 1) and min(pads) >= 0):
            if w in e.grad.trainable:   # turned at each run (a few values per channel)
                turned = e.node("Slice", [w, e.ints([-1, -1]), e.ints([-kh - 1, -kw - 1]), e.ints([2, 3]),
                                          e.ints([-1, -1])])
            else:
                turned = e.const(np.ascontiguousarray(e.const_value(w)[:, :, ::-1, ::-1]).astype(np.float32))
            return e.node("Conv", [dy, turned], group=self.groups, kernel_shape=[kh, kw], pads=pads)
        if (kh, kw) == (1, 1) and self.groups == 1 and self.win.strides == (1, 1) and not any(self.win.pads):
            # a pointwise Conv goes back as a pointwise Conv of the transposed weight (one GEMM in MLAS): ORT's
            # ConvTranspose took 1.7-9x longer (32 samples of 1280x3x3 from 320 channels: 20.5 ms -> 2.2)
            return e.node("Conv", [dy, e.node("Transpose", [w], perm=[1, 0, 2, 3])], kernel_shape=[1, 1])
        return e.node("ConvTranspose", [dy, w], group=self.groups, **self.win.transpose_attrs(h, wd))

    def _emit_weight_grad(self, e, x, dy, wshape):
        """dW as one Conv: the input, channels and batch swapped ((Cg, G*N, H, W)), convolved group by group with
        dy as the kernel ((M, N, Ho, Wo)), the forward's strides as dilations and its dilations as strides;
        the first kh x kw of its output, channels first again, is dW."""
        c, h, wd = e.dims(x)[1:]
        g = self.groups
        cg = c // g
        kh, kw = self.win.kernel
        if (kh, kw) == (1, 1) and g == 1 and self.win.strides == (1, 1) and not any(self.win.pads):
            return self._emit_pointwise_weight_grad(e, x, dy, c, h * wd, wshape)
        xs = e.node("Reshape", [x, e.ints([0, g, cg, h, wd])])
        xs = e.node("Reshape", [e.node("Transpose", [xs], perm=[2, 1, 0, 3, 4]), e.ints([cg, -1, h, wd])])
        kernel = e.node("Transpose", [dy], perm=[1, 0, 2, 3])
        dw = e.node("Conv", [xs, kernel], group=g, strides=list(self.win.dilations), dilations=list(self.win.strides),
                    pads=list(self.win.pads))
        dw = e.node("Slice", [dw, e.ints([0, 0]), e.ints([kh, kw]), e.ints([2, 3])])
        return e.node("Transpose", [dw], perm=[1, 0, 2, 3])

    @staticmethod
    def _emit_pointwise_weight_grad(e, x, dy, c, hw, wshape):
        """A 1x1 Conv's dW (M, C) = the sum over samples and positions of dy (M) times x (C): per sample one MatMul
        (N, M, HW) @ (N, HW, C), summed over N, where a sample has many positions; else one Gemm of (M, N*HW) and
        (C, N*HW). Either ran 3-10x faster than the convolution below (32 samples of 16 -> 96 channels at 48x48:
        84 ms -> 8; of 320 -> 1280 at 3x3: 37 -> 9). The smaller of x and dy is the one transposed."""
        m = wshape[0]
        if hw >= 64:
            d3, x3 = e.node("Reshape", [dy, e.ints([0, 0, -1])]), e.node("Reshape", [x, e.ints([0, 0, -1])])
            if c <= m:   # (N, M, HW) @ (N, HW, C)
                dw = e.node("MatMul", [d3, e.node("Transpose", [x3], perm=[0, 2, 1])])
                dw = e.node("ReduceSum", [dw, e.ints([0])], keepdims=0)
            else:        # ((N, C, HW) @ (N, HW, M)) summed, transposed
                dw = e.node("MatMul", [x3, e.node("Transpose", [d3], perm=[0, 2, 1])])
                dw = e.node("Transpose", [e.node("ReduceSum", [dw, e.ints([0])], keepdims=0)], perm=[1, 0])
        else:
            d2 = e.node("Reshape", [e.node("Transpose", [dy], perm=[1, 0, 2, 3]), e.ints([m, -1])])
            x2 = e.node("Reshape", [e.node("Transpose", [x], perm=[1, 0, 2, 3]), e.ints([c, -1])])
            dw = e.node("Gemm", [d2, x2], transB=1)
        return e.node("Reshape", [dw, e.ints(list(wshape))])


class _Depthwise:
    """A convolution with one input channel per output channel, one multiply-add per kernel tap.

    MobileNetV2 spends most of its time here, and it is memory-bound: (sample, channel) rows are processed
    in blocks of about ``BLOCK`` output elements, so each block's taps stay in a core's cache (measured
    here: 2x faster than whole-batch passes at 160x160, batch 8).
    """

    BLOCK = 1 << 17

    def __init__(self, win: _Window):
        self.win = win

    def _step(self, out_hw: tuple) -> int:
        return max(1, self.BLOCK // (out_hw[0] * out_hw[1]))

    def _blocks(self, rows: int, out_hw: tuple):
        step = self._step(out_hw)
        for start in range(0, rows, step):
            yield slice(start, start + step)

    @staticmethod
    def _rows(a: np.ndarray) -> np.ndarray:
        """(N, C, H, W) as N*C single-channel images, so a block is any run of (sample, channel) rows."""
        return a.reshape(a.shape[0] * a.shape[1], 1, *a.shape[2:])

    @staticmethod
    def _row_taps(w: np.ndarray, n: int) -> np.ndarray:
        return np.tile(w.reshape(w.shape[0], -1), (n, 1))[:, :, None, None, None]   # (N*C, taps, 1, 1, 1)

    def forward(self, xp, w, out_hw):
        n, c = xp.shape[:2]
        rows, taps = self._rows(xp), self._row_taps(w, n)
        y = np.empty((n * c, 1) + out_hw, xp.dtype)
        tmp = np.empty_like(y[:self._step(out_hw)])
        for block in self._blocks(n * c, out_hw):
            yb, xb, wb = y[block], rows[block], taps[block]
            t = tmp[:len(yb)]
            for k, i, j in self.win.taps():
                if k == 0:
                    np.multiply(self.win.view(xb, i, j, out_hw), wb[:, k], out=yb)
                else:
                    np.multiply(self.win.view(xb, i, j, out_hw), wb[:, k], out=t)
                    yb += t
        return y.reshape(n, c, *out_hw)

    def input_grad(self, dy, w, padded, out_hw):
        n, c = dy.shape[:2]
        rows, taps = self._rows(dy), self._row_taps(w, n)
        dxp = np.zeros((n * c, 1) + padded, dy.dtype)
        tmp = np.empty_like(rows[:self._step(out_hw)])
        for block in self._blocks(n * c, out_hw):
            gb, db, wb = rows[block], dxp[block], taps[block]
            t = tmp[:len(gb)]
            for k, i, j in self.win.taps():
                np.multiply(gb, wb[:, k], out=t)
                self.win.view(db, i, j, out_hw)[...] += t
        return dxp.reshape(n, c, *padded)

    def weight_grad(self, dy, xp, out_hw):
        n, c = dy.shape[:2]
        rows, xrows = self._rows(dy), self._rows(xp)
        per_row = np.empty((n * c, self.win.kernel[0] * self.win.kernel[1]), dy.dtype)
        for block in self._blocks(n * c, out_hw):
            for k, i, j in self.win.taps():
                per_row[block, k] = np.einsum("rchw,rchw->r", rows[block], self.win.view(xrows[block], i, j, out_hw))
        return per_row.reshape(n, c, 1, *self.win.kernel).sum(axis=0)


class _BatchNorm(_Op):
    attrs = {"epsilon": None, "momentum": None, "training_mode": (0,)}
    differentiable = (0, 1, 2)
    constant_inputs = (1, 2, 3, 4)

    def __init__(self, node, label, consts):
        super().__init__(node, label, consts)
        if len([o for o in node.output if o]) > 1:
            self.refuse("running-statistics outputs are the training form (only inference)")
        self.batch_stats = False   # GradGraph's batch_stats: training steps normalise by the batch's statistics

    def kept_inputs(self):
        return (0,) if self.need[1] else ()

    def keep(self, xs, shapes):
        return {"input": xs[0]} if self.need[1] else {}

    def _gain(self, scale, var):
        return scale / np.sqrt(var + var.dtype.type(self.a.get("epsilon", 1e-5)))

    def forward(self, xs):
        x, scale, b, mean, var = xs
        a = self._gain(scale, var)
        y = x * _per_channel(a, x.ndim)
        y += _per_channel(b - mean * a, x.ndim)
        return y, ({"input": x} if self.need[1] else {})

    def forward_batch(self, xs) -> tuple:
        """Training mode (``batch_stats``): normalised by the batch's own mean and (biased) variance per channel.
        Returns the output, what backward keeps (the normalised input and the inverse deviation) and the
        batch's (mean, variance, values per channel per sample) for the running statistics."""
        x, scale, b = xs[:3]
        axes = (0,) + tuple(range(2, x.ndim))
        mean = x.mean(axis=axes)
        d = x - _per_channel(mean, x.ndim)
        var = (d * d).mean(axis=axes)
        inv = 1 / np.sqrt(var + var.dtype.type(self.a.get("epsilon", 1e-5)))
        d *= _per_channel(inv, x.ndim)
        y = d * _per_channel(scale, x.ndim) + _per_channel(b, x.ndim)
        return y, {"xhat": d, "inv": inv}, (mean, var, int(np.prod(x.shape[2:])))

    def backward(self, dy, saved, consts):
        scale, _, mean, var = consts[1:]
        axes = (0,) + tuple(range(2, dy.ndim))
        if "xhat" in saved:   # training mode: the batch's statistics depend on the input too
            return _normalised_backward(dy, scale, saved["xhat"], _per_channel(saved["inv"], dy.ndim), axes,
                                        self.need) + [None, None]
        grads = [None] * 5
        if self.need[2]:
            grads[2] = dy.sum(axis=axes)
        if self.need[1]:
            xhat = (saved["input"] - _per_channel(mean, dy.ndim)) * _per_channel(self._gain(var.dtype.type(1), var), dy.ndim)
            grads[1] = (dy * xhat).sum(axis=axes)
        if self.need[0]:
            grads[0] = dy * _per_channel(self._gain(scale, var), dy.ndim)
        return grads

    def emit(self, e, node, dy):
        x, scale, _, mean, var = node.input
        rank = len(e.dims(x))
        if self.batch_stats:   # training mode: ort_train wrote the forward (the centred input, 1/deviation, gain)
            d, inv, gain = e.batch_norm[node.output[0]]
            return _emit_normalised(e, dy, d, inv, gain, [0] + list(range(2, rank)), rank, self.need) + [None] * 2
        var_c = e.const_value(var)
        inv = _per_channel(1 / np.sqrt(var_c + var_c.dtype.type(self.a.get("epsilon", 1e-5))), rank)
        grads = [None] * 5
        if self.need[2]:
            grads[2] = e.channel_sum(dy, rank)
        if self.need[1]:
            xhat = e.node("Mul", [e.node("Sub", [x, e.const(_per_channel(e.const_value(mean), rank))]), e.const(inv)])
            grads[1] = e.channel_sum(e.node("Mul", [dy, xhat]), rank)
        if self.need[0]:
            if self.need[1]:   # the scale trains: the gain from its current value
                gain = e.node("Mul", [e.node("Reshape", [scale, e.ints([-1] + [1] * (rank - 2))]), e.const(inv)])
            else:
                gain = e.const((_per_channel(e.const_value(scale), rank) * inv).astype(np.float32))
            grads[0] = e.node("Mul", [dy, gain])
        return grads


class _Relu(_Op):
    def mask_bounds(self, consts: list) -> tuple:
        """(low, high): the backward passes the gradient where low < input < high (None: unbounded)."""
        return 0.0, None

    def forward(self, xs):
        x = xs[0]
        return np.maximum(x, 0), ({"mask": BitMask(x > 0)} if self.need[0] else {})

    def backward(self, dy, saved, consts):
        return [dy * saved["mask"].unpack()]

    def emit(self, e, node, dy):
        return [e.masked(dy, e.mask(node, self))]


class _Clip(_Op):
    constant_inputs = (1, 2)

    def mask_bounds(self, consts):
        lo, hi = (consts + [None, None])[1:3]
        return (None if lo is None else float(lo)), (None if hi is None else float(hi))

    def forward(self, xs):
        x, lo, hi = (xs + [None, None])[:3]
        lo = -np.inf if lo is None else lo
        hi = np.inf if hi is None else hi
        y = np.maximum(x, lo)   # np.clip is several times slower on numpy 1.23
        np.minimum(y, hi, out=y)
        return y, ({"mask": BitMask((x > lo) & (x < hi))} if self.need[0] else {})

    def backward(self, dy, saved, consts):
        return [dy * saved["mask"].unpack()] + [None] * (len(self.need) - 1)

    def emit(self, e, node, dy):
        return [e.masked(dy, e.mask(node, self))] + [None] * (len(self.need) - 1)


class _Add(_Op):
    differentiable = (0, 1)

    def forward(self, xs):
        return xs[0] + xs[1], {"shapes": (xs[0].shape, xs[1].shape)}

    def kept_inputs(self):
        return ()

    def keep(self, xs, shapes):
        return {"shapes": (tuple(shapes[0]), tuple(shapes[1]))}

    def backward(self, dy, saved, consts):
        return [_unbroadcast(dy, s) if need else None for s, need in zip(saved["shapes"], self.need)]

    def emit(self, e, node, dy):
        out = e.dims(node.output[0])
        return [e.unbroadcast(dy, out, name) if need else None for name, need in zip(node.input, self.need)]


class _Mul(_Op):
    differentiable = (0, 1)

    def kept_inputs(self):
        return tuple(i for i in (0, 1) if self.need[1 - i] and not self.is_const[i])

    def keep(self, xs, shapes):
        saved = {"shapes": (tuple(shapes[0]), tuple(shapes[1]))}
        saved.update({f"operand{i}": xs[i] for i in self.kept_inputs()})
        return saved

    def forward(self, xs):
        saved = {"shapes": (xs[0].shape, xs[1].shape)}
        # the gradient of one operand is multiplied by the other: keep it only if it is an activation
        for i in (0, 1):
            if self.need[1 - i] and not self.is_const[i]:
                saved[f"operand{i}"] = xs[i]
        return xs[0] * xs[1], saved

    def backward(self, dy, saved, consts):
        ops = [consts[i] if self.is_const[i] else saved.get(f"operand{i}") for i in (0, 1)]
        return [_unbroadcast(dy * ops[1 - i], saved["shapes"][i]) if self.need[i] else None for i in (0, 1)]

    def emit(self, e, node, dy):
        out = e.dims(node.output[0])
        return [e.unbroadcast(e.node("Mul", [dy, node.input[1 - i]]), out, node.input[i]) if self.need[i] else None
                for i in (0, 1)]


class _GlobalAveragePool(_ShapeOnly):
    def forward(self, xs):
        x = xs[0]
        return x.mean(axis=(2, 3), keepdims=True), {"shape": x.shape}

    def backward(self, dy, saved, consts):
        shape = saved["shape"]
        return [np.broadcast_to(dy / dy.dtype.type(shape[2] * shape[3]), shape)]

    def emit(self, e, node, dy):
        _, _, h, w = e.dims(node.input[0])
        return [e.node("Expand", [e.node("Mul", [dy, e.const(np.float32(1 / (h * w)))]), e.ints([1, 1, h, w])])]


class _AveragePool(_ShapeOnly):
    attrs = {"auto_pad": (b"NOTSET",), "ceil_mode": (0,), "count_include_pad": (0, 1), "kernel_shape": None,
             "pads": None, "strides": None}

    def __init__(self, node, label, consts):
        super().__init__(node, label, consts)
        self.win = _window_of(self, ())

    def _counts(self, h, w, dtype, out_hw):
        """How many real (not padding) inputs each window averages; ONNX's count_include_pad=0 default."""
        if self.a.get("count_include_pad", 0):
            return dtype.type(self.win.kernel[0] * self.win.kernel[1])
        ones = self.win.pad(np.ones((1, 1, h, w), dtype))
        return sum(self.win.view(ones, i, j, out_hw) for _, i, j in self.win.taps())

    def forward(self, xs):
        x = xs[0]
        out_hw = self.win.out_hw(*x.shape[2:])
        xp = self.win.pad(x)
        total = sum(self.win.view(xp, i, j, out_hw) for _, i, j in self.win.taps())
        return total / self._counts(*x.shape[2:], x.dtype, out_hw), {"shape": x.shape}

    def backward(self, dy, saved, consts):
        n, c, h, w = saved["shape"]
        out_hw = dy.shape[2:]
        share = dy / self._counts(h, w, dy.dtype, out_hw)
        dxp = np.zeros((n, c) + self.win.padded(h, w), dy.dtype)
        for _, i, j in self.win.taps():
            self.win.view(dxp, i, j, out_hw)[...] += share
        return [self.win.unpad(dxp, h, w)]

    def emit(self, e, node, dy):
        _, c, h, w = e.dims(node.input[0])
        out_hw = self.win.out_hw(h, w)
        share = e.node("Div", [dy, e.const(np.asarray(self._counts(h, w, np.dtype(np.float32), out_hw), np.float32))])
        ones = e.const(np.ones((c, 1, *self.win.kernel), np.float32))
        return [e.node("ConvTranspose", [share, ones], group=c, **self.win.transpose_attrs(h, w))]


class _MaxPool(_Op):
    attrs = {"auto_pad": (b"NOTSET",), "ceil_mode": (0,), "dilations": None, "kernel_shape": None, "pads": None,
             "storage_order": (0,), "strides": None}

    def __init__(self, node, label, consts):
        super().__init__(node, label, consts)
        self.win = _window_of(self, ())
        if len([o for o in node.output if o]) > 1:
            self.refuse("the Indices output is not implemented")
        if self.win.kernel[0] * self.win.kernel[1] > 256:
            self.refuse(f"a {self.win.kernel} window (at most 256 taps: the winner is kept in one byte)")

    def forward(self, xs):
        x = xs[0]
        out_hw = self.win.out_hw(*x.shape[2:])
        xp = self.win.pad(x, -np.inf)
        best = self.win.view(xp, 0, 0, out_hw).copy()
        arg = np.zeros(best.shape, np.uint8) if self.need[0] else None
        for k, i, j in self.win.taps():
            v = self.win.view(xp, i, j, out_hw)
            if arg is not None:
                arg[v > best] = k   # strict: the first maximum wins, as in the forward's own tie-break
            np.maximum(best, v, out=best)
        return best, ({"argmax": arg, "shape": x.shape} if arg is not None else {})

    def backward(self, dy, saved, consts):
        n, c, h, w = saved["shape"]
        arg = saved["argmax"]
        dxp = np.zeros((n, c) + self.win.padded(h, w), dy.dtype)
        for k, i, j in self.win.taps():
            self.win.view(dxp, i, j, dy.shape[2:])[...] += np.where(arg == k, dy, 0)
        return [self.win.unpad(dxp, h, w)]

    def emit(self, e, node, dy):
        """MaxUnpool puts each output's gradient where the forward's Indices output says its maximum was: exact
        when no two windows share an input (a shared input would get one gradient, not their sum)."""
        if any(k > s for k, s in zip(self.win.kernel, self.win.strides)) or any(d != 1 for d in self.win.dilations):
            raise NotEmitted(self.op, self.label, "overlapping windows (MaxUnpool writes, it does not add)")
        x = node.input[0]
        return [e.node("MaxUnpool", [dy, e.indices(node), e.shape(x)], kernel_shape=list(self.win.kernel),
                       strides=list(self.win.strides), pads=list(self.win.pads))]


class _Reshaping(_ShapeOnly):
    """Flatten, Reshape, Identity, inference Dropout: the gradient is reshaped back, nothing kept."""

    def backward(self, dy, saved, consts):
        return [dy.reshape(saved["shape"])] + [None] * (len(self.need) - 1)

    def emit(self, e, node, dy):
        return [e.node("Reshape", [dy, e.shape(node.input[0])])] + [None] * (len(self.need) - 1)


class _Flatten(_Reshaping):
    attrs = {"axis": None}

    def forward(self, xs):
        x = xs[0]
        axis = self.a.get("axis", 1) % x.ndim if x.ndim else 0
        return x.reshape(int(np.prod(x.shape[:axis])), -1), {"shape": x.shape}


class _Reshape(_Reshaping):
    attrs = {"allowzero": (0,)}
    constant_inputs = (1,)

    def forward(self, xs):
        x, shape = xs
        shape = [x.shape[i] if s == 0 else int(s) for i, s in enumerate(shape)]
        return x.reshape(shape), {"shape": x.shape}


class _Identity(_Reshaping):
    def forward(self, xs):
        return xs[0], {"shape": xs[0].shape}


class _Dropout(_Identity):
    attrs = {"seed": None}
    constant_inputs = (1, 2)

    def __init__(self, node, label, consts):
        super().__init__(node, label, consts)
        if len([o for o in node.output if o]) > 1:
            self.refuse("the mask output is not implemented")
        if len(node.input) > 2 and node.input[2] and bool(consts[node.input[2]]):
            self.refuse("training_mode is true (only inference: identity)")


class _Expand(_ShapeOnly):
    """Broadcast to a constant shape (the lite residual's nearest upsampling is Reshape -> Expand -> Reshape):
    the gradient is summed back over the broadcast axes, nothing kept."""

    constant_inputs = (1,)

    def forward(self, xs):
        x, shape = xs
        return np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(int(d) for d in shape))).copy(), \
            {"shape": x.shape}

    def backward(self, dy, saved, consts):
        return [_unbroadcast(dy, saved["shape"]), None]

    def emit(self, e, node, dy):
        return [e.unbroadcast(dy, e.dims(node.output[0]), node.input[0]), None]


class _Slice(_ShapeOnly):
    """A window of a tensor (constant starts/ends/axes, step 1): the gradient is zero outside it."""

    constant_inputs = (1, 2, 3, 4)

    def __init__(self, node, label, consts):
        super().__init__(node, label, consts)
        get = lambda i: consts[node.input[i]].astype(np.int64) if len(node.input) > i and node.input[i] else None  # noqa: E731
        self.starts, self.ends, self.axes, steps = get(1), get(2), get(3), get(4)
        if steps is not None and np.any(steps != 1):
            self.refuse(f"steps {steps.tolist()} (only 1)")

    def _window(self, shape):
        axes = range(len(self.starts)) if self.axes is None else self.axes
        window = [slice(None)] * len(shape)
        for axis, start, end in zip(axes, self.starts, self.ends):
            axis = int(axis) % len(shape)
            window[axis] = slice(*slice(int(start), int(end)).indices(shape[axis])[:2])
        return tuple(window)

    def forward(self, xs):
        x = xs[0]
        return x[self._window(x.shape)], {"shape": x.shape}

    def backward(self, dy, saved, consts):
        dx = np.zeros(saved["shape"], dy.dtype)
        dx[self._window(saved["shape"])] = dy
        return [dx] + [None] * (len(self.need) - 1)

    def emit(self, e, node, dy):
        dims = e.dims(node.input[0])
        axes = range(len(self.starts)) if self.axes is None else self.axes
        if dims[0] is None and any(int(a) % len(dims) == 0 for a in axes):
            raise NotEmitted(self.op, self.label, "a slice of the batch axis")
        full = (1,) + tuple(dims[1:])
        spans = [w.indices(n)[:2] for w, n in zip(self._window(full), full)]
        pads = [start for start, _ in spans] + [n - stop for (_, stop), n in zip(spans, full)]
        return [e.node("Pad", [dy, e.ints(pads)])] + [None] * (len(self.need) - 1)


class _Gemm(_Op):
    attrs = {"alpha": None, "beta": None, "transA": (0, 1), "transB": (0, 1)}
    differentiable = (0, 1, 2)

    def forward(self, xs):
        a, b, c = (xs + [None])[:3]
        y = self._alpha() * (self._op(a, "transA") @ self._op(b, "transB"))
        if c is not None:
            y = y + self.a.get("beta", 1.0) * c
        saved = {"shapes": (a.shape, b.shape, None if c is None else c.shape)}
        for i, x in ((0, a), (1, b)):
            if self.need[1 - i] and not self.is_const[i]:
                saved[f"operand{i}"] = x
        return y.astype(a.dtype, copy=False), saved

    def _alpha(self):
        return self.a.get("alpha", 1.0)

    def _op(self, m, trans):
        return m.T if self.a.get(trans, 0) else m

    def backward(self, dy, saved, consts):
        a, b = (consts[i] if self.is_const[i] else saved.get(f"operand{i}") for i in (0, 1))
        g = dy * dy.dtype.type(self._alpha())
        grads = [None, None, None]
        if self.need[0]:
            da = g @ self._op(b, "transB").T
            grads[0] = da.T if self.a.get("transA", 0) else da
        if self.need[1]:
            db = self._op(a, "transA").T @ g
            grads[1] = db.T if self.a.get("transB", 0) else db
        if len(self.need) > 2 and self.need[2]:
            grads[2] = _unbroadcast(dy * dy.dtype.type(self.a.get("beta", 1.0)), saved["shapes"][2])
        return grads

    def emit(self, e, node, dy):
        a, b = node.input[:2]
        ta, tb = self.a.get("transA", 0), self.a.get("transB", 0)
        g = dy if self._alpha() == 1.0 else e.node("Mul", [dy, e.const(np.float32(self._alpha()))])
        grads = [None] * len(node.input)
        if self.need[0]:   # dA = g op(B)^T, transposed back when A was
            grads[0] = e.node("Gemm", [b, g], transA=tb, transB=1) if ta else e.node("Gemm", [g, b], transB=1 - tb)
        if self.need[1]:   # dB = op(A)^T g, transposed back when B was
            grads[1] = e.node("Gemm", [g, a], transA=1, transB=ta) if tb else e.node("Gemm", [a, g], transA=1 - ta)
        if len(self.need) > 2 and self.need[2]:
            beta = self.a.get("beta", 1.0)
            scaled = dy if beta == 1.0 else e.node("Mul", [dy, e.const(np.float32(beta))])
            grads[2] = e.unbroadcast(scaled, e.dims(node.output[0]), node.input[2])
        return grads


class _MatMul(_Op):
    differentiable = (0, 1)

    def forward(self, xs):
        a, b = xs
        if a.ndim < 2 or b.ndim < 2:
            self.refuse("a 1-D operand (only matrices and batches of them)")
        saved = {"shapes": (a.shape, b.shape)}
        for i, x in ((0, a), (1, b)):
            if self.need[1 - i] and not self.is_const[i]:
                saved[f"operand{i}"] = x
        return a @ b, saved

    def backward(self, dy, saved, consts):
        a, b = (consts[i] if self.is_const[i] else saved.get(f"operand{i}") for i in (0, 1))
        sa, sb = saved["shapes"]
        return [_unbroadcast(dy @ np.swapaxes(b, -1, -2), sa) if self.need[0] else None,
                _unbroadcast(np.swapaxes(a, -1, -2) @ dy, sb) if self.need[1] else None]

    def emit(self, e, node, dy):
        a, b = node.input
        out = e.dims(node.output[0])

        def swapped(name):
            rank = len(e.dims(name))
            return e.node("Transpose", [name], perm=list(range(rank - 2)) + [rank - 1, rank - 2])
        return [e.unbroadcast(e.node("MatMul", [dy, swapped(b)]), out, a) if self.need[0] else None,
                e.unbroadcast(e.node("MatMul", [swapped(a), dy]), out, b) if self.need[1] else None]


class _Softmax(_Op):
    attrs = {"axis": None}

    def forward(self, xs):
        x = xs[0]
        axis = self.a.get("axis", -1)
        e = np.exp(x - x.max(axis=axis, keepdims=True))
        y = e / e.sum(axis=axis, keepdims=True)
        return y, ({"output": y} if self.need[0] else {})

    def backward(self, dy, saved, consts):
        y = saved["output"]
        return [y * (dy - (dy * y).sum(axis=self.a.get("axis", -1), keepdims=True))]

    def emit(self, e, node, dy):
        y = node.output[0]
        total = e.node("ReduceSum", [e.node("Mul", [dy, y]), e.ints([self.a.get("axis", -1)])], keepdims=1)
        return [e.node("Mul", [y, e.node("Sub", [dy, total])])]


# -------------------------------------------- elementwise, reductions and shape ops (Gluon LayerNorm, the zoo)
class _Sub(_Add):
    def forward(self, xs):
        return xs[0] - xs[1], {"shapes": (xs[0].shape, xs[1].shape)}

    def backward(self, dy, saved, consts):
        return [_unbroadcast(dy if i == 0 else -dy, s) if need else None
                for i, (s, need) in enumerate(zip(saved["shapes"], self.need))]

    def emit(self, e, node, dy):
        out = e.dims(node.output[0])
        return [e.unbroadcast(dy if i == 0 else e.node("Neg", [dy]), out, name) if need else None
                for i, (name, need) in enumerate(zip(node.input, self.need))]


class _Div(_Op):
    """a / b: da = dy / b needs b, db = -dy a / b^2 needs both (each kept only if it is an activation)."""

    differentiable = (0, 1)

    def kept_inputs(self):
        wanted = [1] if any(self.need) else []
        wanted += [0] if self.need[1] else []
        return tuple(i for i in sorted(wanted) if not self.is_const[i])

    def keep(self, xs, shapes):
        saved = {"shapes": (tuple(shapes[0]), tuple(shapes[1]))}
        saved.update({f"operand{i}": xs[i] for i in self.kept_inputs()})
        return saved

    def forward(self, xs):
        a, b = xs
        saved = {"shapes": (a.shape, b.shape)}
        saved.update({f"operand{i}": xs[i] for i in self.kept_inputs()})
        return a / b, saved

    def backward(self, dy, saved, consts):
        a, b = (consts[i] if self.is_const[i] else saved.get(f"operand{i}") for i in (0, 1))
        q = dy / b
        return [_unbroadcast(q, saved["shapes"][0]) if self.need[0] else None,
                _unbroadcast(-q * (a / b), saved["shapes"][1]) if self.need[1] else None]

    def emit(self, e, node, dy):
        a, b = node.input
        out = e.dims(node.output[0])
        q = e.node("Div", [dy, b])
        return [e.unbroadcast(q, out, a) if self.need[0] else None,
                e.unbroadcast(e.node("Neg", [e.node("Mul", [q, e.node("Div", [a, b])])]), out, b)
                if self.need[1] else None]


class _Pow(_Op):
    """x ** p with a constant exponent p (LayerNorm's square): dx = dy p x^(p-1), the input kept."""

    constant_inputs = (1,)

    def kept_inputs(self):
        return (0,) if self.need[0] else ()

    def keep(self, xs, shapes):
        saved = {"shapes": (tuple(shapes[0]), tuple(shapes[1]))}
        if self.need[0]:
            saved["input"] = xs[0]
        return saved

    def forward(self, xs):
        x, p = xs
        y = np.power(x, p.astype(x.dtype, copy=False))
        return y, self.keep(xs, [x.shape, p.shape])

    def backward(self, dy, saved, consts):
        x, p = saved["input"], consts[1].astype(dy.dtype, copy=False)
        slope = x * dy.dtype.type(2) if np.all(p == 2) else p * np.power(x, p - 1)
        return [_unbroadcast(dy * slope, saved["shapes"][0]), None]

    def emit(self, e, node, dy):
        x, p = node.input
        value = np.asarray(e.const_value(p), np.float32)
        if np.all(value == 2):
            slope = e.node("Mul", [x, e.const(np.float32(2))])
        else:
            slope = e.node("Mul", [e.node("Pow", [x, e.const(value - 1)]), e.const(value)])
        return [e.unbroadcast(e.node("Mul", [dy, slope]), e.dims(node.output[0]), x), None]


class _Neg(_Op):
    def kept_inputs(self):
        return ()

    def keep(self, xs, shapes):
        return {}

    def forward(self, xs):
        return -xs[0], {}

    def backward(self, dy, saved, consts):
        return [-dy]

    def emit(self, e, node, dy):
        return [e.node("Neg", [dy])]


class _Pointwise(_Op):
    """y = f(x) elementwise, dx = dy f'(x): ``uses`` says whether f' is read from the output (kept by the
    forward: sigmoid, tanh, exp, sqrt, elu) or from the input (log, softplus)."""

    uses = "output"

    def f(self, x):
        raise NotImplementedError

    def slope(self, v):
        """f' from the kept value (NumPy)."""
        raise NotImplementedError

    def emit_slope(self, e, v: str) -> str:
        """f' from the kept value (ONNX nodes)."""
        raise NotImplementedError

    def kept_inputs(self):
        return (0,) if self.uses == "input" and self.need[0] else None if self.uses == "output" else ()

    def keep(self, xs, shapes):
        if self.uses == "input":
            return {"input": xs[0]} if self.need[0] else {}
        return self.forward(xs)[1]

    def forward(self, xs):
        x = xs[0]
        y = self.f(x)
        return y, ({self.uses: x if self.uses == "input" else y} if self.need[0] else {})

    def backward(self, dy, saved, consts):
        return [dy * self.slope(saved[self.uses])]

    def emit(self, e, node, dy):
        return [e.node("Mul", [dy, self.emit_slope(e, node.input[0] if self.uses == "input" else node.output[0])])]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    z = np.exp(-np.abs(x))   # e to a non-positive power only: no overflow
    return np.where(x >= 0, 1, z) / (1 + z)


class _Sigmoid(_Pointwise):
    def f(self, x):
        return _sigmoid(x)

    def slope(self, y):
        return y * (1 - y)

    def emit_slope(self, e, y):
        return e.node("Mul", [y, e.node("Sub", [e.const(np.float32(1)), y])])


class _Tanh(_Pointwise):
    def f(self, x):
        return np.tanh(x)

    def slope(self, y):
        return 1 - y * y

    def emit_slope(self, e, y):
        return e.node("Sub", [e.const(np.float32(1)), e.node("Mul", [y, y])])


class _Exp(_Pointwise):
    def f(self, x):
        return np.exp(x)

    def slope(self, y):
        return y

    def emit_slope(self, e, y):
        return y


class _Sqrt(_Pointwise):
    def f(self, x):
        return np.sqrt(x)

    def slope(self, y):
        return y.dtype.type(0.5) / y

    def emit_slope(self, e, y):
        return e.node("Div", [e.const(np.float32(0.5)), y])


class _Log(_Pointwise):
    uses = "input"

    def f(self, x):
        return np.log(x)

    def slope(self, x):
        return 1 / x

    def emit_slope(self, e, x):
        return e.node("Reciprocal", [x])


class _Softplus(_Pointwise):
    """log(1 + e^x) (Gluon's softrelu): f' = sigmoid(x), from the input."""

    uses = "input"

    def f(self, x):
        return np.logaddexp(x.dtype.type(0), x)

    def slope(self, x):
        return _sigmoid(x)

    def emit_slope(self, e, x):
        return e.node("Sigmoid", [x])


class _Elu(_Pointwise):
    """x for x > 0, alpha (e^x - 1) else (Gluon's ELU; Selu scales both by gamma): f' from the output, which is
    positive exactly where the input is (alpha > 0)."""

    attrs = {"alpha": None}
    alpha_default, gamma = 1.0, 1.0

    def __init__(self, node, label, consts):
        super().__init__(node, label, consts)
        if self._alpha() <= 0:
            self.refuse(f"alpha={self._alpha()} (only > 0: the output's sign gives the input's)")

    def _alpha(self):
        return float(self.a.get("alpha", self.alpha_default))

    def f(self, x):
        t = x.dtype.type
        return t(self.gamma) * np.where(x > 0, x, t(self._alpha()) * np.expm1(np.minimum(x, 0)))

    def slope(self, y):
        t = y.dtype.type
        return np.where(y > 0, t(self.gamma), y + t(self.gamma * self._alpha()))

    def emit_slope(self, e, y):
        return e.node("Where", [e.node("Greater", [y, e.const(np.float32(0))]), e.const(np.float32(self.gamma)),
                                e.node("Add", [y, e.const(np.float32(self.gamma * self._alpha()))])])


class _Selu(_Elu):
    attrs = {"alpha": None, "gamma": None}
    alpha_default = 1.67326319217681884765625

    def __init__(self, node, label, consts):
        super().__init__(node, label, consts)
        self.gamma = float(self.a.get("gamma", 1.05070102214813232421875))
        if self.gamma <= 0:
            self.refuse(f"gamma={self.gamma} (only > 0)")


class _LeakyRelu(_Relu):
    """x for x >= 0, alpha x else: the gradient is dy or alpha dy, a 1-bit mask kept (as ReLU)."""

    attrs = {"alpha": None}

    def _alpha(self):
        return float(self.a.get("alpha", 0.01))

    def forward(self, xs):
        x = xs[0]
        pos = x > 0
        return np.where(pos, x, x * x.dtype.type(self._alpha())), ({"mask": BitMask(pos)} if self.need[0] else {})

    def backward(self, dy, saved, consts):
        return [np.where(saved["mask"].unpack(), dy, dy * dy.dtype.type(self._alpha()))]

    def emit(self, e, node, dy):
        alpha = self._alpha()
        # mask (1 - alpha) + alpha: 1 where the input was positive, alpha elsewhere
        slope = e.node("Add", [e.node("Mul", [e.node("Cast", [e.mask(node, self)], to=1),
                                              e.const(np.float32(1 - alpha))]), e.const(np.float32(alpha))])
        return [e.node("Mul", [dy, slope])]


class _PRelu(_Op):
    """x for x >= 0, slope x else, the slope a (broadcast) initializer that may train: dx needs where the input
    was negative (a 1-bit mask when only dx is wanted), dslope the input itself."""

    differentiable = (0, 1)
    constant_inputs = (1,)

    def kept_inputs(self):
        return (0,) if any(self.need) else ()

    def keep(self, xs, shapes):
        saved = {"shapes": (tuple(shapes[0]), tuple(shapes[1]))}
        if self.need[1]:
            saved["input"] = xs[0]
        elif self.need[0]:
            saved["mask"] = BitMask(xs[0] < 0)
        return saved

    def forward(self, xs):
        x, slope = xs
        return np.where(x < 0, x * slope, x), self.keep(xs, [x.shape, slope.shape])

    def backward(self, dy, saved, consts):
        neg = saved["mask"].unpack() if "mask" in saved else saved["input"] < 0
        grads = [None, None]
        if self.need[0]:
            grads[0] = np.where(neg, dy * consts[1], dy)
        if self.need[1]:
            grads[1] = _unbroadcast(np.where(neg, dy * saved["input"], 0), saved["shapes"][1])
        return grads

    def emit(self, e, node, dy):
        x, slope = node.input
        neg = e.node("Less", [x, e.const(np.float32(0))])
        grads = [None, None]
        if self.need[0]:
            grads[0] = e.node("Where", [neg, e.node("Mul", [dy, slope]), dy])
        if self.need[1]:
            part = e.node("Mul", [e.node("Mul", [dy, x]), e.node("Cast", [neg], to=1)])
            grads[1] = e.unbroadcast(part, e.dims(node.output[0]), slope)
        return grads


class _Softsign(_Pointwise):
    """x / (1 + |x|) (Gluon's softsign): f' = 1 / (1 + |x|)^2, from the input."""

    uses = "input"

    def f(self, x):
        return x / (1 + np.abs(x))

    def slope(self, x):
        t = 1 + np.abs(x)
        return 1 / (t * t)

    def emit_slope(self, e, x):
        t = e.node("Add", [e.node("Abs", [x]), e.const(np.float32(1))])
        return e.node("Reciprocal", [e.node("Mul", [t, t])])


class _HardSigmoid(_Relu):
    """max(0, min(1, alpha x + beta)) (mx2onnx's hard_sigmoid; x times it is a hard swish): the gradient is alpha dy
    where the input was inside (-beta/alpha, (1-beta)/alpha), a 1-bit mask kept (as ReLU6)."""

    attrs = {"alpha": None, "beta": None}

    def __init__(self, node, label, consts):
        super().__init__(node, label, consts)
        self.alpha, self.beta = float(self.a.get("alpha", 0.2)), float(self.a.get("beta", 0.5))
        if self.alpha <= 0:
            self.refuse(f"alpha={self.alpha} (only > 0)")

    def mask_bounds(self, consts):
        return -self.beta / self.alpha, (1 - self.beta) / self.alpha

    def forward(self, xs):
        x = xs[0]
        t = x.dtype.type
        y = np.maximum(x * t(self.alpha) + t(self.beta), 0)
        np.minimum(y, 1, out=y)
        lo, hi = self.mask_bounds(())
        return y, ({"mask": BitMask((x > lo) & (x < hi))} if self.need[0] else {})

    def backward(self, dy, saved, consts):
        return [dy * saved["mask"].unpack() * dy.dtype.type(self.alpha)]

    def emit(self, e, node, dy):
        return [e.node("Mul", [e.masked(dy, e.mask(node, self)), e.const(np.float32(self.alpha))])]


class _InstanceNorm(_Op):
    """Each (sample, channel) normalised over its spatial axes, then scaled and shifted per channel (Gluon's
    InstanceNorm): the shift's gradient needs nothing kept, the scale's and the input's the input (the
    normalised input and its inverse deviation are recomputed from it)."""

    attrs = {"epsilon": None}
    differentiable = (0, 1, 2)
    constant_inputs = (1, 2)

    def kept_inputs(self):
        return (0,) if self.need[0] or self.need[1] else ()

    def keep(self, xs, shapes):
        return {"input": xs[0]} if self.need[0] or self.need[1] else {}

    def _normalised(self, x):
        axes = tuple(range(2, x.ndim))
        d = x - x.mean(axis=axes, keepdims=True)
        inv = 1 / np.sqrt((d * d).mean(axis=axes, keepdims=True) + x.dtype.type(self.a.get("epsilon", 1e-5)))
        return d * inv, inv

    def forward(self, xs):
        x, scale, b = xs
        xhat, _ = self._normalised(x)
        return xhat * _per_channel(scale, x.ndim) + _per_channel(b, x.ndim), self.keep(xs, [x.shape])

    def backward(self, dy, saved, consts):
        xhat, inv = self._normalised(saved["input"]) if self.need[0] or self.need[1] else (None, None)
        return _normalised_backward(dy, consts[1], xhat, inv, tuple(range(2, dy.ndim)), self.need)

    def emit(self, e, node, dy):
        x, scale, _ = node.input
        rank = len(e.dims(x))
        spatial, d, inv, gain = list(range(2, rank)), None, None, None
        if self.need[0] or self.need[1]:
            d = e.node("Sub", [x, e.reduce_mean(x, spatial)])
            var = e.reduce_mean(e.node("Mul", [d, d]), spatial)
            eps = e.const(np.float32(self.a.get("epsilon", 1e-5)))
            inv = e.node("Reciprocal", [e.node("Sqrt", [e.node("Add", [var, eps])])])
            gain = e.node("Mul", [inv, e.node("Reshape", [scale, e.ints([-1] + [1] * (rank - 2))])])
        return _emit_normalised(e, dy, d, inv, gain, spatial, rank, self.need)


class _Erf(_Pointwise):
    """The error function (mx2onnx writes Gluon's GELU as x (1 + erf(x / sqrt 2)) / 2): f' = 2/sqrt(pi) e^(-x^2),
    from the input. NumPy has no erf: the forward is math.erf per element (exact, about 0.1 s per million values;
    GELU is rare in the CNNs this trains, and ONNX Runtime runs the forward in the one-graph step)."""

    uses = "input"
    _erf = np.frompyfunc(math.erf, 1, 1)

    def f(self, x):
        return self._erf(x).astype(x.dtype)

    def slope(self, x):
        return x.dtype.type(2 / math.sqrt(math.pi)) * np.exp(-x * x)

    def emit_slope(self, e, x):
        return e.node("Mul", [e.node("Exp", [e.node("Neg", [e.node("Mul", [x, x])])]),
                              e.const(np.float32(2 / math.sqrt(math.pi)))])


class _GlobalMaxPool(_Op):
    """The largest value of each (sample, channel): its gradient goes where that value was (the first, as the
    forward's and ONNX's ArgMax tie-break), one index per output kept."""

    def forward(self, xs):
        x = xs[0]
        flat = x.reshape(x.shape[0], x.shape[1], -1)
        arg = flat.argmax(axis=2)[..., None]
        y = np.take_along_axis(flat, arg, axis=2).reshape(*x.shape[:2], *(1,) * (x.ndim - 2))
        return y, ({"argmax": arg.astype(np.uint32), "shape": x.shape} if self.need[0] else {})

    def backward(self, dy, saved, consts):
        shape = saved["shape"]
        dx = np.zeros((shape[0], shape[1], int(np.prod(shape[2:]))), dy.dtype)
        np.put_along_axis(dx, saved["argmax"].astype(np.intp), dy.reshape(shape[0], shape[1], 1), axis=2)
        return [dx.reshape(shape)]

    def emit(self, e, node, dy):
        x = node.input[0]
        dims = e.dims(x)
        size = int(np.prod(dims[2:]))
        arg = e.node("ArgMax", [e.node("Reshape", [x, e.ints([0, 0, -1])])], axis=2, keepdims=1)
        onehot = e.node("OneHot", [arg, e.ints([size]), e.const(np.asarray([0, 1], np.float32))])   # (N, C, 1, size)
        spread = e.node("Mul", [onehot, e.node("Reshape", [dy, e.ints([0, 0, 1, 1])])])
        return [e.node("Reshape", [spread, e.ints([0, 0, *dims[2:]])])]


class _MaxPoolCeil(_MaxPool):
    """MaxPool, with ceil_mode too (squeezenet's pools): ceil mode's extra outputs are windows running past the
    input, so it is the floor-mode window with more padding at the bottom and right (-inf: never a maximum), as
    wide as the input's size needs. A window that would start past the input and its top/left padding is dropped,
    as ONNX Runtime's kernel does (1.32; ONNX's shape inference keeps it, so a graph where that happens does not
    load in ONNX Runtime)."""

    attrs = {**_MaxPool.attrs, "ceil_mode": (0, 1)}

    def __init__(self, node, label, consts):
        super().__init__(node, label, consts)
        self.floor = self.win

    def _fit(self, h: int, w: int) -> None:
        if not self.a.get("ceil_mode", 0):
            return
        win = self.floor
        top, left, bottom, right = win.pads
        extra = []
        for size, k, s, d, head, tail in zip((h, w), win.kernel, win.strides, win.dilations, (top, left),
                                              (bottom, right)):
            span = size + head + tail - d * (k - 1) - 1
            out = -(-span // s) + 1
            if (out - 1) * s >= size + head:
                out -= 1
            extra.append(max(0, (out - 1) * s - span))
        self.win = _Window(win.kernel, win.strides, (top, left, bottom + extra[0], right + extra[1]), win.dilations)

    def forward(self, xs):
        self._fit(*xs[0].shape[2:])
        return super().forward(xs)

    def backward(self, dy, saved, consts):
        self._fit(*saved["shape"][2:])
        return super().backward(dy, saved, consts)

    def emit(self, e, node, dy):
        self._fit(*e.dims(node.input[0])[2:])
        return super().emit(e, node, dy)


class _Reduce(_ShapeOnly):
    """ReduceMean (axes an attribute in opset 13) and ReduceSum (axes an input): the gradient is the output's
    broadcast back over the reduced axes (divided by their size for the mean), nothing kept."""

    attrs = {"axes": None, "keepdims": (0, 1)}
    mean = True

    def __init__(self, node, label, consts):
        super().__init__(node, label, consts)
        self.axes = self.a.get("axes")

    def _axes(self, rank: int) -> tuple:
        return tuple(range(rank)) if self.axes is None else tuple(sorted(int(a) % rank for a in self.axes))

    def forward(self, xs):
        x = xs[0]
        axes = self._axes(x.ndim)
        keep = bool(self.a.get("keepdims", 1))
        y = x.mean(axis=axes, keepdims=keep) if self.mean else x.sum(axis=axes, keepdims=keep)
        return np.asarray(y, x.dtype), {"shape": x.shape}

    def backward(self, dy, saved, consts):
        shape = saved["shape"]
        axes = self._axes(len(shape))
        g = dy.reshape([1 if i in axes else n for i, n in enumerate(shape)])
        if self.mean:
            g = g / g.dtype.type(np.prod([shape[i] for i in axes]))
        return [np.broadcast_to(g, shape)] + [None] * (len(self.need) - 1)

    def emit(self, e, node, dy):
        dims = e.dims(node.input[0])
        axes = self._axes(len(dims))
        if any(dims[i] is None for i in axes):
            raise NotEmitted(self.op, self.label, "a reduction over the batch axis")
        g = dy if self.a.get("keepdims", 1) else e.node("Unsqueeze", [dy, e.ints(axes)])
        if self.mean:
            g = e.node("Mul", [g, e.const(np.float32(1 / np.prod([dims[i] for i in axes])))])
        g = e.node("Expand", [g, e.ints([dims[i] if i in axes else 1 for i in range(len(dims))])])
        return [g] + [None] * (len(self.need) - 1)


class _ReduceMean(_Reduce):
    pass


class _ReduceSum(_Reduce):
    attrs = {"keepdims": (0, 1), "noop_with_empty_axes": (0,)}
    constant_inputs = (1,)
    mean = False

    def __init__(self, node, label, consts):
        super().__init__(node, label, consts)
        if len(node.input) > 1 and node.input[1]:
            self.axes = [int(a) for a in np.asarray(consts[node.input[1]]).reshape(-1)] or None


class _Concat(_Op):
    """The gradient of each input is its slice of the output's, nothing kept but the shapes."""

    attrs = {"axis": None}

    def __init__(self, node, label, consts):
        super().__init__(node, label, consts)
        self.differentiable = tuple(range(len(node.input)))

    def kept_inputs(self):
        return ()

    def keep(self, xs, shapes):
        return {"shapes": tuple(tuple(int(d) for d in s) for s in shapes)}

    def forward(self, xs):
        return np.concatenate(xs, axis=self.a["axis"]), self.keep(xs, [x.shape for x in xs])

    def _spans(self, shapes):
        axis = self.a["axis"] % len(shapes[0])
        ends = np.cumsum([s[axis] for s in shapes])
        return axis, [(int(end - s[axis]), int(end)) for s, end in zip(shapes, ends)]

    def backward(self, dy, saved, consts):
        axis, spans = self._spans(saved["shapes"])
        return [dy[(slice(None),) * axis + (slice(*span),)] if need else None for span, need in zip(spans, self.need)]

    def emit(self, e, node, dy):
        shapes = [e.dims(name) for name in node.input]
        axis, spans = self._spans(shapes)
        if any(s[axis] is None for s in shapes):
            raise NotEmitted(self.op, self.label, "a concatenation along the batch axis")
        return [e.node("Slice", [dy, e.ints([start]), e.ints([end]), e.ints([axis])]) if need else None
                for (start, end), need in zip(spans, self.need)]


class _Transpose(_Op):
    attrs = {"perm": None}

    def kept_inputs(self):
        return ()

    def keep(self, xs, shapes):
        return {}

    def _perm(self, rank):
        return list(self.a.get("perm", range(rank - 1, -1, -1)))

    def forward(self, xs):
        return xs[0].transpose(self._perm(xs[0].ndim)), {}

    def backward(self, dy, saved, consts):
        return [dy.transpose(np.argsort(self._perm(dy.ndim)))]

    def emit(self, e, node, dy):
        perm = self._perm(len(e.dims(node.input[0])))
        return [e.node("Transpose", [dy], perm=[int(i) for i in np.argsort(perm)])]


class _Squeeze(_Reshaping):
    constant_inputs = (1,)

    def forward(self, xs):
        x = xs[0]
        axes = None if len(xs) < 2 or xs[1] is None else tuple(int(a) for a in np.asarray(xs[1]).reshape(-1))
        return np.squeeze(x, axis=axes), {"shape": x.shape}


class _Unsqueeze(_Reshaping):
    constant_inputs = (1,)

    def forward(self, xs):
        x, axes = xs
        return np.expand_dims(x, tuple(int(a) for a in np.asarray(axes).reshape(-1))), {"shape": x.shape}


OPS = {"Conv": _Conv, "BatchNormalization": _BatchNorm, "Relu": _Relu, "Clip": _Clip, "Add": _Add, "Mul": _Mul,
       "GlobalAveragePool": _GlobalAveragePool, "AveragePool": _AveragePool, "MaxPool": _MaxPool,
       "Flatten": _Flatten, "Reshape": _Reshape, "Identity": _Identity, "Dropout": _Dropout, "Gemm": _Gemm,
       "MatMul": _MatMul, "Softmax": _Softmax, "Expand": _Expand, "Slice": _Slice}
OPS.update({"Sub": _Sub, "Div": _Div, "Pow": _Pow, "Neg": _Neg, "Sigmoid": _Sigmoid, "Tanh": _Tanh, "Exp": _Exp,
            "Sqrt": _Sqrt, "Log": _Log, "Softplus": _Softplus, "Elu": _Elu, "Selu": _Selu, "LeakyRelu": _LeakyRelu,
            "PRelu": _PRelu, "ReduceMean": _ReduceMean, "ReduceSum": _ReduceSum, "Concat": _Concat,
            "Transpose": _Transpose, "Squeeze": _Squeeze, "Unsqueeze": _Unsqueeze, "Softsign": _Softsign,
            "HardSigmoid": _HardSigmoid, "InstanceNormalization": _InstanceNorm, "Erf": _Erf,
            "GlobalMaxPool": _GlobalMaxPool, "MaxPool": _MaxPoolCeil})



def other_weights(graph) -> list[str]:
    """Weights of layers that are not Conv, Gemm, MatMul or BatchNorm: float initializers of more than one value
    an op differentiates (Gluon's LayerNorm scale and shift, which mx2onnx writes as Mul and Neg inputs; an
    InstanceNorm's), and PReLU slopes. A scalar (an epsilon, an exponent, a fixed multiplier) is a constant of the
    graph, and so is what an op applies to the raw input (a mean and std baked into the file are preprocessing)."""
    sizes = {t.name: int(np.prod(t.dims)) for t in graph.initializer if t.data_type == 1}
    raw = {i.name for i in graph.input if i.name not in sizes}
    names = []
    for node in graph.node:   # ops whose initializer operand is a layer's parameter (not a Concat's constant)
        if node.op_type not in ("Add", "Sub", "Mul", "Div", "Neg", "PRelu", "InstanceNormalization") or \
                raw.intersection(node.input):
            continue
        names += [name for i, name in enumerate(node.input) if name in sizes and i in OPS[node.op_type].differentiable
                  and (sizes[name] > 1 or node.op_type == "PRelu")]
    return list(dict.fromkeys(names))

# ------------------------------------------------------------------------------------------------ the graph
def load_model(model):
    """An onnx.ModelProto from a ModelProto, its serialized bytes or a path."""
    onnx = _lazy.onnx()
    if isinstance(model, (str, Path)):
        return onnx.load(str(model))
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    return model


def _label(node) -> str:
    return node.name or node.output[0]


def _needed(nodes, output: str) -> list:
    """The nodes ``output`` depends on, in graph order (a final Softmax is skipped when asked for logits)."""
    wanted, keep = {output}, []
    for node in reversed(nodes):
        if any(o in wanted for o in node.output):
            keep.append(node)
            wanted.update(i for i in node.input if i)
    return keep[::-1]


def logits_name(model) -> str:
    """The value a loss on logits should see: the input of a final Softmax or LogSoftmax (the same classes, the
    same cross-entropy), else the graph's output."""
    graph = load_model(model).graph
    out = graph.output[0].name
    last = [n for n in graph.node if out in n.output]
    return last[0].input[0] if last and last[0].op_type in ("Softmax", "LogSoftmax") else out


class GradGraph:
    """An ONNX inference graph run forward and differentiated in NumPy.

    ``trainable`` is a mode (``"bias"``: every layer's bias and BatchNorm shift; ``"head"``: the classifier's
    weight and bias, whatever ops make it (roles); ``"bias+head"``) or an iterable of initializer names. ``params`` holds
    every initializer (cast to ``dtype`` if float); update the trainable ones there, forward reads them.
    ``output`` defaults to the graph's output (see :func:`logits_name` for the logits before a Softmax).
    ``extra`` names initializers that train on top of a mode (the lite residual modules' weights).
    ``batch_stats``: BatchNorm in training mode where a gradient passes (each BatchNorm whose input, scale or
    shift needs one): a training forward normalises by the batch's own mean and variance (and backward
    differentiates through them), its tape's ``stats`` holds them for :meth:`set_statistics`; a forward with
    ``train=False`` (evaluation) uses the running statistics in ``params``, as the written model does.
    """

    def __init__(self, model, trainable="bias", *, output: str | None = None, dtype=np.float32, extra=(),
                 batch_stats: bool = False):
        model = load_model(model)
        self.dtype = np.dtype(dtype)
        self._check_opset(model)
        graph = model.graph
        to_array = _lazy.from_import("onnx", "numpy_helper").to_array
        self.params = {t.name: self._cast(to_array(t)) for t in graph.initializer}
        inputs = [i.name for i in graph.input if i.name not in self.params]
        if len(inputs) != 1:
            raise UsageError(f"the graph has {len(inputs)} data inputs ({', '.join(inputs)})", graph.name,
                             "the gradient engine takes one image batch")
        self.input, self.output = inputs[0], output or graph.output[0].name
        self._constants: dict = {}
        self.nodes = self._compile(_needed(list(graph.node), self.output))
        self.trainable = self._select(trainable)
        if extra:
            self.trainable = tuple(dict.fromkeys(self.trainable + self._select(list(extra))))
        self._plan()
        for _, op in self.nodes:
            if batch_stats and isinstance(op, _BatchNorm) and any(op.need):
                op.batch_stats = True

    def statistics(self) -> list[str]:
        """The running means and variances training mode updates (batch_stats), in graph order."""
        return [n for node, op in self.nodes if getattr(op, "batch_stats", False) for n in node.input[3:5]]

    def set_statistics(self, parts: Iterable[tuple]) -> None:
        """The running statistics (in ``params``, in place) set to the batches' (the engine's settle pass), the
        variance unbiased as ONNX's BatchNormalization keeps it. ``parts``: one (samples, {BatchNorm node index:
        (mean, variance, values per channel per sample)}) per micro-batch, read one at a time (a pass at
        micro-batch 1 has 256 of them); their statistics are combined into the whole's as they come (Chan et
        al.'s pairwise update: the variance within plus between micro-batches)."""
        seen: dict[int, list] = {}   # node index -> [samples, mean, sum of squared deviations, values per sample]
        for n, stats in parts:
            for index, (mean, var, per) in stats.items():
                m = np.asarray(mean, np.float64).reshape(-1)
                sq = n * np.asarray(var, np.float64).reshape(-1)
                if index not in seen:
                    seen[index] = [n, m, sq, per]
                    continue
                acc = seen[index]
                total = acc[0] + n
                delta = m - acc[1]
                acc[1] = acc[1] + delta * (n / total)
                acc[2] = acc[2] + sq + delta ** 2 * (acc[0] * n / total)
                acc[0] = total
        for index, (total, mean, sq, per) in seen.items():
            node = self.nodes[index][0]
            count = total * per
            var = sq / total * (count / max(count - 1, 1))
            for name, value in ((node.input[3], mean), (node.input[4], var)):
                self.params[name][...] = value.reshape(self.params[name].shape)

    # -- loading
    def _check_opset(self, model):
        version = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)
        if version < 13:
            raise Unsupported("model", model.graph.name or "graph", f"opset {version}: ops are read with "
                              "opset 13 semantics (Clip bounds as inputs, Softmax on one axis); export with 13")

    def _cast(self, a: np.ndarray) -> np.ndarray:
        return a.astype(self.dtype) if a.dtype.kind == "f" else a

    def const(self, name: str):
        return self.params[name] if name in self.params else self._constants[name]

    def _compile(self, nodes) -> list:
        known = set(self.params) | {self.input}
        compiled = []
        for node in nodes:
            label = _label(node)
            if node.domain not in ("", "ai.onnx"):
                raise Unsupported(node.op_type, label, f"domain {node.domain!r} is not ONNX's own")
            missing = [i for i in node.input if i and i not in known]
            if missing:
                raise Unsupported(node.op_type, label, f"input {missing[0]} is not produced before this node")
            known.update(node.output)
            if node.op_type == "Constant":
                self._constants[node.output[0]] = self._constant(node, label)
                continue
            cls = OPS.get(node.op_type)
            if cls is None:
                raise Unsupported(node.op_type, label, "no NumPy forward/backward for this op")
            # a copy of its own: protobuf's C core frees a model only when no part of it is held, and a node held
            # here kept every weight of the file alive beside self.params (12 MB, MobileNetV2 lite)
            node = type(node).FromString(node.SerializeToString())
            compiled.append((node, cls(node, label, {**self.params, **self._constants})))
        if self.output not in known:
            raise UsageError(f"no value named {self.output!r} in the graph", "output")
        return compiled

    def _constant(self, node, label):
        value = [a for a in node.attribute if a.name == "value"]
        if len(node.attribute) != 1 or not value:
            raise Unsupported("Constant", label, "only the tensor 'value' attribute is implemented")
        return self._cast(_lazy.from_import("onnx", "numpy_helper").to_array(value[0].t))

    # -- what trains and what backward must reach
    def _select(self, trainable) -> tuple:
        nodes = [node for node, _ in self.nodes]
        if not isinstance(trainable, str):
            names = list(dict.fromkeys(trainable))
            unknown = [n for n in names if n not in self.params or self.params[n].dtype.kind != "f"]
            if unknown:
                raise UsageError(f"{unknown[0]!r} is not a float initializer of the graph", "trainable",
                                 "name initializers as in the ONNX file")
            return tuple(names)
        if trainable not in MODES:
            raise UsageError(f"unknown trainable set {trainable!r}", "trainable",
                             f"use one of {', '.join(MODES)} or a list of initializer names")
        shapes = {n: tuple(v.shape) for n, v in self.params.items() if v.dtype.kind == "f"}
        names = []
        if "bias" in trainable:   # every layer's bias and BatchNorm shift, whatever ops make the layer
            names += roles.layer_biases(nodes, shapes)
        if "head" in trainable:   # the classifier, whatever ops make it (refused in one line if not recognised)
            names += roles.classifier(nodes, shapes, self.output, "trainable=head").names
        if not names:
            raise UsageError(f"the graph has nothing to train in mode {trainable!r}", "trainable")
        return tuple(dict.fromkeys(names))

    def _plan(self):
        """Which inputs of which nodes need a gradient: only paths from a trainable initializer onwards."""
        wanted = set(self.trainable)
        self._uses: dict[str, int] = {}
        for node, op in self.nodes:
            op.need = tuple(bool(n) and n in wanted for n in node.input)
            for i, (name, need) in enumerate(zip(node.input, op.need)):
                if need and i not in op.differentiable:
                    op.refuse(f"input {i} ({name}) cannot train: the op is not differentiable in it")
                self._uses[name] = self._uses.get(name, 0) + 1
            if any(op.need):
                wanted.update(o for o in node.output if o)
        if self.output not in wanted:
            raise UsageError(f"no trainable initializer ({', '.join(self.trainable)}) reaches {self.output!r}",
                             "trainable")

    # -- running
    def forward(self, x: np.ndarray, train: bool = True) -> tuple:
        """The output for batch ``x`` and the :class:`Tape` its backward needs; intermediates are freed as
        soon as their last consumer ran, as inference would. ``train=False``: BatchNorm on its running
        statistics whatever ``batch_stats`` says (evaluation)."""
        x = np.asarray(x, self.dtype)
        tape = Tape(x.shape[0])
        env, left = {self.input: x}, dict(self._uses)
        live = kept = 0   # bytes of the values alive in env and of the tape (the memory planner's figures)
        for index, (node, op) in enumerate(self.nodes):
            ins = [None if not n else env[n] if n in env else self.const(n) for n in node.input]
            if train and getattr(op, "batch_stats", False):
                y, saved, tape.stats[index] = op.forward_batch(ins)
            else:
                y, saved = op.forward(ins)
            tape.activation_bytes += y.nbytes
            tape.largest_bytes = max(tape.largest_bytes, y.nbytes)
            if any(op.need):
                tape.saved[index], tape.labels[index] = saved, (op.label, op.op)
                kept += sum(v.nbytes for v in saved.values() if hasattr(v, "nbytes"))
            env[node.output[0]] = y
            live += y.nbytes
            tape.peak_bytes = max(tape.peak_bytes, live + kept)
            for n in node.input:
                left[n] -= 1
                if not left[n] and n != self.output and n in env:
                    live -= env.pop(n).nbytes
        tape.tape_bytes = tape.nbytes
        return env[self.output], tape

    def backward(self, tape: Tape, dout: np.ndarray) -> dict:
        """dL/d(initializer) for every trainable initializer, from dL/d(output). Uses the tape up (each
        node's record is dropped once its backward ran, so memory falls as the pass proceeds)."""
        trainable = set(self.trainable)
        grads, found = {self.output: np.asarray(dout, self.dtype)}, dict[str, np.ndarray]()
        kept = tape.nbytes
        for index in sorted(tape.saved, reverse=True):
            node, op = self.nodes[index]
            saved = tape.saved.pop(index)
            dy = grads.pop(node.output[0], None)
            if dy is None:
                continue
            consts = [self.const(n) if c else None for n, c in zip(node.input, op.is_const)]
            out = op.backward(dy, saved, consts)
            held = sum(g.nbytes for g in grads.values()) + sum(g.nbytes for g in out if g is not None)
            tape.peak_bytes = max(tape.peak_bytes, kept + held + dy.nbytes)
            kept -= sum(v.nbytes for v in saved.values() if hasattr(v, "nbytes"))
            for name, need, g in zip(node.input, op.need, out):
                if need and g is not None:
                    into = found if name in trainable else grads
                    into[name] = g if name not in into else into[name] + g
        return {n: np.asarray(found[n], self.dtype).reshape(self.params[n].shape) for n in self.trainable}


# -------------------------------------------------------------------------------------------------- the loss
def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple:
    """(loss summed over the batch, correct count, dL/dlogits of that sum) for int class labels."""
    labels = np.asarray(labels).astype(np.int64, copy=False)
    rows = np.arange(len(labels))
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    grad = np.exp(logp)
    grad[rows, labels] -= 1
    return float(-logp[rows, labels].sum()), int((logits.argmax(axis=1) == labels).sum()), grad
