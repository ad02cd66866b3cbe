"""Narrow repairs that make MXNet 1.9.1's ONNX exporter (``mx.onnx``) work with current onnx/onnxruntime.

MXNet 1.9.1 is the last release; its exporter was written against onnx 1.7-1.10. Against onnx 1.23 and
onnxruntime 1.32 it breaks in the ways below, each repaired here and nowhere else:

1. ``onnx.mapping`` is gone (removed in onnx 1.15). The exporter only uses its two dtype tables
   (``NP_TYPE_TO_TENSOR_TYPE``, ``TENSOR_TYPE_TO_NP_TYPE``); ``_install_mapping`` rebuilds them from
   ``onnx.helper.tensor_dtype_to_np_dtype`` and registers the module, without touching onnx otherwise.
2. ``export_model`` stamps the model with the installed onnx's newest opset (28) while translating with
   opset 12/13 rules; ONNX Runtime 1.32 then rejects or mis-runs it. ``translate`` calls the translator
   itself and declares the opset it translated for, with the IR version that opset implies (the newest IR
   would be refused by older runtimes on the device).
3. Every weight is listed as a graph input as well as an initializer. ONNX Runtime then treats the
   weights as overridable inputs and will not constant-fold them (no Conv+BatchNorm fusion):
   ``drop_weight_inputs`` removes them from the inputs.
4. Weights are written as ``float_data`` through ``ndarray.tolist()``: a Python float object per weight.
   Measured on VGG-11 (133M parameters, 224x224): 95.7 s and 7.0 GB peak RSS to translate and serialize,
   against 8.8 s and 4.3 GB with ``_raw_weights``, which re-registers the translation of weight nodes to
   store them as ``raw_data`` (same values, same file semantics).
5. A missing translation raises a bare ``AttributeError`` from deep inside the exporter, and a
   translation that rejects an attribute raises whatever it likes, neither naming the layer. ``translate``
   checks every operator up front and wraps the per-node conversion so a failure is a ``TranslationError``
   naming the operator and the layer.
6. ``BatchNorm`` ignores ``fix_gamma``. With ``fix_gamma=True`` (the MXNet operator's default, and what
   Gluon's ``BatchNorm(scale=False)`` writes, e.g. ResNet v2's input normalisation) MXNet uses a gamma of
   1 whatever the stored gamma holds; the exporter feeds the stored gamma to ONNX, so any model whose
   stored gamma is not exactly 1 exports wrong (max abs error 75 on logits of 1900, measured on
   resnet50_v2 at 96x96 with gamma drawn from U(0.8, 1.2)). ``_fixed_gamma`` feeds ones instead, and
   unused initializers are dropped afterwards.
7. ``create_onnx_graph_proto`` ends with ``onnx.checker.check_graph(graph)``, whose default context is
   the installed onnx's newest opset, so a correct opset-13 node whose attributes changed later fails
   (``ReduceMean``'s ``axes`` became an input in opset 18: every ``LayerNorm``). ``_checking_at`` makes
   that check use the opset being translated for.
8. With ``dynamic=True`` the exporter marks *every* dimension of inputs and outputs unknown; edgetrain
   only wants a variable batch, so ``translate`` passes a named batch dimension and fixes the outputs.

Import this module freely; it imports mxnet and onnx only when ``translate`` runs.
"""
from __future__ import annotations

import contextlib
import sys
import threading
import types

from .. import _lazy

# mxnet 1.9.1's translation registry has opset 12 and 13 tables; below 12 it warns and uses 12's.
MIN_OPSET = 12
MAX_OPSET = 13
BATCH_DIM = "batch"

_installed = False
_lock = threading.Lock()


class TranslationError(Exception):
    """An MXNet operator the exporter cannot translate (or rejected), with the layer that uses it."""

    def __init__(self, op: str, layer: str, reason: str):
        self.op, self.layer, self.reason = op, layer, reason
        super().__init__(f"operator '{op}' in layer '{layer}': {reason}")


def install() -> None:
    """Apply the repairs that must be in place before the exporter runs (idempotent)."""
    global _installed
    with _lock:
        if _installed:
            return
        _install_mapping()
        MXNetGraph = _lazy.from_import("mxnet.onnx.mx2onnx._export_onnx", "MXNetGraph")
        # importing the translations registers them in MXNetGraph.registry_
        _lazy.module("mxnet.onnx.mx2onnx._op_translations._op_translations_opset12")

        _raw_weights(MXNetGraph)
        _fixed_gamma(MXNetGraph)
        _name_failing_layer(MXNetGraph)
        _installed = True


