"""Click options made from the declarations in ``edgetrain.options`` (never written by hand here)."""
from __future__ import annotations

import typing

import click
from pydantic.fields import FieldInfo

from ..options import DeviceOptions, EnergyOptions, ModelFields, Options, flag_of

# Listed after a command's own options in --help.
SHARED = {*ModelFields.model_fields, *DeviceOptions.model_fields, *EnergyOptions.model_fields}


def _choices(annotation) -> list[str] | None:
    """The allowed values of a Literal (or Optional[Literal]) annotation."""
    for arg in (annotation, *typing.get_args(annotation)):
        if typing.get_origin(arg) is typing.Literal:
            return [str(a) for a in typing.get_args(arg)]
    return None


def _metavar(annotation) -> str:
    text = str(annotation)
    return "N" if "int" in text else "X" if "float" in text else "TEXT"


def click_option(name: str, info: FieldInfo, model: type[Options]):
    extra = info.json_schema_extra or {}
    flag = extra.get("flag") or flag_of(model, name)
    decls = [flag] + ([extra["short"]] if extra.get("short") else [])
    kw: dict = {"help": info.description, "metavar": extra.get("metavar")}
    required = info.is_required()
    if info.annotation is bool:
        kw.update(default=info.default, show_default=True)
        if "/" not in flag:
            kw["is_flag"] = True
    else:
        kw.update(default=None if required else info.default, required=required,
                  show_default=not required and info.default is not None)
        choices = _choices(info.annotation)
        if choices:
            kw["type"] = click.Choice(choices)
        elif not kw["metavar"]:
            kw["metavar"] = _metavar(info.annotation)
    return click.option(*decls, name, **kw)


def declared_options(model: type[Options], skip: tuple[str, ...] = ()):
    """Decorate a click command with one option per field of ``model`` (in declaration order)."""
    def decorate(f):
        own = [n for n in model.model_fields if n not in SHARED]
        for name in reversed(own + [n for n in model.model_fields if n in SHARED]):
            info = model.model_fields[name]
            if name not in skip:
                f = click_option(name, info, model)(f)
        return f
    return decorate


def parse(model: type[Options], values: dict) -> Options:
    """The options a user gave on the command line, validated by the declaration."""
    return model.parse({k: v for k, v in values.items() if v is not None})
