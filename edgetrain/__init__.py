"""edgetrain: take MXNet Gluon models to low-power devices.

The public Python API. Names are resolved lazily so that importing edgetrain (and `edgetrain --help`)
does not load mxnet or onnxruntime.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_API = {
    "EdgetrainError": "errors", "UsageError": "errors", "BudgetExceeded": "errors", "RunFailed": "errors",
    "Preprocess": "preprocess",
    "load_gluon": "models", "load_onnx": "models", "save_prefix": "models", "parse_model_ref": "models",
    "load_data": "data", "Dataset": "data",
    "load_device": "devices", "list_profiles": "devices", "detect_host": "devices",
    "apply_threads": "runtime",
    "quantize_model": "quantize", "QuantizeResult": "quantize",
    "export_onnx": "export", "ExportResult": "export", "compare_outputs": "compare", "Comparison": "compare",
    "profile_model": "profile", "ProfileResult": "profile", "energy_report": "energy",
    "finetune_model": "finetune", "FinetuneResult": "finetune",
}


def __getattr__(name: str):
    module = _API.get(name)
    if module is None:
        raise AttributeError(f"module 'edgetrain' has no attribute '{name}'")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__():
    return sorted(list(globals()) + list(_API))
