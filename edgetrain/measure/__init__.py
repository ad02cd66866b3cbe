"""measure: what a model costs on a device. Profiling (one fresh child per configuration, the device's
verdict), the profile child itself, the memory model that predicts peak RSS from the graph, and the
profile report (HTML, Markdown, the terminal summary).

The face: what other code may use. Its names load on first use, as edgetrain's own do, so the profile
child (``python -m edgetrain.measure.child``) starts with nothing loaded but what it measures.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

_FACE = {  # name -> the module of this wing that defines it
    "ProfileResult": "profiling", "profile": "profiling",
    "check_report_path": "report", "energy_lines": "report", "text_summary": "report", "write_report": "report",
}
__all__ = sorted(_FACE)

if TYPE_CHECKING:
    from .profiling import ProfileResult, profile
    from .report import check_report_path, energy_lines, text_summary, write_report


def __getattr__(name: str):
    module = _FACE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{module}", __name__), name)


def __dir__():
    return sorted(list(globals()) + __all__)
