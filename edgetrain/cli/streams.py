"""Writing to the standard streams: a stream that cannot take what is written is one user error naming
where it goes, never a traceback (shared by every command's output and the progress line)."""
from __future__ import annotations

import sys

from ..errors import UsageError


def write_stream(stream, text: str) -> None:
    """Write and flush ``text`` to a standard stream. A stream that cannot take it (``> /dev/full``, a full
    disk or ``ulimit -f`` under a redirect) is one UsageError naming it (the user chose where it goes: exit
    2); the stream then points at /dev/null, so that what it still buffers cannot fail again at exit. A gone
    reader (BrokenPipeError) is run_guarded's to end quietly."""
    try:
        stream.write(text)
        stream.flush()
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise stream_error(exc, stream) from None


def stream_error(exc: OSError, stream) -> UsageError:
    name = "stderr" if stream is sys.stderr else "stdout"
    where = _stream_target(stream, name)
    _to_devnull(stream)
    return UsageError(f"cannot write to {name} ({exc.strerror or exc})", where,
                      "send it somewhere with room (or use --json PATH / -o PATH)")


def _stream_target(stream, name: str) -> str:
    import os

    try:
        return f"{name} is {os.readlink(f'/proc/self/fd/{stream.fileno()}')}"
    except (OSError, ValueError, AttributeError):
        return name


def _to_devnull(stream) -> None:
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass
