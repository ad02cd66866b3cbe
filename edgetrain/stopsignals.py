"""SIGTERM and SIGHUP unwind the way Ctrl-C does: the handler raises, every ``finally`` runs (a temp file
beside an output is removed, a child's process group is killed), and the process exits 128 + the signal,
saying which one stopped it. The command line holds this for a whole command (``cli.common.run_guarded``),
the child launcher for the time a child runs (``child.run``: also for the API's callers). A handler some
code installs for itself (finetune's checkpoint on SIGTERM, the fleet's) is left alone, and is what runs
while it is installed. Light: `edgetrain predict` starts through here."""
from __future__ import annotations

import contextlib
import signal
import sys

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


class Terminated(BaseException):
    """SIGTERM/SIGHUP arrived: unwind, then exit 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


def _raise(signum, _frame):
    raise Terminated(signum)


@contextlib.contextmanager
def unwind_stop_signals():
    """While inside, SIGTERM/SIGHUP raise Terminated (where they have no handler yet), and a Terminated that
    reaches here exits 128 + signal. Only the main thread can install handlers: elsewhere nothing changes."""
    old = {}
    for sig in STOP_SIGNALS:
        if signal.getsignal(sig) in (signal.SIG_DFL, None):
            try:
                old[sig] = signal.signal(sig, _raise)
            except ValueError:  # not the main thread
                break
    try:
        yield
    except Terminated as exc:
        with contextlib.suppress(OSError, ValueError):  # stderr may be gone or full: the exit code says it
            sys.stderr.write(f"edgetrain: stopped by {signal.Signals(exc.signum).name}\n")
            sys.stderr.flush()
        sys.exit(128 + exc.signum)
    finally:
        for sig, h in old.items():
            signal.signal(sig, h)
