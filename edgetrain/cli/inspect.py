"""`edgetrain inspect MODEL [--data DATA]`: check what a model and data reference resolve to."""
from __future__ import annotations

import click

from .common import json_option, say, setup, threads_option, write_json
from .options import input_shape_option, params_option


@click.command()
@click.argument("model")
@click.option("--data", "data_ref", metavar="DATA", help="Also read this data as the model would see it.")
@params_option
@input_shape_option
@threads_option
@json_option
def inspect(model, data_ref, params, input_shape, threads, json_path):
    """Load MODEL (and DATA) exactly as the other commands would, and describe them."""
    setup(None, threads)
    from ..inspect import inspect as run

    res = run(model, data_ref, params=params, input_shape=input_shape)
    write_json(json_path, res)
    if json_path == "-":
        return
    say(json_path, f"model      {res.model} ({res.kind})")
    say(json_path, f"input      {res.input_name} {'x'.join(map(str, res.input_shape))}  "
                   f"mean {res.preprocess['mean']} std {res.preprocess['std']}")
    say(json_path, f"outputs    {res.num_classes} classes, {res.parameters:,} parameters"
                   + ("  (random weights)" if res.random_weights else ""))
    for note in res.notes:
        say(json_path, f"note       {note}")
    if res.data:
        d = res.data
        say(json_path, f"data       {d['source']}: {d['samples']} samples, {len(d['classes'])} classes"
                       + (f", {d['skipped_files']} non-image files skipped" if d["skipped_files"] else ""))
        for note in d["notes"]:
            say(json_path, f"note       {note}")
