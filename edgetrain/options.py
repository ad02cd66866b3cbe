"""Each command's options, declared once.

A command's options are one class below: each field an ``opt(...)`` with its type (the annotation), default,
bounds, flag, help text and whether a recipe step may set it (``recipe=False``: the recipe or the run folder
supplies it). The click flags (``edgetrain.cli``), the Python API's keyword arguments (``edgetrain.quantize(...)``
etc.) and the recipe steps (``recipes/*.yaml``) are all made from it, so a default, a constraint or a flag name
has exactly one home.

Values are parsed once, here, into what the library uses: sizes into megabytes (a bare number *is*
megabytes, never bytes), shapes into (C, H, W), rates into inferences per hour, ``train_layers`` checked.
The declarations are plain Python, not pydantic: every command imports this module, and on a Pi the
import and first validation of a pydantic model cost more than the work of a short command.
pydantic stays where YAML is read (recipes, device profiles). The annotations stay text until a class's fields
are first read (``Options.fields``): `edgetrain predict` reads one class's, and evaluating every class's at import
was most of this module's import time (predict's start-up is held to a bare ONNX Runtime loop's).
"""
from __future__ import annotations

import math
import sys
import os
import re
import typing
from typing import Annotated, Any, Literal, Optional

try:
    from typing import Self
except ImportError:  # Python 3.10 (JetPack 6): typing.Self is 3.11's
    from typing_extensions import Self

from .errors import UsageError, clip
from .preprocess import parse_shape

OPSETS = (12, 13)  # the opsets mxnet 1.9.1's ONNX translations are written for
DEFAULT_OPSET = 13
MAX_THREADS = 256
REQUIRED = ...  # opt()'s default for an option with no default


class _Given:
    def __repr__(self):
        return "GIVEN"


GIVEN = _Given()  # in an Options class's NEEDS: the other option is given (not None, not False)


# --- the declaration: fields, their types, their checks ------------------------------------------------

class Parse:
    """Annotation marker: this function reads the value (instead of the type's own reading); it may raise
    UsageError or ValueError("what; fix"). ``show`` writes a value back as flag text, where ``str`` would not
    read back (a rate of 720.0 is ``720.0/h``). ``numbers``: the text is numbers (a shape, a list of thread
    counts), so the hostile-number tests feed it NaN, infinities and huge values too."""

    def __init__(self, fn, show=str, numbers: bool = False):
        self.fn, self.show, self.numbers = fn, show, numbers


class Then:
    """Annotation marker: this function checks (and may normalise) the value after the type's reading.
    ``numbers``: as ``Parse``'s."""

    def __init__(self, fn, numbers: bool = False):
        self.fn, self.numbers = fn, numbers


class Range:
    """Annotation marker: numeric bounds (as opt()'s ge/gt/le/lt)."""

    def __init__(self, **bounds):
        self.bounds = bounds


_TRUE = {"true", "t", "yes", "y", "on", "1"}
_FALSE = {"false", "f", "no", "n", "off", "0"}
_BOUND_WORDS = {"ge": "greater than or equal to", "gt": "greater than", "le": "less than or equal to",
                "lt": "less than"}


def _read_bool(value):
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
        return value.strip().lower() in _TRUE
    raise ValueError("Input should be a valid boolean")


def _read_int(value):
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and math.isfinite(value) and value == int(value):
        return int(value)
    if isinstance(value, str) and re.fullmatch(r"\s*[+-]?\d+\s*", value):
        return int(value)
    raise ValueError("Input should be a valid integer")


def _read_float(value):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    elif isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise ValueError("Input should be a valid number") from None
    else:
        raise ValueError("Input should be a valid number")
    if not math.isfinite(number):
        raise ValueError("Input should be a finite number")
    return number + 0.0  # -0.0 -> 0.0: a zero is shown and compared as 0, never "-0"


def _read_str(value):
    if isinstance(value, str):
        return value
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    raise ValueError("Input should be a valid string")


_READERS = {bool: _read_bool, int: _read_int, float: _read_float, str: _read_str}


class Opt:
    """One declared option: what ``opt()`` returns in a class body; the class collects it as a field."""

    def __init__(self, default, help: str, flag: str | None, short: str | None, metavar: str | None, recipe: bool,
                 bounds: dict):
        self.default, self.help, self.short, self.metavar, self.recipe = default, help, short, metavar, recipe
        self._flag, self.bounds = flag, dict(bounds)
        self.name = ""
        self.optional = False  # None is a value (Optional[...])
        self.base: Any = Any  # bool, int, float, str, Any
        self.choices: tuple | None = None  # a Literal's values
        self.parse_fn = self.then_fn = None
        self.show = str
        self.numbers = False  # text holding numbers (a Parse/Then marker says so)

    def _bind(self, name: str, annotation) -> None:
        """Read the field's annotation: Optional, Annotated markers, Literal, the base type."""
        self.name = name
        while True:
            origin, args = typing.get_origin(annotation), typing.get_args(annotation)
            if origin is Annotated:
                for marker in annotation.__metadata__:
                    if isinstance(marker, Parse):
                        self.parse_fn, self.show = marker.fn, marker.show
                        self.numbers = self.numbers or marker.numbers
                    elif isinstance(marker, Then):
                        self.then_fn = marker.fn
                        self.numbers = self.numbers or marker.numbers
                    elif isinstance(marker, Range):
                        self.bounds = {**marker.bounds, **self.bounds}
                annotation = args[0]
            elif origin is typing.Union and type(None) in args:
                self.optional = True
                rest = [a for a in args if a is not type(None)]
                annotation = rest[0] if len(rest) == 1 else Any
            elif origin is Literal:
                self.choices, self.base = args, type(args[0])
                return
            else:
                self.base = annotation if annotation in _READERS else Any
                return

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    @property
    def flag(self) -> str:
        """The whole flag declaration: ``--name``, or ``--on/--off`` for a bool."""
        return self._flag or "--" + self.name.replace("_", "-")

    @property
    def on_flag(self) -> str:
        """The flag a user types (the ``--on`` half of a ``--on/--off`` bool)."""
        return self.flag.split("/")[0]

    @property
    def numeric(self) -> bool:
        """Whether the option takes numbers: an int or float, or text that holds numbers (a shape, a list)."""
        return self.kind in ("int", "float") or self.numbers

    @property
    def kind(self) -> str:
        """For the command line: 'bool', 'choice', 'int', 'float' or 'text'."""
        if self.choices:
            return "choice"
        return {bool: "bool", int: "int", float: "float"}.get(self.base, "text")

    def as_flags(self, value) -> list[str]:
        """``value`` (as ``read`` gives it) written as this option's flag and text, as a user would type it."""
        if self.kind == "bool":
            on, _, off = self.flag.partition("/")
            return [on] if value else [off] if off else []
        return [self.on_flag, ",".join(map(str, value)) if isinstance(value, (list, tuple)) else self.show(value)]

    def read(self, value):
        """The value as the library uses it; ValueError("what; fix") if it is not one this option takes."""
        if value is None:
            if self.optional:
                return None
            raise ValueError(f"Input should be {'one of the choices' if self.choices else 'a value'}")
        try:
            if self.parse_fn is not None:
                value = self.parse_fn(value)
                if value is None:
                    return None
            elif self.base is not Any:
                value = _READERS[self.base](value)
            if self.then_fn is not None:
                value = self.then_fn(value)
        except UsageError as exc:
            raise ValueError(f"{exc.what}; {exc.fix}" if exc.fix else exc.what) from None
        except OverflowError:  # a reader's own arithmetic (a date, a size) on a huge number
            raise ValueError("Input should be a number within the option's range") from None
        if isinstance(value, float):  # whatever read it (a Parse function too): never NaN or an infinity
            if not math.isfinite(value):
                raise ValueError("Input should be a finite number")
            value += 0.0  # -0.0 -> 0.0
        if self.choices is not None and value not in self.choices:
            shown = [repr(c) for c in self.choices]
            raise ValueError("Input should be " + (" or ".join(shown) if len(shown) < 3
                                                   else ", ".join(shown[:-1]) + " or " + shown[-1]))
        for bound, limit in self.bounds.items():
            ok = {"ge": value >= limit, "gt": value > limit, "le": value <= limit, "lt": value < limit}[bound]
            if not ok:
                raise ValueError(f"Input should be {_BOUND_WORDS[bound]} {limit}")
        return value


