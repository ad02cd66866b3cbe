"""A stand-in for ``distutils.version`` (gone in Python 3.12), for mxnet 1.9.1's import only.

mxnet reads ``LooseVersion`` (numpy_dispatch_protocol.py, comparing numpy's version with 1.15 and 1.17)
and ``StrictVersion`` (numpy_op_fallback.py, with 1.6.0). These keep distutils' comparison rules for
the versions mxnet compares; ``numpy_names`` puts them in ``sys.modules`` only while mxnet's modules
load, and only when no real ``distutils`` can be imported.
"""
from __future__ import annotations

import re
import types


class _Version:
    def __init__(self, vstring: str | None = None):
        if vstring is not None:
            self.parse(vstring)

    def __repr__(self):
        return f"{type(self).__name__}('{self}')"

    def _cmp(self, other):
        if isinstance(other, str):
            other = type(self)(other)
        elif not isinstance(other, type(self)):
            return NotImplemented
        a, b = self._key(), other._key()
        return (a > b) - (a < b)

    def __eq__(self, other):
        c = self._cmp(other)
        return c if c is NotImplemented else c == 0

    def __lt__(self, other):
        c = self._cmp(other)
        return c if c is NotImplemented else c < 0

    def __le__(self, other):
        c = self._cmp(other)
        return c if c is NotImplemented else c <= 0

    def __gt__(self, other):
        c = self._cmp(other)
        return c if c is NotImplemented else c > 0

    def __ge__(self, other):
        c = self._cmp(other)
        return c if c is NotImplemented else c >= 0

    __hash__ = None


class LooseVersion(_Version):
    """distutils' LooseVersion: numbers compare as numbers, other runs of letters as strings."""

    component_re = re.compile(r"(\d+ | [a-z]+ | \.)", re.VERBOSE)

    def parse(self, vstring: str) -> None:
        self.vstring = vstring
        parts = [x for x in self.component_re.split(vstring) if x and x != "."]
        self.version = [int(x) if x.isdigit() else x for x in parts]

    def _key(self):
        # distutils compared the lists directly (a TypeError on int vs str); order numbers first instead
        return [(0, x, "") if isinstance(x, int) else (1, 0, x) for x in self.version]

    def __str__(self):
        return self.vstring


class StrictVersion(_Version):
    """distutils' StrictVersion: N.N[.N][(a|b)N]; anything after that (numpy's .devN, rcN) is ignored."""

    version_re = re.compile(r"^(\d+)\.(\d+)(?:\.(\d+))?(?:([ab]|rc)(\d+))?", re.ASCII)

    def parse(self, vstring: str) -> None:
        m = self.version_re.match(vstring)
        if not m:
            raise ValueError(f"invalid version number '{vstring}'")
        major, minor, patch, pre, pre_n = m.groups()
        self.vstring = vstring
        self.version = (int(major), int(minor), int(patch or 0))
        self.prerelease = (pre, int(pre_n)) if pre else None

    def _key(self):
        # a release sorts after its pre-releases
        return (self.version, (1, "", 0) if self.prerelease is None else (0, *self.prerelease))

    def __str__(self):
        return self.vstring


MODULE = types.ModuleType("distutils.version", "distutils.version stand-in (edgetrain.compat), for mxnet 1.9.1")
MODULE.LooseVersion = LooseVersion
MODULE.StrictVersion = StrictVersion
MODULE.__edgetrain_stand_in__ = True
PACKAGE = types.ModuleType("distutils", "distutils stand-in (edgetrain.compat): only .version, for mxnet 1.9.1")
PACKAGE.__path__ = []
PACKAGE.version = MODULE
PACKAGE.__edgetrain_stand_in__ = True
