"""The result contract every command shares.

A command's result is a dataclass deriving from ``Result``. It lists the checks that failed
(``failed_checks``: budget, tolerance, memory, energy, accuracy, in words a user reads); ``passed`` and the
exit code are derived from that here and nowhere else. ``to_dict`` is what ``--json`` writes and what
``edgetrain run`` reads back from a step: it always carries ``passed`` and ``failed_checks``.

A figure nested in a result (an accuracy, a size, a latency, a scheme) is a small dataclass deriving from
``Figure``: named, typed fields; its JSON is its fields in order, less the ``optional()`` ones that are None
(keys a record carries only sometimes). Figures several commands share live in ``edgetrain.figures``.

Progress is one event type, ``Progress``, that long work sends to a callback; ``edgetrain.cli.render``
draws it on a terminal.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Any, Callable, Optional

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_CHECK_FAILED = 0, 1, 2, 3


class Result:
    """Mixin for a command's result dataclass: override ``checks`` to list what failed."""

    def checks(self) -> list[str]:
        return []

    @property
    def failed_checks(self) -> list[str]:
        return [c for c in self.checks() if c]

    @property
    def passed(self) -> bool:
        return not self.failed_checks

    @property
    def exit_code(self) -> int:
        return exit_code(self.passed)

    def to_dict(self) -> dict:
        d: dict[str, Any] = {f.name: _plain(getattr(self, f.name)) for f in fields(self)} if is_dataclass(self) else {}
        d["passed"] = self.passed
        d["failed_checks"] = self.failed_checks
        return seal_windows(d)


# A result another command reads back carries ``seal``, the SHA-256 of the whole result as JSON, so that it reads
# only a result as edgetrain wrote it, not one changed since (an edited figure would otherwise be carried into
# what it writes, or break it): in its meter windows, a result that records them (a profile's ``meter_windows``, a
# fine-tune's under ``energy``: what `edgetrain energy attribute` reads a meter's export over); at the top level,
# a fleet's fleet.json (``seal_whole``: a recipe's report step reads it).
SEAL = "seal"


def _windows(d) -> dict | None:
    w = d.get("meter_windows") if isinstance(d, dict) else None
    if w is None and isinstance(d, dict) and isinstance(d.get("energy"), dict):
        w = d["energy"].get("meter_windows")
    return w if isinstance(w, dict) else None


def _digest(d: dict) -> str:
    import hashlib
    import json

    plain = json.loads(json.dumps(d, default=str))  # as a file holds it: keys strings, tuples lists
    for holder in (plain, _windows(plain) or {}):
        holder.pop(SEAL, None)
    return hashlib.sha256(json.dumps(plain, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def seal_windows(d: dict) -> dict:
    """``d`` with its meter windows sealed (see SEAL), in place; a result without them as it is."""
    w = _windows(d)
    if w is not None:
        w[SEAL] = _digest(d)
    return d


def seal_whole(d: dict) -> dict:
    """``d`` sealed at its top level, in place: a result another command reads back (a fleet's fleet.json)."""
    d[SEAL] = _digest(d)
    return d


def sealed_as_written(d: dict) -> bool:
    """Whether ``d`` is a result as edgetrain wrote it: its seal (in its meter windows if it has them, else at
    its top level) matches the rest of it."""
    holder = _windows(d) or d
    return isinstance(holder, dict) and holder.get(SEAL) == _digest(d)


class Figure:
    """Mixin for a figure nested in a result (a dataclass): ``to_dict`` is its fields in order, less each
    ``optional()`` field that is None (its key is absent, as it was in the records before they were typed)."""

    def to_dict(self) -> dict:
        out = {}
        for f in fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if value is not None or not f.metadata.get("optional"):
                out[f.name] = _plain(value)
        return out


def optional(default: Any = None) -> Any:
    """A ``Figure`` field whose key the JSON carries only when it is not None."""
    return field(default=default, metadata={"optional": True})


def exit_code(passed: bool) -> int:
    """The one place a finished run's exit code is decided: 0 passed, 3 a check failed (artifacts kept)."""
    return EXIT_OK if passed else EXIT_CHECK_FAILED


def step_passed(record: dict | None) -> bool:
    """Whether a result written by ``--json`` (a recipe step's record) says the command passed."""
    return record is not None and record.get("passed") is True


def _plain(value):
    if hasattr(value, "to_dict"):
        return value.to_dict()
    if is_dataclass(value):
        return asdict(value)
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


@dataclass
class Progress:
    """One progress event. ``stage`` names the work; ``done``/``total`` count it when countable;
    ``message`` is a line for a human; ``metrics`` carries figures worth showing (loss, RSS MB, ETA s).
    ``final``: the line stays on screen (an epoch summary) instead of being overwritten."""

    stage: str
    done: Optional[int] = None
    total: Optional[int] = None
    message: str = ""
    metrics: dict = field(default_factory=dict)
    final: bool = False


ProgressFn = Callable[[Progress], None]


def report(progress: ProgressFn | None, stage: str, done: int | None = None, total: int | None = None,
           message: str = "", final: bool = False, **metrics) -> None:
    """Send a progress event if anyone listens (library code calls this, never prints)."""
    if progress is not None:
        progress(Progress(stage, done, total, message, metrics, final))


def stage(progress: ProgressFn | None, name: str):
    """A (done, total) callback reporting one countable stage, or None when nobody listens."""
    return (lambda done, total: report(progress, name, done, total)) if progress else None
