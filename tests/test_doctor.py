"""edgetrain doctor: the healthy host, broken environments in a child process, and the aarch64 ArmPL
repair on a real folder with real symlinks to real system libraries."""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from edgetrain.compat import armpl


def run_doctor(*args, pythonpath: Path | None = None, env_extra: dict | None = None, cwd=None):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = str(pythonpath)
    env.update(env_extra or {})
    proc = subprocess.run([sys.executable, "-m", "edgetrain", "doctor", *args], capture_output=True,
                          text=True, env=env, timeout=600, cwd=cwd)
    return proc


def parsed(proc) -> dict:
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout)


def by_name(report: dict) -> dict:
    return {c["name"]: c for c in report["checks"]}


EXPECTED = {"python", "platform", "numpy", "side", "system-libs", "aarch64-armpl", "mxnet-import", "mxnet-compute",
            "mxnet-compat", "onnx", "onnxruntime", "inference", "threads", "isa"}

# A finder ahead of every other that says mxnet does not exist (find_spec and import alike): a device install,
# made of a host's environment. Loaded by a sitecustomize on PYTHONPATH, in the doctor's children too.
NO_MXNET_SITE = """import sys
class _NoMxnet:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "mxnet" or name.startswith("mxnet."):
            raise ModuleNotFoundError("No module named 'mxnet'", name="mxnet")
        return None
sys.meta_path.insert(0, _NoMxnet)
"""


def _mxnet_installed() -> bool:
    import importlib.util

    return importlib.util.find_spec("mxnet") is not None


host_only = pytest.mark.skipif(not _mxnet_installed(), reason="the host side: needs mxnet installed")


