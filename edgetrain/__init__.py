"""edgetrain: take MXNet Gluon models to low-power devices.

The Python API: ``edgetrain.quantize``, ``export``, ``finetune``, ``profile``, ``inspect``, ``run`` and ``tune`` are
functions taking the same options as the commands (see ``edgetrain.api`` and docs/python-api.md). Names
are resolved lazily so that importing edgetrain (and ``edgetrain --help``) loads no heavy library.
"""
from __future__ import annotations


from . import runtime

runtime.choose_blas_kernels()  # before anything loads numpy's OpenBLAS (see runtime.BLAS_KERNELS)
from . import _lazy  # noqa: E402,F401  its import hook: a plain `import mxnet` after edgetrain gets the compatibility

__version__ = "0.1.0"

_API = {
    "quantize": "api", "export": "api", "finetune": "api", "profile": "api", "inspect": "api", "run": "api",
    "predict": "api", "tune": "api",
    "EdgetrainError": "errors", "UsageError": "errors", "BudgetExceeded": "errors", "RunFailed": "errors",
    "Preprocess": "preprocess",
    "load_gluon": "models", "load_onnx": "models", "save_prefix": "models", "parse_model_ref": "models",
    "load_data": "data", "Dataset": "data",
    "load_device": "devices", "list_profiles": "devices", "detect_host": "host",
    "QuantizeOptions": "options", "ExportOptions": "options", "FinetuneOptions": "options",
    "ProfileOptions": "options", "TuneOptions": "options",
    "Result": "results", "QuantizeResult": "ops.quantize", "ExportResult": "ops.export", "Progress": "results",
    "compare_outputs": "compare", "Comparison": "compare", "energy_report": "energy",
}


__getattr__, __dir__ = _lazy.face(__name__, _API, globals())
