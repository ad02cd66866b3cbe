"""`edgetrain doctor`: check the installation, say what is wrong and how to fix it.

Every library that can fail to load (numpy, mxnet, onnx, onnxruntime) is imported in a child process,
so a missing shared library (the aarch64 mxnet wheel's ArmPL), a crash in native code (onnxruntime's
CPU detection under emulation) or a wrong version is reported instead of taking doctor down with it.
The parent imports none of them.
"""
from __future__ import annotations

import importlib.util
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .. import envvars, runtime
from ..child import python_c
from ..compat import armpl
from ..host import detect_host, read_cpuinfo
from ..results import EXIT_FAILED, EXIT_OK, Result

OK, WARN, FAIL = "ok", "warn", "fail"
NOTHING = "nothing to do"
MXNET_PIN = "mxnet==1.9.1"
NUMPY_MIN = (1, 23, 5)
SUPPORTED_PYTHON = ((3, 10), (3, 11), (3, 12), (3, 13))
# mxnet installed without its dependencies: its metadata pins numpy<2.0, which has no wheels for Python >=
# 3.12; of the others it imports only requests (graphviz is optional), installed first when missing.
PIP_MXNET = [sys.executable, "-m", "pip", "install", "--no-deps", MXNET_PIN]
# Below Python 3.12 pip installs it with its own pins (numpy<2 has wheels there): what `.[host]` adds.
PIP_MXNET_PINNED = [sys.executable, "-m", "pip", "install", MXNET_PIN]
# pyproject.toml's floors: 1.28.0 (the last manylinux_2_27 aarch64 wheel: a stock Jetson Nano), 1.23.2 on Python
# 3.10 (the last release with its wheels: JetPack 6)
ORT_FLOOR = "1.28.0" if sys.version_info >= (3, 11) else "1.23.2"
PIP_REQUESTS = [sys.executable, "-m", "pip", "install", "requests>=2.20"]
# Where pip installs mxnet with its own metadata (numpy<2 has wheels): the host extra, `pip install ".[host]"`.
PIP_RESOLVES_MXNET = sys.version_info < (3, 12)
HOST, DEVICE = "host", "device"
# No onnxruntime or onnx wheels exist for 32-bit ARM (Raspberry Pi OS 32-bit, armv7l/armv6l).
ARM32 = ("armv7l", "armv6l", "armv7", "armv8l", "arm")
# Debian packages that provide the system libraries the mxnet wheels link (and do not bundle).
SYSTEM_PACKAGES = {
    "libgomp.so.1": "libgomp1", "libquadmath.so.0": "libquadmath0", "libgfortran.so.5": "libgfortran5",
    "libopenblas.so.0": "libopenblas0-openmp", "liblapacke.so.3": "liblapacke",
    "libstdc++.so.6": "libstdc++6", "libgcc_s.so.1": "libgcc-s1",
}
# What each wheel links from the system, for when mxnet is not installed yet to read it from (1.9.1).
WHEEL_SYSTEM_LIBS = {
    "x86_64": ("libgomp.so.1", "libquadmath.so.0"),
    "aarch64": ("libgomp.so.1", "libopenblas.so.0", "liblapacke.so.3"),
}
# Under QEMU a child importing mxnet takes tens of seconds; on a Pi Zero 2 W about as long.
PROBE_TIMEOUT = float(envvars.get("EDGETRAIN_DOCTOR_TIMEOUT", "600"))

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "MXNET_OMP_MAX_THREADS",
               "MXNET_CPU_WORKER_NTHREADS", "MXNET_CPU_PRIORITY_NTHREADS", "MXNET_MP_WORKER_NTHREADS")

# ISA features that change which kernels run. x86: /proc/cpuinfo "flags"; ARM: "Features".
ISA_KEYS = {
    "x86_64": ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512_vnni", "avx_vnni"),
    "aarch64": ("asimd", "fphp", "asimdhp", "asimddp", "i8mm", "bf16", "sve"),
}

