"""Typed, validated schemas for every YAML file edgetrain reads; unknown keys are errors.

Each schema is a pydantic model with ``extra='forbid'``. ``load_yaml`` turns the first validation
problem into a UsageError naming the file and the field path (``cores``, ``power.idle_w.value``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal, Optional, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from .errors import UsageError
from .fileio import read_yaml


class Strict(BaseModel):
    """Base for all schemas: unknown keys are errors, values are not silently coerced across types."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True, defer_build=True)


M = TypeVar("M", bound=BaseModel)


def field_path(loc: tuple) -> str:
    parts = []
    for item in loc:
        if isinstance(item, int):
            parts.append(f"[{item}]")
        else:
            parts.append(("." if parts else "") + str(item))
    return "".join(parts) or "<top level>"


def validate(data: object, schema: type[M], source: str) -> M:
    """Validate already-parsed data; ``source`` names where it came from for the error message."""
    if not isinstance(data, dict):
        raise UsageError("expected a mapping of keys to values at the top level", source,
                         f"see the bundled examples for the {schema.__name__} layout")
    try:
        return schema.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        path = field_path(err["loc"])
        if err["type"] == "extra_forbidden":
            what = f"unknown key '{path}'"
            fix = "remove it or check its spelling"
        elif err["type"] == "missing":
            what = f"missing field '{path}'"
            fix = "add it"
        else:
            what = f"bad value for '{path}': {str(err['msg']).removeprefix('Value error, ')}"
            import reprlib

            fix = f"got {reprlib.repr(err.get('input'))}"  # bounded: the input may be huge
        raise UsageError(what, source, fix) from None


def load_yaml(path: Path, schema: type[M]) -> M:
    """Read a YAML file (bounded: regular file, size, UTF-8, nesting, alias expansion) and validate it."""
    return validate(read_yaml(Path(path), "file"), schema, str(path))


# --- Device profiles (devices/*.yaml) ------------------------------------------------------------
# Every power and speed figure carries where it came from, so a reader can check it and an energy
# report can say how much to trust it.

FigureKind = Literal["measured", "rated", "estimate"]


class PowerFigure(Strict):
    """One power figure in watts, with its source (publication/URL/measurement and what was measured)."""

    value: float = Field(gt=0)
    kind: FigureKind = Field(description="measured: someone metered it; rated: a vendor budget/spec; "
                                         "estimate: derived, the arithmetic is in the source")
    source: str = Field(min_length=10)


class Power(Strict):
    idle_w: PowerFigure
    load_w: PowerFigure

    @field_validator("load_w")
    @classmethod
    def _load_not_below_idle(cls, load: PowerFigure, info: ValidationInfo) -> PowerFigure:
        idle = info.data.get("idle_w")
        if idle is not None and load.value < idle.value:
            raise ValueError(f"load_w.value {load.value} W is below idle_w.value {idle.value} W")
        return load


class IsaFeatures(Strict):
    """CPU features that decide which int8 kernels run fast."""

    neon: bool = False      # ARM Advanced SIMD (asimd)
    dotprod: bool = False   # ARMv8.2 SDOT/UDOT (asimddp): Cortex-A76 yes; A72/A57/A53 no
    avx2: bool = False
    vnni: bool = False      # AVX512-VNNI or AVX-VNNI


class SpeedReference(Strict):
    """A published latency on a fixed reference workload, measured on the device."""

    model: str
    input: int = Field(gt=0)
    threads: int = Field(ge=1)
    runtime: str
    latency_ms: float = Field(gt=0)
    source: str = Field(min_length=10)


class Speed(Strict):
    """How the device's speed relates to a measured host.

    ``unknown``: no checkable figure, estimates are refused. ``host``: factor 1, the host is this kind of
    device. ``reference_latency``: device latency = host latency * (reference.latency_ms / the host's
    measured latency on the same reference workload).
    """

    method: Literal["unknown", "host", "reference_latency"]
    note: Optional[str] = None
    reference: Optional[SpeedReference] = None

    @model_validator(mode="after")
    def _reference_iff_method(self) -> "Speed":
        if self.method == "reference_latency" and self.reference is None:
            raise ValueError("method 'reference_latency' needs a 'reference'")
        if self.method != "reference_latency" and self.reference is not None:
            raise ValueError(f"'reference' is only used with method 'reference_latency', not '{self.method}'")
        return self


class DeviceProfile(Strict):
    """A target device: what it has, what budget to give a run, and what it draws."""

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]*$")
    title: str
    arch: Literal["aarch64", "x86_64"]
    cores: int = Field(ge=1, le=1024)
    ram_mb: int = Field(ge=64)
    cpu: str
    isa: IsaFeatures
    default_threads: int = Field(ge=1)
    os_reserve_mb: int = Field(ge=0)
    os_reserve_why: str = Field(min_length=5)
    memory_budget_mb: int = Field(ge=1)
    power: Power
    speed: Speed
    notes: Optional[str] = None

    @field_validator("default_threads")
    @classmethod
    def _threads_within_cores(cls, v: int, info: ValidationInfo) -> int:
        cores = info.data.get("cores")
        if cores is not None and v > cores:
            raise ValueError(f"default_threads {v} is more than cores {cores}")
        return v

    @field_validator("os_reserve_mb")
    @classmethod
    def _reserve_below_ram(cls, v: int, info: ValidationInfo) -> int:
        ram = info.data.get("ram_mb")
        if ram is not None and v >= ram:
            raise ValueError(f"os_reserve_mb {v} leaves nothing of ram_mb {ram}")
        return v

    @field_validator("memory_budget_mb")
    @classmethod
    def _budget_fits(cls, v: int, info: ValidationInfo) -> int:
        ram, reserve = info.data.get("ram_mb"), info.data.get("os_reserve_mb")
        if ram is not None and reserve is not None and v > ram - reserve:
            raise ValueError(f"memory_budget_mb {v} is more than ram_mb - os_reserve_mb = {ram - reserve}")
        return v

    @property
    def int8_features(self) -> list[str]:
        return [k for k, v in self.isa.model_dump().items() if v]

    def to_dict(self) -> dict:
        return self.model_dump(mode="json")
