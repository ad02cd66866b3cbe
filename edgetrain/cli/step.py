"""One recipe step in its own process (``python -m edgetrain.cli.step RUNDIR/steps/VERB.options.json``, from
edgetrain.ops.run): its command's work (``edgetrain.cli.VERB.call``) on the typed options written there, with
the command's output, one-line errors and exit code."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

from . import cap_threads_early


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    threads = spec["options"].get("threads")  # as `edgetrain VERB --threads N` caps it (a sweep of one too)
    threads = threads[0] if isinstance(threads, list) and len(threads) == 1 else threads
    cap_threads_early(str(threads) if isinstance(threads, int) else None)
    from ..options import COMMANDS
    from .common import run_guarded

    command = importlib.import_module(f"{__package__}.{spec['command']}")
    run_guarded(lambda: command.call(spec["model"], COMMANDS[spec["command"]].parse(spec["options"]), spec["json"]))


if __name__ == "__main__":
    main(*sys.argv[1:])
