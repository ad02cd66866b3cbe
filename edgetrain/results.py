"""The result contract every command shares.

A command's result is a dataclass deriving from ``Result``. It lists the checks that failed
(``failed_checks``: budget, tolerance, memory, energy, accuracy, in words a user reads); ``passed`` and the
exit code are derived from that here and nowhere else. ``to_dict`` is what ``--json`` writes and what
``edgetrain run`` reads back from a step: it always carries ``passed`` and ``failed_checks``.

Progress is one event type, ``Progress``, that long work sends to a callback; ``edgetrain.cli.render``
draws it on a terminal.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import Callable, Optional

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
        d = {f.name: _plain(getattr(self, f.name)) for f in fields(self)} if is_dataclass(self) else {}
        d["passed"] = self.passed
        d["failed_checks"] = self.failed_checks
        return d


def exit_code(passed: bool) -> int:
    """The one place a finished run's exit code is decided: 0 passed, 3 a check failed (artifacts kept)."""
    return EXIT_OK if passed else EXIT_CHECK_FAILED


def step_passed(record: dict | None) -> bool:
    """Whether a result written by ``--json`` (a recipe step's record) says the command passed."""
    return bool(record) and record.get("passed") is True


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


# --- the commands' records ------------------------------------------------------------------------------

@dataclass
class BudgetStep:
    step: int
    kept_fp32: list[str]        # every node in fp32 at this step (cumulative)
    added: list[str]            # the nodes this step moved to fp32
    int8_top1: float
    drop: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class QuantizeResult(Result):
    model: str
    output: str
    backend: str
    scheme: dict
    calibration: dict            # method, samples, source
    accuracy: dict               # checked, fp32_top1, int8_top1, drop, max_drop, samples, source
    steps: list[BudgetStep]
    nodes_kept_fp32: list[str]
    size: dict                   # fp32_bytes, int8_bytes, ratio
    latency: dict | None         # fp32/int8 p50 ms, speedup, threads, measured_on
    onnx_exportable: bool
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Per node of the all-int8 model, the nodes that lose most first: node, op, output_sqnr_db, lost_db, kept_fp32
    node_errors: list[dict] = field(default_factory=list)

    def checks(self) -> list[str]:
        # imported here, not at the top: `edgetrain predict` starts without compare (issue 16)
        from .compare import chance_failure

        a = self.accuracy
        failed = []
        if a.get("checked") and a["drop"] > a["max_drop"] + 1e-9:
            failed.append(f"int8 top-1 drop {a['drop']:.2f} pts exceeds --max-drop {a['max_drop']:g}: the best model "
                          "is kept; calibrate on more representative data, allow more --max-fp32-nodes, or raise "
                          "--max-drop")
        return failed + [f for f in [chance_failure(a.get("chance"), "int8")] if f]


@dataclass
class ExportResult(Result):
    path: str
    size_bytes: int
    model: str
    opset: int
    precision: str  # "fp32" | "fp16"
    dynamic_batch: bool
    inputs: list[dict]
    outputs: list[dict]
    ops: dict[str, int]
    comparison: object  # compare.Comparison
    validated_with: list[dict]  # what each compared batch was
    device: str | None
    threads: int
    seconds: dict[str, float]
    metadata_keys: list[str]
    random_weights: bool = False
    notes: list[str] = field(default_factory=list)
    # With --device: the profile command's latency verdict and energy budget for the written file.
    energy: dict | None = None
    accuracy: dict | None = None  # with --data: top-1 of the ONNX model on its samples, against chance

    def checks(self) -> list[str]:
        # imported here, not at the top: `edgetrain predict` starts without compare (issue 16)
        from .compare import chance_failure

        failed = [f for f in [chance_failure((self.accuracy or {}).get("chance"), "ONNX model")] if f]
        if not self.comparison.passed:
            worst = self.comparison.failed[0] if self.comparison.failed else None
            if worst is None:
                failed.append("the ONNX model was not compared with the Gluon model")
            elif worst.error:  # NaN, a wrong shape: no tolerance would pass
                failed.append(f"ONNX output '{worst.name}' does not match the Gluon model: {worst.error}")
            else:
                failed.append(f"ONNX output '{worst.name}' differs from the Gluon model beyond tolerance (max abs "
                              f"{worst.max_abs:.3g}, max rel {worst.max_rel:.3g}; atol {self.comparison.atol:g}, "
                              f"rtol {self.comparison.rtol:g}); it would pass with --atol {worst.atol_needed:.3g}")
        return failed + list((self.energy or {}).get("failed_checks", []))
