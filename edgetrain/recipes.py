"""Recipes: find them (bundled or a path), validate them whole before any step runs.

Validation is schema (Recipe below: unknown keys, types) plus what the schema cannot know: the device
profile exists, the model reference resolves, every data path exists. Each problem is one UsageError
naming the file, the field path and what is expected.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model, model_validator

from .config import Strict, validate
from .data import BUILTIN_PREFIX, BUILTINS
from .devices import load_device
from .errors import UsageError
from .fileio import parse_yaml, read_text_bounded
from .fleet.report import read_report as read_fleet_report
from .models import is_factory_ref, parse_model_ref
from .options import ExportOptions, FinetuneOptions, Options, ProfileOptions, QuantizeOptions, TuneOptions, flag_of

# --- Recipes (recipes/*.yaml) -------------------------------------------------------------------
# A recipe names one model, one data set, one device and the steps to run, each step's options
# spelled as the matching command's option names (max_drop <-> --max-drop). An option left out takes the
# command's own default, so a recipe and the command line never disagree about defaults. Paths are
# relative to the recipe file's folder.


SHIPPED_PREFIX = "builtin:"  # builtin:NAME.onnx: a MODEL shipped inside edgetrain (edgetrain/_builtin)


@dataclass
class Artifacts:
    """What the steps so far have made; each step takes its input from here."""

    model: str                    # the current MODEL (the recipe's, then the fine-tuned or tuned one)
    train: str
    val: str | None
    fp32_onnx: str | None = None
    int8_onnx: str | None = None


@dataclass(frozen=True)
class StepKind:
    """A kind of recipe step that runs a command, declared here only (the schema, the run, --resume and the
    docs read it). ``options``: the command's declaration: a recipe sets the fields it allows, ``inputs(
    artifacts, rundir, step, resume)`` -> (MODEL, {field: value}) the rest. ``files``: what it leaves in the
    run folder (sealed when it passes, checked before --resume skips it); ``makes``: (Artifacts field, path)
    of what later steps take (``also_makes``: more such pairs; ``from_onnx``: those when the step's MODEL is an
    ONNX file); ``extra``: recipe fields beyond the command's."""

    options: type[Options]
    inputs: Callable[[Artifacts, Path, Any, bool], tuple[str, dict]]
    files: tuple[str, ...] = ()
    makes: tuple[str, str] | None = None
    extra: dict = field(default_factory=dict)
    also_makes: tuple[tuple[str, str], ...] = ()
    from_onnx: tuple[tuple[str, str], ...] = ()


def _profile_inputs(art: Artifacts, rundir: Path, step, resume: bool):
    target = {"fp32": art.fp32_onnx, "int8": art.int8_onnx}.get(step.target) or art.int8_onnx or art.fp32_onnx
    if target is None:
        raise UsageError(f"profile target '{step.target}' has no model yet", "recipe steps",
                         "put an export or quantize step before profile")
    return target, {"report": str(rundir / "profile.html")}


def _tune_inputs(art: Artifacts, rundir: Path, step, resume: bool):
    """tune trains from an ONNX file: the export's (or an ONNX model the recipe starts from)."""
    model = art.fp32_onnx or (art.model if str(art.model).lower().endswith(".onnx") else None)
    if model is None:
        raise UsageError("the tune step trains from an ONNX file and there is none yet", "recipe steps",
                         "put an export step before tune")
    return model, {"data": art.train, "val": art.val, "out": str(rundir / "tune"),
                   "resume": resume and (rundir / "tune" / "journal.jsonl").is_file()}