def _install_mapping() -> None:
    import numpy as np
    onnx = _lazy.onnx()
    TensorProto, helper = _lazy.from_import("onnx", "TensorProto", "helper")

    if "onnx.mapping" in sys.modules and hasattr(sys.modules["onnx.mapping"], "NP_TYPE_TO_TENSOR_TYPE"):
        return  # an onnx old enough to still have it
    tensor_to_np, np_to_tensor = {}, {}
    for _, code in sorted(TensorProto.DataType.items(), key=lambda kv: kv[1]):
        try:
            dtype = np.dtype(helper.tensor_dtype_to_np_dtype(code))
        except Exception:  # UNDEFINED
            continue
        # Only plain numpy dtypes: the old tables did not know ml_dtypes' bfloat16/float8/int4.
        if dtype.type.__module__ != "numpy":
            continue
        tensor_to_np[code] = dtype
        np_to_tensor.setdefault(dtype, code)
    mapping = types.ModuleType("onnx.mapping")
    mapping.__doc__ = "Rebuilt by edgetrain.compat.mxnet_onnx for mxnet 1.9.1's exporter."
    mapping.TENSOR_TYPE_TO_NP_TYPE = tensor_to_np
    mapping.NP_TYPE_TO_TENSOR_TYPE = np_to_tensor
    sys.modules["onnx.mapping"] = mapping
    onnx.mapping = mapping


def _raw_weights(graph_cls) -> None:
    """Store weights as raw bytes instead of a Python list of floats (same tensor, ~100x faster)."""
    helper, numpy_helper = _lazy.from_import("onnx", "helper", "numpy_helper")

    table = graph_cls.registry_.setdefault(MIN_OPSET, {})
    original = table["null"]

    def convert_weights_and_inputs(node, **kwargs):
        if kwargs["is_input"]:
            return original(node, **kwargs)
        name = node["name"]
        arr = kwargs["weights"][name]
        tensor = numpy_helper.from_array(arr, name)
        kwargs["initializer"].append(tensor)
        return [helper.make_tensor_value_info(name, tensor.data_type, arr.shape)], (arr.dtype,)

    table["null"] = convert_weights_and_inputs


def _fixed_gamma(graph_cls) -> None:
    """BatchNorm with fix_gamma=True: scale by ones, as MXNet does, not by the stored gamma."""
    import numpy as np
    numpy_helper = _lazy.from_import("onnx", "numpy_helper")

    table = graph_cls.registry_.setdefault(MIN_OPSET, {})
    original = table["BatchNorm"]

    def convert_batchnorm(node, **kwargs):
        nodes = original(node, **kwargs)
        fix = str(node.get("attrs", {}).get("fix_gamma", "True")).lower() in ("true", "1")
        if not fix:
            return nodes
        bn = nodes[-1]
        gamma = kwargs["weights"].get(bn.input[1])
        if gamma is None:  # gamma computed in the graph, not a stored weight: nothing we can fix safely
            raise TranslationError("BatchNorm", node["name"], "fix_gamma=True with a gamma that is not a weight")
        ones = f"{node['name']}_fixed_gamma"
        kwargs["initializer"].append(numpy_helper.from_array(np.ones_like(gamma), ones))
        bn.input[1] = ones
        return nodes

    table["BatchNorm"] = convert_batchnorm


def _name_failing_layer(graph_cls) -> None:
    """Make a failing translation say which operator and layer it was working on."""
    original = graph_cls.convert_layer

    def convert_layer(node, **kwargs):
        try:
            return original(node, **kwargs)
        except TranslationError:
            raise
        except Exception as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise TranslationError(str(node.get("op")), str(node.get("name")), reason) from exc

    graph_cls.convert_layer = staticmethod(convert_layer)


def supported_ops(opset: int) -> set[str]:
    install()
    MXNetGraph = _lazy.from_import("mxnet.onnx.mx2onnx._export_onnx", "MXNetGraph")

    ops: set[str] = set()
    for version in range(min(opset, MAX_OPSET), MIN_OPSET - 1, -1):
        ops.update(MXNetGraph.registry_.get(version, {}))
    return ops


def untranslatable(sym, opset: int) -> list[tuple[str, str]]:
    """(operator, layer name) for every node of ``sym`` that has no ONNX translation at ``opset``."""
    import json

    known = supported_ops(opset)
    nodes = json.loads(sym.tojson())["nodes"]
    return [(n["op"], n["name"]) for n in nodes if n["op"] != "null" and n["op"] not in known]


