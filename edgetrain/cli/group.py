"""The `edgetrain` click group: each verb lives in its own module under edgetrain.cli and is loaded only
when used; API modules are imported inside the commands so that ``--help`` stays fast.
"""
from __future__ import annotations

import click

COMMANDS = {
    # name: module under edgetrain.cli holding a click command of the same name
    "devices": "devices",
    "doctor": "doctor",
    "energy": "energy",
    "export": "export",
    "finetune": "finetune",
    "fleet": "fleet",
    "inspect": "inspect",
    "predict": "predict",
    "profile": "profile",
    "quantize": "quantize",
    "recipes": "recipes",
    "run": "run",
    "tune": "tune",
}


class LazyGroup(click.Group):
    """Loads a verb's module only when that verb is used (or listed by --help)."""

    def list_commands(self, ctx):
        return sorted(COMMANDS)

    def get_command(self, ctx, name):
        module = COMMANDS.get(name)
        if module is None:
            return None
        import importlib

        mod = importlib.import_module(f".{module}", __package__)
        return getattr(mod, name.replace("-", "_"))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="edgetrain")
def cli():
    """Take MXNet Gluon models to low-power devices: quantize to int8, fine-tune on the device,
    export to ONNX, and profile latency, memory and energy.

    MODEL is PREFIX (PREFIX-symbol.json + PREFIX-NNNN.params), zoo:NAME, pkg.module:function, or a
    .onnx file where a command takes one. DATA is an image folder (one sub-folder per class), an .npz
    with `data` and `label`, or builtin:digits.

    Exit codes: 0 done, 1 the run failed, 2 bad usage/config/input, 3 a budget or validation failed
    (artifacts and report kept).
    """