# The probes run as `python -P -c PROBE NAME` and print one JSON line.
PROBE = r'''
import json, sys, time
name = sys.argv[1]
out = {"name": name}
def done():
    print("EDGETRAIN-PROBE " + json.dumps(out), flush=True)
    sys.exit(0)
t0 = time.time()
try:
    from edgetrain import _lazy   # the one door: thread cap, numpy/Python compatibility, no telemetry
    if name == "numpy":
        import numpy
        out["version"] = numpy.__version__
        out["file"] = numpy.__file__
    elif name == "mxnet":
        from edgetrain.compat import numpy_names
        try:
            mx = _lazy.mxnet()
        finally:
            if numpy_names.applied() is not None:
                out["compat"] = numpy_names.applied().to_dict()
                out["compat_text"] = numpy_names.applied().describe()
        out["version"] = mx.__version__
        out["file"] = mx.__file__
        out["import_s"] = round(time.time() - t0, 2)
        try:
            feats = mx.runtime.Features()
            out["features"] = sorted(k for k in ("BLAS_OPEN", "BLAS_MKL", "BLAS_APPLE", "LAPACK", "MKLDNN",
                                               "OPENMP", "DIST_KVSTORE", "INT8") if feats.is_enabled(k))
        except Exception as exc:  # features are informative only
            out["features_error"] = repr(exc)
        import numpy as np
        rng = np.random.RandomState(0)
        a = rng.uniform(-1, 1, (48, 32)).astype("float32")
        b = rng.uniform(-1, 1, (32, 40)).astype("float32")
        got = mx.nd.dot(mx.nd.array(a), mx.nd.array(b)).asnumpy()   # BLAS (cblas_sgemm)
        out["dot_max_abs_err"] = float(np.abs(got - a.dot(b)).max())
        spd = a.T.dot(a) + 32 * np.eye(32, dtype="float32")
        chol = mx.nd.linalg.potrf(mx.nd.array(spd)).asnumpy()        # LAPACK (spotrf)
        out["potrf_max_abs_err"] = float(np.abs(chol - np.linalg.cholesky(spd)).max())
    elif name == "onnx":
        onnx = _lazy.onnx()
        TensorProto, helper = _lazy.from_import("onnx", "TensorProto", "helper")
        out["version"] = onnx.__version__
        node = helper.make_node("MatMul", ["a", "b"], ["y"])
        graph = helper.make_graph([node], "doctor",
                                  [helper.make_tensor_value_info("a", TensorProto.FLOAT, [2, 3]),
                                   helper.make_tensor_value_info("b", TensorProto.FLOAT, [3, 4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])])
        onnx.checker.check_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    elif name == "onnxruntime":
        ort = _lazy.onnxruntime()
        out["version"] = ort.__version__
        out["providers"] = ort.get_available_providers()
        try:
            import numpy as np
            TensorProto, helper = _lazy.from_import("onnx", "TensorProto", "helper")
        except Exception as exc:
            out["compute_skipped"] = repr(exc)
        else:
            node = helper.make_node("MatMul", ["a", "b"], ["y"])
            graph = helper.make_graph([node], "doctor",
                                      [helper.make_tensor_value_info("a", TensorProto.FLOAT, [8, 16]),
                                       helper.make_tensor_value_info("b", TensorProto.FLOAT, [16, 4])],
                                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 4])])
            model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
            model.ir_version = 7
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
            rng = np.random.RandomState(0)
            a = rng.uniform(-1, 1, (8, 16)).astype("float32")
            b = rng.uniform(-1, 1, (16, 4)).astype("float32")
            (got,) = sess.run(None, {"a": a, "b": b})
            out["matmul_max_abs_err"] = float(np.abs(got - a.dot(b)).max())
except BaseException as exc:
    exc = exc.__cause__ or exc   # edgetrain's one-line error keeps the library's own as its cause
    out["error_type"] = type(exc).__name__
    out["error"] = str(exc)
out["seconds"] = round(time.time() - t0, 2)
done()
'''

_MISSING_LIB = re.compile(r"([\w.+-]+\.so[\w.]*): cannot open shared object file")


@dataclass
class Check:
    name: str
    status: str
    message: str
    fix: str = NOTHING
    details: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "message": self.message, "fix": self.fix,
                "details": self.details}


@dataclass
class DoctorReport(Result):
    checked: list[Check]  # its JSON key is "checks" (the name ``Result.checks()`` has)
    fix_requested: bool = False
    fixed: list[dict] = field(default_factory=list)
    machine: str = field(default_factory=platform.machine)
    side: str = ""  # "host" (mxnet installed: Gluon -> ONNX) or "device" (ONNX files only)

    def checks(self) -> list[str]:
        return [f"check '{c.name}' failed: {c.message}" for c in self.checked if c.status == FAIL]

    @property
    def healthy(self) -> bool:
        return self.passed

    @property
    def exit_code(self) -> int:
        # doctor's exit code is older than the contract's 3 for a failed check: scripts and CI read 1 as
        # "not healthy" (`edgetrain doctor || ...`), so it stays 1
        return EXIT_OK if self.healthy else EXIT_FAILED

    def check(self, name: str) -> Check | None:
        return next((c for c in self.checked if c.name == name), None)

    def counts(self) -> dict[str, int]:
        return {s: sum(c.status == s for c in self.checked) for s in (OK, WARN, FAIL)}

    def to_dict(self) -> dict:
        return {
            "healthy": self.healthy,
            "exit_code": self.exit_code,
            "machine": self.machine,
            "side": self.side,
            "python": platform.python_version(),
            "executable": sys.executable,
            "counts": self.counts(),
            "fix_requested": self.fix_requested,
            "fixed": self.fixed,
            "checks": [c.to_dict() for c in self.checked],
            "passed": self.passed,
            "failed_checks": self.failed_checks,
        }


# --- probes -----------------------------------------------------------------------------------------

