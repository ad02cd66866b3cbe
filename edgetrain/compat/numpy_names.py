"""The numpy names mxnet 1.9.1 reads that newer numpy removed, restored for mxnet's own modules only.

mxnet 1.9.1's Python package is pure Python over ctypes (no numpy C-API), so a newer numpy works with
it as long as the names it reads exist. Those names are listed below, each with the numpy release that
removed it. They are not written into numpy: while a module of the ``mxnet`` package executes (its
import, and so the globals it binds), ``sys.modules["numpy"]`` is a view of the real numpy that adds
the missing names; every other module, imported before, after or even in the middle of mxnet's import,
gets the real numpy, unchanged. A name numpy still has is never replaced (numpy 2 has ``np.bool``
again, as its own bool type: mxnet gets that one).

The list was made by reading every ``np.X`` / ``_np.X`` / ``onp.X`` / ``_numpy.X`` in mxnet 1.9.1, its
numpy fallback table and the names its dispatch protocol looks up with getattr, against numpy 1.23.5,
1.26.4, 2.4.6 and 2.5.5; ``python -m
edgetrain.compat.numpy_names`` prints what this numpy lacks.

Python >= 3.12 has no ``distutils``; mxnet imports ``distutils.version`` (LooseVersion, StrictVersion)
while it loads. When ``distutils`` cannot be imported (setuptools' shim provides it where setuptools is
installed), a stand-in (edgetrain/compat/distutils_version.py) is in ``sys.modules`` for the same window.
"""
from __future__ import annotations

import builtins
import importlib.abc
import importlib.util
import math
import sys
import threading
import types
import warnings
from dataclasses import dataclass
from typing import Any, Callable

from . import distutils_version

PACKAGE = "mxnet"


def _expired(name: str) -> Callable:
    # numpy 1.20 to 1.26 answered these names with a function that raises when called (NEP 32);
    # mxnet's fallback table only binds them, so it gets the same.
    def expired(*args, **kwargs):
        raise RuntimeError(f"In accordance with NEP 32, the function {name} was removed from NumPy version "
                           "1.20. A replacement for this function is available in the numpy_financial "
                           "library: https://pypi.org/project/numpy-financial")
    expired.__name__ = name
    return expired


def _in1d(np):
    def in1d(ar1, ar2, assume_unique=False, invert=False, **kwargs):
        return np.isin(ar1, ar2, assume_unique=assume_unique, invert=invert, **kwargs).ravel()
    return in1d


def _msort(np):
    def msort(a):
        return np.sort(a, axis=0)
    return msort


def _trapz(np):
    new = getattr(np, "trapezoid", None)   # numpy >= 2.0: the same function under its new name
    if new is not None:
        return new

    def trapz(y, x=None, dx=1.0, axis=-1):
        y = np.asanyarray(y)
        if x is None:
            d = dx
        else:
            x = np.asanyarray(x)
            d = np.diff(x) if x.ndim != 1 else np.diff(x).reshape(
                [-1 if k == (axis % y.ndim) else 1 for k in range(y.ndim)])
        hi, lo = [slice(None)] * y.ndim, [slice(None)] * y.ndim
        hi[axis], lo[axis] = slice(1, None), slice(None, -1)
        return (d * (y[tuple(hi)] + y[tuple(lo)]) / 2.0).sum(axis)
    return trapz


def _compat(np):
    mod = types.ModuleType("numpy.compat", "numpy.compat as mxnet 1.9.1 reads it (restored by edgetrain)")
    mod.basestring = str
    return mod


@dataclass(frozen=True)
class Alias:
    name: str
    removed_in: str          # the numpy release that removed the name
    value: Callable          # numpy -> the object the name used to mean
    mxnet_reads: str         # where mxnet 1.9.1 reads it


