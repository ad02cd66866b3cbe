"""Hostile numbers (issue 37, R3): every numeric option of every command is read finite and in range at the
declaration, so NaN, an infinity, 1e300 or -0 is refused in one line (exit 2) before any work -- or, where 0 is a
value the option takes, accepted as a plain 0.

The options are not listed here: they are found by walking the click commands (every command made from a
declaration carries it: ``cli.options.declared_options``) and reading each field's kind from the declaration.
"""
from __future__ import annotations

import math

import click
import pytest

from clitools import cli_commands
from edgetrain.cli import main
from edgetrain.errors import UsageError
from edgetrain.options import GIVEN, Options

HOSTILE = ("nan", "inf", "-inf", "1e300", "-0")
PY_HOSTILE = (math.nan, math.inf, -math.inf, 1e300, -0.0)

# Text options that hold numbers, where the declaration's bounds cannot say whether 0 is a value: -0 accepted or not.
ZERO_IN_TEXT = {
    "mean": True,         # a mean of 0 leaves the pixels as they are
    "std": False,         # the pixels are divided by it
    "input_shape": False,  # a side or channel count of 0 is no shape
    "threads": False,     # profile's sweep: at least one thread
}


COMMANDS = dict(cli_commands())


def _zero_is_a_value(field) -> bool:
    if field.kind in ("int", "float"):
        bounds = field.bounds
        return (bounds.get("ge", -math.inf) <= 0 and bounds.get("gt", -math.inf) < 0
                and bounds.get("le", math.inf) >= 0 and bounds.get("lt", math.inf) > 0)
    return ZERO_IN_TEXT[field.name]


def _argv(path, cmd, tmp_path) -> list[str]:
    """The command with every argument and required option given (files that do not exist: the option under test
    must be refused before any of them is looked at)."""
    argv = list(path)
    for p in cmd.params:
        if isinstance(p, click.Argument):  # an optional one too: `run`'s RECIPE defaults to the whole quickstart
            argv.append(str(tmp_path / f"missing-{p.name}"))
        elif p.required and isinstance(p, click.Option):
            argv += [p.opts[0], str(tmp_path / f"missing-{p.name}")]
    return argv


def _run(argv, capsys) -> tuple[int, str]:
    """`edgetrain ARGV` through the console script's own entry point, in this process."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(argv)
    return done.value.code, capsys.readouterr().err


def test_every_command_refuses_hostile_numbers_in_every_numeric_option_at_the_declaration(tmp_path, capsys,
                                                                                          monkeypatch):
    monkeypatch.delenv("EDGETRAIN_DEBUG", raising=False)
    checked = []
    for path, cmd in COMMANDS.items():
        model = getattr(cmd.callback, "declared_options", None)
        numeric_click = [p for p in cmd.params if isinstance(p, click.Option)
                         and isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType))]
        if model is None:  # a command not made from a declaration takes no numbers (it would be missed here)
            assert not numeric_click, (path, [p.name for p in numeric_click])
            continue
        assert issubclass(model, Options)
        flags = {p.name: p.opts[0] for p in cmd.params if isinstance(p, click.Option)}
        base = _argv(path, cmd, tmp_path)
        for field in model.fields.values():
            if not field.numeric:
                continue
            flag = flags[field.name]
            assert field.kind not in ("int", "float") or ("le" in field.bounds or "lt" in field.bounds), (
                f"{' '.join(path)} {flag} has no upper bound: declare one (Range or opt(le=...))")
            for value in HOSTILE:
                if value == "-0" and _zero_is_a_value(field):
                    # taken, as a plain 0 (never shown as -0): the command goes on to MODEL/DATA, which do not exist
                    # (with what the option takes effect with, options.NEEDS, given too)
                    needed = {other: str(tmp_path / "missing-needed") if want is GIVEN else want
                              for other, want in model.needs.get(field.name, ({}, ""))[0].items()}
                    read = model.parse({**_required(model), **needed, field.name: value})
                    got = getattr(read, field.name)
                    if field.kind in ("int", "float"):
                        assert got == 0 and math.copysign(1.0, got) == 1.0, (path, flag, got)
                    more = [f"{flags[other]}={v}" for other, v in needed.items()]
                    code, err = _run(base + more + [f"{flag}={value}"], capsys)
                    # the number was taken: an error naming the flag may only ask for what it acts with (a grid
                    # of 0 g/kWh prices a device's energy: --device)
                    assert "Traceback" not in err and (flag not in err or "--device" in err), (path, flag, err)
                    continue
                code, err = _run(base + [f"{flag}={value}"], capsys)
                lines = [ln for ln in err.splitlines() if ln.strip()]
                assert code == 2 and "Traceback" not in err, (path, flag, value, code, err)
                assert len(lines) == 1 and lines[0].startswith("Error: ") and flag in lines[0], (path, flag, value, err)
                checked.append((path, flag, value))
            if field.kind in ("int", "float"):  # the Python API and recipes take numbers, not text: the same answer
                for number in PY_HOSTILE:
                    if number == 0 and _zero_is_a_value(field):
                        continue
                    with pytest.raises(UsageError) as refused:
                        model.parse({**_required(model), field.name: number})
                    assert flag in refused.value.line(), (path, flag, number)
    assert list(tmp_path.iterdir()) == []  # refused before any work: nothing written
    # every command made from a declaration, and NaN refused for each of its numeric options
    assert {p for p, _, v in checked if v == "nan"} >= {p for p, c in COMMANDS.items()
                                                        if any(f.numeric for f in getattr(
                                                            c.callback, "declared_options", Options).fields.values())}
    assert len(checked) > 150, len(checked)


def _required(model) -> dict:
    return {name: "x" for name, field in model.fields.items() if field.required}


def test_the_grid_intensity_bound_is_the_carbon_modules():
    from edgetrain import options
    from edgetrain.energy import carbon

    assert options.MAX_G_PER_KWH == carbon.MAX_G_PER_KWH