STEPS: dict[str, StepKind] = {
    # from a Gluon model it writes a PREFIX; from an ONNX base (a device: no mxnet) model.onnx, which is then
    # also the fp32 ONNX later steps take (there is no export step on a device)
    "finetune": StepKind(FinetuneOptions, lambda art, rundir, step, resume: (art.model, {
        "data": art.train, "out": str(rundir / "finetune"), "val": art.val,
        "resume": resume and (rundir / "finetune").is_dir()}), makes=("model", "finetune/model"),
        from_onnx=(("model", "finetune/model.onnx"), ("fp32_onnx", "finetune/model.onnx")),
        files=("finetune/model-symbol.json", "finetune/model-0000.params", "finetune/model-edgetrain.json",
               "finetune/model.onnx")),
    "quantize": StepKind(QuantizeOptions, lambda art, rundir, step, resume: (art.model, {
        "calib": art.train, "val": art.val,
        "output": str(rundir / ("model_int8" if step.backend == "mxnet" else "model_int8.onnx"))}),
        makes=("int8_onnx", "model_int8.onnx"),
        files=("model_int8.onnx", "model_int8-symbol.json", "model_int8-0000.params")),
    "export": StepKind(ExportOptions, lambda art, rundir, step, resume: (art.model, {
        "output": str(rundir / "model.onnx"), "data": art.val or art.train}),
        makes=("fp32_onnx", "model.onnx"), files=("model.onnx",)),
    # the tuned model is what later steps take: quantize's MODEL, profile's fp32
    "tune": StepKind(TuneOptions, _tune_inputs, makes=("model", "tune/model.onnx"),
                     also_makes=(("fp32_onnx", "tune/model.onnx"),),
                     files=("tune/model.onnx", "tune/trials.csv", "tune/tune.json", "tune/report.html")),
    "profile": StepKind(ProfileOptions, _profile_inputs, files=("profile.html",), extra={"target": (
        Literal["deployed", "fp32", "int8"], Field("deployed", description="The model profiled: deployed (int8 if "
                                                   "quantized, else fp32), fp32 or int8."))}),
}


def _schema(name: str, kind: StepKind) -> type[BaseModel]:
    """A step's schema: the command's declared options a recipe may set, each optional (left out: the
    command's own default), read and checked by the declaration itself (edgetrain.options); unknown keys
    are errors."""
    fields = {n: (Annotated[Any, BeforeValidator(_reader(f))], Field(None, description=f.help))
              for n, f in kind.options.fields.items() if f.recipe}
    return create_model(f"{name.title()}Step", __config__=ConfigDict(extra="forbid", frozen=True), **fields,
                        **kind.extra)


def _reader(field):
    return lambda value: None if value is None else field.read(value)


class ReportStep(Strict):
    """The run's own report (not a command): written from the results of the steps before it."""

    format: Literal["html", "md"] = "html"
    fleet: Optional[str] = Field(None, description="A fleet run folder (`edgetrain fleet serve -o RUNDIR`, relative "
                                 "to the recipe): its round-by-round report (fleet.json) becomes a section of this one.")


STEP_SCHEMAS: dict[str, type[BaseModel]] = {**{n: _schema(n, k) for n, k in STEPS.items()}, "report": ReportStep}


class _OneStep(Strict):
    @model_validator(mode="before")
    @classmethod
    def _empty_options_allowed(cls, data):
        # `- export:` (no options) parses as {"export": None}: treat as the defaults
        if isinstance(data, dict):
            return {k: ({} if v is None else v) for k, v in data.items()}
        return data

    @model_validator(mode="after")
    def _exactly_one(self):
        set_ = [name for name in STEP_SCHEMAS if getattr(self, name) is not None]
        if len(set_) != 1:
            raise ValueError(f"each step is exactly one of {', '.join(STEP_SCHEMAS)}; got "
                             f"{', '.join(set_) or 'none'}")
        return self

    @property
    def name(self) -> str:
        return next(n for n in STEP_SCHEMAS if getattr(self, n) is not None)

    @property
    def options(self):
        return getattr(self, self.name)


Step = create_model("Step", __base__=_OneStep, __doc__="One entry of ``steps``: exactly one of the keys below.",
                    **{n: (Optional[schema], None) for n, schema in STEP_SCHEMAS.items()})


class Recipe(Strict):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$", description="The run's name (the default run folder "
                      "is edgetrain-run-NAME).")
    description: str = Field("", description="Free text.")
    device: str = Field(description="Device profile name or a profile YAML path (relative to the recipe).")
    model: str = Field(description="MODEL: PREFIX, zoo:NAME, pkg.module:function (the host: mxnet), or an ONNX "
                       f"file (every step without mxnet; no export step), {SHIPPED_PREFIX}NAME.onnx for one "
                       "shipped with edgetrain (builtin:digits5.onnx, the digits CNN's ONNX base).")
    data: str = Field(description="Training and calibration DATA: image folder, .npz or builtin:digits.")
    val: Optional[str] = Field(None, description="Held-out DATA for every accuracy figure.")
    val_split: Optional[float] = Field(default=None, gt=0, lt=1,
                                       description="Or: hold out this fraction of `data` (stratified).")
    seed: int = Field(0, description="Seed of the held-out split.")
    threads: Optional[int] = Field(default=None, ge=1, description="Thread cap of every step (default: the device's).")
    steps: list[Step] = Field(min_length=1, description="The steps, in order (see below).")

    @model_validator(mode="after")
    def _one_validation_source(self) -> "Recipe":
        if self.val is not None and self.val_split is not None:
            raise ValueError("give either 'val' or 'val_split', not both")
        return self

    def to_dict(self) -> dict:
        return self.model_dump(mode="json", exclude_none=True)


