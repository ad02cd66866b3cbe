"""The one door to mxnet, onnx and onnxruntime.

edgetrain imports these three only through this module, and only when a command needs them (never at
``edgetrain --help``). Opening a door does what must happen before the library's first import:

- mxnet: the thread cap requested with ``runtime.apply_threads`` is put in the environment (OpenMP and
  MXNet's engine read it once, at load), library banners are silenced, and the compatibility layer for
  newer numpy and Python is installed (edgetrain/compat/numpy_names.py). mxnet missing (Python >= 3.12,
  where pip cannot install it with its numpy<2 pin) or a system library it links missing is a one-line
  error that names the fix.
- onnxruntime: its telemetry writes nothing (ONNX Runtime 1.32 otherwise writes a device id and an
  SQLite event log under ~/.cache/Microsoft/DeveloperTools/.onnxruntime/ as it loads) and is switched off.

``module("onnxruntime.quantization")`` and ``from_import("onnx", "TensorProto", "helper")`` open the
right door first, then import what follows the package name.
"""
from __future__ import annotations

import contextlib
import importlib
import importlib.util
import os
import re
import sys
import threading
from types import ModuleType
from typing import Any

from . import runtime
from .errors import UsageError

MXNET_VERSION = "1.9.1"
_lock = threading.RLock()
_opened: set[str] = set()
_MISSING_LIB = re.compile(r"([\w.+-]+\.so[\w.]*): cannot open shared object file")


def _before_mxnet() -> None:
    # the cap in force must be in the environment before OpenMP and MXNet's engine load. numpy_names is
    # imported where mxnet is, not at the top: `edgetrain predict` never loads mxnet.
    from .compat import numpy_names

    runtime.apply_threads(runtime.requested_threads())
    runtime.quiet_libraries()
    numpy_names.install()


class _MxnetImportHook:
    """A plain ``import mxnet`` in a process that has loaded edgetrain (a user's factory module, a test)
    gets the same preparation as the door, when mxnet actually loads (a find_spec query alone, as
    doctor makes, prepares nothing)."""

    edgetrain_hook = True   # the compatibility finder, which asks the other finders, skips this one

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "mxnet" or "mxnet" in sys.modules:
            return None
        from .compat import numpy_names

        spec = numpy_names.spec_from_other_finders(fullname, path, target)
        if spec is None:
            return None
        if spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _PreparingLoader(spec.loader)
        return spec


class _PreparingLoader:
    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        from .compat import numpy_names

        with _lock:
            _before_mxnet()
        numpy_names.exec_for_mxnet(self._inner, module)

    def __getattr__(self, name):
        return getattr(self._inner, name)


if not any(isinstance(f, _MxnetImportHook) for f in sys.meta_path):
    sys.meta_path.insert(0, _MxnetImportHook())


def mxnet_installed() -> bool:
    """Whether this install has mxnet (the host side) or not (a device), found without importing it."""
    try:
        return importlib.util.find_spec("mxnet") is not None
    except (ImportError, ValueError):
        return False


def mxnet() -> ModuleType:
    """``import mxnet``, after the thread cap, the quiet banner and the numpy/Python compatibility."""
    if "mxnet" in _opened:
        return sys.modules["mxnet"]
    with _lock:
        if "mxnet" not in _opened:
            _before_mxnet()
            try:
                importlib.import_module("mxnet")
            except ModuleNotFoundError as exc:
                if exc.name != "mxnet":
                    top = (exc.name or "?").split(".")[0]
                    raise UsageError(f"mxnet cannot load: it imports {top}, which is not installed",
                                     "import mxnet", f"pip install {top}") from exc
                how = ("without the numpy<2 pin in its metadata" if sys.version_info >= (3, 12) else
                       'with its pins, as pip install ".[host]" does')
                raise UsageError(f"mxnet {MXNET_VERSION} is not installed (a device install: this needs the host side)",
                                 f"Python {_python()}",
                                 f"run `edgetrain doctor --fix` (it installs mxnet==1.9.1 {how})") from exc
            except OSError as exc:
                libs = _MISSING_LIB.findall(str(exc))
                if not libs:
                    raise
                raise UsageError(f"mxnet cannot load: {', '.join(sorted(set(libs)))} is missing",
                                 "import mxnet", "run `edgetrain doctor`: it names the package that "
                                 "provides it (and --fix links what it can)") from exc
            _opened.add("mxnet")
    return sys.modules["mxnet"]


def onnx() -> ModuleType:
    """``import onnx``."""
    if "onnx" not in _opened:
        with _lock:
            importlib.import_module("onnx")
            _opened.add("onnx")
    return sys.modules["onnx"]


def onnxruntime() -> ModuleType:
    """``import onnxruntime`` without its telemetry touching the user's home folder.

    ONNX Runtime 1.32 creates ~/.cache/Microsoft/DeveloperTools/.onnxruntime/ (a device id and an SQLite
    event log) while its extension loads, before ``disable_telemetry_events()`` can be called (measured:
    calling it right after the import leaves both files). So while it loads, XDG_CACHE_HOME (which it
    honours) points where no folder can be made; it then keeps an in-memory id and writes nothing, and
    the one warning it prints about that is held back. Its event reporting is then switched off.
    """
    if "onnxruntime" not in _opened:
        with _lock:
            if "onnxruntime" not in _opened:
                if "onnxruntime" in sys.modules:
                    ort = sys.modules["onnxruntime"]   # loaded before the door: too late for the cache folder
                else:
                    with _no_telemetry_cache():
                        ort = importlib.import_module("onnxruntime")
                disable = getattr(ort, "disable_telemetry_events", None)
                if disable is not None:
                    disable()
                _opened.add("onnxruntime")
    return sys.modules["onnxruntime"]


