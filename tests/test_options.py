"""One declaration per command: the CLI flags, the Python API and the recipe steps agree with it."""
from __future__ import annotations

import click
import pytest
import yaml

from clitools import assert_user_error, run_edgetrain
from edgetrain.cli import cli
from edgetrain.recipes import STEP_SCHEMAS
from edgetrain.errors import UsageError
from edgetrain.options import COMMANDS, FinetuneOptions, TrainLayers, flag_of

CLI_ONLY = {"json_path"}  # rendering, not an option of the work


def _command(name: str) -> click.Command:
    return cli.get_command(click.Context(cli), name)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_field_has_a_flag_with_the_same_default_and_every_flag_a_field(name):
    model, command = COMMANDS[name], _command(name)
    params = {p.name: p for p in command.params if isinstance(p, click.Option)}
    assert set(params) - CLI_ONLY == set(model.fields), name
    for field, info in model.fields.items():
        p = params[field]
        assert flag_of(model, field) in p.opts, (field, p.opts)
        assert p.required == info.required, field
        if not info.required:
            assert p.default == info.default, (field, p.default, info.default)
        assert p.help == info.help


# One bad value per constraint kind; each must be refused the same way by the CLI, the API and a recipe.
BAD = {
    "finetune": [("memory_budget", "banana"), ("memory_budget", "0"), ("train_layers", "last:0"),
                 ("train_layers", "middle"), ("epochs", "0"), ("batch_size", "-3"), ("lr", "nan"),
                 ("optimizer", "rmsprop"), ("seed", "-1"), ("input_shape", "2,3,32,32")],
    "quantize": [("max_drop", "-1"), ("max_drop", "inf"), ("samples", "0"), ("method", "kl"),
                 ("max_fp32_nodes", "-1"), ("backend", "tvm")],
    "export": [("opset", "7"), ("opset", "14"), ("atol", "-1e-3"), ("rate", "fast")],
    "profile": [("threads", "0"), ("runs", "0"), ("warmup", "-1"), ("batch", "0"), ("timeout", "0"),
                ("budget_mj", "-5")],
}
REQUIRED = {"finetune": {"data": "builtin:digits", "out": "o"}, "quantize": {"calib": "builtin:digits", "output": "q.onnx"},
            "export": {"output": "m.onnx"}, "profile": {}}


@pytest.mark.parametrize("command,field,value", [(c, f, v) for c, cases in BAD.items() for f, v in cases])
def test_the_api_and_recipes_refuse_what_the_command_refuses(command, field, value, tmp_path):
    model = COMMANDS[command]
    with pytest.raises(UsageError) as api:
        model.parse({**REQUIRED[command], field: value})
    assert flag_of(model, field) in api.value.line()

    recipe = {"name": "bad", "device": "rpi4b-4gb", "model": "edgetrain.nets:pretrained_digits",
              "data": "builtin:digits", "steps": [{command: {field: yaml.safe_load(value)}}]}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(recipe))
    res = run_edgetrain("recipes", "validate", str(path), cwd=tmp_path)
    assert_user_error(res, 2, f"steps[0].{command}.{field}")


@pytest.mark.parametrize("command,field,value", [("finetune", "memory_budget", "banana"), ("export", "opset", "7"),
                                                 ("quantize", "max_drop", "-1")])
def test_the_command_line_refuses_with_the_flag_named(command, field, value, tmp_path):
    argv = [command, "edgetrain.nets:digits_cnn", flag_of(COMMANDS[command], field), value]
    for k, v in REQUIRED[command].items():
        argv += [flag_of(COMMANDS[command], k), v]
    res = run_edgetrain(*argv, cwd=tmp_path)
    assert_user_error(res, 2, flag_of(COMMANDS[command], field))
    assert list(tmp_path.iterdir()) == []  # refused before any work


@pytest.mark.parametrize("value,mb", [(300, 300.0), ("300", 300.0), ("300MB", 300.0), ("1GiB", 1024.0),
                                      (512.5, 512.5)])
def test_a_bare_memory_size_is_megabytes_everywhere(value, mb):
    assert FinetuneOptions.parse({"data": "d", "out": "o", "memory_budget": value}).memory_budget == mb
    assert STEP_SCHEMAS["finetune"].model_validate({"memory_budget": value}).memory_budget == mb