BUNDLED_PACKAGE = "edgetrain._recipes"
DEFAULT_RECIPE = "quickstart"
# the default where mxnet is not installed (a device): the quickstart's device loop from the shipped ONNX base
DEFAULT_DEVICE_RECIPE = "quickstart-device"
ORIGIN_FILE = "recipe-origin.json"  # in a run folder, beside recipe.yaml: where the recipe came from


@dataclass(frozen=True)
class LoadedRecipe:
    recipe: Recipe
    source: str      # what error messages name: a path, or "bundled recipe recipes/NAME.yaml"
    base: Path       # relative paths in the recipe are relative to this folder
    text: str        # the YAML as read, kept in the run folder

    def device_ref(self, override: str | None = None) -> str:
        """The --device to pass on: the override, or the recipe's (a profile file beside the recipe resolved)."""
        if override:
            return override
        device = self.recipe.device
        return self.resolve(device) if device.endswith((".yaml", ".yml")) else device

    def resolve(self, ref: str | None) -> str | None:
        """A DATA/MODEL reference with relative paths made relative to the recipe's folder; builtin:NAME.onnx
        (a MODEL shipped with edgetrain) the path of that file."""
        if ref is not None and ref.startswith(SHIPPED_PREFIX) and ref.lower().endswith(".onnx"):
            return shipped_model(ref)
        if ref is None or ref.startswith(("builtin:", "zoo:")) or is_factory_ref(ref):
            return ref
        path = Path(ref)
        return str(path if path.is_absolute() else (self.base / path))


def shipped_model(ref: str) -> str:
    """The path of builtin:NAME.onnx, an ONNX model shipped inside edgetrain (edgetrain/_builtin)."""
    name = ref[len(SHIPPED_PREFIX):]
    entry = resources.files("edgetrain._builtin").joinpath(name)
    if "/" in name or "\\" in name or not entry.is_file():
        shipped = sorted(SHIPPED_PREFIX + e.name for e in resources.files("edgetrain._builtin").iterdir()
                         if e.name.endswith(".onnx"))
        raise UsageError(f"no ONNX model '{ref}' is shipped with edgetrain", "model", f"use one of: {', '.join(shipped)}")
    return str(entry)


def model_is_onnx(loaded: "LoadedRecipe") -> bool:
    """The recipe starts from an ONNX file: every step runs without mxnet (a device)."""
    return str(loaded.resolve(loaded.recipe.model)).lower().endswith(".onnx")


def bundled_files() -> dict[str, object]:
    root = resources.files(BUNDLED_PACKAGE)
    return {e.name[:-5]: e for e in root.iterdir() if e.is_file() and e.name.endswith(".yaml")}


def bundled_names() -> list[str]:
    return sorted(bundled_files())


def default_recipe() -> str:
    """The recipe ``edgetrain run`` runs with none named: the quickstart on the host, its device loop from the
    shipped ONNX base where mxnet is not installed."""
    from ._lazy import mxnet_installed

    return DEFAULT_RECIPE if mxnet_installed() else DEFAULT_DEVICE_RECIPE


