"""The grid a tune searches: ``NAME=V1,V2`` entries (repeated ``--grid``) or a YAML file in the form of MXNet's
``GridSearch`` (``param_dict: {learning_rate: [...], ...}``, ``objective: validation_accuracy``).

Every name is one of finetune's options worth searching; every value is read by finetune's own declaration
(edgetrain.options.FinetuneOptions), so a value finetune would refuse is refused here, before any training.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import UsageError
from ..options import grid_entries, grid_field, grid_values, objective_text

YAML_KEYS = ("param_dict", "objective")


@dataclass
class Grid:
    """The axes in the order given (field -> values as finetune reads them) and the objective a file named."""

    axes: dict[str, list] = field(default_factory=dict)
    objective: str | None = None
    sources: list[str] = field(default_factory=list)

    def points(self) -> list[dict]:
        """Every combination, the first axis slowest (the order trials are numbered in)."""
        names = list(self.axes)
        return [dict(zip(names, values)) for values in itertools.product(*(self.axes[n] for n in names))]

    def to_dict(self) -> dict:
        return {name: list(values) for name, values in self.axes.items()}


def read_grid(text: str | None) -> Grid:
    """The Grid ``text`` (as grid_text wrote it) stands for, YAML files read; an empty grid is refused."""
    grid = Grid()
    for entry in grid_entries(text):
        if "=" in entry:
            name, _, raw = entry.partition("=")
            _add(grid, grid_field(name, "--grid"), raw.split(","), "--grid")
        else:
            _read_yaml(grid, Path(entry))
    if not grid.axes:
        raise UsageError("the grid is empty", "--grid", "give the values to search, e.g. --grid lr=0.003,0.01,0.03 "
                         "--grid train_layers=head,bias,lite")
    return grid


def _add(grid: Grid, key: str, raw: list, where: str) -> None:
    if key in grid.axes:
        raise UsageError(f"the grid names '{key}' twice", where, "give each name once")
    grid.axes[key] = grid_values(key, raw, where)


def _read_yaml(grid: Grid, path: Path) -> None:
    from ..fileio import parse_yaml, read_text_bounded

    if not path.is_file():
        raise UsageError(f"grid file not found: {path}", "--grid", "give a YAML file with a param_dict, or NAME=V1,V2")
    source = str(path)
    data = parse_yaml(read_text_bounded(path, "grid file"), source)
    if not isinstance(data, dict):
        raise UsageError("a grid file is a mapping (param_dict, objective)", source,
                         "write param_dict: {learning_rate: [0.01, 0.1]}")
    for key in data:
        if key not in YAML_KEYS:
            raise UsageError(f"unknown key '{key}'", f"{source}, field '{key}'", f"a grid file has {', '.join(YAML_KEYS)}")
    params = data.get("param_dict")
    if not isinstance(params, dict) or not params:
        raise UsageError("param_dict is missing or empty", f"{source}, field 'param_dict'",
                         "give name: [values], e.g. learning_rate: [0.01, 0.1]")
    for name, values in params.items():
        where = f"{source}, field 'param_dict.{name}'"
        values = values if isinstance(values, list) else [values]
        if any(isinstance(v, (dict, list)) or v is None for v in values):
            raise UsageError("each value is a number or a word", where, "give a list, e.g. [0.01, 0.1]")
        _add(grid, grid_field(name, where), values, where)
    if "objective" in data:
        try:
            grid.objective = objective_text(data["objective"])
        except ValueError as exc:
            raise UsageError(f"objective {str(data['objective'])[:40]!r}: {exc}", f"{source}, field 'objective'",
                             "use validation_accuracy") from None
    grid.sources.append(source)
