"""The preprocessing a model expects, recorded with the model so every later command applies the same.

Pixels are first scaled to [0, 1] by the data reader (images /255, builtin:digits /16), resized to the
model's H x W (bilinear), converted to its channel count (grayscale <-> RGB), then normalised
``(x - mean) / std`` per channel and laid out NCHW.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

from .errors import UsageError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
SIDECAR_SUFFIX = "-edgetrain.json"


@dataclass(frozen=True)
class Preprocess:
    input_shape: tuple[int, int, int]  # C, H, W of one sample
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    input_name: str = "data"
    layout: str = "NCHW"
    resize: str = "bilinear"
    pixel_range: str = "0..1"  # what the reader scales raw pixels to before mean/std
    class_names: tuple[str, ...] | None = field(default=None)

    def __post_init__(self):
        c = self.input_shape[0]
        if c not in (1, 3):
            raise UsageError(f"input must have 1 or 3 channels, got {c}", "input shape", "use C,H,W like 3,224,224")
        if len(self.input_shape) != 3 or not all(1 <= int(d) <= MAX_SIDE for d in self.input_shape[1:]):
            raise UsageError(f"input shape {list(self.input_shape)[:4]} is not C,H,W with sides 1..{MAX_SIDE}",
                             "input shape", "use C,H,W like 3,224,224")
        if len(self.mean) != c or len(self.std) != c:
            raise UsageError(f"mean/std need {c} values for {c} channel(s)", "preprocessing",
                             "give one mean and std per channel")
        if not all(math.isfinite(v) for v in (*self.mean, *self.std)):
            raise UsageError("mean/std values must be finite numbers", "preprocessing", "fix the mean/std values")
        if any(s <= 0 for s in self.std):
            raise UsageError("std values must be positive", "preprocessing", "fix the std values")

    @property
    def channels(self) -> int:
        return self.input_shape[0]

    @property
    def hw(self) -> tuple[int, int]:
        return self.input_shape[1], self.input_shape[2]

    def batch_shape(self, batch: int = 1) -> tuple[int, int, int, int]:
        return (batch, *self.input_shape)

    def with_classes(self, names) -> "Preprocess":
        return replace(self, class_names=tuple(str(n) for n in names) if names is not None else None)

    def with_shape(self, shape: tuple[int, int, int]) -> "Preprocess":
        c = shape[0]
        mean, std = self.mean, self.std
        if len(mean) != c:
            mean, std = default_norm(c)
        return replace(self, input_shape=tuple(shape), mean=mean, std=std)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["input_shape"] = list(self.input_shape)
        d["mean"] = list(self.mean)
        d["std"] = list(self.std)
        d["class_names"] = list(self.class_names) if self.class_names is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict, source: str = "preprocessing") -> "Preprocess":
        try:
            names = d.get("class_names")
            return cls(
                input_shape=tuple(int(v) for v in d["input_shape"]),
                mean=tuple(float(v) for v in d["mean"]),
                std=tuple(float(v) for v in d["std"]),
                input_name=str(d.get("input_name", "data")),
                layout=str(d.get("layout", "NCHW")),
                resize=str(d.get("resize", "bilinear")),
                pixel_range=str(d.get("pixel_range", "0..1")),
                class_names=tuple(str(n) for n in names) if names is not None else None,
            )
        except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise UsageError(f"bad preprocessing record: {type(exc).__name__} {str(exc)[:100]}", source,
                             "re-export the model with edgetrain or delete the file") from None


def default_norm(channels: int) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """ImageNet statistics for colour input; for grayscale, centre [0,1] pixels on 0.5."""
    if channels == 3:
        return IMAGENET_MEAN, IMAGENET_STD
    return (0.5,), (0.25,)


def default_for_shape(shape: tuple[int, int, int]) -> Preprocess:
    mean, std = default_norm(shape[0])
    return Preprocess(input_shape=tuple(shape), mean=mean, std=std)


# Largest side accepted: 8192 px is a 67 MP input, far beyond any edge model; bigger is a typo.
MAX_SIDE = 8192


def parse_norm(value, channels: int, where: str) -> list[float]:
    """--mean/--std: '0.5' or '0.485,0.456,0.406' (or a list) -> one finite float per channel."""
    import math

    items = value if isinstance(value, (list, tuple)) else str(value).replace(" ", ",").split(",")
    try:
        vals = [float(v) for v in items if str(v).strip()]
    except ValueError:
        raise UsageError(f"not a list of numbers: {str(value)[:60]!r}", where,
                         "write one value per channel, e.g. 0.485,0.456,0.406") from None
    if len(vals) == 1 and channels > 1:
        vals = vals * channels
    if len(vals) != channels or not all(math.isfinite(v) for v in vals):
        raise UsageError(f"{where} needs {channels} finite value(s) for {channels} channel(s), got "
                         f"{str(value)[:60]!r}", where, "write one value per channel, e.g. 0.485,0.456,0.406")
    if where.endswith("std") and any(v <= 0 for v in vals):
        raise UsageError("std values must be positive", where, "fix the std values")
    return vals


def parse_shape(text: str, where: str = "--input-shape") -> tuple[int, int, int]:
    """'1,3,224,224' or '3,224,224' -> (3, 224, 224)."""
    try:
        dims = tuple(int(p) for p in str(text).replace("x", ",").split(",") if p.strip())
    except ValueError:
        raise UsageError(f"not a shape: {str(text)[:60]!r}", where,
                         "write it as N,C,H,W or C,H,W, e.g. 1,3,224,224") from None
    if len(dims) == 4:
        if dims[0] != 1:
            raise UsageError(f"batch size {dims[0]} in {text!r}: the input shape is one sample's", where,
                             "write 1,C,H,W (batch size: --dynamic-batch on export, --batch on profile)")
        dims = dims[1:]
    if len(dims) != 3 or any(d < 1 for d in dims):
        raise UsageError(f"not a shape: {str(text)[:60]!r}", where, "write it as N,C,H,W or C,H,W, e.g. 1,3,224,224")
    if dims[0] not in (1, 3):
        raise UsageError(f"input must have 1 or 3 channels, got {dims[0]}", where, "write it as 1,C,H,W with C 1 or 3")
    if max(dims[1:]) > MAX_SIDE:
        raise UsageError(f"input side {max(dims[1:])} is over {MAX_SIDE} pixels", where,
                         "give the model's real input size, e.g. 1,3,224,224")
    return dims


def sidecar_path(prefix: str | Path) -> Path:
    return Path(f"{prefix}{SIDECAR_SUFFIX}")


def read_sidecar(prefix: str | Path) -> Preprocess | None:
    path = sidecar_path(prefix)
    if not path.exists():
        return None
    try:
        from .fileio import parse_json

        data = parse_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UsageError(f"cannot read preprocessing record: {exc}", str(path),
                         "re-export the model with edgetrain or delete the file") from None
    return Preprocess.from_dict(data.get("preprocess", data), str(path))


def sidecar_text(pre: Preprocess, extra: dict | None = None) -> str:
    return json.dumps({"format": "edgetrain-model/1", "preprocess": pre.to_dict(), **(extra or {})}, indent=2) + "\n"
