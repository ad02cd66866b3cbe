"""Device profiles, size parsing and host detection, on the real bundled files and this machine."""
from __future__ import annotations

import os
import platform

import pytest
import yaml

from edgetrain.config import DeviceProfile
from edgetrain.devices import bundled_names, list_profiles, load_device, match_profile
from edgetrain.options import parse_size
from edgetrain.host import detect_host, emulation_evidence, isa_from_cpuinfo
from edgetrain.errors import UsageError

EXPECTED = {"rpi3bplus", "rpi4b-4gb", "rpi5-8gb", "rpi-zero2w", "jetson-nano-5w", "jetson-nano-10w",
            "x86-64-generic"}


def test_every_bundled_profile_loads_and_validates():
    profiles = list_profiles()
    assert {p.name for p in profiles} == EXPECTED == set(bundled_names())
    for p in profiles:
        assert isinstance(p, DeviceProfile)
        assert 1 <= p.default_threads <= p.cores
        assert p.memory_budget_mb <= p.ram_mb - p.os_reserve_mb
        assert 0 < p.power.idle_w.value <= p.power.load_w.value
        for fig in (p.power.idle_w, p.power.load_w):
            # every figure says where it came from; estimates say so in the source text
            assert len(fig.source) > 40
            if fig.kind == "estimate":
                assert "ESTIMATE" in fig.source
        if p.speed.method == "reference_latency":
            ref = p.speed.reference
            assert ref is not None and ref.latency_ms > 0
            assert 1 <= ref.threads <= p.cores  # the device must be able to run the reference thread count
            assert len(ref.source) > 40
        assert p.to_dict()["name"] == p.name


def test_isa_facts_for_int8():
    by = {p.name: p for p in list_profiles()}
    assert by["rpi5-8gb"].isa.dotprod and by["rpi5-8gb"].isa.neon  # Cortex-A76 has SDOT/UDOT
    for name in ("rpi3bplus", "rpi4b-4gb", "rpi-zero2w", "jetson-nano-5w", "jetson-nano-10w"):
        assert by[name].isa.neon and not by[name].isa.dotprod, name  # A53/A57/A72: ARMv8.0
    assert by["x86-64-generic"].arch == "x86_64" and by["x86-64-generic"].speed.method == "host"
    assert by["jetson-nano-5w"].cores == 2  # nvpmodel 5W mode takes two cores offline


def test_load_device_by_name_and_path(tmp_path):
    assert load_device("rpi4b-4gb").ram_mb == 4096
    src = load_device("rpi5-8gb").to_dict()
    src["name"] = "my-board"
    path = tmp_path / "my-board.yaml"
    path.write_text(yaml.safe_dump(src))
    assert load_device(str(path)).name == "my-board"


def test_unknown_device_lists_the_names():
    with pytest.raises(UsageError) as info:
        load_device("rpi9")
    assert info.value.exit_code == 2
    assert "rpi9" in info.value.line() and "rpi4b-4gb" in info.value.line()


@pytest.mark.parametrize("text,expected", [
    ("512MB", 512 * 2**20), ("2GiB", 2 * 2**30), ("1.5G", int(1.5 * 2**30)), ("300m", 300 * 2**20),
    ("64k", 64 * 1024), ("1048576", 1048576), (" 1 GB ", 2**30), ("1gib", 2**30),
])
def test_parse_size_good(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "abc", "12XB", "-5MB", "1.2.3G", "0", "0MB", "iB", "5 i"])
def test_parse_size_bad(text):
    with pytest.raises(UsageError) as info:
        parse_size(text, "--memory-budget")
    assert info.value.exit_code == 2 and "--memory-budget" in info.value.line()


def test_detect_host_describes_this_machine():
    host = detect_host()
    assert host.arch == platform.machine()
    assert host.cores_usable == len(os.sched_getaffinity(0))
    assert host.cores_logical >= host.cores_usable >= 1
    assert host.ram_mb > 0
    assert host.python == platform.python_version()
    d = host.to_dict()
    assert d["arch"] == platform.machine() and isinstance(d["emulated"], bool)


def test_matches_needs_arch_cores_and_ram_within_15_percent():
    host = detect_host()
    profile = load_device("x86-64-generic")
    fitted = profile.model_copy(update={"arch": host.arch, "cores": host.cores_usable,
                                        "ram_mb": host.ram_mb, "default_threads": 1})
    assert host.matches(fitted) == (not host.emulated)
    assert not host.matches(fitted.model_copy(update={"ram_mb": int(host.ram_mb * 1.3)}))
    assert not host.matches(fitted.model_copy(update={"cores": host.cores_usable + 1}))
    assert match_profile(host, [fitted]) in (fitted, None)


X86_CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Xeon\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n"
ARM_CPUINFO = ("processor\t: 0\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm aes crc32 asimddp\n"
               "CPU implementer\t: 0x41\nCPU part\t: 0xd0b\n")


def test_isa_from_cpuinfo_text():
    assert isa_from_cpuinfo(X86_CPUINFO) == {"neon": False, "dotprod": False, "avx2": True, "vnni": True,
                                             "avx512f": True}
    arm = isa_from_cpuinfo(ARM_CPUINFO)
    assert arm["neon"] and arm["dotprod"] and not arm["avx2"]


def test_emulation_evidence():
    assert emulation_evidence("x86_64", "x86_64", X86_CPUINFO) == []
    assert emulation_evidence("aarch64", "aarch64", ARM_CPUINFO) == []
    # QEMU user-mode: uname says aarch64, the host kernel says x86_64 (even with an ARM cpuinfo bind-mounted)
    assert emulation_evidence("aarch64", "x86_64", ARM_CPUINFO)
    assert emulation_evidence("aarch64", None, X86_CPUINFO)
    assert emulation_evidence("aarch64", None, ARM_CPUINFO, binfmt_enabled=True)
