"""The `edgetrain` command line: parse options, call the API, render the result.

This package is the only place that imports click (``group``: the verbs; each verb's module). ``main``,
the console script, does not import it for `edgetrain predict`: that command starts on a Pi Zero as
small and as fast as a bare ONNX Runtime loop (issue 16), so ``predict_fast`` reads its command line
from the flags the declaration generated and runs it. Whatever that light parser does not take exactly
as click would (--help, a bad value, an unknown flag, --device) goes to click, which answers as always.
"""
from __future__ import annotations

import sys


def main(argv=None):
    from .common import run_cli, run_guarded

    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["predict"]:
        from . import predict_fast

        parsed = predict_fast.parse(args[1:])
        if parsed is not None:
            run_guarded(lambda: predict_fast.run(*parsed))
            return
    from .group import cli

    run_cli(cli, args)


def __getattr__(name: str):
    if name == "cli":  # the click group (tests and the reference-docs writer use it)
        from .group import cli

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