def read_recipe(name_or_path: str | None, rundir: str | Path | None = None) -> LoadedRecipe:
    """Parse and schema-validate a recipe: a bundled name, a path, or None: the one a run folder being
    resumed (``rundir``) was made with, else the default (``default_recipe``)."""
    bundled = bundled_files()
    if name_or_path is None and rundir is not None and (Path(rundir) / "recipe.yaml").is_file():
        text = (Path(rundir) / "recipe.yaml").read_text(encoding="utf-8")
        try:
            origin = json.loads((Path(rundir) / ORIGIN_FILE).read_text(encoding="utf-8"))
            source, base = str(origin["source"]), Path(origin["base"])
        except (OSError, ValueError, KeyError, TypeError):
            source, base = str(Path(rundir) / "recipe.yaml"), Path(rundir).resolve()
    elif (name_or_path or default_recipe()) in bundled:
        name_or_path = name_or_path or default_recipe()
        entry = bundled[name_or_path]
        text, source, base = entry.read_text(encoding="utf-8"), f"bundled recipe recipes/{entry.name}", Path.cwd()
    else:
        path = Path(name_or_path)
        if not path.exists():
            raise UsageError(f"recipe not found: {name_or_path}", "RECIPE",
                             f"give a recipe YAML path or one of: {', '.join(sorted(bundled))}")
        text = read_text_bounded(path, "recipe")  # a FIFO, /dev/zero or a huge file is refused, not read
        source, base = str(path), path.resolve().parent
    data = parse_yaml(text, source)  # bounded nesting and alias expansion
    return LoadedRecipe(validate(data, Recipe, source), source, base, text)


def check_recipe(loaded: LoadedRecipe, device_override: str | None = None):
    """Everything the schema cannot check, before any step runs. Returns the device profile."""
    r = loaded.recipe
    try:
        profile = load_device(loaded.device_ref(device_override))
    except UsageError as exc:
        where = "--device" if device_override else f"{loaded.source}, field 'device'"
        raise UsageError(exc.what, where, exc.fix) from None
    try:
        parse_model_ref(loaded.resolve(r.model), accept_onnx=True)
    except UsageError as exc:
        raise UsageError(exc.what, f"{loaded.source}, field 'model'", exc.fix) from None
    if model_is_onnx(loaded):
        for i, step in enumerate(r.steps):
            if step.name == "export" or (step.name == "quantize" and step.options.backend == "mxnet"):
                raise UsageError(f"the {step.name} step needs a Gluon model (mxnet) and the recipe's model is an ONNX "
                                 "file", f"{loaded.source}, field 'steps[{i}]'",
                                 f"leave the {step.name} step out: every other step runs from the ONNX file")
    _check_data(loaded, r.data, "data")
    if r.val is not None:
        _check_data(loaded, r.val, "val")
    seen = set()
    for i, step in enumerate(r.steps):
        if step.name in seen:
            raise UsageError(f"step '{step.name}' appears twice", f"{loaded.source}, field 'steps[{i}]'",
                             "give each step once")
        seen.add(step.name)
        if step.name == "report" and step.options.fleet is not None:
            read_fleet_report(loaded.resolve(step.options.fleet), f"{loaded.source}, field 'steps[{i}].report.fleet'")
        elif step.name in STEPS:
            _check_step_needs(loaded, i, step, STEPS[step.name].options)
    return profile


def _check_step_needs(loaded: LoadedRecipe, i: int, step, model: type[Options]) -> None:
    """A step's option that takes effect only with another (the declaration's NEEDS), where the recipe supplies the
    other (its val or val_split, its device): refused now, not when the step runs after the ones before it."""
    r = loaded.recipe
    values = {n: (None if f.required else f.default) for n, f in model.fields.items()}
    values.update({"val": "the recipe's" if r.val is not None or r.val_split else None, "device": "the recipe's"})
    values.update({n: v for n, v in vars(step.options).items() if n in values and v is not None})
    try:
        model.check_needs(values)
    except UsageError as exc:
        name = next(n for n in model.needs if exc.where == flag_of(model, n))
        raise UsageError(exc.what, f"{loaded.source}, field 'steps[{i}].{step.name}.{name}'",
                         "give the recipe a val (or val_split), or leave the option out") from None


def _check_data(loaded: LoadedRecipe, ref: str, field: str) -> None:
    if ref.startswith(BUILTIN_PREFIX):
        if ref[len(BUILTIN_PREFIX):] not in BUILTINS:
            raise UsageError(f"unknown built-in data set '{ref}'", f"{loaded.source}, field '{field}'",
                             "use " + ", ".join(BUILTIN_PREFIX + b for b in BUILTINS))
        return
    path = Path(loaded.resolve(ref))
    if not path.exists():
        raise UsageError(f"data path does not exist: {path}", f"{loaded.source}, field '{field}'",
                         "expected an image folder, an .npz file or builtin:digits (paths are relative to the recipe)")
