"""What every command shares: --device/--threads/--json, error rendering, JSON output."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from .. import runtime
from ..errors import BudgetExceeded, EdgetrainError
from ..fileio import atomic_write_text


def run_cli(group: click.Group, argv=None) -> None:
    """Run the click group; a user's error becomes one line on stderr and its exit code."""
    try:
        rc = group.main(args=argv, prog_name="edgetrain", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("Aborted.", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except EdgetrainError as exc:
        if os.environ.get("EDGETRAIN_DEBUG") == "1":
            raise
        click.echo(f"Error: {exc.line()}", err=True)
        sys.exit(exc.exit_code)
    sys.exit(rc if isinstance(rc, int) else 0)


def json_option(f):
    return click.option("--json", "json_path", metavar="PATH",
                        help="Write the result as JSON to PATH ('-' for stdout).")(f)


def setup(opts) -> int | None:
    """Apply the thread cap the options ask for (--threads, else the device's), before any heavy import."""
    runtime.quiet_libraries()
    return runtime.apply_threads(opts.thread_cap() if opts is not None else None)


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
    return json_path == "-"


def say(json_path: str | None, message: str = "", **kw) -> None:
    """Human output: to stdout, or to stderr when stdout carries the JSON."""
    click.echo(message, err=quiet(json_path), **kw)


def write_json(json_path: str | None, result) -> None:
    """Write ``result`` (a dict or an object with ``to_dict``) as JSON; atomically when to a file."""
    if not json_path:
        return
    data = result.to_dict() if hasattr(result, "to_dict") else result
    text = json.dumps(data, indent=2, sort_keys=False, default=_default) + "\n"
    if json_path == "-":
        sys.stdout.write(text)
        sys.stdout.flush()
        return

    atomic_write_text(Path(json_path), text, what="--json")


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
