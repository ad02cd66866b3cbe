"""Errors that reach the user, kept apart from bugs.

An EdgetrainError is the user's to fix (or a budget the run did not meet); the CLI prints it as one
line ``Error: <what> (<where>); <how to fix>`` and exits with its ``exit_code``. Any other exception is
a bug and keeps its traceback.
"""
from __future__ import annotations

# An error line never embeds unbounded input (a path, a value, a parser's message quoting a whole file).
MAX_WHAT, MAX_WHERE, MAX_FIX = 400, 200, 300


def printable(text: str) -> str:
    """``text`` with a file name's undecodable bytes (surrogates) as ``\\xNN`` escapes: an error line prints
    in any locale and shows the byte the name holds."""
    if not any("\ud800" <= c <= "\udfff" for c in text):
        return text
    try:
        return text.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    except UnicodeEncodeError:  # a lone surrogate no file name holds (from JSON, say): its escape
        return text.encode("utf-8", "backslashreplace").decode("ascii")


def clip(text, limit: int = 200) -> str:
    """``text`` on one line and at most ``limit`` characters (the middle elided: both ends are telling)."""
    text = " ".join(printable(str(text)).split())
    if len(text) <= limit:
        return text
    keep = max(limit - 5, 2)
    return text[: keep - keep // 3] + " ... " + text[len(text) - keep // 3:]


class EdgetrainError(Exception):
    """Base class: a failure the user can act on. Exit code 1: the run failed."""

    exit_code = 1

    def __init__(self, what: str, where: str | None = None, fix: str | None = None):
        self.what = clip(what, MAX_WHAT)
        self.where = clip(where, MAX_WHERE) if where is not None else None
        self.fix = clip(fix, MAX_FIX) if fix is not None else None
        super().__init__(self.line())

    def line(self) -> str:
        text = self.what
        if self.where:
            text += f" ({self.where})"
        if self.fix:
            text += f"; {self.fix}"
        return text


class RunFailed(EdgetrainError):
    """The work itself failed (a child process crashed, a runtime refused the model). Exit 1."""

    exit_code = 1


class UsageError(EdgetrainError):
    """Bad usage, configuration or input: a missing file, a wrong value, a model that does not fit. Exit 2."""

    exit_code = 2


class BudgetExceeded(EdgetrainError):
    """The run finished but a budget or validation failed; artifacts and report are kept. Exit 3."""

    exit_code = 3
