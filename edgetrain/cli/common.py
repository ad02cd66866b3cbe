"""What every command shares: --device/--threads/--json, error rendering, JSON output.

Nothing here imports click at module level: `edgetrain predict`'s light start (``predict_fast``) uses
this module without click; ``run_cli`` and ``json_option`` import it when they run.
"""
from __future__ import annotations

import errno
import json
import sys
from pathlib import Path

from .. import envvars, runtime
from ..errors import BudgetExceeded, EdgetrainError
from ..stopsignals import unwind_stop_signals
from .streams import stream_error, write_stream

JSON_FLAG, JSON_DEST = "--json", "json_path"   # every command's --json PATH (the light parser reads it too)

# The exit code when the reader of stdout (or stderr) went away (`edgetrain ... | head -1`), said nowhere
# (no one is left to read it): 1, the run failed to deliver its output. Not 141 (a SIGPIPE death): click
# already ends a command that meets EPIPE with 1, and every command must answer alike.
CLOSED_PIPE_EXIT = 1


def run_cli(group, argv=None) -> None:
    """Run the click group; a user's error becomes one line on stderr and its exit code."""
    import click

    def call():
        try:
            return group.main(args=argv, prog_name="edgetrain", standalone_mode=False)
        except click.exceptions.Abort:
            echo("Aborted.", err=True)
            sys.exit(130)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        except OSError as exc:  # click's own output (--help, --version, click.echo): as write_stream says it
            if isinstance(exc, BrokenPipeError) or not _raised_in_click_echo(exc):
                raise
            stream = sys.stderr if _failed_stream_is_stderr(exc) else sys.stdout
            raise stream_error(exc, stream) from None

    run_guarded(call)


def _raised_in_click_echo(exc: BaseException) -> bool:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    return bool(frames) and frames[-1].name == "echo" and frames[-1].filename.endswith(("click/utils.py",
                                                                                         "click\\utils.py"))


def _failed_stream_is_stderr(exc: BaseException) -> bool:
    tb = exc.__traceback__
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_locals.get("file") is sys.stderr


def run_guarded(call) -> None:
    """Run a command's ``call()`` and exit: a user's error is one line on stderr and its exit code; an
    interrupt is "Aborted." and 130 (as click does it), a SIGTERM or SIGHUP unwinds the same way and exits
    128 + signal (stopsignals: no temp file left beside an output); a returned int is the exit code. A reader
    of stdout or stderr that went away ends it quietly with CLOSED_PIPE_EXIT (there is no one left to tell)."""
    try:
        with unwind_stop_signals():
            _run_and_exit(call)
    except BrokenPipeError:
        if not _reader_gone():
            raise  # a pipe of our own (a child's, a socket): a bug, with its traceback
        _quiet_streams()
        sys.exit(CLOSED_PIPE_EXIT)


def _run_and_exit(call) -> None:
    try:
        rc = call()
    except (KeyboardInterrupt, EOFError):  # click turns these into Abort; the light path sees them raw
        echo(err=True)
        echo("Aborted.", err=True)
        sys.exit(130)
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:
            raise
        # Any path from the command line, or made from one (OUTDIR/..., a temp name beside -o), that the
        # system cannot open: the user's to shorten, wherever it was first opened.
        from ..fileio import path_too_long

        _exit_with(path_too_long(exc.filename or "?", f"a path is too long for the system ({exc.strerror})"))
    except EdgetrainError as exc:
        _exit_with(exc)
    sys.exit(rc if isinstance(rc, int) else 0)


def _exit_with(exc: EdgetrainError) -> None:
    if envvars.get("EDGETRAIN_DEBUG") == "1":
        raise exc
    try:
        echo(f"Error: {exc.line()}", err=True)
    except EdgetrainError:  # stderr itself cannot take it (2>/dev/full): the exit code still says it
        pass
    sys.exit(exc.exit_code)


def _reader_gone() -> bool:
    """Whether the reading end of our stdout or stderr is closed (a pipe whose reader exited: poll says
    POLLERR on its writing end)."""
    import select

    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            poller = select.poll()
            poller.register(stream.fileno(), select.POLLOUT)
            if any(ev & select.POLLERR for _, ev in poller.poll(0)):
                return True
        except (OSError, ValueError, AttributeError):
            continue
    return False


