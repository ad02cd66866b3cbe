"""Repair for the aarch64 mxnet 1.9.1 wheel, which links ARM Performance Libraries it does not ship.

Why: ``libmxnet.so`` in the manylinux2014_aarch64 wheel has DT_NEEDED entries for
``libarmpl_lp64_mp.so``, ``libamath.so`` and ``libastring.so`` (and RPATH ``$ORIGIN``) but the wheel
bundles none of them, so ``import mxnet`` fails on a Raspberry Pi with "cannot open shared object
file". What libmxnet.so actually takes from them (its unversioned undefined symbols):

- from ArmPL: ``cblas_*`` (BLAS), Fortran LAPACK (``dgesdd_``, ``spotrf_``...) and ``LAPACKE_*``;
- from libamath: plain libm functions (``expf``, ``logf``, ``powf``, ``sincosf``...);
- from libastring: plain libc string functions (``memcpy``, ``strlen``...).

Debian's ``liblapacke.so.3`` provides LAPACKE and pulls in ``libblas.so.3``/``liblapack.so.3``, which
``libopenblas0-openmp`` provides (cblas and LAPACK, OpenMP-threaded like ArmPL's ``_mp``). glibc's
``libm.so.6`` and ``libc.so.6`` provide the rest. So the repair is three symlinks next to
libmxnet.so (found first thanks to ``$ORIGIN``)::

    libarmpl_lp64_mp.so -> .../liblapacke.so.3   (+ OpenBLAS through libblas.so.3/liblapack.so.3)
    libamath.so         -> .../libm.so.6
    libastring.so       -> .../libc.so.6

Nothing here imports mxnet: the repair must work precisely when mxnet cannot be imported.
"""
from __future__ import annotations

import os
import platform
import shutil
import struct
import subprocess
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

from ..fileio import fsync_dir

# name libmxnet.so asks for -> the system library (soname) that stands in for it
STAND_INS: dict[str, str] = {
    "libarmpl_lp64_mp.so": "liblapacke.so.3",
    "libamath.so": "libm.so.6",
    "libastring.so": "libc.so.6",
}
# soname -> the Debian package that ships it (same names on Raspberry Pi OS and Ubuntu)
PACKAGES: dict[str, str] = {
    "liblapacke.so.3": "liblapacke",
    "libopenblas.so.0": "libopenblas0-openmp",
    "libm.so.6": "libc6",
    "libc.so.6": "libc6",
}
# LAPACKE alone would fall back to the slow reference BLAS: OpenBLAS must be there as well.
ALSO_REQUIRED = ("libopenblas.so.0",)

_MULTIARCH = {"aarch64": "aarch64-linux-gnu", "arm64": "aarch64-linux-gnu", "x86_64": "x86_64-linux-gnu"}


@dataclass
class Link:
    name: str          # e.g. libarmpl_lp64_mp.so
    path: Path         # where the link goes (beside libmxnet.so)
    target: Path       # the system library it points to

    def to_dict(self) -> dict:
        return {"name": self.name, "path": str(self.path), "target": str(self.target)}


@dataclass
class Plan:
    """What the repair would do for one libmxnet.so; empty ``links`` and ``missing_packages``: healthy."""

    libmxnet: Path | None
    needed: list[str] = field(default_factory=list)        # ArmPL names libmxnet.so asks for
    satisfied: dict[str, str] = field(default_factory=dict)  # name -> where the loader finds it
    links: list[Link] = field(default_factory=list)        # links to create or replace
    missing_libs: list[str] = field(default_factory=list)  # stand-in sonames not on this system
    missing_packages: list[str] = field(default_factory=list)
    needed_from: str = "elf"                               # "elf" or "known" (DT_NEEDED unreadable)

    @property
    def ok(self) -> bool:
        return not self.links and not self.missing_packages

    @property
    def fixable(self) -> bool:
        return bool(self.links) and not self.missing_packages

    def apt_command(self) -> str:
        prefix = "" if _is_root() else "sudo "
        return f"{prefix}apt-get install -y {' '.join(self.missing_packages)}"

    def to_dict(self) -> dict:
        return {
            "libmxnet": str(self.libmxnet) if self.libmxnet else None,
            "needed": self.needed,
            "needed_from": self.needed_from,
            "satisfied": self.satisfied,
            "links": [link.to_dict() for link in self.links],
            "missing_libs": self.missing_libs,
            "missing_packages": self.missing_packages,
        }