ALIASES: tuple[Alias, ...] = (
    Alias("bool", "1.24", lambda np: builtins.bool, "mxnet/numpy/multiarray.py, ndarray/numpy/_op.py"),
    Alias("int", "1.24", lambda np: builtins.int, "mxnet/test_utils.py"),
    Alias("compat", "2.0", _compat, "np.compat.basestring in mxnet/ndarray/numpy/_op.py"),
    Alias("Inf", "2.0", lambda np: math.inf, "mxnet/gluon/contrib/estimator/event_handler.py"),
    Alias("PINF", "2.0", lambda np: math.inf, "mxnet/numpy/utils.py"),
    Alias("NINF", "2.0", lambda np: -math.inf, "mxnet/numpy/utils.py"),
    Alias("PZERO", "2.0", lambda np: 0.0, "mxnet/numpy/utils.py"),
    Alias("NZERO", "2.0", lambda np: -0.0, "mxnet/numpy/utils.py"),
    Alias("NaN", "2.0", lambda np: math.nan, "mxnet/numpy/utils.py"),
    Alias("NAN", "2.0", lambda np: math.nan, "mxnet/numpy/utils.py"),
    Alias("alltrue", "2.0", lambda np: np.all, "mxnet/numpy/fallback.py"),
    Alias("sometrue", "2.0", lambda np: np.any, "mxnet/numpy_dispatch_protocol.py (by name)"),
    Alias("product", "2.0", lambda np: np.prod, "mxnet/numpy_dispatch_protocol.py (by name)"),
    Alias("round_", "2.0", lambda np: np.round, "mxnet/numpy_dispatch_protocol.py (by name)"),
    Alias("msort", "2.0", _msort, "mxnet/numpy/fallback.py"),
    Alias("mirr", "2.0", lambda np: _expired("mirr"), "mxnet/numpy/fallback.py"),
    Alias("npv", "2.0", lambda np: _expired("npv"), "mxnet/numpy/fallback.py"),
    Alias("pmt", "2.0", lambda np: _expired("pmt"), "mxnet/numpy/fallback.py"),
    Alias("ppmt", "2.0", lambda np: _expired("ppmt"), "mxnet/numpy/fallback.py"),
    Alias("pv", "2.0", lambda np: _expired("pv"), "mxnet/numpy/fallback.py"),
    Alias("rate", "2.0", lambda np: _expired("rate"), "mxnet/numpy/fallback.py"),
    Alias("in1d", "2.4", _in1d, "mxnet/numpy/fallback.py"),
    Alias("trapz", "2.4", _trapz, "mxnet/numpy/fallback.py"),
)


def missing(np=None) -> list[Alias]:
    """The aliases this numpy lacks (what would be restored for mxnet)."""
    if np is None:
        import numpy as np
    return [a for a in ALIASES if not _present(np, a.name)]


def _present(np, name: str) -> bool:
    # numpy < 2 still answers some removed names (np.bool with a warning, np.mirr with a function that
    # raises): those count as present, mxnet gets numpy's own answer.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            getattr(np, name)
        except AttributeError:
            return False
    return True


class NumpyForMxnet(types.ModuleType):
    """numpy as mxnet 1.9.1 reads it: every attribute is the real numpy's, plus the restored names."""

    def __init__(self, real: types.ModuleType, restored: dict[str, Any]):
        super().__init__(real.__name__, real.__doc__)
        object.__setattr__(self, "_edgetrain_real", real)
        for k, v in restored.items():
            object.__setattr__(self, k, v)

    def __getattr__(self, name):
        return getattr(object.__getattribute__(self, "_edgetrain_real"), name)

    def __setattr__(self, name, value):   # mxnet never sets numpy attributes; if it did, numpy gets it
        setattr(object.__getattribute__(self, "_edgetrain_real"), name, value)

    def __dir__(self):
        return sorted(set(dir(object.__getattribute__(self, "_edgetrain_real"))) | set(vars(self)))


@dataclass
class Applied:
    numpy_version: str
    restored: list[Alias]
    distutils_stand_in: bool

    def to_dict(self) -> dict:
        return {"numpy": self.numpy_version,
                "restored": [{"name": a.name, "removed_in": a.removed_in} for a in self.restored],
                "distutils_stand_in": self.distutils_stand_in}

    def describe(self) -> str:
        if not self.restored and not self.distutils_stand_in:
            return f"none needed (numpy {self.numpy_version} has every name mxnet 1.9.1 reads)"
        parts = []
        if self.restored:
            by_release: dict[str, list[str]] = {}
            for a in self.restored:
                by_release.setdefault(a.removed_in, []).append(a.name)
            parts.append(f"{len(self.restored)} numpy name(s) restored for mxnet only (" + "; ".join(
                f"removed in {rel}: {', '.join(names)}" for rel, names in sorted(by_release.items())) + ")")
        if self.distutils_stand_in:
            parts.append("a distutils.version stand-in (Python >= 3.12 has no distutils)")
        return f"numpy {self.numpy_version}: " + " and ".join(parts)


class _State:
    def __init__(self):
        self.lock = threading.RLock()
        self.local = threading.local()
        self.view: NumpyForMxnet | None = None
        self.real: types.ModuleType | None = None
        self.applied: Applied | None = None
        self.finder: _Finder | None = None


