"""The `edgetrain` command line: parse options, call the API, render the result.

This package is the only place that imports click (``group``: the verbs; each verb's module). ``main``,
the console script, applies ``--threads`` before numpy can load; it does not import click for
`edgetrain predict`, whose start-up must stay within 10% of a bare ONNX Runtime loop's CPU time (click
costs 6-13% of a short run: README.md, "predict's start-up"): ``predict_fast`` reads that command line
with the one declaration and runs it. Whatever it does not take exactly as click would (--help, a bad
value, an unknown flag) goes to click, which answers as always.
"""
from __future__ import annotations

import os
import sys


def main(argv=None, light_predict: bool = True):
    """The console script. ``light_predict=False``: `predict` through click too (tools/bench_predict.py
    measures what the light path saves)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None and _address_space_limited():  # the console script under ulimit -v: a crash gets its line
        from ..child import watch_under_memory_limit

        watch_under_memory_limit(args)
    _early_thread_cap(args)
    _printable_streams()
    from .common import run_cli, run_guarded

    if light_predict and args[:1] == ["predict"]:
        from . import predict_fast

        parsed = predict_fast.parse(args[1:])
        if parsed is not None:
            run_guarded(lambda: predict_fast.run(*parsed))
            return
    from .group import cli

    run_cli(cli, args)


def _address_space_limited() -> bool:
    import resource  # cheap, unlike the child launcher: predict's start-up stays light

    return resource.getrlimit(resource.RLIMIT_AS)[0] != resource.RLIM_INFINITY


def _printable_streams() -> None:
    """Whatever the locale (LC_ALL=C, an ASCII or a strict UTF-8 one), stdout and stderr print every name:
    a file name's undecodable bytes (held as surrogates) go out as they came in, as `ls` prints them, and a
    character the locale cannot encode becomes a backslash escape -- never a UnicodeEncodeError."""
    import codecs

    def names(exc):
        if not isinstance(exc, UnicodeEncodeError):
            raise exc
        bad = exc.object[exc.start:exc.end]
        if all("\udc80" <= c <= "\udcff" for c in bad):
            return bytes(ord(c) - 0xDC00 for c in bad), exc.end
        return codecs.backslashreplace_errors(exc)

    try:
        codecs.lookup_error("edgetrain-names")
    except LookupError:
        codecs.register_error("edgetrain-names", names)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors="edgetrain-names")
        except (AttributeError, ValueError, OSError):  # not a TextIOWrapper (a test's capture), or closed
            pass


def _early_thread_cap(args: list[str]) -> None:
    value = None  # the last --threads wins, as in click
    for i, arg in enumerate(args):
        if arg == "--threads" and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith("--threads="):
            value = arg.split("=", 1)[1]
    cap_threads_early(value)


def cap_threads_early(value: str | None) -> None:
    """``--threads N`` (one whole number, within the usable cores) into the environment before anything
    loads numpy: numpy's OpenBLAS sizes its pool from OPENBLAS_NUM_THREADS when it loads (before click
    parses the command line), and an uncapped pool's workers spin ~0.1 s on every core at start-up, whatever
    cap runtime.cap_loaded_blas sets later. The declaration still reads and checks the flag, and
    runtime.apply_threads sets the same variables; a value it would refuse or cap changes nothing here."""
    from .. import runtime

    if value is not None and value.isdigit() and 1 <= int(value) <= runtime.usable_cores():
        os.environ.update(runtime.thread_env(int(value)))


def __getattr__(name: str):
    if name == "cli":  # the click group (tests and the reference-docs writer use it)
        from .group import cli

        return cli
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