def probe(name: str, timeout: float | None = None) -> dict:
    """Import one library in a child Python and return what it reported (or how it died)."""
    cmd = python_c(PROBE, name)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout or PROBE_TIMEOUT,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return {"name": name, "error_type": "Timeout",
                "error": f"the child importing {name} did not finish in {timeout or PROBE_TIMEOUT:.0f} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("EDGETRAIN-PROBE "):
            try:
                return json.loads(line[len("EDGETRAIN-PROBE "):])
            except json.JSONDecodeError:
                break
    if proc.returncode < 0:
        try:
            sig = signal.Signals(-proc.returncode).name
        except ValueError:
            sig = f"signal {-proc.returncode}"
        what = f"the child importing {name} was killed by {sig}"
    else:
        what = f"the child importing {name} exited {proc.returncode} without a report"
    tail = (proc.stderr.strip().splitlines() or [""])[-1][:300]
    return {"name": name, "error_type": "Crash", "error": what + (f": {tail}" if tail else ""),
            "returncode": proc.returncode}


def ldd_missing(lib: Path) -> list[str]:
    """Libraries `ldd` reports as 'not found' for ``lib`` ([] when ldd is unavailable)."""
    exe = shutil.which("ldd")
    if not exe or not lib.exists():
        return []
    try:
        out = subprocess.run([exe, str(lib)], capture_output=True, text=True, timeout=120).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted({line.split("=>")[0].strip() for line in out.splitlines() if "not found" in line})


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for piece in text.split(".")[:3]:
        m = re.match(r"\d+", piece)
        if not m:
            break
        parts.append(int(m.group()))
    return tuple(parts)


# --- checks -----------------------------------------------------------------------------------------

def check_python(version: tuple[int, int] | None = None) -> Check:
    v = version or sys.version_info[:2]
    text = platform.python_version() if version is None else "%d.%d" % version
    details = {"version": text, "executable": sys.executable}
    if tuple(v) in SUPPORTED_PYTHON:
        return Check("python", OK, f"Python {text}", details=details)
    if tuple(v) < SUPPORTED_PYTHON[0]:
        return Check("python", FAIL,
                     f"Python {text} is older than edgetrain supports (3.10 to 3.13); a stock Jetson Nano (JetPack 4, "
                     "Python 3.6) needs a newer Python beside the system's",
                     "install Miniforge (conda-forge), make a Python 3.11 environment (conda create -n edgetrain "
                     "python=3.11) and in it: pip install . \"onnxruntime==1.28.0\" (README, Jetson Nano)", details)
    return Check("python", FAIL,
                 f"Python {text}: edgetrain supports 3.10 to 3.13 (mxnet 1.9.1 and the onnxruntime wheels are not "
                 "tested on others)",
                 "install Python 3.13 (Raspberry Pi OS / Debian trixie) or 3.11 (bookworm) and reinstall "
                 "edgetrain in a venv of it", details)


def check_platform(machine: str, bits: str | None = None) -> Check:
    """32-bit ARM has no onnxruntime or onnx wheels: say so, with what to install instead."""
    details = {"machine": machine, "bits": bits or platform.architecture()[0]}
    if machine in ARM32 or (machine.startswith("armv") and not machine.startswith("armv8")):
        return Check("platform", FAIL,
                     f"{machine} is 32-bit ARM (32-bit Raspberry Pi OS): no onnxruntime or onnx wheels exist for it "
                     "(nor mxnet's), so no edgetrain command can run here",
                     "install the 64-bit Raspberry Pi OS (aarch64: every Pi from the 3 and the Zero 2 W runs it), then "
                     "edgetrain in a venv there (README, Supported platforms)", details)
    if machine in ("aarch64", "arm64") and details["bits"] == "32bit":
        return Check("platform", FAIL, "a 32-bit Python on a 64-bit ARM kernel: no onnxruntime or onnx wheels exist "
                     "for it", "use the 64-bit Raspberry Pi OS's own Python (a 64-bit userland)", details)
    return Check("platform", OK, f"{machine} ({details['bits']})", details=details)


def _host_how() -> str:
    """How a device install becomes a host (mxnet for export and Gluon models), on this Python."""
    if PIP_RESOLVES_MXNET:
        return f'pip install ".[host]" in the edgetrain checkout, or edgetrain doctor --fix (both: pip install {MXNET_PIN})'
    return 'pip install ".[host]" && edgetrain doctor --fix (installs mxnet 1.9.1 without its numpy<2 pin)'


def check_side(side: str) -> Check:
    """Which side this install is: the host (mxnet: Gluon -> ONNX) or a device (ONNX files only)."""
    details = {"side": side, "mxnet_installed": side == HOST}
    if side == HOST:
        return Check("side", OK, "host: mxnet is installed (export, Gluon models) beside every device command",
                     details=details)
    return Check("side", OK, "device: no mxnet, none needed (finetune, quantize, predict, profile, energy and fleet join "
                 f"from ONNX files); for the host side (export, Gluon models): {_host_how()}", details=details)


def _not_on_a_device(name: str) -> Check:
    return Check(name, OK, "not applicable: a device install has no mxnet (see 'side')",
                 details={"applicable": False, "side": DEVICE})


def check_numpy(result: dict) -> Check:
    if "error" in result:
        return Check("numpy", FAIL, f"numpy does not import: {result['error_type']}: {result['error']}",
                     'pip install --force-reinstall "numpy>=1.23.5"', result)
    version = result.get("version", "?")
    details = {"version": version, "file": result.get("file")}
    if _version_tuple(version) < NUMPY_MIN:
        return Check("numpy", FAIL, f"numpy {version} is older than edgetrain supports (1.23.5 to 2.x)",
                     'pip install "numpy>=1.23.5"', details)
    return Check("numpy", OK, f"numpy {version} (edgetrain supports 1.23.5 to 2.x; what mxnet 1.9.1 reads "
                 "and newer numpy removed is restored for mxnet alone: see mxnet-compat)", details=details)


def check_compat(result: dict) -> Check:
    """Which compatibility the mxnet door applied for this numpy and Python (informative)."""
    compat = result.get("compat")
    if compat is None:
        return Check("mxnet-compat", WARN, "not known: the mxnet probe did not reach the compatibility layer",
                     "see mxnet-import", details={})
    return Check("mxnet-compat", OK, result.get("compat_text") or "applied", details=compat)


def check_system_libs(machine: str, libmxnet: Path | None, lib_dirs: list[Path] | None = None,
                      use_cache: bool = True) -> Check:
    """The system libraries the mxnet wheel links and does not bundle, with the apt line when missing."""
    arch = "aarch64" if machine in ("aarch64", "arm64") else machine
    bundled: set[str] = set()
    if libmxnet is not None and libmxnet.exists():
        wanted: list[str] = []
        for lib in [libmxnet, *sorted(libmxnet.parent.glob("*.so*"))]:
            bundled.add(lib.name)
            try:
                wanted += [n for n in armpl.elf_needed(lib) if n not in wanted]
            except (OSError, ValueError):
                continue
        source = "read from the wheel's libraries"
    else:
        wanted = list(WHEEL_SYSTEM_LIBS.get(arch, ()))
        source = "what the mxnet 1.9.1 wheel links; mxnet is not installed yet"
    checked = [n for n in wanted if n in SYSTEM_PACKAGES and n not in bundled]
    missing = [n for n in checked if armpl.locate(n, lib_dirs, use_cache) is None]
    details = {"checked": checked, "missing": missing, "source": source}
    if not missing:
        return Check("system-libs", OK, f"{', '.join(checked) or 'none needed'} found ({source})",
                     details=details)
    packages = sorted({SYSTEM_PACKAGES[n] for n in missing})
    details["packages"] = packages
    sudo = "" if os.geteuid() == 0 else "sudo "
    return Check("system-libs", FAIL, f"the mxnet wheel needs {', '.join(missing)}, not installed "
                 f"(Debian/Raspberry Pi OS packages {', '.join(packages)})",
                 f"{sudo}apt-get install -y {' '.join(packages)}", details)


def check_armpl(machine: str, libmxnet: Path | None) -> tuple[Check, armpl.Plan | None]:
    name = "aarch64-armpl"
    if machine not in ("aarch64", "arm64"):
        return Check(name, OK, f"not applicable on {machine} (only the aarch64 mxnet wheel needs ArmPL)",
                     details={"applicable": False}), None
    if libmxnet is None:
        return Check(name, WARN, "mxnet is not installed, so its libraries cannot be checked",
                     "edgetrain doctor --fix", {"applicable": True}), None
    p = armpl.plan(libmxnet)
    details = {"applicable": True, **p.to_dict()}
    if p.ok:
        how = ", ".join(f"{k} -> {os.path.realpath(v)}" for k, v in p.satisfied.items()) or "none needed"
        check = Check(name, OK, f"ARM Performance Libraries resolved ({how})", details=details)
        via_lapacke = os.path.realpath(p.satisfied.get("libarmpl_lp64_mp.so", "")).find("lapacke") >= 0
        if via_lapacke:
            blas = armpl.blas_behind_lapacke()
            details["blas"] = blas
            slow = [k for k, v in blas.items() if v and "openblas" not in v]
            if slow:
                check.status = WARN
                check.message += f"; but {', '.join(slow)} resolve to the reference BLAS/LAPACK (slow)"
                check.fix = ("select OpenBLAS: update-alternatives --config libblas.so.3-aarch64-linux-gnu "
                             "(and liblapack.so.3-aarch64-linux-gnu)")
        return check, p
    names = ", ".join(p.needed if not p.satisfied else [n for n in p.needed if n not in p.satisfied])
    if p.missing_packages:
        return Check(name, FAIL, f"libmxnet.so needs {names}, not shipped in the mxnet wheel; the stand-ins "
                     f"({', '.join(p.missing_libs)}) are not installed",
                     f"{p.apt_command()} && edgetrain doctor --fix", details), p
    return Check(name, FAIL, f"libmxnet.so needs {names}, not shipped in the mxnet wheel",
                 "edgetrain doctor --fix (links OpenBLAS+LAPACKE, libm and libc under those names beside "
                 "libmxnet.so)", details), p


def check_mxnet(result: dict, libmxnet: Path | None, machine: str) -> list[Check]:
    if "error" in result:
        err = f"{result['error_type']}: {result['error']}"
        if result["error_type"] == "ModuleNotFoundError" and libmxnet is None:
            fail = Check("mxnet-import", FAIL, "mxnet is not installed (on Python >= 3.12 pip cannot install "
                         "it with the numpy<2 pin in its metadata, so edgetrain installs it without)",
                         "edgetrain doctor --fix (runs: pip install --no-deps mxnet==1.9.1)", result)
        else:
            missing = sorted(set(_MISSING_LIB.findall(result["error"])) |
                             set(ldd_missing(libmxnet) if libmxnet else []))
            details = {**result, "missing_libraries": missing, "libmxnet": str(libmxnet) if libmxnet else None}
            module = re.match(r"No module named '([\w.]+)'", result["error"]) \
                if result["error_type"] == "ModuleNotFoundError" else None
            if module and not missing:
                name = module.group(1).split(".")[0]
                message = f"mxnet does not import: it needs the Python package {name}, not installed ({err})"
                fix = f"pip install {name}"
            elif missing:
                message = f"mxnet does not import: missing {', '.join(missing)} ({err})"
                armpl_names = [m for m in missing if m in armpl.STAND_INS]
                fix = ("edgetrain doctor --fix" if armpl_names and machine in ("aarch64", "arm64")
                       else f"install the package that provides {', '.join(missing)}")
            else:
                message = f"mxnet does not import ({err})"
                fix = "reinstall: pip install --force-reinstall --no-deps mxnet==1.9.1"
            fail = Check("mxnet-import", FAIL, message, fix, details)
        return [fail, Check("mxnet-compute", FAIL, "not run: mxnet does not import", fail.fix)]
    version = result.get("version", "?")
    imp = Check("mxnet-import", OK, f"mxnet {version} imports in {result.get('import_s', '?')} s",
                details={k: result.get(k) for k in ("version", "file", "import_s", "features")})
    if version != "1.9.1":
        imp.status, imp.fix = WARN, 'pip install "mxnet==1.9.1"'
        imp.message += " (edgetrain is tested with 1.9.1)"
    dot, potrf = result.get("dot_max_abs_err"), result.get("potrf_max_abs_err")
    details = {"dot_max_abs_err": dot, "potrf_max_abs_err": potrf, "tolerance": 1e-3}
    if dot is None or potrf is None:
        comp = Check("mxnet-compute", FAIL, "mxnet imported but the compute check did not run",
                     "reinstall: pip install --force-reinstall --no-deps mxnet==1.9.1", details)
    elif dot <= 1e-3 and potrf <= 1e-3:
        comp = Check("mxnet-compute", OK, f"dot (BLAS) and potrf (LAPACK) match numpy (max abs error "
                     f"{max(dot, potrf):.1e})", details=details)
    else:
        comp = Check("mxnet-compute", FAIL, f"mxnet computes wrong results: max abs error dot {dot:.2e}, "
                     f"potrf {potrf:.2e} (tolerance 1e-3)",
                     "check which BLAS libmxnet.so loads (ldd libmxnet.so); on aarch64 reinstall "
                     "libopenblas0-openmp and run edgetrain doctor --fix", details)
    return [imp, comp]


def check_onnx(result: dict) -> Check:
    if "error" in result:
        return Check("onnx", FAIL, f"onnx does not import: {result['error_type']}: {result['error']}",
                     'pip install --force-reinstall "onnx>=1.15"', result)
    return Check("onnx", OK, f"onnx {result.get('version')} builds and checks a model",
                 details={"version": result.get("version")})


def check_onnxruntime(result: dict, emulated: bool) -> Check:
    if "error" in result:
        fix = f'pip install --force-reinstall "onnxruntime>={ORT_FLOOR}"'
        if result.get("error_type") == "Crash" and emulated:
            fix = ("under QEMU, bind-mount an ARM /proc/cpuinfo into the root (tools/arm64/cpuinfo); "
                   "onnxruntime's CPU detection crashes on the host's")
        return Check("onnxruntime", FAIL,
                     f"onnxruntime does not work: {result['error_type']}: {result['error']}", fix, result)
    details = {k: result.get(k) for k in ("version", "providers", "matmul_max_abs_err", "compute_skipped")}
    err = result.get("matmul_max_abs_err")
    if err is not None and err > 1e-4:
        return Check("onnxruntime", FAIL, f"onnxruntime MatMul differs from numpy by {err:.2e}",
                     f'pip install --force-reinstall "onnxruntime>={ORT_FLOOR}"', details)
    extra = f", MatMul matches numpy ({err:.1e})" if err is not None else ""
    return Check("onnxruntime", OK, f"onnxruntime {result.get('version')} runs{extra}", details=details)


# A tiny fp32 and int8 (QDQ, fused by ONNX Runtime into its int8 kernels) inference, in a child: a wheel
# built for instructions this CPU lacks dies with SIGILL there (onnxruntime 1.21 on a Pi 4: #23957, #24512),
# only once the int8 or fp32 kernels run, which importing it does not show.
INFERENCE_PROBE = r'''
import json, sys
import numpy as np
from edgetrain import _lazy   # the one door: ONNX Runtime's telemetry writes nothing in HOME
ort = _lazy.onnxruntime()
from onnx import TensorProto, helper, numpy_helper
rng = np.random.RandomState(0)
w = rng.uniform(-1, 1, (8, 4, 3, 3)).astype(np.float32)
m = rng.uniform(-1, 1, (8, 5)).astype(np.float32)
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4, 8, 8])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5])
def model(int8):
    init = [numpy_helper.from_array(m, "m")]
    if int8:
        ws = np.abs(w).max() / 127
        init += [numpy_helper.from_array(np.round(w / ws).astype(np.int8), "wq"),
                 numpy_helper.from_array(np.array(ws, np.float32), "ws"), numpy_helper.from_array(np.array(0, np.int8), "wz"),
                 numpy_helper.from_array(np.array(0.02, np.float32), "s"), numpy_helper.from_array(np.array(128, np.uint8), "z")]
        nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"]),
                 helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"]),
                 helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"]),
                 helper.make_node("Conv", ["xd", "w"], ["c"], pads=[1, 1, 1, 1]),
                 helper.make_node("QuantizeLinear", ["c", "s", "z"], ["cq"]),
                 helper.make_node("DequantizeLinear", ["cq", "s", "z"], ["cd"])]
        last = "cd"
    else:
        init.append(numpy_helper.from_array(w, "w"))
        nodes, last = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1])], "c"
    nodes += [helper.make_node("Relu", [last], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["g"]),
              helper.make_node("Flatten", ["g"], ["f"]), helper.make_node("MatMul", ["f", "m"], ["y"])]
    g = helper.make_graph(nodes, "probe", [x], [y], init)
    proto = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    proto.ir_version = 7   # what every onnxruntime edgetrain supports reads (1.23.2 refuses the newest onnx's IR)
    return proto.SerializeToString()
data = rng.uniform(-1, 1, (2, 4, 8, 8)).astype(np.float32)
out = {}
for kind in ("fp32", "int8"):
    so = ort.SessionOptions(); so.intra_op_num_threads = 1
    s = ort.InferenceSession(model(kind == "int8"), so, providers=["CPUExecutionProvider"])
    out[kind] = s.run(None, {"x": data})[0]
err = float(np.abs(out["int8"] - out["fp32"]).max() / max(np.abs(out["fp32"]).max(), 1e-6))
print("EDGETRAIN-PROBE " + json.dumps({"version": ort.__version__, "int8_rel_err": err}), flush=True)
'''
INT8_REL_TOLERANCE = 0.1  # int8 with 8-bit activations against fp32 on a tiny conv net


def check_inference(script: str = INFERENCE_PROBE, timeout: float | None = None) -> Check:
    """A tiny fp32 and int8 inference in a child; SIGILL (a wheel using an instruction this CPU lacks) is
    one line naming the wheel and the fix."""
    version = _dist_version("onnxruntime")
    wheel = f"onnxruntime {version}" if version else "onnxruntime"
    try:
        proc = subprocess.run(python_c(script), capture_output=True, text=True,
                              timeout=timeout or PROBE_TIMEOUT, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return Check("inference", FAIL, f"a tiny fp32/int8 inference with {wheel} did not finish",
                     "run `edgetrain doctor` again on an idle machine; if it hangs again, reinstall onnxruntime")
    if proc.returncode == -signal.SIGILL:
        cpu = detect_host().cpu
        return Check("inference", FAIL,
                     f"{wheel} dies with SIGILL (illegal instruction) running a tiny fp32/int8 model on this CPU "
                     f"({cpu}): the wheel was built for instructions it lacks (onnxruntime #23957, #24512)",
                     "install a wheel built for this CPU: pip install 'onnxruntime<1.21' (1.20 runs on a "
                     "Cortex-A72/A53), or onnxruntime from your distribution (apt install python3-onnxruntime)",
                     {"version": version, "signal": "SIGILL", "cpu": cpu})
    result = next((json.loads(line.split(" ", 1)[1]) for line in reversed(proc.stdout.splitlines())
                   if line.startswith("EDGETRAIN-PROBE ")), None)
    if proc.returncode != 0 or result is None:
        how = (f"was killed by {signal.Signals(-proc.returncode).name}" if proc.returncode < 0
               else f"exited {proc.returncode}")
        tail = (proc.stderr.strip().splitlines() or [""])[-1][:200]
        return Check("inference", FAIL, f"a tiny fp32/int8 inference with {wheel} {how}" + (f": {tail}" if tail else ""),
                     f'pip install --force-reinstall "onnxruntime>={ORT_FLOOR}"', {"version": version})
    if result["int8_rel_err"] > INT8_REL_TOLERANCE:
        return Check("inference", WARN, f"{wheel}'s int8 kernels differ from fp32 by {result['int8_rel_err']:.2g} "
                     "(relative) on a tiny model", "check int8 accuracy with `edgetrain quantize --val`", result)
    return Check("inference", OK, f"{wheel} runs a tiny fp32 and int8 model (int8 within "
                 f"{result['int8_rel_err']:.1e} of fp32)", details=result)


def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def check_threads() -> Check:
    cores = runtime.usable_cores()
    online = os.cpu_count() or cores
    env = {k: os.environ.get(k) for k in THREAD_VARS}
    details = {"usable_cores": cores, "online_cores": online, "env": env,
               "threads_in_force": runtime.current_threads()}
    bad = {k: v for k, v in env.items() if v is not None and not (v.isdigit() and int(v) > 0)}
    if bad:
        return Check("threads", FAIL, "invalid thread settings: " + ", ".join(f"{k}={v!r}" for k, v in bad.items()),
                     f"unset them or set positive integers, e.g. export OMP_NUM_THREADS={cores}", details)
    over = {k: v for k, v in env.items() if v is not None and int(v) > cores and k in THREAD_VARS[:4]}
    set_vars = ", ".join(f"{k}={v}" for k, v in env.items() if v is not None)
    where = f"{cores} usable core{'s' if cores != 1 else ''}" + (f" of {online}" if online != cores else "")
    if over:
        return Check("threads", WARN, f"{', '.join(f'{k}={v}' for k, v in over.items())} exceeds the {where}: "
                     "threads will contend", f"export OMP_NUM_THREADS={cores} or pass --threads {cores}", details)
    if not set_vars:
        return Check("threads", OK, f"{where}; no thread variables set (libraries use every usable core; "
                     "--threads N caps them)", details=details)
    return Check("threads", OK, f"{where}; {set_vars}", details=details)


def check_isa(machine: str) -> Check:
    info = read_cpuinfo()
    flags = set(info["flags"])
    arch = "aarch64" if machine in ("aarch64", "arm64") else machine
    keys = ISA_KEYS.get(arch, ())
    present = [k for k in keys if k in flags]
    details = {"machine": machine, "model": info["model"], "cpu_part": info.get("cpu_part"),
               "features": present, "absent": [k for k in keys if k not in flags]}
    if not info["flags"]:
        return Check("isa", WARN, "could not read CPU features from /proc/cpuinfo",
                     "nothing to do unless you need the feature list (mount /proc)", details)
    label = ", ".join(present) or "none of " + ", ".join(keys)
    if arch == "x86_64" and "avx2" not in flags:
        return Check("isa", WARN, f"{label}: no AVX2, MXNet and ONNX Runtime fall back to slower kernels",
                     "nothing to fix in software; expect lower throughput", details)
    if arch == "aarch64" and "asimd" not in flags:
        return Check("isa", WARN, f"{label}: no NEON (asimd), the aarch64 wheels expect it",
                     "use a Cortex-A53 or newer core", details)
    note = ""
    if arch == "aarch64" and "asimddp" not in flags:
        note = " (no dot-product instructions: int8 gains are smaller, as on a Pi 3/4)"
    return Check("isa", OK, f"{label}{note}", details=details)


def _emulated() -> bool:
    """A cheap guess used only to word a fix: is an aarch64 Python running on an x86 kernel via QEMU?"""
    try:
        return bool(detect_host().emulated)
    except Exception:
        return False


# --- the command ------------------------------------------------------------------------------------

def run_checks(fix: bool = False, progress=None) -> DoctorReport:
    """Run every check; with ``fix``, repair what can be repaired (on Python 3.12+ install mxnet, the aarch64 ArmPL
    links) and re-check.

    ``progress`` (optional) is called with the name of each check before it runs.
    """
    say = progress or (lambda name: None)
    machine = platform.machine()
    report = DoctorReport(checked=[], fix_requested=fix, machine=machine)
    say("python")
    report.checked.append(check_python())
    report.checked.append(check_platform(machine))
    say("numpy")
    report.checked.append(check_numpy(probe("numpy")))

    if fix and not _mxnet_installed():
        # --fix makes the host: Python 3.12+ cannot have mxnet's metadata pin numpy<2 (no wheels), so it goes in
        # without its dependencies and requests (what it imports) first; below 3.12 pip installs it with its pins
        if not PIP_RESOLVES_MXNET and not _module_installed("requests"):
            say("installing requests")
            report.fixed.append(_pip(PIP_REQUESTS, "pip install requests>=2.20"))
        say("installing mxnet")
        report.fixed.append(install_mxnet())
    report.side = HOST if _mxnet_installed() else DEVICE
    report.checked.append(check_side(report.side))
    if report.side == HOST:
        _check_host_side(report, fix, machine, say)
    else:
        report.checked += [_not_on_a_device(n) for n in ("system-libs", "aarch64-armpl", "mxnet-import",
                                                           "mxnet-compute", "mxnet-compat")]
    say("onnx")
    report.checked.append(check_onnx(probe("onnx")))
    say("onnxruntime")
    ort_result = probe("onnxruntime")
    report.checked.append(check_onnxruntime(ort_result, "error" in ort_result and _emulated()))
    if "error" not in ort_result:
        say("inference")
        report.checked.append(check_inference())
    numpy_check = report.check("numpy")
    if numpy_check.status == FAIL:
        # mxnet, onnx and onnxruntime all import numpy: a broken numpy is the likely cause of their failures.
        for c in report.checked:
            if c.status == FAIL and c.name in ("mxnet-import", "mxnet-compute", "onnx", "onnxruntime"):
                c.fix = f"fix numpy first ({numpy_check.fix}), then run edgetrain doctor again"
    say("threads")
    report.checked.append(check_threads())
    say("isa")
    report.checked.append(check_isa(machine))
    return report


def _check_host_side(report: DoctorReport, fix: bool, machine: str, say) -> None:
    """mxnet's checks: the system libraries its wheel links, the aarch64 ArmPL links (repaired with ``fix``), its
    import and a computation, the numpy/Python compatibility applied."""
    libmxnet = armpl.find_libmxnet()
    say("system-libs")
    report.checked.append(check_system_libs(machine, libmxnet))
    say("aarch64-armpl")
    armpl_check, p = check_armpl(machine, libmxnet)
    if fix and p is not None and p.fixable:
        try:
            changed = armpl.apply(p)
        except PermissionError as exc:
            armpl_check.message += f"; --fix could not write beside libmxnet.so ({exc.strerror})"
            armpl_check.fix = "run `edgetrain doctor --fix` as the user that installed mxnet (or with sudo)"
        else:
            report.fixed += [{"action": "symlink", **link.to_dict()} for link in changed]
            armpl_check, p = check_armpl(machine, libmxnet)
            if report.fixed:
                armpl_check.message += f" (--fix linked {', '.join(link.name for link in changed)})"
    report.checked.append(armpl_check)

    say("mxnet")
    mx_result = probe("mxnet")
    report.checked += check_mxnet(mx_result, libmxnet, machine)
    report.checked.append(check_compat(mx_result))


def _mxnet_installed() -> bool:
    from .. import _lazy

    return _lazy.mxnet_installed()


def _module_installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _pip(argv: list[str], command: str) -> dict:
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=PROBE_TIMEOUT)
    tail = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or [""])[-1][:300]
    importlib.invalidate_caches()
    return {"action": "pip", "command": command, "exit_code": proc.returncode, "message": tail}