def translate(sym, params: dict, input_name: str, input_shape: tuple, opset: int = 13,
              dynamic_batch: bool = False, check: bool = True):
    """Translate an MXNet symbol + params into an ONNX ModelProto that checks and loads in ONNX Runtime.

    ``params`` maps parameter names (no ``arg:``/``aux:`` prefix) to NDArrays; ``input_shape`` is the full
    N,C,H,W shape. Raises TranslationError for an operator the exporter cannot translate. ``check=False``
    skips the exporter's own onnx.checker pass (it serializes and parses the whole graph, weights and all:
    ~2x the weights in peak memory) for a caller that proves the result another way (finetune runs it in
    ONNX Runtime against Gluon's outputs before trusting it).
    """
    if not MIN_OPSET <= opset <= MAX_OPSET:
        raise ValueError(f"opset {opset} outside the exporter's {MIN_OPSET}..{MAX_OPSET}")
    install()
    MXNetGraph = _lazy.from_import("mxnet.onnx.mx2onnx._export_onnx", "MXNetGraph")
    TensorProto, helper = _lazy.from_import("onnx", "TensorProto", "helper")

    missing = untranslatable(sym, opset)
    if missing:
        op, layer = missing[0]
        raise TranslationError(op, layer, "mxnet 1.9.1's ONNX exporter has no translation for it")
    dyn = [(BATCH_DIM, *input_shape[1:])] if dynamic_batch else None
    with _checking_at(opset, check):
        graph = MXNetGraph().create_onnx_graph_proto(
            sym, params, [tuple(input_shape)], [TensorProto.FLOAT], opset_version=opset,
            dynamic=dynamic_batch, dynamic_input_shapes=dyn)
    if graph.input and graph.input[0].name != input_name:
        raise TranslationError("null", graph.input[0].name, f"expected the graph input to be '{input_name}'")
    # make_model_gen_version picks the IR version the opset implies instead of the newest one.
    model = helper.make_model_gen_version(graph, opset_imports=[helper.make_opsetid("", opset)],
                                          producer_name="edgetrain", producer_version=_mxnet_version())
    drop_weight_inputs(model)
    drop_unused_initializers(model)
    if dynamic_batch:
        _batch_only_dynamic(model)
    return model


@contextlib.contextmanager
def _checking_at(opset: int, check: bool = True):
    """The exporter's own check_graph, at the opset being translated for (not the newest); none at all
    with ``check=False``."""
    checker, helper = _lazy.from_import("onnx", "checker", "helper")

    ctx = checker.C.CheckerContext()
    ctx.ir_version = helper.find_min_ir_version_for([helper.make_opsetid("", opset)])
    ctx.opset_imports = {"": opset}
    original = checker.check_graph

    def check_graph(graph, *args, **kwargs):
        return original(graph, ctx) if check else None

    with _lock:
        checker.check_graph = check_graph
        try:
            yield
        finally:
            checker.check_graph = original


def drop_weight_inputs(model) -> None:
    """Remove initializers from graph.input so ONNX Runtime treats them as constants it can fold."""
    weights = {t.name for t in model.graph.initializer}
    keep = [i for i in model.graph.input if i.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(keep)


def drop_unused_initializers(model) -> None:
    """Weights no node reads (a fixed gamma's stored value) would only make the file bigger."""
    used = {i for n in model.graph.node for i in n.input} | {o.name for o in model.graph.output}
    keep = [t for t in model.graph.initializer if t.name in used]
    if len(keep) != len(model.graph.initializer):
        del model.graph.initializer[:]
        model.graph.initializer.extend(keep)


def _batch_only_dynamic(model) -> None:
    """Outputs keep their known trailing dims; only the leading (batch) dim is symbolic."""
    shape_inference, helper = _lazy.from_import("onnx", "shape_inference", "helper")

    inferred = shape_inference.infer_shapes(_without_weight_bytes(model, helper))
    known = {o.name: o for o in inferred.graph.output}
    for out in model.graph.output:
        dims = out.type.tensor_type.shape.dim
        src = known.get(out.name)
        src_dims = src.type.tensor_type.shape.dim if src is not None else []
        for k, dim in enumerate(dims):
            dim.Clear()
            if k == 0:
                dim.dim_param = BATCH_DIM
            elif k < len(src_dims) and src_dims[k].HasField("dim_value"):
                dim.dim_value = src_dims[k].dim_value
            else:
                dim.dim_param = f"{out.name}_dim{k}"


SMALL_CONSTANT = 4096  # bytes: a shape or axes constant shape inference may need the values of


def _without_weight_bytes(model, helper):
    """A copy of ``model`` for shape inference: each large initializer becomes a graph input of its type
    and shape (inference needs those, not the bytes), so inferring never copies the weights (infer_shapes
    serializes the whole model and returns another copy of it)."""
    graph = model.graph
    small = [t for t in graph.initializer if len(t.raw_data) <= SMALL_CONSTANT and len(t.float_data) * 4 <= SMALL_CONSTANT]
    kept = {t.name for t in small}
    stand_ins = [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                 for t in graph.initializer if t.name not in kept]
    light = helper.make_graph(list(graph.node), graph.name, list(graph.input) + stand_ins, list(graph.output),
                              initializer=small, value_info=list(graph.value_info))
    return helper.make_model(light, opset_imports=list(model.opset_import), ir_version=model.ir_version)


def _mxnet_version() -> str:
    mxnet = _lazy.mxnet()

    return f"mxnet {mxnet.__version__} exporter"