def opt(default: Any = REQUIRED, *, help: str, flag: str | None = None, short: str | None = None,
        metavar: str | None = None, recipe: bool = True, **bounds) -> Any:
    """A field with its command-line spelling. ``flag`` overrides ``--field-name``; for a bool it may be
    ``--on/--off``. ``recipe=False``: not settable in a recipe step (the recipe supplies it). ``bounds``:
    ge, gt, le, lt."""
    return Opt(default, help, flag, short, metavar, recipe, bounds)


class _Fields:
    """``Options.fields``: a class's fields, each bound to its annotation (evaluated in the declaring module) the
    first time the class's fields are read."""

    def __get__(self, obj, owner) -> dict[str, Opt]:
        got = owner.__dict__.get("_bound")
        if got is None:
            got = {}
            for name in owner._names:
                klass = next(k for k in owner.__mro__ if isinstance(vars(k).get(name), Opt))
                field = vars(klass)[name]
                if not field.name:
                    field._bind(name, eval(klass.__annotations__[name], vars(sys.modules[klass.__module__])))
                got[name] = field
            owner._bound = got
        return got


class Options:
    """Base of every command's options: unknown names are errors; values are read and checked once, when the
    options are made (``Options.parse(values)`` or ``SomeOptions(**values)``), and never change after.

    ``NEEDS``: an option that takes effect only with others, ``{field: ({other: GIVEN or a value, ...}, why)}``;
    given (not its default) without them, it is refused in one line before any work, never silently ignored.
    A class's NEEDS add to its bases'."""

    fields = _Fields()  # the class's fields in declaration order, read on first use
    NEEDS: dict[str, tuple[dict[str, Any], str]] = {}
    needs: dict[str, tuple[dict[str, Any], str]] = {}  # NEEDS of the class and its bases
    _names: tuple[str, ...] = ()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        # every base's fields, in the order they were first declared (a redeclaration keeps its place)
        order: dict[str, None] = {}
        for klass in reversed(cls.__mro__):
            for name in vars(klass).get("__annotations__", {}):
                if isinstance(vars(klass).get(name), Opt):
                    order[name] = None
        cls._names = tuple(order)
        needs: dict = {}
        for klass in reversed(cls.__mro__):
            needs.update(vars(klass).get("NEEDS", {}))
        for name, (conditions, _) in needs.items():
            if name not in order or not set(conditions) <= set(order):
                raise TypeError(f"{cls.__name__}.NEEDS names an option it does not have: {name}: {conditions}")
        cls.needs = needs

    def __init__(self, **values):
        for name, value in self._check(values).items():
            object.__setattr__(self, name, value)

    @classmethod
    def _check(cls, values: dict) -> dict:
        out = {}
        for name, field in cls.fields.items():
            if name not in values:
                if field.required:
                    raise UsageError(f"missing option {field.on_flag}", field.on_flag, "add it")
                out[name] = field.default
                continue
            try:
                out[name] = field.read(values[name])
            except ValueError as exc:
                what, _, fix = str(exc).partition("; ")
                raise UsageError(f"bad value {repr(values[name])[:40]} for {field.on_flag}: {what}", field.on_flag,
                                 fix or "see the command's --help for what it takes") from None
        for name in values:
            if name not in cls.fields:
                raise UsageError(f"unknown option '{name}'", flag_of(cls, name),
                                 f"known options: {', '.join(sorted(cls.fields))}")
        cls.check_needs(out)
        return out

    @classmethod
    def check_needs(cls, out: dict) -> None:
        """An option given without the options it takes effect with (``NEEDS``): one UsageError naming both."""
        for name, (conditions, why) in cls.needs.items():
            value = out[name]
            if value is None or value is False or value == cls.fields[name].default:
                continue
            for other, want in conditions.items():
                have = out[other]
                if (have is not None and have is not False) if want is GIVEN else have == want:
                    continue
                flag = flag_of(cls, name)
                need = flag_of(cls, other) if want is GIVEN else f"{flag_of(cls, other)} {want}"
                raise UsageError(f"{flag} has no effect without {need} ({why})", flag,
                                 f"give {need} as well, or leave {flag} out")

    @classmethod
    def parse(cls, values: dict) -> Self:
        """Read and check ``values``; the first problem is one UsageError naming the flag."""
        return cls(**values)

    @classmethod
    def unchecked(cls, **values) -> Self:
        """Options made by edgetrain itself (not a user's input): the defaults plus ``values``, not checked
        (a name that is not a field is a bug here, not a user's error)."""
        unknown = set(values) - set(cls.fields)
        if unknown:
            raise TypeError(f"{cls.__name__} has no field(s) {', '.join(sorted(unknown))}")
        self = cls.__new__(cls)
        for name, field in cls.fields.items():
            object.__setattr__(self, name, values.get(name, None if field.required else field.default))
        return self

    def thread_cap(self) -> int | None:
        """The thread cap these options ask for (None: none; commands with --threads or --device say)."""
        return None

    def given(self) -> dict[str, Any]:
        """The values that are not their option's default (a required one always), in declaration order."""
        return {name: getattr(self, name) for name, field in self.fields.items()
                if field.required or getattr(self, name) != field.default}

    def flags(self) -> list[str]:
        """``given()`` as the flags a user would type: the command line these options stand for."""
        return [text for name, value in self.given().items() for text in self.fields[name].as_flags(value)]

    def __setattr__(self, name, value):
        raise AttributeError(f"{type(self).__name__} is read-only")

    def __eq__(self, other):
        return type(other) is type(self) and vars(other) == vars(self)

    __hash__ = None  # type: ignore[assignment]  # compared by value: unhashable on purpose

    def __repr__(self):
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in vars(self).items())})"


def flag_of(model: type[Options], name: str) -> str:
    """The flag a user types for ``name`` (the ``--on`` half of a ``--on/--off`` bool)."""
    field = model.fields.get(name)
    return field.on_flag if field else "--" + name.replace("_", "-")


# --- sizes ------------------------------------------------------------------------------------------

_SIZE_RE = r"^\s*(\d+(?:\.\d+)?|\.\d+)\s*([kmgt]?)(i?)(b?)\s*$"  # compiled on first use, not at start-up
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def parse_size(text: str, what: str = "size") -> int:
    """'512MB', '2GiB', '1.5G', '300m', '1048576' -> bytes.

    Binary units throughout (1 MB = 1 MiB = 2**20 bytes): RAM is sold and reported in powers of two, and
    a budget read as 10**6 would silently be 5% smaller than the user meant.
    """
    m = re.match(_SIZE_RE, str(text), re.IGNORECASE)
    if not m or (m.group(3) and not m.group(2)):
        raise UsageError(f"cannot read {what} '{text}'", what,
                         "write a number with an optional unit, e.g. 512MB, 2GiB, 1.5G")
    number, unit = float(m.group(1)), m.group(2).lower()
    size = int(number * (1024 ** _POWERS[unit]))
    if size <= 0:
        raise UsageError(f"{what} must be more than zero, got '{text}'", what, "give a positive size")
    return size


