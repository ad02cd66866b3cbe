"""This machine: CPU (from /proc/cpuinfo), int8 ISA features, cores, RAM, OS, and whether it is emulated.

Pure Python: read before mxnet/onnxruntime load.
"""
from __future__ import annotations

import os
import platform
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

# A host "matches" a profile when arch and cores are equal and RAM is within this fraction: close enough
# that measuring on the host counts as measuring on the device.
RAM_TOLERANCE = 0.15

# ARM "CPU part" ids of the cores our profiles use (from the Arm TRMs), for a readable cpu name.
_ARM_PARTS = {"0xd03": "Cortex-A53", "0xd04": "Cortex-A35", "0xd05": "Cortex-A55", "0xd07": "Cortex-A57",
              "0xd08": "Cortex-A72", "0xd09": "Cortex-A73", "0xd0a": "Cortex-A75", "0xd0b": "Cortex-A76",
              "0xd0c": "Neoverse-N1", "0xd40": "Neoverse-V1", "0xd41": "Cortex-A78", "0xd49": "Neoverse-N2"}
_X86 = {"x86_64", "amd64", "i386", "i686"}
_ARM = {"aarch64", "arm64", "armv7l", "armv8l"}


@dataclass
class HostInfo:
    arch: str
    cores_logical: int
    cores_usable: int
    ram_mb: int
    cpu: str
    isa: dict[str, bool]
    os: str
    python: str
    emulated: bool
    emulation_evidence: list[str] = field(default_factory=list)
    kernel_arch: str | None = None
    matched_profile: str | None = None

    @property
    def cores(self) -> int:
        return self.cores_usable

    def matches(self, profile) -> bool:
        """Same arch, same usable cores, RAM within 15%: measuring here counts as measuring there.

        An emulated host never matches: its timings say nothing about the device.
        """
        if self.emulated or self.arch != profile.arch or self.cores_usable != profile.cores:
            return False
        return abs(self.ram_mb - profile.ram_mb) <= RAM_TOLERANCE * profile.ram_mb

    def to_dict(self) -> dict:
        data = asdict(self)
        data["int8_features"] = [k for k, v in self.isa.items() if v]
        return data


def read_quietly(path: str) -> str:
    """A small system file (/proc, /sys, /etc) as text; "" when it cannot be read."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


def cpuinfo_fields(text: str) -> dict[str, str]:
    """First value of each key in /proc/cpuinfo."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip().lower()
        if sep and key and key not in out:
            out[key] = value.strip()
    return out


def isa_from_cpuinfo(text: str) -> dict[str, bool]:
    """int8-relevant features from /proc/cpuinfo's x86 'flags' or ARM 'Features' line."""
    info = cpuinfo_fields(text)
    flags = set((info.get("flags", "") + " " + info.get("features", "")).split())
    return {
        "neon": bool(flags & {"asimd", "neon"}),
        "dotprod": "asimddp" in flags,
        "avx2": "avx2" in flags,
        "vnni": bool(flags & {"avx512_vnni", "avx_vnni"}),
        "avx512f": "avx512f" in flags,
    }


def cpu_name_from_cpuinfo(text: str) -> str:
    info = cpuinfo_fields(text)
    if info.get("model name"):
        return info["model name"]
    part = info.get("cpu part", "").lower()
    if part:
        return _ARM_PARTS.get(part, f"ARM part {part}")
    return info.get("hardware") or info.get("model") or platform.processor() or "unknown"


def cpuinfo_family(text: str) -> str | None:
    """'x86' or 'arm' from the shape of /proc/cpuinfo (written by the running kernel), or None."""
    info = cpuinfo_fields(text)
    if "vendor_id" in info or "flags" in info:
        return "x86"
    if "cpu implementer" in info or "features" in info:
        return "arm"
    return None


def _family(machine: str | None) -> str | None:
    if not machine:
        return None
    machine = machine.lower()
    if machine in _X86:
        return "x86"
    if machine in _ARM:
        return "arm"
    return None


