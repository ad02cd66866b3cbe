"""The one fresh-process launcher: every child edgetrain starts (a profile measurement, a recipe step,
a runtime baseline) goes through ``start``/``run`` here.

What each child gets, in one place:
- the thread caps in its environment before anything loads (``runtime.thread_env``), edgetrain on its
  PYTHONPATH (and ``-P``: never a folder named edgetrain in the working directory), no EDGETRAIN_DEBUG;
- its own process group, so a timeout or a stop kills it *and* anything it started;
- ``PR_SET_PDEATHSIG`` = SIGKILL (Linux), so it dies with us even when we are SIGKILLed and cannot clean
  up; a Ctrl-C or SIGTERM to us kills its group before we exit;
- a timeout that always ends, and a failure described by its signal name and the last line of stderr.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from . import envvars, runtime
from .errors import RunFailed
from .stopsignals import unwind_stop_signals

PR_SET_PDEATHSIG = 1


def _pdeathsig() -> None:  # runs in the child between fork and exec
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the process group still bounds the child
        pass


def make_preexec(parent: int, extra: Callable[[], None] | None):
    def preexec():
        _pdeathsig()
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(137)
        if extra is not None:
            extra()
    return preexec


def child_env(threads: int | None = None, extra: dict | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "EDGETRAIN_DEBUG"}
    if threads is not None:
        env.update(runtime.thread_env(threads))
    here = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = here + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.update(extra or {})
    return env


# Python 3.10 (JetPack 6) has no -P: these drop the working directory from sys.path themselves.
_RUN_MODULE_310 = "import runpy, sys; del sys.path[0]; runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"


def python_argv(module: str, *args: str) -> list[str]:
    """``python -P -m MODULE ARGS``: edgetrain is imported from where this process imported it."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-m", module, *map(str, args)]
    return [sys.executable, "-c", _RUN_MODULE_310, module, *map(str, args)]


def python_c(code: str, *args: str) -> list[str]:
    """``python -P -c CODE ARGS`` (on Python 3.10, without -P, the same sys.path)."""
    if sys.version_info >= (3, 11):
        return [sys.executable, "-P", "-c", code, *map(str, args)]
    return [sys.executable, "-c", "import sys; del sys.path[0]\n" + code, *map(str, args)]


def start(argv: list[str], *, threads: int | None = None, env: dict | None = None, merge_stderr: bool = False,
          preexec: Callable[[], None] | None = None, cwd: str | None = None) -> subprocess.Popen:
    """Start a child in its own process group that dies with this process."""
    return subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE, text=True,
                            env=child_env(threads, env), start_new_session=True, cwd=cwd or os.getcwd(),
                            preexec_fn=make_preexec(os.getpid(), preexec), bufsize=1 if merge_stderr else -1)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL the child's whole process group and reap it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
    with contextlib.suppress(Exception):
        proc.communicate(timeout=30)


@dataclass
class Finished:
    code: int
    out: str
    err: str


def run(argv: list[str], *, what: str, timeout: float | None = None, threads: int | None = None,
        env: dict | None = None, on_line: Callable[[str], None] | None = None,
        preexec: Callable[[], None] | None = None, timeout_fix: str = "raise --timeout if it is just slow",
        where: str = "child process") -> Finished:
    """Run a child to its end: output captured (or, with ``on_line``, stdout+stderr merged and handed
    over line by line). A timeout kills its group and is RunFailed; any exception or stop signal
    here kills its group before propagating."""
    with unwind_stop_signals():
        proc = start(argv, threads=threads, env=env, merge_stderr=on_line is not None, preexec=preexec)
        try:
            if on_line is not None:
                timer = threading.Timer(timeout, kill_group, (proc,)) if timeout else None
                if timer:
                    timer.daemon = True
                    timer.start()
                lines = []
                for line in proc.stdout:
                    lines.append(line)
                    on_line(line)
                code = proc.wait()
                if timer:
                    fired = not timer.is_alive() and code == -signal.SIGKILL
                    timer.cancel()
                    if fired:
                        raise RunFailed(f"{what} did not finish within {timeout:g} s and was stopped", where,
                                        timeout_fix)
                return Finished(code, "".join(lines), "")
            try:
                out, err = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_group(proc)
                raise RunFailed(f"{what} did not finish within {timeout:g} s and was stopped", where,
                                timeout_fix) from None
            return Finished(proc.returncode, out, err)
        except BaseException:
            if proc.poll() is None:
                kill_group(proc)
            raise


def death(code: int) -> str:
    """'crashed with SIGSEGV (under the address-space limit ...)' / 'failed with exit code 2'."""
    if code < 0:
        name = _signal_name(-code)
        return f"crashed with {name}{_likely_cause(name)}"
    return f"failed with exit code {code}"


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# What a native library does when memory runs out under an address-space limit: a failed mmap read as a
# null pointer (SIGSEGV/SIGBUS), an abort from a C++ allocation or unwinder (SIGABRT).
_MEMORY_SIGNALS = ("SIGSEGV", "SIGBUS", "SIGABRT")


def _likely_cause(name: str) -> str:
    limit = address_space_limit_mb()
    if name in _MEMORY_SIGNALS and limit is not None:
        return (f" -- most likely out of memory under the address-space limit of {limit:,.0f} MB (ulimit -v); "
                "raise or remove the limit")
    if name == "SIGKILL":
        return " (killed: out of memory?)"
    return ""


def watch_under_memory_limit(args: list[str]) -> None:
    """Under an address-space limit (``ulimit -v``) a native library (mxnet above all, which export and
    quantize run in this process) dies of SIGSEGV/SIGABRT when an allocation fails, and the command would end
    with no word. So there the command runs in a child with the same streams, and this process, which
    allocates nothing more, says in one line what killed it (exit 1). Returns at once without a limit, or in
    the child itself; otherwise exits with the child's code."""
    if address_space_limit_mb() is None or envvars.get("EDGETRAIN_WATCHED") == "1":
        return
    proc = subprocess.Popen([sys.executable, "-m", "edgetrain", *args], env={**os.environ, "EDGETRAIN_WATCHED": "1"},
                            preexec_fn=make_preexec(os.getpid(), None))

    def forward(signum, _frame):
        if proc.poll() is None:
            proc.send_signal(signum)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, forward)
    code = proc.wait()
    if code < 0 and _signal_name(-code) in _MEMORY_SIGNALS:
        command = "edgetrain " + (args[0] if args else "")
        sys.stderr.write(f"Error: {command} {death(code)}\n")
        sys.exit(1)
    sys.exit(128 - code if code < 0 else code)


def address_space_limit_mb() -> float | None:
    """This process's (and so its children's) RLIMIT_AS soft limit in MB, or None when unlimited."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_AS)[0]
    return None if soft == resource.RLIM_INFINITY else soft / 2**20


def last_line(err: str) -> str:
    """': <the last non-empty line of stderr, clipped>' or ''."""
    lines = [ln.strip() for ln in (err or "").splitlines() if ln.strip()]
    return f": {lines[-1][:300]}" if lines else ""
