"""Click options made from the declarations in ``edgetrain.options`` (never written by hand here)."""
from __future__ import annotations

import click

from ..options import DeviceOptions, EnergyOptions, ModelFields, Opt, Options

# Listed after a command's own options in --help.
SHARED = {*ModelFields.fields, *DeviceOptions.fields, *EnergyOptions.fields}
_METAVARS = {"int": "N", "float": "X", "text": "TEXT"}


def click_option(field: Opt):
    decls = [field.flag] + ([field.short] if field.short else [])
    kw: dict = {"help": field.help, "metavar": field.metavar}
    if field.kind == "bool":
        kw.update(default=field.default, show_default=True)
        if "/" not in field.flag:
            kw["is_flag"] = True
    else:
        kw.update(default=None if field.required else field.default, required=field.required,
                  show_default=not field.required and field.default is not None)
        if field.kind == "choice":
            kw["type"] = click.Choice([str(c) for c in field.choices])
        else:
            # the text goes to the declaration as typed: click would guess INT or FLOAT from a default and
            # answer a bad number itself, with a usage block instead of the one-line error, and without the bounds
            kw["type"] = click.STRING
            if not kw["metavar"]:
                kw["metavar"] = _METAVARS[field.kind]
    return click.option(*decls, field.name, **kw)


def ordered_fields(model: type[Options]) -> list[Opt]:
    """A command's fields as --help lists them: its own first, then the shared ones (declaration order)."""
    fields = list(model.fields.values())
    return [f for f in fields if f.name not in SHARED] + [f for f in fields if f.name in SHARED]


def declared_options(model: type[Options], skip: tuple[str, ...] = ()):
    """Decorate a click command with one option per field of ``model`` (in declaration order)."""
    def decorate(f):
        for field in reversed(ordered_fields(model)):
            if field.name not in skip:
                f = click_option(field)(f)
        f.declared_options = model  # the command's declaration, for tests that walk every command's options
        return f
    return decorate


def parse(model: type[Options], values: dict) -> Options:
    """The options a user gave on the command line, validated by the declaration."""
    return model.parse({k: v for k, v in values.items() if v is not None})