def test_recipes_can_set_every_option_a_step_may_set():
    def settable(command):
        return set(STEP_SCHEMAS[command].model_fields)

    for command in ("finetune", "quantize", "export"):
        assert settable(command) >= {"input_shape"}
        assert not settable(command) & {"data", "out", "output", "calib", "val", "device", "resume"}  # the run's
    assert {"max_fp32_nodes", "per_channel", "backend"} <= settable("quantize")
    assert {"fp16", "opset"} <= settable("export")
    assert {"runtime", "timeout", "target"} <= settable("profile")


def test_the_device_default_thread_count_applies_from_python_as_from_the_cli():
    opts = FinetuneOptions.parse({"data": "d", "out": "o", "device": "rpi-zero2w"})
    assert opts.thread_cap() == opts.profile().default_threads
    assert FinetuneOptions.parse({"data": "d", "out": "o", "device": "rpi-zero2w", "threads": 1}).thread_cap() == 1
    assert opts.budget_mb() == opts.profile().memory_budget_mb


def test_the_reference_docs_are_generated_from_the_code():
    """docs/cli.md (every command's --help) and docs/formats.md (recipe and profile fields) are not stale:
    regenerate them with `python -m edgetrain.cli.reference docs/`."""
    from pathlib import Path

    from edgetrain.cli.reference import cli_reference, formats_reference

    docs = Path(__file__).resolve().parents[1] / "docs"
    assert (docs / "cli.md").read_text(encoding="utf-8") == cli_reference()
    assert (docs / "formats.md").read_text(encoding="utf-8") == formats_reference()


# The declaration reads values itself (no pydantic on the command path): every kind of field, from what the
# command line (text), the Python API (numbers, bools, paths) and a recipe (YAML scalars) give it.
READS = [
    ("epochs", "12", 12), ("epochs", 12, 12), ("epochs", 12.0, 12), ("epochs", " 7 ", 7),
    ("lr", "0.5", 0.5), ("lr", 1, 1.0), ("memory_budget", 300, 300.0), ("memory_budget", "1GiB", 1024.0),
    ("resume", "yes", True), ("resume", "off", False), ("resume", 1, True), ("resume", False, False),
    ("optimizer", "sgd", "sgd"), ("train_layers", " LAST:2 ", TrainLayers("last:2")),
    ("input_shape", "1,3,32,32", (3, 32, 32)),
    ("input_shape", [3, 32, 32], (3, 32, 32)), ("val", __import__("pathlib").Path("/x/val"), "/x/val"),
    ("val_split", "0.25", 0.25), ("seed", 2**32 - 1, 2**32 - 1), ("lr", None, None),
]
REFUSED = [
    ("epochs", "2.5", "valid integer"), ("epochs", True, "valid integer"), ("epochs", 0, "greater than or equal to 1"),
    ("lr", "fast", "valid number"), ("lr", float("inf"), "finite number"), ("lr", True, "valid number"),
    ("lr", 0, "greater than 0"), ("val_split", 1, "less than 1"), ("seed", 2**32, "less than or equal to"),
    ("resume", "maybe", "valid boolean"), ("resume", 2, "valid boolean"), ("optimizer", "SGD", "'sgd' or 'adam'"),
    ("data", 5, "valid string"), ("epochs", None, "a value"), ("memory_budget", True, "not a size"),
]


@pytest.mark.parametrize("field,value,expected", READS)
def test_the_declaration_reads_each_kind_of_value(field, value, expected):
    opts = FinetuneOptions.parse({"data": "d", "out": "o", field: value})
    assert getattr(opts, field) == expected and type(getattr(opts, field)) is type(expected)


@pytest.mark.parametrize("field,value,fragment", REFUSED)
def test_the_declaration_refuses_with_the_flag_and_the_reason(field, value, fragment):
    with pytest.raises(UsageError) as err:
        FinetuneOptions.parse({"data": "d", "out": "o", field: value})
    assert flag_of(FinetuneOptions, field) in err.value.line() and fragment in err.value.line()


