"""Where an ONNX inference graph can be cut into layers: the tensors no skip connection crosses.

``last:N`` cuts the graph right before its N-th weighted layer from the end; ``lite`` finds its blocks among
the same layers (lite.py). A layer is a weighted node (Conv, Gemm, MatMul with an initializer weight) and
what follows it up to the next one; a residual block is one layer, since no cut can enter it.
"""
from __future__ import annotations

import numpy as np

from .. import _lazy
from ..errors import UsageError
from ..fileio import atomic_path

WEIGHTED = ("Conv", "Gemm", "MatMul")


def cuts(graph, initializers: set) -> list[tuple[int, str]]:
    """(node index, tensor) of each node whose single output alone carries everything later nodes need
    from it and before it: cutting there leaves no edge (a skip connection) crossing. Constants (initializers,
    Constant nodes) are not edges: each side has its own copy."""
    constant = set(initializers) | {o for n in graph.node if n.op_type == "Constant" for o in n.output}
    last_use: dict[str, int] = {}
    for j, node in enumerate(graph.node):
        for name in node.input:
            if name and name not in constant:
                last_use[name] = j
    # the furthest node that a tensor made so far (the data input first) is still used by
    reach = max((last_use.get(i.name, -1) for i in graph.input if i.name not in constant), default=-1)
    cuts = []
    for i, node in enumerate(graph.node):
        if node.op_type != "Constant" and len(node.output) == 1 and reach <= i:
            cuts.append((i, node.output[0]))
        for out in node.output:
            reach = max(reach, last_use.get(out, -1))
    return cuts


def layer_points(graph, initializers: set) -> list[tuple[int, str]]:
    """(node index, tensor) of the cut right before each weighted layer, in graph order (the data input, at
    index -1, before a first layer that starts the graph); a residual block's layers share one."""
    found = [(-1, i.name) for i in graph.input if i.name not in initializers][:1] + cuts(graph, initializers)
    weighted = [j for j, node in enumerate(graph.node)
                if node.op_type in WEIGHTED and len(node.input) > 1 and node.input[1] in initializers]
    points: list[tuple[int, str]] = []
    for j in weighted:
        before = [(i, name) for i, name in found if i < j]
        if before and (not points or points[-1] != before[-1]):
            points.append(before[-1])
    return points


def cut_before_layer(graph, initializers: set, n: int) -> str:
    """The tensor at which ``last:n`` cuts: right before the n-th weighted layer from the end (a layer being
    a block no cut can enter)."""
    points = [name for i, name in layer_points(graph, initializers) if i >= 0]
    if n > len(points):
        raise UsageError(f"--train-layers last:{n}: the model has {len(points)} layer(s) that can train from the end",
                         "--train-layers", f"use last:{len(points)} at most, or all")
    return points[-n]


def weightless(proto):
    """A copy of ``proto`` for shape inference: large float initializers become graph inputs of their shape
    (inference reads a weight's shape, not its values; on MobileNetV2 at 160x160, inferring the whole model
    raised the fine-tune's RSS by 43 MB: its weights serialized and parsed twice). Small ones stay: a Reshape's
    target shape is read from its values."""
    helper = _lazy.onnx().helper
    light = type(proto)()
    light.ir_version = proto.ir_version
    light.opset_import.extend(proto.opset_import)
    graph = light.graph
    graph.node.extend(proto.graph.node)
    graph.input.extend(proto.graph.input)
    graph.output.extend(proto.graph.output)
    for t in proto.graph.initializer:
        size = int(np.prod(t.dims)) if t.dims else 1
        if t.data_type == 1 and size > 64:
            graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
        else:
            graph.initializer.append(t)
    return light


def shapes_of(proto) -> dict[str, tuple]:
    """(C, H, W, ...) of every tensor whose shape inference knows every dimension but the batch."""
    inferred = _lazy.onnx().shape_inference.infer_shapes(weightless(proto))
    found = {}
    for v in list(inferred.graph.input) + list(inferred.graph.value_info) + list(inferred.graph.output):
        dims = [d.dim_value for d in v.type.tensor_type.shape.dim][1:]
        if dims and all(d > 0 for d in dims):
            found[v.name] = tuple(dims)
    return found


