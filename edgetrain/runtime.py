"""Thread caps and environment, applied before mxnet or onnxruntime is imported.

OpenMP, OpenBLAS and MXNet's engine read their thread variables once, when the library loads, so
``apply_threads`` must run before the first heavy import; after that it can only refuse.
ONNX Runtime takes its cap per session: ``_lazy.ort_session_options`` builds options that honour it.
"""
from __future__ import annotations

import ctypes
import os
import sys

from . import envvars

_threads: int | None = None


def thread_env(threads: int) -> dict[str, str]:
    """The environment variables that cap every pool to ``threads``."""
    n = str(threads)
    return {
        "OMP_NUM_THREADS": n,           # OpenMP: MXNet operators, OpenBLAS's OpenMP build
        "OPENBLAS_NUM_THREADS": n,
        "MKL_NUM_THREADS": n,
        "MXNET_OMP_MAX_THREADS": n,     # MXNet's own ceiling on the OpenMP pool
        "MXNET_CPU_WORKER_NTHREADS": "1",   # engine workers that run ops; each op uses the OMP pool
        "MXNET_CPU_PRIORITY_NTHREADS": "1",
        "MXNET_MP_WORKER_NTHREADS": "1",
    }


# OpenBLAS picks its kernels from the CPU model when it loads. The one numpy 1.x bundles (0.3.20) does not
# know CPUs newer than itself (measured: a Xeon, family 6 model 207) and falls back to 'Prescott' (SSE3):
# float32 GEMM 4x slower (1280x320 @ 320x800: 21 ms against 5 ms with the AVX-512 kernels), which is the
# whole cost of training a tail in NumPy. The CPU's own flags name the kernels when the user has not.
BLAS_KERNELS = (("SKYLAKEX", {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"}),
                ("HASWELL", {"avx2", "fma"}))


def blas_kernels_for(cpuinfo_text: str) -> str | None:
    """The OpenBLAS kernel family an x86-64 CPU's /proc/cpuinfo flags allow (None: leave it to OpenBLAS)."""
    from .host import cpuinfo_fields

    flags = set(cpuinfo_fields(cpuinfo_text).get("flags", "").split())
    return next((name for name, needs in BLAS_KERNELS if needs <= flags), None)


def choose_blas_kernels() -> str | None:
    """Set OPENBLAS_CORETYPE from the CPU's flags before numpy (or mxnet) loads OpenBLAS, unless the user
    set it; returns what was set. Child processes inherit it."""
    import platform

    if "OPENBLAS_CORETYPE" in os.environ or "numpy" in sys.modules or platform.machine() not in ("x86_64", "AMD64"):
        return None
    from .host import read_quietly

    core = blas_kernels_for(read_quietly("/proc/cpuinfo"))
    if core is not None:
        os.environ["OPENBLAS_CORETYPE"] = core
    return core


def quiet_libraries() -> None:
    """Keep library banners off the user's terminal (read by mxnet when it loads)."""
    os.environ.setdefault("MXNET_SUBGRAPH_VERBOSE", "0")  # "Subgraph backend MKLDNN is activated" on every load


def apply_threads(threads: int | None, strict: bool = True) -> int:
    """Cap all thread pools to ``threads`` (None: leave them as they are) and return the cap in force;
    on a busy host no pool spins (``ThreadPolicy``).

    After mxnet is loaded its pools cannot change: ``strict`` refuses (a bug in a command); otherwise (the
    Python API, a second call in one interpreter) ONNX Runtime sessions take the new cap and a warning
    says MXNet keeps its own."""
    global _threads
    if threads is None:
        apply_policy(ThreadPolicy(current_threads(), host_load(), usable_cores()))
        return current_threads()
    if threads < 1:
        from .errors import UsageError
        raise UsageError(f"--threads must be at least 1, got {threads}", "--threads", "pass a positive count")
    threads = cap_to_cores(threads)
    if "mxnet" in sys.modules and _threads != threads:
        # ONNX Runtime takes the cap per session, but MXNet's pools are sized at import.
        if strict:
            raise RuntimeError(f"thread cap {threads} requested after mxnet was imported; "
                               "apply_threads must run before the first heavy import")
        import warnings

        warnings.warn(f"mxnet was loaded before the thread cap {threads} was asked for: ONNX Runtime uses "
                      f"{threads} thread(s), MXNet keeps the pools it started with (set the cap in a fresh "
                      "interpreter, or call edgetrain.runtime.apply_threads first)", stacklevel=3)
    os.environ.update(thread_env(threads))
    cap_loaded_blas(threads)
    _threads = threads
    apply_policy(ThreadPolicy(threads, host_load(), usable_cores()))
    return threads


def cap_loaded_blas(threads: int) -> None:
    """Cap the OpenBLAS libraries already loaded (numpy's) to ``threads``: numpy is imported before the
    thread cap is applied, so OPENBLAS_NUM_THREADS comes too late for it. (Uncapped, its spinning workers made a 32x1280 @ 1280x10
    matmul take 24 ms instead of 0.6 ms on a busy 2-core host.) The way threadpoolctl does it."""
    try:
        with open("/proc/self/maps") as fh:
            libs = {ln.split()[-1] for ln in fh if "openblas" in ln.lower() and ".so" in ln}
    except OSError:
        return
    for path in libs:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("openblas_set_num_threads64_", "openblas_set_num_threads", "scipy_openblas_set_num_threads64_"):
            fn = getattr(lib, name, None)
            if fn is not None:
                fn(ctypes.c_int(threads))
                break


cap_notes: list[str] = []  # what cap_to_cores did in this process, for a command's notes


class ThreadPolicy:
    """Whether thread pools may spin, given the host's load (issue 26; tools/bench_threads.py, README
    "Threads on a busy host"). When the threads plus the others' average demand are over the cores
    (``host.oversubscribed``), no pool spins: OpenMP waits passively (OMP_WAIT_POLICY=PASSIVE, unless the
    user set it; read when mxnet loads) and ONNX Runtime's workers sleep between tasks
    (``session.intra_op.allow_spinning`` 0), so a waiting worker yields its core to the work it waits for.
    The thread count itself is kept: measured on a loaded 2-core host, 1 thread was no faster than 2."""

    def __init__(self, threads: int, loadavg: float | None, cores: int):
        from .host import oversubscribed

        self.threads, self.loadavg, self.cores = threads, loadavg, cores
        self.spin = not oversubscribed(loadavg, cores, threads)


_spin = True
_load: list = []  # the host's load as this process first read it: every thread decision here agrees


def host_load() -> float | None:
    """The 1-minute load average, read once per process (``host.host_load``)."""
    if not _load:
        from .host import host_load as read

        _load.append(read())
    return _load[0]


def apply_policy(policy: ThreadPolicy) -> None:
    """No spinning pools when ``policy`` says so: before mxnet (OpenMP reads OMP_WAIT_POLICY when it loads),
    and for every ONNX Runtime session made after (``_lazy.ort_session_options``)."""
    global _spin
    _spin = policy.spin
    if not policy.spin:
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def spinning_allowed() -> bool:
    """Whether thread pools may spin (False once ``apply_policy`` found the host busy)."""
    return _spin


def cap_to_cores(threads: int) -> int:
    """A cap above the cores this process may use only adds contention (512 threads on 2 cores ran 50x
    slower): capped to the cores, with a warning on stderr. ``EDGETRAIN_ALLOW_OVERSUBSCRIBE=1`` keeps it
    (measuring a bigger board's thread count on purpose)."""
    cores = usable_cores()
    if threads <= cores or envvars.get("EDGETRAIN_ALLOW_OVERSUBSCRIBE") == "1":
        return threads
    note = (f"thread cap {threads} is above the {cores} core(s) this process may use: capped to {cores} "
            "(EDGETRAIN_ALLOW_OVERSUBSCRIBE=1 keeps it)")
    if note not in cap_notes:
        cap_notes.append(note)
        sys.stderr.write(f"warning: {note}\n")
    return cores


def requested_threads() -> int | None:
    """The cap ``apply_threads`` was given in this process (None: none was)."""
    return _threads


def current_threads() -> int:
    """The cap in force: the one applied here, else OMP_NUM_THREADS, else the usable cores."""
    if _threads is not None:
        return _threads
    env = envvars.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    return usable_cores()


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1