_state = _State()


def _stack() -> list:
    s = getattr(_state.local, "stack", None)
    if s is None:
        s = _state.local.stack = []
    return s


_ABSENT = object()


class _Swap:
    """While a module executes: sys.modules["numpy"] is the view (mxnet's modules) or the real numpy
    (any other module imported in the middle of mxnet's import); restored afterwards."""

    def __init__(self, for_mxnet: bool):
        self.for_mxnet = for_mxnet

    def __enter__(self):
        want = _state.view if self.for_mxnet else _state.real
        self.prev_numpy = sys.modules.get("numpy")
        self.prev_distutils = {k: sys.modules.get(k, _ABSENT) for k in ("distutils", "distutils.version")}
        sys.modules["numpy"] = want
        if self.for_mxnet and _state.applied.distutils_stand_in:
            sys.modules["distutils"] = distutils_version.PACKAGE
            sys.modules["distutils.version"] = distutils_version.MODULE
        elif not self.for_mxnet and _state.applied.distutils_stand_in:
            for k in self.prev_distutils:
                sys.modules.pop(k, None)
        _stack().append(self)
        return self

    def __exit__(self, *exc):
        _stack().pop()
        sys.modules["numpy"] = self.prev_numpy
        for k, v in self.prev_distutils.items():
            if v is _ABSENT:
                sys.modules.pop(k, None)
            else:
                sys.modules[k] = v
        return False


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, for_mxnet: bool):
        self._inner, self._for_mxnet = inner, for_mxnet

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        with _Swap(self._for_mxnet):
            self._inner.exec_module(module)

    def __getattr__(self, name):   # get_source, get_filename, is_package, ... of the real loader
        return getattr(self._inner, name)


def spec_from_other_finders(fullname, path=None, target=None):
    """The module spec the import system's other finders give (edgetrain's own hooks skipped), or None."""
    for finder in sys.meta_path:
        if getattr(finder, "edgetrain_hook", False) or not hasattr(finder, "find_spec"):
            continue
        spec = finder.find_spec(fullname, path, target)
        if spec is not None:
            return spec
    return None


class _Finder(importlib.abc.MetaPathFinder):
    """Wraps the loader of every mxnet module; during mxnet's import also of the modules it pulls in."""

    edgetrain_hook = True

    def find_spec(self, fullname, path, target=None):
        is_mxnet = fullname == PACKAGE or fullname.startswith(PACKAGE + ".")
        if not is_mxnet and not (_stack() and _stack()[-1].for_mxnet):
            return None
        if fullname == "numpy" or fullname.startswith("numpy."):
            for_mxnet = False
        else:
            for_mxnet = is_mxnet
        spec = spec_from_other_finders(fullname, path, target)
        if spec is None:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Loader(spec.loader, for_mxnet)
        return spec


def install() -> Applied:
    """Make mxnet's modules see the numpy names it reads (idempotent; imports numpy, never mxnet).

    Returns what is applied: the aliases this numpy lacks and whether the distutils stand-in is used.
    """
    with _state.lock:
        if _state.applied is not None:
            return _state.applied
        import numpy
        restore = missing(numpy)
        need_distutils = _distutils_missing()
        _state.real = numpy
        _state.view = NumpyForMxnet(numpy, {a.name: a.value(numpy) for a in restore})
        _state.applied = Applied(numpy.__version__, restore, need_distutils)
        if restore or need_distutils:
            _state.finder = _Finder()
            sys.meta_path.insert(0, _state.finder)
        return _state.applied


def exec_for_mxnet(loader, module) -> None:
    """Execute an mxnet module with ``loader`` as the compatibility finder would (the view in place)."""
    if _state.finder is None:
        loader.exec_module(module)
    else:
        with _Swap(True):
            loader.exec_module(module)


def finder():
    """The import finder install() put in place (None: not installed, or nothing to restore)."""
    return _state.finder


def applied() -> Applied | None:
    """What install() applied in this process (None: not installed yet)."""
    return _state.applied


def _distutils_missing() -> bool:
    if sys.modules.get("distutils.version") is not None:
        return False
    try:
        return importlib.util.find_spec("distutils") is None
    except (ImportError, ValueError):
        return True


if __name__ == "__main__":
    import numpy as _np
    for a in missing(_np):
        print(f"np.{a.name:<8} removed in numpy {a.removed_in:<4} read by {a.mxnet_reads}")
    print(f"distutils stand-in needed: {_distutils_missing()}")