@host_only
def test_healthy_host_exits_0_with_json(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    proc = run_doctor("--json", "-", cwd=tmp_path, env_extra={"HOME": str(home)})
    # every library is loaded through edgetrain's door: ONNX Runtime's telemetry wrote nothing in HOME
    assert sorted(p.relative_to(home).as_posix() for p in home.rglob("*")) == []
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = parsed(proc)
    checks = by_name(report)
    assert set(checks) == EXPECTED
    assert report["healthy"] is True and report["exit_code"] == 0
    for c in report["checks"]:
        assert c["status"] in ("ok", "warn"), c
        assert c["message"] and c["fix"]
    assert checks["mxnet-compute"]["details"]["dot_max_abs_err"] < 1e-3
    assert checks["mxnet-compute"]["details"]["potrf_max_abs_err"] < 1e-3
    if platform.machine() == "x86_64":
        assert "not applicable" in checks["aarch64-armpl"]["message"]
    assert report["side"] == "host" and checks["side"]["message"].startswith("host: mxnet is installed")
    # the human report went to stderr, the JSON alone to stdout
    assert "healthy: " in proc.stderr and "failed (host side)" in proc.stderr


def test_a_device_install_is_healthy_and_says_it_is_the_device_side(tmp_path):
    """No mxnet at all (issue 36): healthy, exit 0, the side named, and how to become a host on this Python."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_MXNET_SITE)
    proc = run_doctor("--json", "-", pythonpath=site, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = parsed(proc)
    checks = by_name(report)
    assert set(checks) == EXPECTED and report["healthy"] and report["side"] == "device"
    assert all(c["status"] == "ok" for c in report["checks"]), [c for c in report["checks"] if c["status"] != "ok"]
    assert checks["side"]["message"].startswith("device: no mxnet, none needed")
    assert 'pip install ".[host]"' in checks["side"]["message"] and "edgetrain doctor --fix" in checks["side"]["message"]
    for name in ("mxnet-import", "mxnet-compute", "mxnet-compat", "system-libs", "aarch64-armpl"):
        assert checks[name]["details"]["applicable"] is False, checks[name]
    assert "healthy: " in proc.stderr and "failed (device side)" in proc.stderr and ", device side (" in proc.stderr


def test_fix_installs_mxnet_the_way_pip_can_on_this_python():
    """--fix makes the host: below 3.12 with mxnet's own pins (what `.[host]` adds: pip check stays clean), on
    3.12+ without them (numpy<2 has no wheels there)."""
    from edgetrain.ops import doctor

    cmd = doctor.PIP_MXNET_PINNED if sys.version_info < (3, 12) else doctor.PIP_MXNET
    assert cmd[-1] == "mxnet==1.9.1" and ("--no-deps" in cmd) is (sys.version_info >= (3, 12))
    assert doctor.PIP_RESOLVES_MXNET is (sys.version_info < (3, 12))


@pytest.mark.parametrize("machine", ["armv7l", "armv6l"])
def test_32_bit_arm_is_refused_with_what_to_install(machine):
    from edgetrain.ops.doctor import FAIL, check_platform

    c = check_platform(machine, "32bit")
    assert c.status == FAIL and "32-bit ARM" in c.message and "no onnxruntime or onnx wheels" in c.message
    assert "64-bit Raspberry Pi OS" in c.fix
    assert check_platform("aarch64", "32bit").status == FAIL
    assert check_platform("aarch64", "64bit").status == "ok" and check_platform("x86_64", "64bit").status == "ok"


def test_a_python_older_than_3_10_points_at_conda_forge_and_the_jetson_nano_pin():
    from edgetrain.ops.doctor import FAIL, OK, check_python

    old = check_python((3, 6))   # JetPack 4.6 on a stock Jetson Nano
    assert old.status == FAIL and "3.10 to 3.13" in old.message
    assert "conda-forge" in old.fix and "python=3.11" in old.fix and 'onnxruntime==1.28.0' in old.fix
    assert check_python((3, 10)).status == OK and check_python((3, 14)).status == FAIL


@pytest.mark.compat
@host_only
def test_doctor_reports_the_compatibility_applied_for_this_numpy(tmp_path):
    import numpy

    from edgetrain.compat import numpy_names

    proc = run_doctor("--json", "-", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = by_name(parsed(proc))
    assert checks["numpy"]["status"] == "ok" and numpy.__version__ in checks["numpy"]["message"]
    compat = checks["mxnet-compat"]
    assert compat["status"] == "ok"
    restored = {r["name"]: r["removed_in"] for r in compat["details"]["restored"]}
    assert restored == {a.name: a.removed_in for a in numpy_names.missing(numpy)}
    if restored:    # numpy >= 1.24: say what was restored, by release
        assert "restored for mxnet only" in compat["message"] and all(n in compat["message"] for n in restored)
    else:
        assert "none needed" in compat["message"]
    try:
        import distutils.version  # noqa: F401
        has_distutils = True
    except ImportError:
        has_distutils = False
    assert compat["details"]["distutils_stand_in"] is (not has_distutils)
    assert checks["python"]["status"] == "ok"


@host_only
def test_fix_on_healthy_host_changes_nothing(tmp_path):
    proc = run_doctor("--fix", "--json", str(tmp_path / "doctor.json"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "doctor.json").read_text())
    assert report["fix_requested"] is True
    assert report["fixed"] == []
    assert "healthy: " in proc.stdout


def test_too_old_numpy_fails_with_the_fix(tmp_path):
    fake = tmp_path / "fake"
    (fake / "numpy").mkdir(parents=True)
    (fake / "numpy" / "__init__.py").write_text('__version__ = "1.22.4"\n')
    proc = run_doctor("--json", "-", pythonpath=fake, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = by_name(parsed(proc))
    numpy = checks["numpy"]
    assert numpy["status"] == "fail"
    assert "1.22.4" in numpy["message"] and "1.23.5" in numpy["message"]
    assert 'numpy>=1.23.5' in numpy["fix"]
    # mxnet cannot work with it either, and its fix points back at numpy (on a host: a device has no mxnet)
    if _mxnet_installed():
        assert checks["mxnet-import"]["status"] == "fail"
        assert "numpy" in checks["mxnet-import"]["fix"]


def test_mxnet_not_installed_points_at_doctor_fix(tmp_path):
    fake = tmp_path / "fake"
    (fake / "mxnet").mkdir(parents=True)
    (fake / "mxnet" / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'mxnet\'", name="mxnet")\n')
    proc = run_doctor("--json", "-", pythonpath=fake, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = by_name(parsed(proc))
    imp = checks["mxnet-import"]
    assert imp["status"] == "fail" and "not installed" in imp["message"]
    assert imp["fix"].startswith("edgetrain doctor --fix") and "--no-deps mxnet==1.9.1" in imp["fix"]
    # without the wheel to read, the libraries it will need are checked by name
    assert checks["system-libs"]["details"]["source"].startswith("what the mxnet 1.9.1 wheel links")


def test_system_libraries_missing_give_the_apt_line(tmp_path):
    from edgetrain.ops.doctor import check_system_libs

    empty = tmp_path / "empty"
    empty.mkdir()
    for machine, packages in (("x86_64", "libgomp1 libquadmath0"),
                              ("aarch64", "libgomp1 liblapacke libopenblas0-openmp")):
        check = check_system_libs(machine, None, lib_dirs=[empty], use_cache=False)
        assert check.status == "fail", check
        assert check.fix.endswith(f"apt-get install -y {packages}"), check.fix
        assert all(p in check.message for p in packages.split())
    # present (real libraries under those names): ok, nothing to install
    libs = tmp_path / "lib"
    libs.mkdir()
    for name in ("libgomp.so.1", "libquadmath.so.0"):
        (libs / name).symlink_to(system_lib("libm.so.6"))
    check = check_system_libs("x86_64", None, lib_dirs=[libs], use_cache=False)
    assert check.status == "ok" and check.details["missing"] == []


@host_only
def test_system_libraries_are_read_from_the_installed_wheel():
    from edgetrain.ops.doctor import check_system_libs

    lib = armpl.find_libmxnet()
    check = check_system_libs(platform.machine(), lib)
    assert check.status == "ok", check
    assert check.details["source"] == "read from the wheel's libraries"
    assert "libgomp.so.1" in check.details["checked"]
    bundled = {p.name for p in lib.parent.glob("*.so*")}
    assert not bundled & set(check.details["checked"])    # what the wheel ships is not asked of the system


def test_mxnet_missing_armpl_is_reported_not_crashed(tmp_path):
    fake = tmp_path / "fake"
    (fake / "mxnet").mkdir(parents=True)
    (fake / "mxnet" / "__init__.py").write_text(
        'raise OSError("libarmpl_lp64_mp.so: cannot open shared object file: No such file or directory")\n')
    proc = run_doctor("--json", "-", pythonpath=fake, cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    checks = by_name(parsed(proc))
    imp = checks["mxnet-import"]
    assert imp["status"] == "fail"
    assert "libarmpl_lp64_mp.so" in imp["message"]
    assert imp["details"]["missing_libraries"] == ["libarmpl_lp64_mp.so"]
    assert checks["mxnet-compute"]["status"] == "fail"
    assert checks["numpy"]["status"] == "ok"
    assert checks["onnxruntime"]["status"] == "ok"


def test_native_crash_in_a_library_is_caught(tmp_path):
    fake = tmp_path / "fake"
    (fake / "onnxruntime").mkdir(parents=True)
    # what onnxruntime does under QEMU with the host's x86 /proc/cpuinfo: abort in native code
    (fake / "onnxruntime" / "__init__.py").write_text("import os\nos.abort()\n")
    proc = run_doctor(pythonpath=fake, cwd=tmp_path)
    assert proc.returncode == 1
    line = next(line for line in proc.stdout.splitlines() if "onnxruntime" in line and "FAIL" in line)
    assert "SIGABRT" in line
    assert "healthy" in proc.stdout


def test_bad_thread_setting_fails(tmp_path):
    proc = run_doctor("--json", "-", env_extra={"OMP_NUM_THREADS": "lots"}, cwd=tmp_path)
    assert proc.returncode == 1
    threads = by_name(parsed(proc))["threads"]
    assert threads["status"] == "fail" and "OMP_NUM_THREADS" in threads["message"]


# --- the ArmPL repair on a real folder --------------------------------------------------------------

def system_lib(soname: str) -> Path:
    path = armpl.locate(soname)
    if path is None:
        pytest.skip(f"{soname} not found on this system")
    return path


@pytest.fixture
def fake_site(tmp_path):
    """site/mxnet/libmxnet.so (a stand-in file: DT_NEEDED unreadable, so the wheel's known list applies),
    and a library folder where liblapacke/libopenblas are real ELF libraries under those names."""
    site = tmp_path / "site" / "mxnet"
    site.mkdir(parents=True)
    (site / "libmxnet.so").write_bytes(b"not really libmxnet")
    libm, libc = system_lib("libm.so.6"), system_lib("libc.so.6")
    libs = tmp_path / "lib"
    libs.mkdir()
    for name, real in {"liblapacke.so.3": libm, "libopenblas.so.0": libm,
                       "libm.so.6": libm, "libc.so.6": libc}.items():
        (libs / name).symlink_to(real)
    return site / "libmxnet.so", libs


def test_elf_needed_reads_real_libraries():
    libm = system_lib("libm.so.6")
    assert "libc.so.6" in armpl.elf_needed(libm)
    with pytest.raises(ValueError):
        armpl.elf_needed(Path(__file__))


@host_only
def test_installed_mxnet_needs_no_armpl_on_x86():
    lib = armpl.find_libmxnet()
    assert lib is not None and lib.name == "libmxnet.so"
    if platform.machine() != "x86_64":
        pytest.skip("the x86-64 wheel is the one without ArmPL")
    p = armpl.plan(lib)
    assert p.needed == [] and p.ok and p.links == []


def test_repair_links_idempotently_and_atomically(fake_site):
    libmxnet, libs = fake_site
    folder = libmxnet.parent
    p = armpl.plan(libmxnet, lib_dirs=[libs], use_cache=False)
    assert p.needed_from == "known"
    assert p.needed == ["libarmpl_lp64_mp.so", "libamath.so", "libastring.so"]
    assert p.fixable and not p.ok
    assert {link.name: link.target for link in p.links} == {
        "libarmpl_lp64_mp.so": libs / "liblapacke.so.3",
        "libamath.so": libs / "libm.so.6",
        "libastring.so": libs / "libc.so.6",
    }

    changed = armpl.apply(p)
    assert [link.name for link in changed] == ["libarmpl_lp64_mp.so", "libamath.so", "libastring.so"]
    for link in changed:
        assert link.path.is_symlink() and link.path.exists()
        assert os.readlink(link.path) == str(link.target)
    assert os.path.realpath(folder / "libamath.so") == os.path.realpath(system_lib("libm.so.6"))
    assert sorted(p.name for p in folder.iterdir()) == [
        "libamath.so", "libarmpl_lp64_mp.so", "libastring.so", "libmxnet.so"]   # no temp files left

    before = {p.name: os.lstat(p) for p in folder.iterdir()}
    again = armpl.plan(libmxnet, lib_dirs=[libs], use_cache=False)
    assert again.ok and again.links == [] and set(again.satisfied) == set(again.needed)
    assert armpl.apply(again) == []
    assert armpl.apply(p) == []          # re-applying the old plan is a no-op too
    after = {p.name: os.lstat(p) for p in folder.iterdir()}
    assert {k: (v.st_ino, v.st_mtime_ns) for k, v in before.items()} == \
           {k: (v.st_ino, v.st_mtime_ns) for k, v in after.items()}


def test_repair_replaces_a_dangling_link_and_keeps_a_real_library(fake_site):
    libmxnet, libs = fake_site
    folder = libmxnet.parent
    (folder / "libamath.so").symlink_to(folder / "gone.so")            # dangling: must be replaced
    (folder / "libastring.so").write_bytes(b"a real ArmPL library")   # present: must be left alone
    p = armpl.plan(libmxnet, lib_dirs=[libs], use_cache=False)
    assert [link.name for link in p.links] == ["libarmpl_lp64_mp.so", "libamath.so"]
    assert p.satisfied == {"libastring.so": str(folder / "libastring.so")}
    armpl.apply(p)
    assert os.readlink(folder / "libamath.so") == str(libs / "libm.so.6")
    assert (folder / "libastring.so").read_bytes() == b"a real ArmPL library"


def test_missing_debian_packages_give_the_apt_command_and_change_nothing(fake_site):
    libmxnet, libs = fake_site
    (libs / "liblapacke.so.3").unlink()
    (libs / "libopenblas.so.0").unlink()
    p = armpl.plan(libmxnet, lib_dirs=[libs], use_cache=False)
    assert p.missing_libs == ["liblapacke.so.3", "libopenblas.so.0"]
    assert p.missing_packages == ["liblapacke", "libopenblas0-openmp"]
    assert not p.fixable
    assert p.apt_command().endswith("apt-get install -y liblapacke libopenblas0-openmp")
    with pytest.raises(ValueError):
        armpl.apply(p)
    assert sorted(x.name for x in libmxnet.parent.iterdir()) == ["libmxnet.so"]


def test_doctor_armpl_check_not_applicable_off_arm():
    from edgetrain.ops.doctor import check_armpl

    check, plan = check_armpl("x86_64", armpl.find_libmxnet())
    assert check.status == "ok" and "not applicable" in check.message and plan is None


def test_blas_behind_lapacke_follows_the_alternatives_links(tmp_path):
    real = tmp_path / "openblas-openmp"
    real.mkdir()
    (real / "libblas.so.3").symlink_to(system_lib("libm.so.6"))
    alternatives = tmp_path / "etc-alternatives-libblas"
    alternatives.symlink_to(real / "libblas.so.3")
    libs = tmp_path / "lib"
    libs.mkdir()
    (libs / "libblas.so.3").symlink_to(alternatives)
    found = armpl.blas_behind_lapacke(lib_dirs=[libs], use_cache=False)
    assert found["libblas.so.3"] == os.path.realpath(system_lib("libm.so.6"))
    assert found["liblapack.so.3"] is None