def emulation_evidence(machine: str, kernel_arch: str | None, cpuinfo_text: str,
                       binfmt_enabled: bool = False) -> list[str]:
    """Reasons to think we run under QEMU user-mode emulation (empty list: native).

    QEMU user-mode rewrites uname() to the guest arch but leaves the host kernel's files alone, so the
    kernel's own view (/proc/sys/kernel/arch, /proc/cpuinfo) disagrees with platform.machine(). cpuinfo
    alone is not enough: an emulated root is often given an ARM cpuinfo by bind mount (onnxruntime
    crashes on an x86 one), hence kernel.arch first, and binfmt_misc as a last hint.
    """
    reasons = []
    mine = _family(machine)
    kfam = _family(kernel_arch)
    if mine and kfam and mine != kfam:
        reasons.append(f"/proc/sys/kernel/arch is {kernel_arch} but the process reports {machine}")
    cfam = cpuinfo_family(cpuinfo_text)
    if mine and cfam and mine != cfam:
        reasons.append(f"/proc/cpuinfo describes an {cfam} CPU but the process reports {machine}")
    if binfmt_enabled and not reasons and kernel_arch is None:
        reasons.append(f"binfmt_misc has an enabled qemu-{machine} handler for this machine's own arch")
    return reasons


def _binfmt_enabled(machine: str) -> bool:
    text = read_quietly(f"/proc/sys/fs/binfmt_misc/qemu-{machine}")
    return text.splitlines()[0].strip() == "enabled" if text else False


def _ram_mb() -> int:
    m = re.search(r"^MemTotal:\s+(\d+)\s*kB", read_quietly("/proc/meminfo"), re.MULTILINE)
    if m:
        return int(m.group(1)) // 1024
    try:  # not Linux: ask the libc
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // (1024 * 1024)
    except (ValueError, OSError, AttributeError):
        return 0


def _os_name() -> str:
    for path in ("/etc/os-release", "/usr/lib/os-release"):
        m = re.search(r'^PRETTY_NAME="?([^"\n]*)"?', read_quietly(path), re.MULTILINE)
        if m:
            return m.group(1)
    return f"{platform.system()} {platform.release()}".strip()


def detect_host() -> HostInfo:
    """Describe this machine: arch, cores, RAM, CPU, int8 ISA features, OS, and whether it is emulated."""
    machine = platform.machine()
    cpuinfo = read_quietly("/proc/cpuinfo")
    kernel_arch = read_quietly("/proc/sys/kernel/arch").strip() or None
    logical = os.cpu_count() or 1
    try:
        usable = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        usable = logical
    evidence = emulation_evidence(machine, kernel_arch, cpuinfo, _binfmt_enabled(machine))
    host = HostInfo(
        arch=machine,
        cores_logical=logical,
        cores_usable=usable,
        ram_mb=_ram_mb(),
        cpu=cpu_name_from_cpuinfo(cpuinfo),
        isa=isa_from_cpuinfo(cpuinfo),
        os=_os_name(),
        python=sys.version.split()[0],
        emulated=bool(evidence),
        emulation_evidence=evidence,
        kernel_arch=kernel_arch,
    )
    return host


def read_cpuinfo(path: str = "/proc/cpuinfo") -> dict:
    """What doctor reports of the CPU: feature flags, model name, ARM CPU part, processor count."""
    text = read_quietly(path)
    info = cpuinfo_fields(text)
    flags = info.get("flags") or info.get("features") or ""
    return {"flags": flags.split(), "processors": sum(1 for ln in text.splitlines() if ln.startswith("processor")),
            "model": info.get("model name") or info.get("model") or info.get("hardware"),
            **({"cpu_part": info["cpu part"]} if "cpu part" in info else {})}


def host_load() -> float | None:
    """The host's 1-minute load average (None where it cannot be read)."""
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def oversubscribed(loadavg: float | None, cores: int, threads: int = 0) -> bool:
    """The one busy-host test: the others' average demand (the 1-minute load) plus ``threads`` more is over
    the usable cores. With ``threads`` 0: the host was already over its cores (timings made there are
    doubtful: energy.reliability); with a thread count: those threads would wait for cores, and a pool
    that spins while it waits takes them from the work it waits for (runtime.ThreadPolicy)."""
    return loadavg is not None and cores > 0 and loadavg + threads > cores