# --- value types: each parsed once ------------------------------------------------------------------

def parse_megabytes(value) -> float | None:
    """'512MB', '2GiB', '1.5G', 300 (a bare number is megabytes) -> MiB. Binary units throughout."""
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise UsageError(f"not a size: {value!r}", "size", "write e.g. 512MB")
    if isinstance(value, (int, float)):
        mb = float(value)
    else:
        text = str(value).strip()
        try:
            mb = float(text)
        except ValueError:
            mb = parse_size(text, "size") / (1024 * 1024)
    if not (math.isfinite(mb) and mb > 0):
        raise UsageError(f"a size must be more than zero, got {value!r}", "size", "write e.g. 512MB")
    return mb


def _shape(value):
    if value is None or isinstance(value, tuple) and len(value) == 3:
        return value
    text = ",".join(str(v) for v in value) if isinstance(value, (list, tuple)) else value
    return parse_shape(text, "input_shape")


class TrainLayers(str):
    """``--train-layers`` parsed once, at the declaration: its text as a user writes it ('head', 'last:N', 'bias',
    'lite', 'all'; 'last:1' reads 'head') and what it names: ``kind`` ("last" | "bias" | "lite" | "all") and
    ``n`` (the layers from the end that train, for "last"). A str, so a result, a recipe and a fleet's messages
    carry it as the text; the job, the engine and the fleet read ``kind`` and ``n`` from it."""

    kind: str
    n: int

    def __new__(cls, text) -> "TrainLayers":
        if isinstance(text, TrainLayers):
            return text
        raw = str(text).strip().lower()
        kind, n = ("last", 1) if raw == "head" else (raw, 1)
        if raw not in ("head", "all", "bias", "lite"):
            m = re.fullmatch(r"last:(-?\d+)", raw)
            if not m:
                raise UsageError(f"cannot read --train-layers '{text}'", "--train-layers",
                                 "use head, last:N (N trainable layers from the end), bias (every bias and BatchNorm "
                                 "shift, and the output layer), lite (bias and lite residual modules) or all")
            kind, n = "last", int(m.group(1))
            if n < 1:
                raise UsageError(f"--train-layers {text} trains nothing", "--train-layers",
                                 "use last:1 (= head) or more, or all")
        self = super().__new__(cls, kind if kind != "last" else ("head" if n == 1 else f"last:{n}"))
        self.kind, self.n = kind, n
        return self

    def __reduce__(self):   # pickles (and copies) as the text it is
        return (TrainLayers, (str(self),))

    @property
    def text(self) -> str:
        return str(self)

    @property
    def head_only(self) -> bool:
        return self.kind == "last" and self.n == 1


# --mean/--std act on [0,1] pixels: beyond these a value is a typo or 0-255 units, and the input would overflow.
NORM_LIMITS = {"mean": (-1000.0, 1000.0), "std": (1e-6, 1000.0)}


def _norm_values(which: str):
    """A --mean/--std check at the declaration: one or three finite numbers within NORM_LIMITS (the count per
    channel is checked when the model's channels are known); the text is kept as given."""
    lo, hi = NORM_LIMITS[which]

    def check(value: str) -> str:
        items = [v for v in str(value).replace(" ", ",").split(",") if v.strip()]
        try:
            numbers = [float(v) for v in items]
        except ValueError:
            raise ValueError(f"not a list of numbers; write one value per channel, e.g. "
                             f"{'0.485,0.456,0.406' if which == 'mean' else '0.229,0.224,0.225'}") from None
        if len(numbers) not in (1, 3):
            raise ValueError(f"{len(numbers)} values; give one per channel (1 or 3)")
        if not all(math.isfinite(v) and lo <= v <= hi for v in numbers):
            raise ValueError(f"each value should be a finite number from {lo:g} to {hi:g} (a {which} of [0,1] "
                             "pixels); fix the value")
        return value
    return check


DEFAULT_TRAIN_LAYERS = TrainLayers("head")   # the one place the default is written


def _train_layers(value) -> TrainLayers:
    return TrainLayers(value)


def _rate(value):
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _read_float(value)
    from .energy import parse_rate  # lazy: a command that takes no rate never loads the energy model

    return parse_rate(value)


def parse_threads(text) -> list[int]:
    """'1,2,4' (or [1, 2, 4]) -> [1, 2, 4]: order kept, duplicates dropped."""
    items = [str(t) for t in text] if isinstance(text, (list, tuple)) else [p.strip() for p in str(text).split(",")]
    out: list[int] = []
    for item in items:
        if not item.isdigit():
            raise UsageError(f"cannot read thread count '{item[:20]}'", "--threads",
                             "give positive whole numbers separated by commas, e.g. 1,2,4")
        n = int(item)
        if not 1 <= n <= MAX_THREADS:
            raise UsageError(f"thread count must be between 1 and {MAX_THREADS}, got {n}", "--threads",
                             "give positive whole numbers separated by commas, e.g. 1,2,4")
        if n not in out:
            out.append(n)
    if not out:
        raise UsageError("no thread counts given", "--threads", "give e.g. 1,2,4")
    return out


def _opset(value: int) -> int:
    if value not in OPSETS:
        raise ValueError(f"opset {value} is not one mxnet 1.9.1's exporter translates for; use 12 or 13")
    return value


# Every number an option takes is finite and has both bounds (tests/test_options_numbers.py feeds NaN, the
# infinities, 1e300 and -0 to each): an upper bound is where a value stops being a setting and is a typo or a
# unit mistake, and where the arithmetic downstream (a date, a byte count, a timer) would overflow.
MAX_MEMORY_MB = 16 * 1024 * 1024  # 16 TiB: beyond any board's (or host's) RAM
MemoryMB = Annotated[Optional[float], Parse(parse_megabytes), Range(gt=0, le=MAX_MEMORY_MB)]
InputShape = Annotated[Optional[tuple[int, int, int]], Parse(_shape, numbers=True)]
TrainLayersValue = Annotated[TrainLayers, Then(_train_layers)]
RatePerHour = Annotated[Optional[float], Parse(_rate, show=lambda rate: f"{rate}/h"),
                        Range(gt=0, le=3.6e9)]  # a million inferences a second: no edge board serves more
ThreadList = Annotated[Optional[list[int]], Parse(parse_threads, numbers=True)]
Opset = Annotated[int, Then(_opset), Range(ge=min(OPSETS), le=max(OPSETS))]
Threads = Annotated[Optional[int], Range(ge=1, le=MAX_THREADS)]
Positive = Annotated[Optional[float], Range(gt=0)]
# A learning rate a float32 weight update can hold (beyond it the step is inf at once); a huge one within it is
# the divergence guard's to stop (tests/test_finetune_guards.py trains at 1e38 on purpose).
MAX_LR = 1e38
MeanText = Annotated[Optional[str], Then(_norm_values("mean"), numbers=True)]
StdText = Annotated[Optional[str], Then(_norm_values("std"), numbers=True)]


def _country(value: str) -> str:
    from .energy import country_row  # the table is read only when a country is given

    row = country_row(value)
    if row is None:
        raise ValueError("the bundled grid-intensity table has no such country; give an ISO 3166 code listed in "
                         "grid_intensity.csv (e.g. DE or DEU), or the grid's own figure with --grid-intensity G_PER_KWH")
    return row["iso3"]


Country = Annotated[Optional[str], Parse(_country)]


MAX_G_PER_KWH = 2000.0  # as energy.carbon.MAX_G_PER_KWH, whose API checks the same (a test holds them equal)


