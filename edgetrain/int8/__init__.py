"""int8: post-training quantization. Calibration data, the int8 scheme a device wants, the memory plan, the
nodes that lose most, the scheme search (timed in fresh children), the ONNX Runtime and MXNet quantizers, and the
top-1 figure both are judged by.

The face: what other code may use. Its names load on first use, as edgetrain's own do, so a child started
inside the wing (``python -m edgetrain.int8.search``) loads only what it runs.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _lazy

_FACE = {  # name -> the module of this wing that defines it
    "onnx_top1": "accuracy",
    "calibration_reader": "calibration", "check_symbol_not_quantized": "calibration",
    "calibration_notes": "calibration", "load_calibration": "calibration", "load_validation": "calibration",
    "stride_for": "calibration",
    "QuantizeMemoryPlan": "memplan", "check_memory_plan": "memplan", "memory_plan": "memplan",
    "quantize_mxnet": "mxnet",
    "Quantizer": "ort", "check_not_quantized": "ort", "int8_weight_count": "ort", "prepare": "ort",
    "quantized_node_names": "ort",
    "quiet_ort": "ort", "set_metadata": "ort",
    "SchemeRecord": "scheme", "scheme_for": "scheme",
    "DYNAMIC_OPS": "search", "Candidate": "search", "dynamic_applies": "search", "fastest": "search",
    "measure": "search", "static_candidates": "search",
    "NodeError": "sensitivity", "node_errors": "sensitivity", "rank_nodes": "sensitivity",
}
__all__ = sorted(_FACE)

if TYPE_CHECKING:
    from .accuracy import onnx_top1
    from .calibration import (calibration_notes, calibration_reader, check_symbol_not_quantized, load_calibration,
                              load_validation, stride_for)
    from .memplan import QuantizeMemoryPlan, check_memory_plan, memory_plan
    from .mxnet import quantize_mxnet
    from .ort import (Quantizer, check_not_quantized, int8_weight_count, prepare, quantized_node_names, quiet_ort,
                      set_metadata)
    from .scheme import SchemeRecord, scheme_for
    from .search import DYNAMIC_OPS, Candidate, dynamic_applies, fastest, measure, static_candidates
    from .sensitivity import NodeError, node_errors, rank_nodes


__getattr__, __dir__ = _lazy.face(__name__, _FACE, globals())
