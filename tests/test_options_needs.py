"""An option that cannot take effect is refused before the run, in one line, exit 2 (issue 37, R5): `finetune
--meter-export` without --device exited 0 with `energy: null`, no windows kept, and the meter's recording wasted.

The declaration says which options take effect only with others (an Options class's NEEDS); the test walks every
click command and gives each such option without what it needs. What depends on the machine (a power sensor) or
on the device's figures is checked by the command before its work: those members of the class are listed below.
"""
from __future__ import annotations

import click
import pytest

from clitools import assert_user_error, cli_commands, run_edgetrain
from edgetrain.cli import main
from edgetrain.errors import UsageError
from edgetrain.options import GIVEN

NO_SENSOR = {"EDGETRAIN_SYSFS_ROOT": "/nonexistent-sysfs", "EDGETRAIN_VCGENCMD": "/nonexistent-vcgencmd"}


def _a_value(field) -> str:
    """A value the option takes that is not its default (the text a user would type; a choice's other value)."""
    for text in (*map(str, field.choices or ()), "2", "0.5", "3", "0.25", "10", "1", "x"):
        try:
            value = field.read(text)
        except ValueError:
            continue
        if value != field.default:
            return text
    raise AssertionError(f"no value found for {field.name}")


def _needs_cases():
    for path, cmd in cli_commands():
        model = getattr(cmd.callback, "declared_options", None)
        for name, (conditions, _) in (model.needs if model else {}).items():
            yield pytest.param(path, cmd, model, name, conditions, id=f"{' '.join(path)} {name}")


NEEDS_CASES = list(_needs_cases())


def test_the_class_is_declared():
    names = {(" ".join(p.values[0]), p.values[3]) for p in NEEDS_CASES}
    assert {("quantize", "max_drop"), ("quantize", "max_fp32_nodes"), ("fleet serve", "ternary_density"),
            ("fleet serve", "ternary_min_keep"), ("fleet serve", "ternary_control_step")} <= names


@pytest.mark.parametrize("path,cmd,model,name,conditions", NEEDS_CASES)
def test_an_option_without_what_it_needs_is_refused_at_the_declaration(path, cmd, model, name, conditions, tmp_path,
                                                                       capsys, monkeypatch):
    monkeypatch.delenv("EDGETRAIN_DEBUG", raising=False)
    argv = list(path)
    for p in cmd.params:
        if p.required and isinstance(p, click.Argument):
            argv.append(str(tmp_path / f"missing-{p.name}"))
        elif p.required and isinstance(p, click.Option):
            argv += [p.opts[0], str(tmp_path / f"missing-{p.name}")]
    field = model.fields[name]
    flag = field.on_flag
    given = [flag] if field.kind == "bool" else [flag, _a_value(field)]
    # a condition its default meets (quantize --scheme needs --backend onnxruntime, the default) is given otherwise
    against = {other: next(c for c in model.fields[other].choices if c != want) for other, want in conditions.items()
               if want is not GIVEN and model.fields[other].default == want}
    for other, value in against.items():
        given += [model.fields[other].on_flag, str(value)]
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(argv + given)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert done.value.code == 2 and "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith(f"Error: {flag} has no effect without "), err
    assert list(tmp_path.iterdir()) == []
    # with what it needs, the declaration takes it (the same line through the Python API: the same answer)
    needed = {other: ("x" if want is GIVEN else want) for other, want in conditions.items()}
    values = {n: "x" for n, f in model.fields.items() if f.required}
    model.parse({**values, **needed, name: field.read(given[1]) if field.kind != "bool" else True})
    with pytest.raises(UsageError, match=f"{flag} has no effect without"):
        model.parse({**values, **against, name: field.read(given[1]) if field.kind != "bool" else True})


def _finetune(*more):
    return ["finetune", "edgetrain.nets:pretrained_digits", "--data", "builtin:digits", "-o", "out", *more]


# Checked by the command before its work: they depend on this machine (a power sensor) or a device's figures.
BEFORE_WORK = {
    "finetune --meter-export": (_finetune("--meter-export"), "--meter-export has no effect without --device"),
    "finetune --country": (_finetune("--country", "DE"), "--country has no effect without --device"),
    "finetune --grid-intensity": (_finetune("--grid-intensity", "300"),
                                  "--grid-intensity has no effect without --device"),
    "finetune --power-log-start": (_finetune("--power-log-start", "2026-12-03T10:00:00"),
                                   "--power-log-start given without --power-log"),
    "profile --battery-wh": (["profile", "model.onnx", "--battery-wh", "10"], "needs the device's power figures"),
    "profile --country": (["profile", "model.onnx", "--country", "DE"], "need the device's energy figures"),
    "profile --power-log-voltage": (["profile", "model.onnx", "--power-log-voltage", "3.3"],
                                    "--power-log-voltage given without --power-log"),
    "export --rate": (["export", "edgetrain.nets:pretrained_digits", "-o", "m.onnx", "--rate", "120/h"], "--device"),
}


@pytest.mark.parametrize("case", sorted(BEFORE_WORK))
def test_an_option_that_cannot_take_effect_here_is_refused_before_the_work(case, tmp_path):
    argv, fragment = BEFORE_WORK[case]
    if "model.onnx" in argv:
        import shutil
        from pathlib import Path

        import edgetrain

        shutil.copyfile(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx", tmp_path / "model.onnx")
    res = run_edgetrain(*argv, cwd=tmp_path, env=NO_SENSOR)
    assert_user_error(res, 2, fragment)
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["model.onnx"])  # nothing written


def test_finetune_meter_export_with_a_device_keeps_its_windows(tmp_path):
    """The refusal's other side: with --device the record holds the windows `energy attribute` reads."""
    import json

    res = run_edgetrain(*_finetune("--meter-export", "--device", "rpi4b-4gb", "--epochs", "1", "--json", "r.json"),
                        cwd=tmp_path, env=NO_SENSOR)
    assert res.code in (0, 3), res.err
    w = json.loads((tmp_path / "r.json").read_text())["energy"]["meter_windows"]
    assert w["held_for_a_meter"] and w["timed"][1] > w["timed"][0]


def test_a_recipe_step_option_without_the_recipes_val_is_refused_when_validated(tmp_path):
    recipe = tmp_path / "r.yaml"
    base = ("name: r\ndevice: rpi4b-4gb\nmodel: edgetrain.nets:pretrained_digits\ndata: builtin:digits\n{val}"
            "steps:\n  - quantize: {{max_drop: 0.5}}\n")
    recipe.write_text(base.format(val=""))
    assert_user_error(run_edgetrain("recipes", "validate", recipe), 2, "--max-drop has no effect without --val",
                      "steps[0].quantize.max_drop")
    recipe.write_text(base.format(val="val_split: 0.2\n"))
    assert run_edgetrain("recipes", "validate", recipe).code == 0