def _is_root() -> bool:
    return hasattr(os, "geteuid") and os.geteuid() == 0


def find_libmxnet() -> Path | None:
    """libmxnet.so of the mxnet that ``import mxnet`` would load, found without importing it."""
    try:
        spec = find_spec("mxnet")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    for folder in spec.submodule_search_locations:
        lib = Path(folder) / "libmxnet.so"
        if lib.exists():
            return lib
    return None


def elf_needed(path: Path) -> list[str]:
    """DT_NEEDED entries of an ELF shared object (pure Python: readelf is not on every Pi).

    Raises ValueError when ``path`` is not an ELF file this reader understands.
    """
    with open(path, "rb") as fh:
        ident = fh.read(16)
        if len(ident) < 16 or ident[:4] != b"\x7fELF":
            raise ValueError(f"not an ELF file: {path}")
        is64 = ident[4] == 2
        end = "<" if ident[5] == 1 else ">"
        if is64:
            fh.seek(0x20)
            (phoff,) = struct.unpack(end + "Q", fh.read(8))
            fh.seek(0x36)
            phentsize, phnum = struct.unpack(end + "HH", fh.read(4))
        else:
            fh.seek(0x1C)
            (phoff,) = struct.unpack(end + "I", fh.read(4))
            fh.seek(0x2A)
            phentsize, phnum = struct.unpack(end + "HH", fh.read(4))
        loads = []   # (vaddr, offset, filesz) to map addresses to file offsets
        dynamic = None
        for i in range(phnum):
            fh.seek(phoff + i * phentsize)
            raw = fh.read(phentsize)
            if is64:
                p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack(end + "IIQQQQ", raw[:40])
            else:
                p_type, p_offset, p_vaddr, _paddr, p_filesz = struct.unpack(end + "IIIII", raw[:20])
            if p_type == 1:    # PT_LOAD
                loads.append((p_vaddr, p_offset, p_filesz))
            elif p_type == 2:  # PT_DYNAMIC
                dynamic = (p_offset, p_filesz)
        if dynamic is None:
            return []
        fh.seek(dynamic[0])
        data = fh.read(dynamic[1])
        fmt, size = (end + "qQ", 16) if is64 else (end + "iI", 8)
        needed_offsets, strtab = [], None
        for pos in range(0, len(data) - size + 1, size):
            tag, val = struct.unpack(fmt, data[pos:pos + size])
            if tag == 0:       # DT_NULL
                break
            if tag == 1:       # DT_NEEDED
                needed_offsets.append(val)
            elif tag == 5:     # DT_STRTAB (an address)
                strtab = val
        if strtab is None:
            raise ValueError(f"no string table in {path}")
        for vaddr, offset, filesz in loads:
            if vaddr <= strtab < vaddr + filesz:
                strtab_off = strtab - vaddr + offset
                break
        else:
            raise ValueError(f"string table outside loaded segments in {path}")
        names = []
        for off in needed_offsets:
            fh.seek(strtab_off + off)
            chunk = fh.read(256)
            names.append(chunk.split(b"\0", 1)[0].decode("utf-8", "replace"))
        return names