def test_options_are_complete_read_only_and_know_their_fields():
    with pytest.raises(UsageError, match="missing option --out"):
        FinetuneOptions.parse({"data": "d"})
    with pytest.raises(UsageError, match="unknown option 'epoch'.*known options: .*epochs"):
        FinetuneOptions.parse({"data": "d", "out": "o", "epoch": 3})
    opts = FinetuneOptions(data="d", out="o")
    assert opts.epochs == FinetuneOptions.fields["epochs"].default == 10 and opts.memory_budget is None
    with pytest.raises(AttributeError):
        opts.epochs = 3
    assert opts == FinetuneOptions.parse({"data": "d", "out": "o", "epochs": "10"}) != FinetuneOptions(data="d", out="p")
    # edgetrain's own internal values skip the reading (the fleet evaluates with epochs=0), defaults filled in
    inner = FinetuneOptions.unchecked(data="d", out="o", epochs=0)
    assert inner.epochs == 0 and inner.batch_size == 32
    with pytest.raises(TypeError, match="epoch"):
        FinetuneOptions.unchecked(data="d", out="o", epoch=0)


def test_the_command_path_never_imports_pydantic():
    """The options are read without pydantic (its import and first validation cost ~50 ms and ~20 MB per
    command); pydantic is loaded only where YAML is read (recipes, device profiles)."""
    import subprocess
    import sys

    code = ("import sys, edgetrain.cli.finetune, edgetrain.ops.finetune\n"
            "from edgetrain.options import FinetuneOptions\n"
            "FinetuneOptions.parse({'data': 'd', 'out': 'o', 'memory_budget': '200MB', 'train_layers': 'last:2'})\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] == 'pydantic'))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


@pytest.mark.parametrize("recipe", ["quickstart", "quickstart-device", "pi5", "pi-zero2w", "jetson-nano-cpu"])
def test_a_recipe_step_runs_with_the_options_its_logged_command_line_gives(recipe, tmp_path):
    """Each step is recorded and logged as `edgetrain VERB MODEL --flag value ...`: click and the declaration
    read that command line back to exactly the typed options the step ran with, and so does the step's own
    process from the JSON it is handed (the run's thread cap and device included)."""
    import json

    from edgetrain.cli.options import parse
    from edgetrain.ops.run import step_options
    from edgetrain.recipes import STEPS, Artifacts, read_recipe

    art = Artifacts("edgetrain.nets:pretrained_digits", "train.npz", "val.npz", "model.onnx", "model_int8.onnx")
    steps = [s for s in read_recipe(recipe).recipe.steps if s.name in STEPS]
    assert steps
    for step in steps:
        model, opts = step_options(step, art, tmp_path, "rpi4b-4gb", 2, resume=False)
        params = dict(_command(step.name).make_context(step.name, [model, *opts.flags()]).params)
        assert params.pop("model") == model and params.pop("json_path") is None
        assert parse(COMMANDS[step.name], params) == opts, step.name
        assert COMMANDS[step.name].parse(json.loads(json.dumps(opts.given()))) == opts, step.name
        assert opts.device == "rpi4b-4gb" and (opts.threads in (2, [2]) or step.name == "profile")


@pytest.mark.parametrize("recipe", ["quickstart", "pi5"])
def test_the_runs_country_reaches_the_steps_that_price_energy_and_round_trips_their_command_line(recipe, tmp_path):
    """`edgetrain run --country DE`: the finetune, export and profile steps get it (their logged command line
    carries --country DEU); quantize, which reports no energy, does not."""
    from edgetrain.cli.options import parse
    from edgetrain.ops.run import step_options
    from edgetrain.recipes import STEPS, Artifacts, read_recipe

    art = Artifacts("edgetrain.nets:pretrained_digits", "train.npz", "val.npz", "model.onnx", "model_int8.onnx")
    steps = [s for s in read_recipe(recipe).recipe.steps if s.name in STEPS]
    priced = set()
    for step in steps:
        model, opts = step_options(step, art, tmp_path, "rpi4b-4gb", 2, resume=False,
                                   carbon={"country": "DE", "grid_intensity": None})
        if "country" in COMMANDS[step.name].fields:
            assert opts.country == "DEU" and "--country" in opts.flags(), step.name
            params = dict(_command(step.name).make_context(step.name, [model, *opts.flags()]).params)
            params.pop("model"), params.pop("json_path")
            assert parse(COMMANDS[step.name], params) == opts
            priced.add(step.name)
        else:
            assert not hasattr(opts, "country"), step.name
    assert priced & {"finetune", "profile", "export"}
