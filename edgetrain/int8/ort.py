"""ONNX Runtime static int8 quantization: pre-process once, calibrate once, quantize as often as needed.

The accuracy-budget loop re-quantizes with different nodes kept in fp32; calibration ranges do not
depend on that choice, so they are computed once and reused from ORT's calibration cache.
"""
from __future__ import annotations

import contextlib
import io
import json
import logging
from pathlib import Path

from .. import _lazy
from ..errors import UsageError
from ..procmem import release_freed_memory

# Operators that only exist in a quantized graph.
QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "DynamicQuantizeLinear", "QLinearConv", "QLinearMatMul",
                 "QLinearAdd", "QLinearMul", "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearConcat",
                 "QLinearSigmoid", "QLinearLeakyRelu", "QLinearSoftmax", "QGemm", "ConvInteger", "MatMulInteger",
                 "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "MatMulNBits"}
METHODS = ("minmax", "entropy", "percentile")
METADATA_KEY = "edgetrain.quantization"


def check_not_quantized(proto, where: str) -> None:
    ops = sorted({n.op_type for n in proto.graph.node} & QUANTIZED_OPS)
    if ops:
        raise UsageError(f"model is already quantized (it has {', '.join(ops[:3])} nodes)", where,
                         "pass the fp32 model it was made from")


def prepare(fp32_path: Path, out_path: Path) -> list[str]:
    """Shape inference + the graph optimisation that folds BatchNorm into Conv, then name every node.

    Without the folding, int8 ran slower than fp32 (DESIGN.md). Returns the node names in graph order.
    """
    onnx = _lazy.onnx()
    quant_pre_process = _lazy.from_import("onnxruntime.quantization", "quant_pre_process")

    with quiet_ort():
        quant_pre_process(str(fp32_path), str(out_path))
    proto = onnx.load(str(out_path))
    # The optimiser leaves fused nodes unnamed, and nodes_to_exclude addresses nodes by name.
    used = {n.name for n in proto.graph.node if n.name}
    for node in proto.graph.node:
        if not node.name:
            base = f"{node.op_type}_{node.output[0]}" if node.output else node.op_type
            name, k = base, 1
            while name in used:
                name, k = f"{base}_{k}", k + 1
            node.name = name
            used.add(name)
    onnx.save(proto, str(out_path))
    names = [n.name for n in proto.graph.node]
    del proto
    release_freed_memory()  # the optimiser's session and shape inference's copies: not kept under calibration
    return names


class Quantizer:
    """Calibrates ``model_path`` (the prepared fp32 model) on first use, then quantizes with any exclusions."""

    def __init__(self, model_path: Path, workdir: Path, scheme, method: str, reader, samples: int, stride: int):
        self.model_path = Path(model_path)
        self.cache = Path(workdir) / "calibration.json"
        self.scheme = scheme
        self.method = method
        self.reader = reader
        self.samples = samples
        self.stride = stride

    def quantize(self, out_path: Path, exclude: list[str] = ()) -> Path:
        (CalibrationMethod, QuantFormat, QuantType, quantize_static) = _lazy.from_import(
            "onnxruntime.quantization", "CalibrationMethod", "QuantFormat", "QuantType", "quantize_static")

        method = {"minmax": CalibrationMethod.MinMax, "entropy": CalibrationMethod.Entropy,
                  "percentile": CalibrationMethod.Percentile}[self.method]
        qtype = {"int8": QuantType.QInt8, "uint8": QuantType.QUInt8}
        cache = {}
        if _has_calibration_cache(quantize_static):
            cache = {"calibration_cache_path": str(self.cache)}
        calibrate = not cache or not self.cache.exists()
        if calibrate:
            # onnxruntime without calibration_cache_path (added in 2026, PR #28221) calibrates every time.
            self.reader.set_range(0, self.samples)
        with quiet_ort():
            quantize_static(str(self.model_path), str(out_path),
                            calibration_data_reader=self.reader if calibrate else None,
                            quant_format=QuantFormat.QDQ if self.scheme.format == "QDQ" else QuantFormat.QOperator,
                            activation_type=qtype[self.scheme.activations], weight_type=qtype[self.scheme.weights],
                            per_channel=self.scheme.per_channel, reduce_range=self.scheme.reduce_range,
                            calibrate_method=method, nodes_to_exclude=list(exclude),
                            extra_options={"CalibStridedMinMax": self.stride} if calibrate else {}, **cache)
        release_freed_memory()  # the calibration session and its strides' outputs
        return Path(out_path)


def _has_calibration_cache(quantize_static) -> bool:
    import inspect

    return "calibration_cache_path" in inspect.signature(quantize_static).parameters


def set_metadata(path: Path, metadata: dict[str, str], quantization: dict) -> None:
    """Give the int8 file the fp32 export's metadata_props (preprocessing etc.) plus how it was quantized."""
    onnx = _lazy.onnx()

    proto = onnx.load(str(path))
    props = dict(metadata)
    props[METADATA_KEY] = json.dumps(quantization, sort_keys=True)
    # the fp32 export's record said fp32: metadata tells the truth
    props["edgetrain.precision"] = quantization.get("precision", "int8")
    del proto.metadata_props[:]
    for key, value in props.items():
        entry = proto.metadata_props.add()
        entry.key, entry.value = key, value
    onnx.save(proto, str(path))


def int8_weight_count(path: Path) -> int:
    """Elements of the int8/uint8 weight tensors (initializers of 2 or more dimensions) in an ONNX file: 0
    for a graph whose quantization only wrapped activations (nothing int8 is stored)."""
    onnx = _lazy.onnx()

    proto = onnx.load(str(path))
    int8 = {onnx.TensorProto.INT8, onnx.TensorProto.UINT8}
    count = 0
    for t in proto.graph.initializer:
        if t.data_type in int8 and len(t.dims) >= 2:
            n = 1
            for d in t.dims:
                n *= d
            count += n
    return count


def quantized_node_names(int8_path: Path, candidates: list[str]) -> list[str]:
    """The candidate nodes that ended up in int8 (a DequantizeLinear feeds them)."""
    onnx = _lazy.onnx()

    proto = onnx.load(str(int8_path))
    dq_out = {o for n in proto.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    fed = {n.name for n in proto.graph.node if any(i in dq_out for i in n.input)}
    return [c for c in candidates if c in fed]


class quiet_ort:
    """ORT's quantizer print()s its calibration stages to stdout (which may carry our --json) and logs
    advice through the root logger; keep both off the user's terminal. Its errors are held until the work
    ends: said then if it went on regardless, dropped if it failed (the failure is said in one line; a full
    TMPDIR made quant_pre_process log a whole traceback before the save that failed)."""

    def __enter__(self):
        root = logging.getLogger()
        self.level = root.level
        root.setLevel(logging.ERROR)
        self.held = _Held()
        root.addHandler(self.held)
        self.redirect = contextlib.redirect_stdout(io.StringIO())
        self.redirect.__enter__()

    def __exit__(self, exc_type, *rest):
        self.redirect.__exit__(exc_type, *rest)
        root = logging.getLogger()
        root.removeHandler(self.held)
        root.setLevel(self.level)
        if exc_type is None:
            for record in self.held.records:
                logging.getLogger(record.name).handle(record)


class _Held(logging.Handler):
    def __init__(self):
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)