def _grid_intensity(value: float) -> float:
    from . import energy  # the check's one home (energy.carbon), read only when the option is given

    return energy.check_g_per_kwh(value)


GridIntensity = Annotated[Optional[float], Then(_grid_intensity), Range(ge=0, le=MAX_G_PER_KWH)]


def _clock_time(value) -> float:
    """Unix seconds, or an ISO 8601 time (a naive one is this machine's local time, as a meter on it logs)."""
    from datetime import datetime

    if isinstance(value, (int, float)) and not isinstance(value, bool):
        t = float(value)
    else:
        text = str(value).strip()
        try:
            t = float(text)
        except ValueError:
            try:
                t = datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
            except ValueError:
                raise ValueError(f"cannot read the time {text[:40]!r}; give ISO 8601 (2026-12-03T10:00:00.5) or Unix "
                                 "seconds") from None
    if not CLOCK_RANGE[0] <= t < CLOCK_RANGE[1]:  # NaN fails it too
        raise ValueError(f"the time {str(value)[:40]} is not a clock time between the years 2000 and 2100; give the "
                         "clock time the meter's recording started, ISO 8601 (2026-12-03T10:00:00.5) or Unix seconds")
    return t


# A clock time a meter's recording started: within the years a meter log's own clock times may be
# (meterlog._CLOCK_RANGE, 2000 to 2100): 0 is 1970, a missing digit or a relative time, not a start.
CLOCK_RANGE = (946684800.0, 4102444800.0)  # 2000-01-01 and 2100-01-01, UTC
ClockTime = Annotated[Optional[float], Parse(_clock_time), Range(ge=CLOCK_RANGE[0], lt=CLOCK_RANGE[1])]
NonNegative = Annotated[Optional[float], Range(ge=0)]


# --- what every command shares -------------------------------------------------------------------------

class DeviceOptions(Options):
    device: Optional[Any] = opt(None, metavar="NAME", recipe=False,
                                help="Device profile name (see `edgetrain devices list`) or a profile YAML path.")
    threads: Threads = opt(None, metavar="N", recipe=False,
                           help="Cap every thread pool (OpenMP, MXNet, ONNX Runtime); default: the device's.")

    def profile(self):
        """The DeviceProfile (loaded once), or None for this host."""
        if self.device is None:
            return None
        from .devices import DeviceProfile, load_device  # lazy: most runs name no device

        return self.device if isinstance(self.device, DeviceProfile) else load_device(str(self.device))

    def thread_cap(self) -> int | None:
        """--threads, else the device's default thread count, else None (leave the pools alone)."""
        if self.threads is not None:
            return self.threads
        prof = self.profile()
        return prof.default_threads if prof is not None else None


class ModelFields(Options):
    params: Optional[str] = opt(None, metavar="FILE", recipe=False,
                                help="Weights for a zoo: or factory model (save_parameters file).")
    input_shape: InputShape = opt(None, metavar="N,C,H,W",
                                  help="Input shape, e.g. 1,3,224,224 (default: recorded with the model; zoo: "
                                       "3x224x224; a PREFIX without a record needs it).")
    mean: MeanText = opt(None, metavar="M[,M,M]",
                              help="Per-channel mean subtracted from [0,1] pixels (default: recorded with the model, "
                                   "else ImageNet's / 0.5 for grayscale, with a note).")
    std: StdText = opt(None, metavar="S[,S,S]",
                             help="Per-channel std the pixels are divided by (default: as --mean).")


class PowerLogOptions(Options):
    """What a meter's log may leave out (a Nordic PPK2 export: the voltage and the clock)."""

    power_log_voltage: Positive = opt(None, metavar="V", recipe=False, le=1000,
                                      help="The supply voltage of a --power-log with current only (a Nordic "
                                           "PPK2 export: the voltage its source mode set; an Otii 'Main current' "
                                           "export: the Otii's main voltage).")
    power_log_start: ClockTime = opt(None, metavar="TIME", recipe=False,
                                     help="The clock time a --power-log timed from its recording's start began "
                                          "(PPK2, Otii, Joulescope 'relative', WITRN), ISO 8601 or Unix seconds.")

    def power_log_spec(self):
        """The --power-log with what was given for it, checked now (None without one)."""
        if getattr(self, "power_log", None) is None:
            if self.power_log_voltage is not None or self.power_log_start is not None:
                flag = "--power-log-voltage" if self.power_log_voltage is not None else "--power-log-start"
                raise UsageError(f"{flag} given without --power-log", flag, "give the meter's log with --power-log FILE")
            return None
        from .energy import check_power_log

        return check_power_log(self.power_log, self.power_log_voltage, self.power_log_start)


class EnergyOptions(Options):
    battery_wh: Positive = opt(None, metavar="WH", le=100_000,
                               help="Battery capacity for the battery-life figure (with a device).")
    rate: RatePerHour = opt(None, metavar="N/h", help="Inferences per hour for the daily energy budget, e.g. 120/h.")
    budget_mj: Positive = opt(None, metavar="MJ", le=1e9,
                              help="Energy budget per inference in millijoules; over budget exits 3 (report kept).")


class CarbonOptions(Options):
    country: Country = opt(None, metavar="CODE",
                           help="Where the device draws its power (ISO 3166 code, e.g. DE or DEU): grams of CO2e from "
                                "that country's grid intensity in the bundled Ember table.")
    grid_intensity: GridIntensity = opt(None, metavar="G_PER_KWH",
                                   help="Your grid's carbon intensity in g CO2e per kWh (0 for a fully renewable supply), "
                                        "instead of --country.")

    def carbon_grid(self) -> dict | None:
        """The grid intensity the grams use (with its provenance), or None when neither was given."""
        if self.country is None and self.grid_intensity is None:
            return None
        from .energy import grid_intensity

        return grid_intensity(self.country, self.grid_intensity)


# --- the commands ----------------------------------------------------------------------------------------

class ModelOptions(ModelFields, DeviceOptions):
    """A command that loads a MODEL and runs for a device."""


class InspectOptions(ModelFields):
    data: Optional[str] = opt(None, metavar="DATA", help="Also read this data as the model would see it.")
    threads: Threads = opt(None, metavar="N", help="Cap every thread pool (OpenMP, MXNet, ONNX Runtime).")

    def thread_cap(self) -> int | None:
        return self.threads


