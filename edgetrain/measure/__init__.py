"""measure: what a model costs on a device. Profiling (one fresh child per configuration, the device's
verdict), the profile child itself, the memory model that predicts peak RSS from the graph, and the
profile report (HTML, Markdown, the terminal summary).

The face: what other code may use. Its names load on first use, as edgetrain's own do, so the profile
child (``python -m edgetrain.measure.child``) starts with nothing loaded but what it measures.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _lazy

_FACE = {  # name -> the module of this wing that defines it
    "ProfileResult": "profiling", "profile": "profiling", "device_speed": "profiling", "attribute": "attribution",
    "first_window": "attribution",
    "check_report_path": "report", "energy_lines": "report", "host_energy_lines": "report",
    "text_summary": "report", "write_report": "report",
    "reference_onnx": "reference_net", "onnx_stats": "memory_model",
}
__all__ = sorted(_FACE)

if TYPE_CHECKING:
    from .attribution import attribute, first_window
    from .memory_model import onnx_stats
    from .profiling import ProfileResult, device_speed, profile
    from .reference_net import reference_onnx
    from .report import check_report_path, energy_lines, host_energy_lines, text_summary, write_report


__getattr__, __dir__ = _lazy.face(__name__, _FACE, globals())