def extract(proto, inputs: list[str], outputs: list[str], shapes: dict[str, tuple]):
    """The part of ``proto`` that computes ``outputs`` from ``inputs`` (and its own initializers), as a model:
    what onnx.utils.Extractor does, without inferring the shapes of the whole weighted model again (twice,
    in the Extractor) to type the part's inputs and outputs: ``shapes`` (shapes_of) has them."""
    helper = _lazy.onnx().helper
    graph = proto.graph
    wanted, keep = set(outputs), []
    for node in reversed(graph.node):
        if any(o in wanted for o in node.output):
            keep.append(node)
            wanted.update(i for i in node.input if i and i not in inputs)
    batch = graph.input[0].type.tensor_type.shape.dim[0]
    first = batch.dim_param or batch.dim_value or "batch"

    def typed(name):
        return helper.make_tensor_value_info(name, 1, [first, *shapes[name]])

    part = type(proto)()
    part.ir_version = proto.ir_version
    part.opset_import.extend(proto.opset_import)
    part.graph.name = graph.name
    part.graph.node.extend(keep[::-1])
    part.graph.input.extend(typed(name) for name in inputs)
    part.graph.output.extend(typed(name) for name in outputs)
    part.graph.initializer.extend(t for t in graph.initializer if t.name in wanted)
    return part


# --- a model's copies without its weights' bytes, and its file written a weight at a time ----------------------

def _copy_field(message, field, value) -> None:
    if hasattr(value, "CopyFrom"):   # a message (FieldDescriptor.label is gone from newer protobufs)
        getattr(message, field.name).CopyFrom(value)
    elif hasattr(value, "extend"):   # a repeated field
        getattr(message, field.name).extend(value)
    else:
        setattr(message, field.name, value)


def _shell(model):
    """A copy of ``model`` without its graph's initializers."""
    shell = type(model)()
    for field, value in model.ListFields():
        if field.name != "graph":
            _copy_field(shell, field, value)
    for field, value in model.graph.ListFields():
        if field.name != "initializer":
            _copy_field(shell.graph, field, value)
    return shell


def without_weights(model, names):
    """A copy of ``model`` (not touched) whose initializers ``names`` keep their name, type and dims but no data:
    marked external (ort_train feeds them as inputs instead: the process's own
    arrays, one copy of the weights), and as write_streamed writes them from arrays."""
    onnx = _lazy.onnx()
    proto = _shell(model)
    names = set(names)
    for t in model.graph.initializer:
        if t.name in names:
            empty = proto.graph.initializer.add()
            empty.name, empty.data_type = t.name, t.data_type
            empty.dims.extend(t.dims)
            empty.data_location = onnx.TensorProto.EXTERNAL
            where = empty.external_data.add()
            where.key, where.value = "location", "edgetrain-shared"
        else:
            proto.graph.initializer.add().CopyFrom(t)
    # parsed anew: protobuf's C core may copy a message by fusing the two trees' memory, which would keep the
    # model's weights alive as long as this copy
    fresh = type(model)()
    fresh.ParseFromString(proto.SerializeToString())
    return fresh


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:
    """A length-delimited protobuf field (wire type 2)."""
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def _float_tensor(name: str, array: np.ndarray) -> tuple[bytes, memoryview]:
    """A float32 TensorProto as (its fields but the raw data's bytes, those bytes): dims (1), data_type (2),
    name (8), raw_data (9, little-endian), so the array is written as it lies in memory, not copied twice."""
    data = memoryview(np.ascontiguousarray(array, "<f4")).cast("B")  # type: ignore[arg-type]  # numpy < 2 stubs lack the buffer protocol
    head = b"".join(_varint(1 << 3) + _varint(int(d)) for d in array.shape) + _varint(2 << 3) + _varint(1)
    head += _field(8, name.encode("utf-8")) + _varint(9 << 3 | 2) + _varint(len(data))
    return head, data