class QuantizeOptions(ModelOptions):
    calib: str = opt(metavar="DATA", recipe=False, help="Data to calibrate activation ranges on.")
    output: str = opt(metavar="PATH", short="-o", recipe=False,
                      help="The int8 model: FILE.onnx (onnxruntime backend) or PREFIX (mxnet backend).")
    val: Optional[str] = opt(None, metavar="DATA", recipe=False,
                             help="Labelled data to compare fp32 and int8 top-1 on.")
    max_drop: Annotated[float, Range(ge=0, le=100)] = opt(
        1.0, metavar="PTS", help="Largest top-1 drop allowed, in percentage points (needs --val).")
    method: Literal["minmax", "entropy", "percentile"] = opt("minmax", help="How activation ranges are calibrated.")
    samples: Annotated[int, Range(ge=1, le=10_000_000)] = opt(300, help="Calibration samples (fewer if --calib has fewer).")
    per_channel: bool = opt(True, flag="--per-channel/--per-tensor", help="Weight scales per output channel.")
    max_fp32_nodes: Optional[Annotated[int, Range(ge=0, le=1_000_000)]] = opt(
        None, metavar="N", help="Most nodes the accuracy search may keep in fp32 (default: half of them; 0: all int8; "
                                "never all: the file stays int8).")
    backend: Literal["onnxruntime", "mxnet"] = opt(
        "onnxruntime", help="onnxruntime: portable int8 .onnx; mxnet: MXNet oneDNN int8 PREFIX (not exportable to ONNX).")
    latency: bool = opt(True, flag="--latency/--no-latency", help="Time the fp32 and int8 models after quantizing.")
    scheme: Literal["auto", "int8", "qdq", "rule"] = opt(
        "auto", help="The int8 scheme; every one writes int8, whatever -o is called. auto: where quantize runs on the "
                     "device's CPU (or with no --device), time QDQ S8S8/U8S8 per-channel/per-tensor, QOperator and "
                     "dynamic int8 (only where it is smaller than every static one) in fresh processes and write the "
                     "fastest within --max-drop; fp32 is timed beside them and said when it is faster, never written; "
                     "int8: the same as auto; qdq: the fastest QDQ candidate; rule: ONNX Runtime's per-architecture "
                     "advice, not measured (always so when quantizing for another device).")
    allow_chance: bool = opt(False, help="Accept a model at chance on the held-out data (else exit 3: it learned nothing "
                                         "the data can show).")

    NEEDS = {"max_drop": ({"val": GIVEN}, "the int8 top-1 drop is measured on the held-out data"),
             "max_fp32_nodes": ({"val": GIVEN}, "the accuracy search that keeps nodes in fp32 runs on the held-out "
                                                "data"),
             "scheme": ({"backend": "onnxruntime"}, "--backend mxnet quantizes with MXNet's own oneDNN int8 scheme")}


class ExportOptions(ModelOptions, EnergyOptions, CarbonOptions):
    output: str = opt(metavar="FILE", short="-o", recipe=False,
                      help="Where to write the ONNX model (written atomically; kept even if validation fails).")
    opset: Opset = opt(DEFAULT_OPSET, metavar="N",
                       help="ONNX opset to translate for (12 or 13, the opsets mxnet 1.9.1's exporter knows).")
    dynamic_batch: bool = opt(True, flag="--dynamic-batch/--fixed-batch",
                              help="Any batch size (validated at batch 1 and 3), as every ONNX file edgetrain "
                                   "writes; --fixed-batch writes batch 1 only.")
    atol: NonNegative = opt(None, metavar="X", le=1000, help="Absolute tolerance (default 1e-4; 1e-2 with --fp16).")
    rtol: NonNegative = opt(None, metavar="X", le=1000, help="Relative tolerance (default 1e-3; 1e-2 with --fp16).")
    data: Optional[str] = opt(None, metavar="DATA", recipe=False, help="Also validate on real samples from DATA.")
    fp16: bool = opt(False, help="fp16 weights and compute (fp32 inputs/outputs), for GPU targets.")
    allow_chance: bool = opt(False, help="Accept a model at chance on the held-out data (else exit 3: it learned nothing "
                                         "the data can show).")


class MeterExportOptions(Options):
    """A meter whose app exports its log only after the recording (Nordic PPK2, Otii)."""

    meter_export: bool = opt(False, recipe=False,
                             help="A meter records during the run and its app exports the log after it (Nordic PPK2, "
                                  "Otii): the run holds the idle stretch and the windows --power-log would and records "
                                  "them in the result; give the export to `edgetrain energy attribute` afterwards.")


class FinetuneOptions(ModelOptions, CarbonOptions, PowerLogOptions, MeterExportOptions):
    data: str = opt(metavar="DATA", recipe=False, help="Training data (classes come from it).")
    out: str = opt(metavar="OUTDIR", short="-o", recipe=False,
                   help="Folder for the model (OUTDIR/model), metrics.json and the checkpoint.")
    val: Optional[str] = opt(None, metavar="DATA", recipe=False, help="Held-out data to report accuracy on.")
    val_split: Optional[Annotated[float, Range(gt=0, lt=1)]] = opt(
        None, metavar="F", recipe=False,
        help="Hold out this fraction of DATA (stratified) for accuracy; default 0.2 unless --val.")
    epochs: Annotated[int, Range(ge=1, le=100_000)] = opt(10, help="Passes over the training data.")
    batch_size: Annotated[int, Range(ge=1, le=1_000_000)] = opt(
        32, help="Effective batch size (micro-batches accumulate up to it).")
    lr: Positive = opt(None, metavar="LR", le=MAX_LR,
                       help="Learning rate (default: adam 0.02 / sgd 0.2 for the head alone, 0.001 / 0.005 for all, else "
                            "0.003 / 0.05).")
    optimizer: Literal["sgd", "adam"] = opt("adam", help="Optimizer.")
    momentum: Annotated[Optional[float], Range(ge=0, lt=1)] = opt(
        None, metavar="M", help="sgd's momentum (default 0.9; 0: plain SGD).")
    weight_decay: Annotated[float, Range(ge=0, le=1)] = opt(
        1e-4, metavar="WD", help="Weight decay: WD times the weights added to the gradient (L2, as MXNet's sgd and "
                                 "adam apply it; not AdamW's decoupled decay).")
    train_layers: TrainLayersValue = opt(DEFAULT_TRAIN_LAYERS, metavar="head|last:N|bias|lite|all",
                                    help="What trains: the output layer, the last N trainable layers/blocks, "
                                         "every bias (bias), every bias and a lite residual module per block "
                                         "(lite), or everything.")
    memory_budget: MemoryMB = opt(None, metavar="SIZE",
                                  help="Peak RSS bound for the whole process, e.g. 512MB; a bare number is MB "
                                       "(default: the device's).")
    resume: bool = opt(False, recipe=False, help="Continue the run checkpointed in OUTDIR.")
    seed: Annotated[int, Range(ge=0, le=2**32 - 1)] = opt(0, help="Random seed (0 to 2**32-1).")
    power_log: Optional[str] = opt(None, metavar="FILE", recipe=False,
                                   help="A power meter's log recorded during the run: clock times and power (or "
                                        "voltage and current), units in its header, e.g. 'timestamp,power (W)'; "
                                        "read before the work starts. The fine-tune's energy is measured from it.")
    allow_chance: bool = opt(False, help="Accept a fine-tuned model at chance on the held-out data (else exit 3: it "
                                         "learned nothing these samples show; the model is kept).")
    NEEDS = {"momentum": ({"optimizer": "sgd"}, "adam's first-moment decay is fixed at 0.9")}

    def budget_mb(self) -> float | None:
        """--memory-budget, else the device's budget, else None (no budget)."""
        if self.memory_budget is not None:
            return self.memory_budget
        prof = self.profile()
        return float(prof.memory_budget_mb) if prof is not None else None


class ProfileOptions(ModelOptions, EnergyOptions, CarbonOptions, PowerLogOptions, MeterExportOptions):
    threads: ThreadList = opt(None, metavar="N[,N...]",  # type: ignore[assignment]  # a sweep, not one cap
                              help="Thread counts to sweep, e.g. 1,2,4; one fresh process each (default: the device's).")
    runtime: Optional[Literal["onnxruntime", "mxnet"]] = opt(
        None, help="Runtime to profile in (default: onnxruntime for .onnx, mxnet for a Gluon MODEL; onnxruntime on "
                   "a Gluon MODEL exports it first, as `edgetrain export` would).")
    batch: Annotated[int, Range(ge=1, le=65536)] = opt(1, help="Batch size of each inference.")
    warmup: Annotated[int, Range(ge=0, le=100_000)] = opt(10, help="Untimed runs after the first inference.")
    runs: Annotated[int, Range(ge=1, le=1_000_000)] = opt(100, help="Timed runs per configuration.")
    report: Optional[str] = opt(None, metavar="PATH", recipe=False,
                                help="Write a self-contained report (.html or .md).")
    timeout: Positive = opt(None, metavar="S", le=7 * 86_400,
                            help="Stop a configuration that runs longer than this many seconds (default 900).")
    power_log: Optional[str] = opt(None, metavar="FILE", recipe=False,
                                   help="A power meter's log recorded during the run: clock times and power (or "
                                        "voltage and current), units in its header, e.g. 'timestamp,power (W)'; "
                                        "read before the work starts. Energy is measured from it over the timed runs.")

    def thread_cap(self) -> int | None:  # a sweep: each child gets its own cap
        prof = self.profile()
        return prof.default_threads if self.threads is None and prof is not None else None