def install_mxnet() -> dict:
    """mxnet 1.9.1 into this interpreter's environment (doctor --fix): the host side.

    On Python >= 3.12 ``pip install --no-deps``: its metadata pins numpy<2.0, which pip cannot satisfy there (no
    wheels). Below, ``pip install mxnet==1.9.1`` with its pins, as ``pip install ".[host]"`` does (a numpy 2 goes
    back below 2; ``pip check`` stays clean).
    """
    if PIP_RESOLVES_MXNET:
        return _pip(PIP_MXNET_PINNED, "pip install " + MXNET_PIN)
    return _pip(PIP_MXNET, "pip install --no-deps " + MXNET_PIN)


def render(report: DoctorReport) -> str:
    """The human report: one line per check, a fix line under each that is not ok."""
    lines = [f"edgetrain doctor: Python {platform.python_version()} on {report.machine}, "
             f"{report.side or 'unknown'} side ({sys.executable})"]
    for c in report.checked:
        lines.append(f"  {c.status.upper():<4}  {c.name:<14} {c.message}")
        if c.status != OK:
            lines.append(f"        {'':<14} fix: {c.fix}")
    for action in report.fixed:
        if action.get("action") == "pip":
            lines.append(f"  fixed: {action['command']} (exit {action['exit_code']})")
        else:
            lines.append(f"  fixed: {action['path']} -> {action['target']}")
    n = report.counts()
    verdict = "healthy" if report.healthy else "NOT healthy"
    lines.append(f"{verdict}: {n[OK]} ok, {n[WARN]} warning(s), {n[FAIL]} failed ({report.side or 'unknown'} side)")
    return "\n".join(lines)