def _read_varint(fh) -> int | None:
    """A varint read from ``fh`` (None at the end of the file)."""
    shift = value = 0
    while True:
        byte = fh.read(1)
        if not byte:
            if shift:
                raise ValueError("truncated varint")
            return None
        value |= (byte[0] & 0x7F) << shift
        shift += 7
        if byte[0] < 0x80:
            return value


def with_metadata_streamed(src, dst, key: str, value: str, what: str) -> None:
    """The ONNX file ``src`` copied to ``dst`` (atomically) with the metadata entry ``key`` set to ``value``, field
    by field of the ModelProto without parsing it: the graph's bytes go through in 1 MiB pieces (onnx.load and
    save held the file three times over: 36 MB at the end of a tune of MobileNetV2 at 80x80, where its peak was).
    Entries named ``key`` are left out and the new one follows the rest (protobuf reads repeated fields in order).
    A file that ends inside a field is refused (UsageError; ``dst`` is left as it was)."""
    with open(src, "rb") as fh, atomic_path(dst, what) as tmp, open(tmp, "wb") as out:
        field = 0

        def need(got):
            if got is None:
                raise ValueError("no bytes")
            return got

        try:
            while (tag := _read_varint(fh)) is not None:
                field, kind = tag >> 3, tag & 7
                if kind == 0:
                    out.write(_varint(tag) + _varint(need(_read_varint(fh))))
                    continue
                if kind != 2:   # ModelProto has varint and length-delimited fields only
                    raise UsageError(f"not an ONNX model: field {field} has wire type {kind}", str(src),
                                     "give a file edgetrain or onnx.save wrote")
                size = need(_read_varint(fh))
                if field == 14:   # metadata_props: a StringStringEntryProto (key 1, value 2)
                    entry = fh.read(size)
                    if len(entry) < size:
                        raise ValueError("short entry")
                    onnx = _lazy.onnx()
                    if onnx.StringStringEntryProto.FromString(entry).key != key:
                        out.write(_field(14, entry))
                    continue
                out.write(_varint(tag) + _varint(size))
                while size:
                    piece = need(fh.read(min(size, 1 << 20)) or None)
                    out.write(piece)
                    size -= len(piece)
        except ValueError:   # (_read_varint's "truncated varint" too)
            raise UsageError(f"the ONNX file is truncated: it ends inside field {field} of its ModelProto",
                             str(src), "restore it, or write it again (a tune's trial model.onnx: remove it and run "
                             "the tune again with --resume)") from None
        entry = _field(1, key.encode("utf-8")) + _field(2, value.encode("utf-8"))
        out.write(_field(14, entry))


def write_streamed(path, model, values: dict, what: str) -> None:
    """``model`` as an ONNX file, each initializer named in ``values`` written from that array (as float32),
    without the file's bytes in memory at once (they took 15-26 MB at the end of a fine-tune of MobileNetV2,
    where its peak was; a TensorProto made per weight still 5): the model without its initializers, then each
    initializer as a GraphProto of its own (field 7 of ModelProto, holding field 5). Protobuf merges repeated
    occurrences of a message field, so the file parses to the model, its initializers in order."""
    with atomic_path(path, what) as tmp, open(tmp, "wb") as fh:
        fh.write(_shell(model).SerializeToString())
        for t in model.graph.initializer:
            if t.name in values:
                head, data = _float_tensor(t.name, np.asarray(values[t.name], np.float32))
                tensor = _varint(5 << 3 | 2) + _varint(len(head) + len(data))
                fh.write(_varint(7 << 3 | 2) + _varint(len(tensor) + len(head) + len(data)) + tensor + head)
                fh.write(data)
            else:
                fh.write(_field(7, _field(5, t.SerializeToString())))