class RunOptions(CarbonOptions):
    output: Optional[str] = opt(None, short="-o", metavar="RUNDIR",
                                help="Run folder, new or empty (default: ./edgetrain-run-NAME, or NAME-2, -3... if taken).")
    device: Optional[str] = opt(None, metavar="NAME", help="Run for this device instead of the recipe's.")
    resume: Optional[str] = opt(None, metavar="RUNDIR",
                                help="Continue the run in RUNDIR (its recipe is kept there), re-running every step "
                                     "that did not pass.")
    threads: Threads = opt(None, metavar="N", help="Cap every thread pool of every step; default: the recipe's, "
                                                   "else the device's.")

    def thread_cap(self) -> int | None:
        return self.threads


COMMANDS: dict[str, type[Options]] = {
    "quantize": QuantizeOptions, "export": ExportOptions, "finetune": FinetuneOptions, "profile": ProfileOptions,
    "inspect": InspectOptions, "run": RunOptions,
}


class PredictOptions(DeviceOptions):
    """``edgetrain predict MODEL DATA``: MODEL (an ONNX file written by edgetrain) and DATA are arguments."""

    top_k: Annotated[int, Range(ge=1, le=1000)] = opt(5, metavar="K", help="Labels shown per input, best first.")
    format: Optional[Literal["table", "csv", "jsonl", "json"]] = opt(
        None, help="How each input's top-k labels are written: table (tab-separated), csv, jsonl (an object a "
                   "line) or json (one array). Default: what -o's name says (.csv, .jsonl, .json, .tsv), else table.")
    batch: Annotated[int, Range(ge=1, le=4096)] = opt(
        16, help="Inputs per inference (a model exported with a fixed batch runs that many at a time).")
    output: Optional[str] = opt(None, metavar="FILE", short="-o", recipe=False,
                                help="Write the predictions to FILE (atomically) instead of standard output.")

    # what an -o name ending so holds; a --format that says otherwise is refused (`-o x.json` wrote a table)
    SUFFIX_FORMATS = {".csv": "csv", ".jsonl": "jsonl", ".json": "json", ".tsv": "table"}

    @classmethod
    def _check(cls, values: dict) -> dict:
        out = super()._check(values)
        if out["output"] == "-":  # standard output, as --json - is (it wrote a file named '-')
            out["output"] = None
        name = out["output"]
        # by the name's ending, a file named only '.json' too (splitext gives a dotfile no suffix: it wrote a table)
        suffix = next((s for s in cls.SUFFIX_FORMATS if name and name.lower().endswith(s)), "")
        named = cls.SUFFIX_FORMATS.get(suffix)
        if out["format"] is None:
            out["format"] = named or "table"
        elif named is not None and named != out["format"]:
            raise UsageError(f"-o {clip(name, 60)} is named as {named} but --format is {out['format']}", "-o",
                             f"leave --format out (the name decides) or give -o a name that does not end in {suffix}")
        return out


COMMANDS["predict"] = PredictOptions


class EnergyAttributeOptions(PowerLogOptions, CarbonOptions):
    """``edgetrain energy attribute RESULT METER_LOG``: a meter's export attributed to a finished profile's windows;
    --country/--grid-intensity as profile and finetune take them (the grams of the figures written)."""

    output: Optional[str] = opt(None, metavar="FILE", short="-o", recipe=False,
                                help="Where to write the result with the measured energy (atomically; default "
                                     "RESULT's name with '-measured' before '.json'). Never RESULT itself.")


class EnergyCalibrateOptions(Options):
    """``edgetrain energy calibrate METER_LOG``: the board's own sensor fitted to a meter logging at the same time."""

    output: Optional[str] = opt(None, metavar="FILE", short="-o", recipe=False,
                                help="Where to write the fit (atomically). Default: the calibration later runs read, "
                                     "$XDG_CONFIG_HOME/edgetrain/power-calibration.json (~/.config/...); another "
                                     "FILE is used when EDGETRAIN_POWER_CALIBRATION names it.")
    seconds: Annotated[float, Range(ge=2, le=3600)] = opt(
        30.0, metavar="S", help="How long to sample the sensor (alternating idle and busy) while the meter logs.")
    phase: Annotated[float, Range(gt=0, le=600)] = opt(
        2.0, metavar="S", help="Length of each idle and each busy stretch, so the fit sees a spread of power.")


# --- edgetrain fleet ----------------------------------------------------------------------------------

