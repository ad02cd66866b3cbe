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

# a name a user may give -> the FinetuneOptions field it sets (MXNet's spellings too)
NAMES = {"lr": "lr", "learning_rate": "lr", "optimizer": "optimizer", "momentum": "momentum",
         "weight_decay": "weight_decay", "wd": "weight_decay", "batch_size": "batch_size",
         "train_layers": "train_layers", "epochs": "epochs"}
OBJECTIVES = ("accuracy", "validation_accuracy", "val_accuracy")
YAML_KEYS = ("param_dict", "objective")
FIX = f"search {', '.join(sorted(set(NAMES.values())))} (as finetune's options), e.g. --grid lr=0.003,0.01,0.03"


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


def _field(name: str, where: str) -> str:
    key = str(name).strip().lower().replace("-", "_")
    if key in NAMES:
        return NAMES[key]
    raise UsageError(f"unknown name '{name}' in the grid", where, FIX)


def _values(name: str, raw: list, where: str) -> list:
    """``raw`` read as finetune reads ``name``: each value checked, duplicates (0.01 and 1e-2) once."""
    from ..options import FinetuneOptions

    fld = FinetuneOptions.fields[name]
    if not raw:
        raise UsageError(f"the grid's '{name}' has no values", where, "give one or more, e.g. lr=0.003,0.03")
    out = []
    for value in raw:
        if isinstance(value, str) and not value.strip():
            raise UsageError(f"the grid's '{name}' has an empty value", where, "separate values by single commas")
        try:
            got = fld.read(value.strip() if isinstance(value, str) else value)
        except ValueError as exc:
            what, _, fix = str(exc).partition("; ")
            raise UsageError(f"finetune refuses {fld.on_flag} {str(value)[:40]!r} in the grid: {what}", where,
                             fix or "give a value `edgetrain finetune` takes") from None
        if got is None:
            raise UsageError(f"the grid's '{name}' needs a value, not {value!r}", where, "give e.g. lr=0.003,0.03")
        if got not in out:
            out.append(got)
    return out


def _entries(value) -> list[str]:
    if value is None:
        return []
    if isinstance(value, dict):
        return [f"{k}={','.join(str(v) for v in (vs if isinstance(vs, (list, tuple)) else [vs]))}"
                for k, vs in value.items()]
    if isinstance(value, (list, tuple)):
        return [e for item in value for e in _entries(item)]
    if not isinstance(value, str):
        raise UsageError(f"cannot read the grid {value!r}", "--grid", "give NAME=V1,V2 (or a YAML file)")
    return [e.strip() for e in value.split(";") if e.strip()]


def grid_text(value) -> str | None:
    """The grid as one text, ``name=v1,v2;...`` (each name and value checked, a YAML file's path kept): what
    the declaration holds, and reads back."""
    parts, seen = [], set()
    for entry in _entries(value):
        if "=" not in entry:
            if not entry.lower().endswith((".yaml", ".yml")):
                raise UsageError(f"cannot read the grid entry '{entry[:40]}'", "--grid",
                                 "give NAME=V1,V2,... or a YAML file (*.yaml) with a param_dict")
            parts.append(entry)
            continue
        name, _, raw = entry.partition("=")
        key = _field(name, "--grid")
        if key in seen:
            raise UsageError(f"the grid names '{key}' twice", "--grid", "give each name once, its values comma-separated")
        seen.add(key)
        values = _values(key, raw.split(","), "--grid")
        parts.append(f"{key}={','.join(str(v) for v in values)}")
    return ";".join(parts) or None


MAX_OBJECTIVE_WEIGHT = 1e6


def objective_text(value) -> str:
    """``accuracy``, ``latency:W`` or ``energy:W`` (W > 0: accuracy points per ms / mJ of one inference)."""
    text = str(value).strip().lower()
    if text in OBJECTIVES:
        return "accuracy"
    kind, sep, weight = text.partition(":")
    if kind in ("latency", "energy") and sep:
        try:
            w = float(weight)
        except ValueError:
            w = float("nan")
        # at most a million points per ms or mJ: far beyond it (latency:1e308) the accuracy vanished in the
        # score's rounding and a tie on the same graph chose the less accurate trial, exit 0
        if 0 < w <= MAX_OBJECTIVE_WEIGHT:
            return f"{kind}:{w:g}"
    raise ValueError("not an objective; give accuracy, latency:W or energy:W (W: accuracy points given up per ms "
                     f"or mJ of one inference, more than 0 and at most {MAX_OBJECTIVE_WEIGHT:g}, e.g. latency:0.5)")


def read_grid(text: str | None) -> Grid:
    """The Grid ``text`` (as grid_text wrote it) stands for, YAML files read; an empty grid is refused."""
    grid = Grid()
    for entry in _entries(text):
        if "=" in entry:
            name, _, raw = entry.partition("=")
            _add(grid, _field(name, "--grid"), raw.split(","), "--grid")
        else:
            _read_yaml(grid, Path(entry))
    if not grid.axes:
        raise UsageError("the grid is empty", "--grid", "give the values to search, e.g. --grid lr=0.003,0.01,0.03 "
                         "--grid train_layers=head,bias,lite")
    return grid


def _add(grid: Grid, key: str, raw: list, where: str) -> None:
    if key in grid.axes:
        raise UsageError(f"the grid names '{key}' twice", where, "give each name once")
    grid.axes[key] = _values(key, raw, where)


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
        _add(grid, _field(name, where), values, where)
    if "objective" in data:
        try:
            grid.objective = objective_text(data["objective"])
        except ValueError as exc:
            raise UsageError(f"objective {str(data['objective'])[:40]!r}: {exc}", f"{source}, field 'objective'",
                             "use validation_accuracy") from None
    grid.sources.append(source)