def elf_machine(path: Path) -> int | None:
    """e_machine of an ELF file (183 aarch64, 62 x86-64), None when unreadable or not ELF."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(20)
    except OSError:
        return None
    if len(head) < 20 or head[:4] != b"\x7fELF":
        return None
    return struct.unpack("<H" if head[5] == 1 else ">H", head[18:20])[0]


def system_lib_dirs(machine: str | None = None) -> list[Path]:
    """Folders the dynamic loader searches by default, most specific first."""
    machine = machine or platform.machine()
    triplet = _MULTIARCH.get(machine)
    dirs = []
    for base in ("/lib", "/usr/lib", "/usr/local/lib"):
        if triplet:
            dirs.append(Path(base) / triplet)
    dirs += [Path("/lib64"), Path("/usr/lib64"), Path("/lib"), Path("/usr/lib")]
    extra = os.environ.get("LD_LIBRARY_PATH", "")
    return [Path(d) for d in extra.split(":") if d] + dirs


def _ldconfig_paths() -> dict[str, str]:
    """soname -> path from the loader cache (the first, i.e. native, entry per name)."""
    exe = shutil.which("ldconfig") or ("/sbin/ldconfig" if os.path.exists("/sbin/ldconfig") else None)
    if not exe:
        return {}
    try:
        out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    found: dict[str, str] = {}
    for line in out.splitlines()[1:]:
        line = line.strip()
        if "=>" not in line:
            continue
        left, path = line.rsplit("=>", 1)
        name = left.split(" (", 1)[0].strip()
        found.setdefault(name, path.strip())
    return found


def locate(soname: str, lib_dirs: list[Path] | None = None, use_cache: bool = True,
           machine: int | None = None) -> Path | None:
    """Where the loader would find ``soname``: first in ``lib_dirs``, then the loader cache.

    With ``machine`` (an ELF e_machine), libraries built for another architecture are passed over.
    """
    candidates = [Path(folder) / soname for folder in (lib_dirs if lib_dirs is not None else system_lib_dirs())]
    if use_cache:
        path = _ldconfig_paths().get(soname)
        if path:
            candidates.append(Path(path))
    for candidate in candidates:
        if candidate.exists() and (machine is None or elf_machine(candidate) in (None, machine)):
            return candidate
    return None


def plan(libmxnet: Path | None, lib_dirs: list[Path] | None = None, use_cache: bool = True) -> Plan:
    """Work out which ArmPL names are unresolved for ``libmxnet`` and what would stand in for them.

    ``lib_dirs`` replaces the system's library folders (tests point it at a prepared folder);
    ``use_cache`` adds the loader cache (``ldconfig -p``) as a last resort.
    """
    result = Plan(libmxnet=libmxnet)
    if libmxnet is None:
        return result
    try:
        needed = elf_needed(libmxnet)
        result.needed = [name for name in needed if name in STAND_INS]
    except (OSError, ValueError, struct.error):
        # Unreadable: assume the pinned aarch64 wheel's known list (what readelf -d shows for 1.9.1).
        result.needed = list(STAND_INS)
        result.needed_from = "known"
    machine = elf_machine(libmxnet)
    here = libmxnet.parent
    missing_libs: list[str] = []
    for name in result.needed:
        beside = here / name
        if beside.exists():               # a real file or a symlink that resolves
            result.satisfied[name] = str(beside)
            continue
        on_system = locate(name, lib_dirs, use_cache, machine)
        if on_system is not None:         # e.g. real ArmPL installed system-wide
            result.satisfied[name] = str(on_system)
            continue
        stand_in = STAND_INS[name]
        target = locate(stand_in, lib_dirs, use_cache, machine)
        if target is None:
            missing_libs.append(stand_in)
            continue
        result.links.append(Link(name=name, path=beside, target=target))
    if result.links or missing_libs:
        for soname in ALSO_REQUIRED:
            if "libarmpl_lp64_mp.so" in result.needed and locate(soname, lib_dirs, use_cache, machine) is None:
                missing_libs.append(soname)
    result.missing_libs = sorted(set(missing_libs))
    result.missing_packages = sorted({PACKAGES.get(lib, lib) for lib in result.missing_libs})
    return result


def blas_behind_lapacke(lib_dirs: list[Path] | None = None, use_cache: bool = True) -> dict[str, str | None]:
    """What liblapacke's libblas.so.3/liblapack.so.3 resolve to (Debian alternatives): OpenBLAS, or the
    slow reference implementation when someone chose it."""
    out: dict[str, str | None] = {}
    for soname in ("libblas.so.3", "liblapack.so.3"):
        path = locate(soname, lib_dirs, use_cache)
        out[soname] = os.path.realpath(path) if path else None
    return out


def apply(p: Plan) -> list[Link]:
    """Create the planned links atomically (temp symlink, then rename over the name).

    Idempotent: a link that already points at its target is left alone; returns the links changed.
    Refuses (ValueError) when packages are missing, so it never half-repairs.
    """
    if p.missing_packages:
        raise ValueError(f"missing packages: {' '.join(p.missing_packages)}")
    changed = []
    for link in p.links:
        if link.path.is_symlink() and os.readlink(link.path) == str(link.target) and link.path.exists():
            continue
        tmp = link.path.with_name(f".{link.name}.edgetrain-{os.getpid()}.tmp")
        if tmp.is_symlink() or tmp.exists():
            tmp.unlink()
        os.symlink(link.target, tmp)
        try:
            os.replace(tmp, link.path)
        except OSError:
            tmp.unlink(missing_ok=True)
            raise
        changed.append(link)
    if changed:
        fsync_dir(changed[0].path.parent)
    return changed