def _quiet_streams() -> None:
    """Point stdout and stderr at /dev/null, so that nothing buffered for the gone reader (flushed at exit)
    prints "Exception ignored ... BrokenPipeError". Whatever was being written has been abandoned by the
    exception (each output file's temp removed as it unwound); only the gone reader misses the rest."""
    import os

    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.__stdout__, sys.__stderr__):
        try:
            os.dup2(devnull, stream.fileno())
        except (OSError, ValueError, AttributeError):
            pass
    os.close(devnull)


def json_option(f):
    import click

    return click.option(JSON_FLAG, JSON_DEST, metavar="PATH",
                        help="Write the result as JSON to PATH ('-' for stdout).")(f)


def echo(message: str = "", err: bool = False, nl: bool = True) -> None:
    """One line to stdout (or stderr), flushed: what click.echo does for plain text, without click."""
    stream = sys.stderr if err else sys.stdout
    if stream is not None:
        write_stream(stream, message + "\n" if nl else message)


def setup(opts) -> int | None:
    """Apply the thread cap the options ask for (--threads, else the device's), before any heavy import."""
    runtime.quiet_libraries()
    return runtime.apply_threads(opts.thread_cap() if opts is not None else None)


def command(work, render):
    """A command's ``call(MODEL, options, json_path)``: its work with its options read, for the click command
    and for a recipe step (edgetrain.cli.step). No output may overwrite an input (checked before any work),
    the thread cap is applied, ``work`` runs with a progress line, and its result is written and rendered."""
    def call(model: str, opts, json_path: str | None) -> None:
        from ..fileio import check_command_outputs
        from .render import ProgressLine

        check_command_outputs(model, opts, json_path)
        setup(opts)
        finish(json_path, work(model, opts, progress=ProgressLine(not quiet(json_path))), render)
    return call


def finish(json_path: str | None, result, render) -> None:
    """Write the result as JSON, render it for a human, and turn a failed check into exit 3 (one place)."""
    write_json(json_path, result)
    if not quiet(json_path):
        render(json_path, result)
    if not result.passed:
        raise BudgetExceeded("; ".join(result.failed_checks), _where(result),
                             "the outputs and report are kept; see them for the details")


def quiet(json_path: str | None) -> bool:
    """Human output and progress stay off stdout when JSON goes there."""
    return json_path == "-" or names_stdout(json_path)


def names_stdout(path: str | None) -> bool:
    """Whether ``path`` is another name for this process's standard output (``/dev/stdout``, ``/dev/fd/1``,
    ``/proc/self/fd/1``, a symlink to one, or the file stdout is redirected to): ``--json`` there is ``-``."""
    import os

    if not path or path == "-":
        return False
    try:
        named, out = os.stat(path), os.fstat(sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # no such file; stdout closed or not a real descriptor
        return False
    return (named.st_dev, named.st_ino) == (out.st_dev, out.st_ino)


def say(json_path: str | None, message: str = "", **kw) -> None:
    """Human output: to stdout, or to stderr when stdout carries the JSON."""
    echo(message, err=quiet(json_path), **kw)


def write_json(json_path: str | None, result) -> None:
    """Write ``result`` (a dict or an object with ``to_dict``) as JSON; atomically when to a file."""
    if not json_path:
        return
    data = result.to_dict() if hasattr(result, "to_dict") else result
    text = json.dumps(data, indent=2, sort_keys=False, default=_default) + "\n"
    if json_path == "-" or names_stdout(json_path):  # written through stdout's own descriptor, never replaced
        write_stream(sys.stdout, text)
        return

    from ..fileio import atomic_write_text

    atomic_write_text(Path(json_path), text, what=JSON_FLAG)


def _default(obj):
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def _where(result) -> str:
    for name in ("output", "path", "outdir", "rundir"):
        if getattr(result, name, None):
            return str(getattr(result, name))
    return "result"
