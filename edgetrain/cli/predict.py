"""`edgetrain predict MODEL DATA` as a click command: its --help, its errors, and what the light parser hands over.

The options are ``options.PredictOptions``, as for every command. A command line ``predict_fast.parse``
reads (the same declaration, without click) never gets here: it runs without click, which costs 6-13% of
a short run (README.md, "predict's start-up"). Both end in ``predict_fast.run``.
"""
from __future__ import annotations

import click

from ..options import PredictOptions
from .common import json_option
from .options import declared_options, parse
from .predict_fast import run


@click.command()
@click.argument("model")
@click.argument("data")
@declared_options(PredictOptions)
@json_option
def predict(model, data, json_path, **values):
    """Classify DATA with MODEL, an .onnx written by `edgetrain export` or `edgetrain quantize` (fp32 or
    int8), applying the preprocessing recorded in it. DATA is an image folder (one sub-folder per class:
    labelled; images directly in it: unlabelled), an image file, an .npz, builtin:digits, or '-' to read
    image paths from standard input, one per line.

    Prints each input's top-k labels and scores (--format table, csv, jsonl or json; by default what -o's
    name says), then the throughput and latency; with labels, the top-1 and top-k accuracy and a confusion
    summary. Only ONNX Runtime, NumPy and Pillow are loaded (never mxnet).
    """
    run(model, data, json_path, parse(PredictOptions, values))
