"""Will the device set install and load on a stock Jetson Nano (JetPack 4.6: Ubuntu 18.04, glibc 2.27, aarch64)
with a Python 3.11 from conda-forge? Checked from here, without the board:

1. pip resolves the device set for that platform, wheels only: `pip download --only-binary=:all:` for Python 3.11
   on aarch64 with every manylinux tag up to glibc 2.27 (and none newer), onnxruntime pinned to 1.28.0;
2. every shared object in those wheels needs at most GLIBC_2.27 and GLIBCXX_3.4.25 (Ubuntu 18.04's libstdc++,
   GCC 8) (its ELF version needs, read with readelf; a wheel's own bundled libstdc++ would satisfy its own).

    python tools/nano_wheels.py [--glibc 2.27] [--python-version 3.11] [--keep DIR]

Prints each wheel with the newest GLIBC symbol version its libraries need; exit 1 if one needs more.
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GLIBC = re.compile(r"\bGLIBC_(\d+)\.(\d+)")
GLIBCXX = re.compile(r"\bGLIBCXX_3\.4\.(\d+)")
UBUNTU_1804_GLIBCXX = 25  # libstdc++6 8.4.0 in Ubuntu 18.04 (bionic-updates): GLIBCXX_3.4.25


def device_requirements(python_version: str) -> list[str]:
    """pyproject.toml's dependencies that apply on that Python (markers read by pip's own parser)."""
    from pip._vendor.packaging.requirements import Requirement

    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    env = {"python_version": python_version, "python_full_version": python_version + ".0",
           "platform_machine": "aarch64", "sys_platform": "linux"}
    out = []
    for text in deps:
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(env):
            out.append(f"{req.name}{req.specifier}")
    return out


def glibc_needed(so_bytes: bytes, tmp: Path) -> tuple[tuple[int, int], int]:
    """(newest GLIBC_x.y, newest GLIBCXX_3.4.N's N) the library's version-needs section asks for."""
    path = tmp / "lib.so"
    path.write_bytes(so_bytes)
    text = subprocess.run(["readelf", "--version-info", "--wide", str(path)], capture_output=True, text=True).stdout
    needs = text[text.find("Version needs section"):] if "Version needs section" in text else ""
    found = [(int(a), int(b)) for a, b in GLIBC.findall(needs)]
    return max(found, default=(0, 0)), max((int(n) for n in GLIBCXX.findall(needs)), default=0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--glibc", default="2.27")
    ap.add_argument("--python-version", default="3.11")
    ap.add_argument("--onnxruntime", default="1.28.0")
    ap.add_argument("--keep", type=Path)
    args = ap.parse_args()
    major, minor = map(int, args.glibc.split("."))
    folder = args.keep or Path(tempfile.mkdtemp(prefix="edgetrain-nano-"))
    folder.mkdir(parents=True, exist_ok=True)
    reqs = [r for r in device_requirements(args.python_version) if not r.startswith("onnxruntime")]
    reqs.append(f"onnxruntime=={args.onnxruntime}")
    platforms = ["manylinux2014_aarch64"] + [f"manylinux_2_{m}_aarch64" for m in range(17, minor + 1)]
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--python-version",
           args.python_version, "--implementation", "cp", "-d", str(folder / "wheels")]
    for p in platforms:
        cmd += ["--platform", p]
    print("pip download for", args.python_version, "aarch64, glibc <=", args.glibc, ":", " ".join(reqs), flush=True)
    proc = subprocess.run(cmd + reqs, capture_output=True, text=True)
    if proc.returncode != 0:
        print("pip could not resolve the device set for that platform:\n" + proc.stderr[-2000:])
        return 1
    worst, worst_cxx = (0, 0), 0
    tmp = folder / "tmp"
    tmp.mkdir(exist_ok=True)
    for wheel in sorted((folder / "wheels").glob("*.whl")):
        need, cxx = (0, 0), 0
        libs = 0
        with zipfile.ZipFile(wheel) as z:
            for name in z.namelist():
                if re.search(r"\.so(\.|$)", name):
                    libs += 1
                    g, c = glibc_needed(z.read(name), tmp)
                    need, cxx = max(need, g), max(cxx, c)
        worst, worst_cxx = max(worst, need), max(worst_cxx, cxx)
        label = (f"GLIBC_{need[0]}.{need[1]}" + (f" GLIBCXX_3.4.{cxx}" if cxx else "")) if libs else "pure Python"
        flag = "" if need <= (major, minor) and cxx <= UBUNTU_1804_GLIBCXX else "  <-- needs more than Ubuntu 18.04 has"
        print(f"  {wheel.name:<90} {label}{flag}")
    ok = worst <= (major, minor) and worst_cxx <= UBUNTU_1804_GLIBCXX
    print(f"newest needed: GLIBC_{worst[0]}.{worst[1]}, GLIBCXX_3.4.{worst_cxx} -> {'loads' if ok else 'does NOT load'} "
          f"with glibc {args.glibc} and Ubuntu 18.04's libstdc++ (GLIBCXX_3.4.{UBUNTU_1804_GLIBCXX})")
    if not args.keep:
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