class FleetServeOptions(Options):
    """``edgetrain fleet serve MODEL``: the coordinator (Flower SuperLink + the rounds)."""

    val: str = opt(metavar="DATA", recipe=False,
                   help="Held-out data on the coordinator: the global model's top-1 per round (its classes are the "
                        "fleet's).")
    out: str = opt(metavar="RUNDIR", short="-o", recipe=False,
                   help="Folder for the global weights per round, fleet.json, fleet-report.html and logs.")
    rounds: Annotated[int, Range(ge=1, le=100_000)] = opt(10, help="Federated rounds.")
    min_clients: Annotated[int, Range(ge=1, le=100_000)] = opt(
        2, metavar="N", help="Devices to wait for before a round starts (after --join-timeout: whoever is there).")
    min_updates: Annotated[int, Range(ge=1, le=100_000)] = opt(
        1, metavar="N", help="Updates a round needs to change the global model (fewer: the round leaves it as it was "
                             "and is not counted as completed).")
    fraction: Annotated[float, Range(gt=0, le=1)] = opt(1.0, metavar="F",
                                                         help="Fraction of the available devices asked each round: a "
                                                              "random sample, seeded by --seed and the round.")
    round_timeout: Annotated[float, Range(gt=0, le=86_400)] = opt(
        600.0, metavar="S", help="Seconds a round waits for updates, a hard bound (the held-out check and the save "
                                 "follow); a slower device is left out of that round and is told so.")
    join_timeout: Annotated[float, Range(gt=0, le=86_400)] = opt(
        300.0, metavar="S", help="Seconds to wait for --min-clients devices before a round starts with fewer.")
    codec: Literal["fp32", "int8", "2bit", "ternary"] = opt(
        "int8", help="How devices compress their updates: fp32 (none), int8 (per-tensor affine), 2bit (with error "
                     "feedback: what is dropped stays on the device and is sent with the next round), ternary "
                     "(the largest 9 in 100 of each tensor, at least 48, as +-one scale, positions Rice-coded, with "
                     "error feedback; BatchNorm statistics as int8 deltas; "
                     "the global model then goes down as a delta against what each device holds: --downlink-ratio).")
    ternary_density: Annotated[float, Range(gt=0, le=1)] = opt(
        0.09, metavar="F", help="With --codec ternary and --uplink-ratio 0: the fraction of each weight tensor's "
                                "entries a device sends per round (at least --ternary-min-keep; the rest waits in "
                                "its residual). Smaller: fewer bytes, slower rounds to the same accuracy.")
    ternary_control_step: Annotated[float, Range(gt=0, le=1)] = opt(
        0.4, metavar="F", help="With --codec ternary and --aggregate scaffold: no control deltas travel; the device "
                               "and the coordinator both derive them from the update as decoded, and move the "
                               "control variates this fraction of the way each round (one sparse update is noisy).")
    ternary_min_keep: Annotated[int, Range(ge=1, le=1_000_000_000)] = opt(
        48, metavar="K", help="With --codec ternary and --uplink-ratio 0: at least K entries of each tensor go up "
                              "(all of a smaller one).")
    uplink_ratio: Annotated[float, Range(ge=0, le=1_000_000)] = opt(
        0.0, metavar="R", help="With --codec ternary: each device sizes each message to its float32 bytes / R, as "
                               "exactly as fits (int8, else 2-bit, else ternary at the largest density that fits); "
                               "0 (default): the fixed --ternary-density and --ternary-min-keep (sized to 100x, the "
                               "head and bias fleets lost far more accuracy: README, Sizing).")
    downlink_ratio: Annotated[float, Range(ge=0, le=1_000_000)] = opt(
        0.0, metavar="R", help="With --codec ternary: the global model goes down to each device as a delta against "
                               "what that device holds, sized to its float32 bytes / R (as --uplink-ratio sizes "
                               "the uplink); 0 (default): int8 deltas (sized to 16x, the head fleet lost 7 points "
                               "more: README, Sizing).")
    server_momentum: Annotated[Optional[float], Range(ge=0, lt=1)] = opt(
        None, metavar="B", help="Server momentum (FedAvgM): the global step is the averaged update plus B times the "
                                "last step (default: 0.4; 0: plain averaging).")
    max_update_norm: Positive = opt(
        None, metavar="X", le=1e38, help="Refuse a device's update whose L2 norm (all its arrays) exceeds X (default: 10x the "
                                "round's median update norm, and 1000x the global arrays' norm); a non-finite update "
                                "or sample count is always refused. The round goes on without it.")
    aggregate: Literal["scaffold", "fedavg"] = opt(
        "scaffold", help="How updates are combined: scaffold (FedAvg with drift correction: devices that see only "
                         "some classes do not pull the model towards theirs; twice the bytes) or plain fedavg.")
    epochs: Annotated[int, Range(ge=1, le=10_000)] = opt(1, help="Local epochs per round on each device.")
    batch_size: Annotated[int, Range(ge=1, le=1_000_000)] = opt(32, help="Effective batch size on the devices.")
    lr: Positive = opt(None, metavar="LR", le=MAX_LR, help="Devices' learning rate (default: the fine-tuning engine's).")
    optimizer: Literal["sgd", "adam"] = opt("sgd", help="Devices' optimizer (its state starts afresh each round).")
    train_layers: TrainLayersValue = opt(DEFAULT_TRAIN_LAYERS, metavar="head|last:N|bias|lite|all",
                                    help="What the devices train and send: the output layer, the last N trainable "
                                         "layers/blocks (with their BatchNorm statistics), every bias and BatchNorm "
                                         "shift with the output layer (bias), those and TinyTL's lite residual "
                                         "modules (lite), or everything. bias and lite train from an .onnx MODEL "
                                         "(each device gives its own --model FILE.onnx; no mxnet needed).")
    seed: Annotated[int, Range(ge=0, le=2**31 - 1)] = opt(0, help="Seed of the new output layer and of the devices.")
    params: Optional[str] = opt(None, metavar="FILE", recipe=False,
                                help="Weights for a zoo: or factory model (save_parameters file).")
    export: Literal["onnx", "int8", "none"] = opt(
        "onnx", help="The deployable global model written to RUNDIR/model at the end: onnx (the PREFIX for a Gluon "
                     "base, and ONNX fp32), int8 (also an int8 ONNX calibrated on --val), none (the arrays only).")
    listen: str = opt("127.0.0.1", metavar="HOST",
                      help="Address to listen on. Loopback by default; give 0.0.0.0 (with TLS) to accept devices.")
    port: Annotated[int, Range(ge=1, le=65535)] = opt(9092, help="Port devices connect to (Flower's HTTP APIs).")
    tls_cert: Optional[str] = opt(None, metavar="PEM", recipe=False, help="Server certificate (enables TLS).")
    tls_key: Optional[str] = opt(None, metavar="PEM", recipe=False, help="Server private key (with --tls-cert).")
    tls_ca: Optional[str] = opt(None, metavar="PEM", recipe=False, help="CA certificate that signed --tls-cert.")
    allow_chance: bool = opt(False, help="Accept a global model at chance on --val (else exit 3: the fleet learned "
                                         "nothing the held-out data can show).")
    resume: bool = opt(False, recipe=False, help="Continue the run in RUNDIR after its last completed round.")
    threads: Threads = opt(None, metavar="N", recipe=False, help="Cap the coordinator's thread pools.")

    NEEDS = {"ternary_density": ({"codec": "ternary"}, "the other codecs send every entry"),
             "ternary_min_keep": ({"codec": "ternary"}, "the other codecs send every entry"),
             "uplink_ratio": ({"codec": "ternary"}, "only ternary sizes itself to a bytes target"),
             "downlink_ratio": ({"codec": "ternary"}, "only ternary compresses the downlink"),
             "ternary_control_step": ({"codec": "ternary", "aggregate": "scaffold"},
                                      "only SCAFFOLD's control variates over the ternary codec are derived this way")}

    def thread_cap(self) -> int | None:
        return self.threads


class FleetJoinOptions(DeviceOptions):
    """``edgetrain fleet join ADDRESS``: one device (a Flower SuperNode training with edgetrain)."""

    data: str = opt(metavar="DATA", recipe=False, help="This device's training data (it never leaves the device).")
    state: str = opt(metavar="DIR", short="-o", recipe=False,
                     help="This device's folder: its round state, error-feedback residual and logs.")
    name: Optional[str] = opt(None, metavar="NAME", help="Name shown in the coordinator's report (default: hostname).")
    model: Optional[str] = opt(None, metavar="MODEL", recipe=False,
                               help="The model on this device (default: the coordinator's, when it is built in).")
    params: Optional[str] = opt(None, metavar="FILE", recipe=False, help="Weights for a zoo: or factory --model.")
    memory_budget: MemoryMB = opt(None, metavar="SIZE", help="Peak RSS bound per round (default: the device's).")
    tls_ca: Optional[str] = opt(None, metavar="PEM", recipe=False,
                                help="CA certificate to verify the coordinator with (enables TLS).")
    local_port: Optional[Annotated[int, Range(ge=1, le=65535)]] = opt(
        None, metavar="PORT", help="Loopback port of this device's own Flower runtime API (default: a free one).")
    max_wait: Positive = opt(None, metavar="S", le=30 * 86_400, help="Give up after this many seconds without the coordinator "
                                                     "(default: keep trying).")

    def budget_mb(self) -> float | None:
        if self.memory_budget is not None:
            return self.memory_budget
        prof = self.profile()
        return float(prof.memory_budget_mb) if prof is not None else None



# --- edgetrain tune -------------------------------------------------------------------------------------
# The grid's names and values are read here, as finetune's own options read them (the tuning wing reads the
# YAML files and runs the trials).

# a name a user may give -> the FinetuneOptions field it sets (MXNet's spellings too)
GRID_NAMES = {"lr": "lr", "learning_rate": "lr", "optimizer": "optimizer", "momentum": "momentum",
              "weight_decay": "weight_decay", "wd": "weight_decay", "batch_size": "batch_size",
              "train_layers": "train_layers", "epochs": "epochs"}