NO_CACHE_DIR = "/dev/null/edgetrain-no-telemetry"   # a path under a device file: never creatable
_TELEMETRY_WARNING = "telemetry device ID"


def _scratch_file():
    """An anonymous file for the held-back stderr: in memory where Linux offers it (no tempfile import at
    `edgetrain predict`'s start), else a temp file."""
    if hasattr(os, "memfd_create"):
        try:
            return os.fdopen(os.memfd_create("edgetrain-held-stderr"), "w+b")
        except OSError:
            pass
    import tempfile

    return tempfile.TemporaryFile()


@contextlib.contextmanager
def _no_telemetry_cache():
    prev = os.environ.get("XDG_CACHE_HOME")
    os.environ["XDG_CACHE_HOME"] = NO_CACHE_DIR
    sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:   # no stderr at all: nothing to hold back
        saved = None
    held = _scratch_file() if saved is not None else None
    if held is not None:
        os.dup2(held.fileno(), 2)
    try:
        yield
    finally:
        if held is not None:
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read().decode(errors="replace")
            held.close()
            keep = [line for line in text.splitlines(True) if _TELEMETRY_WARNING not in line]
            if keep:
                sys.stderr.write("".join(keep))
                sys.stderr.flush()
        if prev is None:
            os.environ.pop("XDG_CACHE_HOME", None)
        else:
            os.environ["XDG_CACHE_HOME"] = prev


DOORS = {"mxnet": mxnet, "onnx": onnx, "onnxruntime": onnxruntime}


def module(name: str) -> ModuleType:
    """A module of one of the three packages (``"mxnet.contrib.quantization"``), its door opened first."""
    top = name.partition(".")[0]
    door = DOORS.get(top)
    if door is None:
        raise ValueError(f"{name!r} is not in mxnet, onnx or onnxruntime")
    package = door()
    return package if name == top else importlib.import_module(name)


def from_import(name: str, *names: str) -> Any:
    """``from NAME import A, B``: one object for one name, a tuple for several (like itemgetter)."""
    mod = module(name)
    found = []
    for attr in names:
        try:
            found.append(getattr(mod, attr))
        except AttributeError:
            found.append(importlib.import_module(f"{name}.{attr}"))   # a submodule not imported yet
    return found[0] if len(found) == 1 else tuple(found)


def opened() -> list[str]:
    """The doors opened in this process."""
    return sorted(_opened)


def _python() -> str:
    v = sys.version_info
    return f"{v.major}.{v.minor}.{v.micro}"


def ort_session(model, threads: int | None = None, optimize: bool = True, **kw):
    """An ONNX Runtime CPU session (file path or serialized bytes) with the thread cap applied (``kw``: see
    ``ort_session_options``)."""
    ort = onnxruntime()

    source = model if isinstance(model, (bytes, bytearray)) else str(model)
    return ort.InferenceSession(source, ort_session_options(threads, optimize, **kw),
                                providers=["CPUExecutionProvider"])


def ort_session_options(threads: int | None = None, optimize: bool = True, *, spinning: bool = False,
                        stop_spinning_after_run: bool = False, arena: bool = True, priority_order: bool = False,
                        prepack: bool = True):
    """ONNX Runtime session options with the thread cap applied (intra-op threads, sequential).
    ``spinning``: ORT's workers spin between runs (faster for back-to-back runs such as a feature pass;
    otherwise they burn a core after each run, waste on a battery). ``stop_spinning_after_run``: they spin
    within a run only (other work between runs gets the cores). ``arena``: ORT's CPU memory arena (off:
    every tensor through malloc). ``priority_order``: nodes run in the graph's own order (ORT's default
    order ran mask nodes added beside each ReLU at the end of a pass, keeping every activation alive: 2.5x the
    peak, measured). ``prepack``: off, weights are not kept a second time in MLAS's packed layout."""
    ort = onnxruntime()

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads or runtime.current_threads()
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    if not spinning or not runtime.spinning_allowed():  # a busy host: a spinning worker takes a core
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
    elif stop_spinning_after_run:
        opts.add_session_config_entry("session.force_spinning_stop", "1")
    opts.enable_cpu_mem_arena = arena
    if priority_order:
        opts.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    if not prepack:
        opts.add_session_config_entry("session.disable_prepacking", "1")
    opts.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if optimize
                                     else ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    return opts


def face(package: str, names: dict[str, str], namespace: dict):
    """``__getattr__`` and ``__dir__`` for a package whose names load on first use (``names``: name -> the
    module of the package that defines it), so importing the package loads none of its modules."""
    def __getattr__(name: str):
        module = names.get(name)
        if module is None:
            # a wing or module of the package (``edgetrain.energy.calibrate`` after ``import edgetrain``, as the
            # README names it): imported on first use, as a name of the face would be. The face's names come
            # first, so a function keeps its name whatever is imported (``edgetrain.quantize``).
            if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
                return importlib.import_module(f".{name}", package)
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f".{module}", package), name)

    def __dir__():
        return sorted(set(namespace) | set(names))

    return __getattr__, __dir__
