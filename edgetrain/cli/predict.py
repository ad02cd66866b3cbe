"""`edgetrain predict MODEL DATA` as a click command: its --help and its errors.

A command line the light parser (``predict_fast``) reads exactly as click would never gets here: it runs
without click (issue 16: start-up within 10% of a bare ONNX Runtime loop). The flags are
declared once, by ``options.PredictOptions``; both parsers take them from ``predict_flags.json``, derived
from that declaration by ``python -m edgetrain.cli.predict --write-flags`` and checked equal to it by a
test; click checks the values with the declaration's bounds. ``--device`` (a profile to read) takes the
full path (click, the declaration, pydantic for the profile's YAML).
"""
from __future__ import annotations

import json

import click

from .common import json_option
from .predict_fast import FLAGS, flag_specs_from_file, run


def flag_specs() -> list[dict]:
    """The click options PredictOptions declares, as plain data (for writing and checking the JSON)."""
    from ..options import PredictOptions
    from .options import ordered_fields

    specs = []
    for field in ordered_fields(PredictOptions):
        spec = {"name": field.name, "decls": [field.flag] + ([field.short] if field.short else []), "help": field.help,
                "metavar": field.metavar, "default": field.default, "type": "str"}
        if field.kind == "choice":
            spec.update(type="choice", choices=[str(c) for c in field.choices])
        elif field.kind == "int":
            spec["type"] = "int"
            for bound, key in (("ge", "min"), ("le", "max")):
                if bound in field.bounds:
                    spec[key] = field.bounds[bound]
        if spec["type"] == "str" and not spec["metavar"]:
            spec["metavar"] = "TEXT"
        if spec["type"] == "int" and not spec["metavar"]:
            spec["metavar"] = "N"
        specs.append(spec)
    return specs


def _flag_options(f):
    specs = flag_specs_from_file() if FLAGS.is_file() else flag_specs()
    for spec in reversed(specs):
        kw = {"help": spec["help"], "metavar": spec["metavar"], "default": spec["default"],
              "show_default": spec["default"] is not None}
        if spec["type"] == "choice":
            kw["type"] = click.Choice(spec["choices"])
            kw.pop("metavar")
        elif spec["type"] == "int":
            kw["type"] = click.IntRange(spec.get("min"), spec.get("max"))
        f = click.option(*spec["decls"], spec["name"], **kw)(f)
    return f


@click.command()
@click.argument("model")
@click.argument("data")
@_flag_options
@json_option
def predict(model, data, json_path, **values):
    """Classify DATA with MODEL, an .onnx written by `edgetrain export` or `edgetrain quantize` (fp32 or
    int8), applying the preprocessing recorded in it. DATA is an image folder (one sub-folder per class:
    labelled; images directly in it: unlabelled), an image file, an .npz, builtin:digits, or '-' to read
    image paths from standard input, one per line.

    Prints each input's top-k labels and scores (--format table, csv or jsonl), then the throughput and
    latency; with labels, the top-1 and top-k accuracy and a confusion summary. Only ONNX Runtime, NumPy
    and Pillow are loaded (never mxnet).
    """
    run(model, data, json_path, values)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--write-flags"]:
        FLAGS.write_text(json.dumps(flag_specs(), indent=1) + "\n", encoding="utf-8")
