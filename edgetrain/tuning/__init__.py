"""tuning: ``edgetrain tune``'s wing. The grid (its names and values read as finetune reads them, or a YAML file
in MXNet's GridSearch form), the schedule (successive halving over epochs, the full grid, a random sample),
the journal a resume replays, the tuner that runs the trials as fine-tune jobs, and its outputs.

The face: what other code may use. Its names load on first use. A grid's names and values are read by the
declaration (edgetrain.options: ``grid_text``), as finetune's own options read them; this wing reads its YAML files.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from .. import _lazy

_FACE = {  # name -> the module of this wing that defines it
    "Grid": "grid", "read_grid": "grid",
    "halving": "schedule", "rung_epochs": "schedule", "planned_epochs": "schedule",
    "TuneResult": "records", "tune": "tuner",
}
__all__ = sorted(_FACE)

if TYPE_CHECKING:
    from .grid import Grid, read_grid
    from .schedule import halving, planned_epochs, rung_epochs
    from .records import TuneResult
    from .tuner import tune


__getattr__, __dir__ = _lazy.face(__name__, _FACE, globals())