GRID_OBJECTIVES = ("accuracy", "validation_accuracy", "val_accuracy")
GRID_FIX = (f"search {', '.join(sorted(set(GRID_NAMES.values())))} (as finetune's options), "
            "e.g. --grid lr=0.003,0.01,0.03")


def grid_field(name: str, where: str) -> str:
    """The FinetuneOptions field a grid's ``name`` sets."""
    key = str(name).strip().lower().replace("-", "_")
    if key in GRID_NAMES:
        return GRID_NAMES[key]
    raise UsageError(f"unknown name '{name}' in the grid", where, GRID_FIX)


def grid_values(name: str, raw: list, where: str) -> list:
    """``raw`` read as finetune reads ``name``: each value checked, duplicates (0.01 and 1e-2) once."""
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


def grid_entries(value) -> list[str]:
    """The grid's ``NAME=V1,V2`` entries and YAML paths, from a text, a list of them or the API's mapping."""
    if value is None:
        return []
    if isinstance(value, dict):
        return [f"{k}={','.join(str(v) for v in (vs if isinstance(vs, (list, tuple)) else [vs]))}"
                for k, vs in value.items()]
    if isinstance(value, (list, tuple)):
        return [e for item in value for e in grid_entries(item)]
    if not isinstance(value, str):
        raise UsageError(f"cannot read the grid {value!r}", "--grid", "give NAME=V1,V2 (or a YAML file)")
    return [e.strip() for e in value.split(";") if e.strip()]


def grid_text(value) -> str | None:
    """``--grid`` (a repeated flag: a list; the API's mapping, ``{"lr": [0.01, 0.1]}``; or that text) as one text,
    ``name=v1,v2;...`` (each name and value checked, a YAML file's path kept): what the declaration holds, and
    reads back."""
    parts, seen = [], set()
    for entry in grid_entries(value):
        if "=" not in entry:
            if not entry.lower().endswith((".yaml", ".yml")):
                raise UsageError(f"cannot read the grid entry '{entry[:40]}'", "--grid",
                                 "give NAME=V1,V2,... or a YAML file (*.yaml) with a param_dict")
            parts.append(entry)
            continue
        name, _, raw = entry.partition("=")
        key = grid_field(name, "--grid")
        if key in seen:
            raise UsageError(f"the grid names '{key}' twice", "--grid", "give each name once, its values comma-separated")
        seen.add(key)
        values = grid_values(key, raw.split(","), "--grid")
        parts.append(f"{key}={','.join(str(v) for v in values)}")
    return ";".join(parts) or None


MAX_OBJECTIVE_WEIGHT = 1e6


def objective_text(value) -> str:
    """``accuracy``, ``latency:W`` or ``energy:W`` (W > 0: accuracy points per ms / mJ of one inference)."""
    text = str(value).strip().lower()
    if text in GRID_OBJECTIVES:
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


def _duration(value) -> float:
    """'90s', '30m', '2h', '1.5h', or a bare number of seconds -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = _read_float(value)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?|\.\d+)\s*(s|sec|m|min|h|hr|d)?\s*", str(value), re.IGNORECASE)
        if not m:
            raise ValueError("cannot read a duration; write e.g. 90s, 30m, 2h (a bare number is seconds)")
        seconds = float(m.group(1)) * {"s": 1, "sec": 1, "m": 60, "min": 60, "h": 3600, "hr": 3600,
                                        "d": 86400}[(m.group(2) or "s").lower()]
    if not seconds > 0:
        raise ValueError("a duration must be more than zero; write e.g. 30m")
    return seconds


GridText = Annotated[Optional[str], Parse(grid_text)]
# at most a year: beyond it a figure is a typo (or an infinity), not a plan
Duration = Annotated[Optional[float], Parse(_duration, show=lambda s: f"{s:g}s"), Range(gt=0, le=366 * 86400)]
ObjectiveText = Annotated[str, Parse(objective_text)]


class TuneOptions(DeviceOptions):
    """``edgetrain tune MODEL``: a search over finetune's options, within the device's budgets."""

    NEEDS = {"eta": ({"strategy": "halving"}, "grid and random train every point they try in full"),
             "min_rung": ({"strategy": "halving"}, "grid and random train every point they try in full")}

    data: str = opt(metavar="DATA", recipe=False, help="Training data (classes come from it); decoded once for "
                                                      "every trial.")
    out: str = opt(metavar="OUTDIR", short="-o", recipe=False,
                   help="Folder for the best model (OUTDIR/model.onnx), the trials (trials.csv, tune.json), "
                        "report.html and every trial's checkpoint.")
    val: Optional[str] = opt(None, metavar="DATA", recipe=False,
                             help="Held-out data the trials are ranked on.")
    val_split: Optional[Annotated[float, Range(gt=0, lt=1)]] = opt(
        None, metavar="F", recipe=False,
        help="Hold out this fraction of DATA (stratified, --seed) to rank on; default 0.2 unless --val.")
    grid: GridText = opt(None, metavar="NAME=V1,V2,...|FILE.yaml",
                         help="Values to search, repeatable: lr, optimizer, momentum (sgd's), weight_decay, batch_size, "
                              "train_layers (head, last:N, bias, lite, all), epochs; each value as finetune takes "
                              "it. Or a YAML file in MXNet's GridSearch form (param_dict: {learning_rate: [...]}, "
                              "objective: validation_accuracy). Required.")
    epochs: Annotated[int, Range(ge=1, le=10_000)] = opt(
        10, help="Epochs of a trial trained in full (the last rung); a grid's epochs values override it.")
    strategy: Literal["halving", "grid", "random"] = opt(
        "halving", help="halving: successive halving over epochs (every point 1 epoch or so, the best 1/--eta "
                        "further, the best one to --epochs); grid: every point fully (the reference); random: "
                        "--trials points of the grid, fully.")
    eta: Annotated[int, Range(ge=2, le=16)] = opt(
        3, metavar="N", help="halving: the best 1/N of the points at a rung go on to the next; the rungs are --epochs "
                             "divided by N, N^2, ... down to 1 epoch.")
    min_rung: Annotated[float, Range(gt=0, le=1)] = opt(
        1.0, metavar="F", help="halving: the first rung may be this fraction of an epoch's steps (e.g. 0.5 when one "
                               "epoch of every point is costly); default 1: whole epochs.")
    trials: Optional[Annotated[int, Range(ge=1, le=100_000)]] = opt(
        None, metavar="N", help="Points of the grid tried (a seeded sample; default: all of them, a quarter with "
                                "--strategy random).")
    objective: ObjectiveText = opt(
        "accuracy", metavar="accuracy|latency:W|energy:W",
        help="What ranks the trials: held-out accuracy (ties: less device time, then lower peak memory); "
             "latency:W or energy:W take W accuracy points off per ms or mJ of one inference of the trial's model "
             "(energy modelled from the --device's power).")
    time_budget: Duration = opt(None, metavar="DURATION",
                                help="Stop starting trial epochs that would end after this (e.g. 30m, 2h); the "
                                     "best so far is chosen.")
    memory_budget: MemoryMB = opt(None, metavar="SIZE",
                                  help="Peak RSS bound, e.g. 512MB (default: the device's); a trial whose plan "
                                       "would not fit is skipped before it runs.")
    seed: Annotated[int, Range(ge=0, le=2**32 - 1)] = opt(0, help="Seed of every trial, the held-out split and "
                                                                 "the sample of points.")
    resume: bool = opt(False, recipe=False, help="Continue the tune run in OUTDIR after a stop or power cut.")

    def budget_mb(self) -> float | None:
        if self.memory_budget is not None:
            return self.memory_budget
        prof = self.profile()
        return float(prof.memory_budget_mb) if prof is not None else None


COMMANDS["tune"] = TuneOptions
