"""`edgetrain inspect MODEL [--data DATA]`: check what a model and data reference resolve to."""
from __future__ import annotations

import click

from ..fileio import check_command_outputs
from ..ops.inspect import inspect as run
from ..options import InspectOptions
from .common import finish, json_option, say, setup
from .options import declared_options, parse


@click.command()
@click.argument("model")
@declared_options(InspectOptions)
@json_option
def inspect(model, json_path, **values):
    """Load MODEL (and DATA) exactly as the other commands would, and describe them."""
    opts = parse(InspectOptions, values)
    check_command_outputs(model, opts, json_path)  # no output overwrites an input, before any work
    setup(opts)

    finish(json_path, run(model, opts.data, params=opts.params, input_shape=opts.input_shape,
                               mean=opts.mean, std=opts.std), _render)


def _render(json_path, res) -> None:
    say(json_path, f"model      {res.model} ({res.kind})")
    say(json_path, f"input      {res.input_name} {'x'.join(map(str, res.input_shape))}  "
                   f"mean {list(res.preprocess.mean)} std {list(res.preprocess.std)}")
    say(json_path, f"outputs    {res.num_classes} classes, {res.parameters:,} parameters"
                   + ("  (random weights)" if res.random_weights else ""))
    for note in res.notes:
        say(json_path, f"note       {note}")
    if res.data:
        d = res.data
        say(json_path, f"data       {d.source}: {d.samples} samples, {len(d.classes)} classes"
                       + (f", {d.skipped_files} non-image files skipped" if d.skipped_files else ""))
        for note in d.notes:
            say(json_path, f"note       {note}")
