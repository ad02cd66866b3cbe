#!/usr/bin/env python3
"""The ARM smoke suite: run inside the emulated arm64 root by tools/arm64/check.sh (or on a real Pi).

    python smoke.py [--fresh] [--workdir DIR]

--fresh first removes doctor's ArmPL stand-in links beside libmxnet.so, so every run proves what a
Pi user sees on a fresh install: `doctor` fails naming the missing library, `doctor --fix` repairs it,
a second `--fix` changes nothing.

Each step runs one command with the flags it declares (docs/cli.md) and checks its JSON result, not only
its exit code. Exit 0 when no step failed.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = "edgetrain.nets:digits_cnn"
DATA = "builtin:digits"
STEP_TIMEOUT = 900
VERBS = ("export", "quantize", "profile", "finetune")

results: list[tuple[str, str, float, str]] = []   # step, PASS/FAIL, seconds, note
t_start = time.time()


def log(msg: str) -> None:
    print(f"[smoke {time.time() - t_start:5.0f}s] {msg}", flush=True)


class StepFailed(Exception):
    pass


def step(name):
    def wrap(fn):
        def run(*a, **kw):
            log(f"== {name}")
            t0 = time.time()
            try:
                note = fn(*a, **kw) or ""
                status = "PASS"
            except StepFailed as exc:
                status, note = "FAIL", str(exc)
            except Exception as exc:  # a bug in a step is a failure too, with its message
                status, note = "FAIL", f"{type(exc).__name__}: {exc}"
            dt = time.time() - t0
            results.append((name, status, dt, note))
            log(f"   {status} {name} ({dt:.0f} s){': ' + note if note else ''}")
            return status
        return run
    return wrap


def expect(cond, msg):
    if not cond:
        raise StepFailed(msg)


def edgetrain_cmd() -> list[str]:
    exe = shutil.which("edgetrain")
    return [exe] if exe else [sys.executable, "-m", "edgetrain"]


def run_group(cmd: list[str], timeout: float, cwd=None) -> subprocess.CompletedProcess:
    """subprocess.run in its own session; on timeout the whole group goes (the steps `run` starts too)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd,
                            stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        for sig, wait in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            try:
                os.killpg(proc.pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def et(*args, timeout=STEP_TIMEOUT, cwd=None):
    """Run edgetrain; return (exit code, parsed JSON or None, stdout, stderr)."""
    cmd = edgetrain_cmd() + [str(a) for a in args]
    log("   $ edgetrain " + " ".join(str(a) for a in args))
    proc = run_group(cmd, timeout, cwd)
    data = None
    if "--json" in args and args[list(args).index("--json") + 1] == "-":
        try:
            data = json.loads(proc.stdout)
        except json.JSONDecodeError:
            data = None
    return proc.returncode, data, proc.stdout, proc.stderr


def tail(text: str, n: int = 6) -> str:
    return " | ".join(text.strip().splitlines()[-n:])


def checks_of(report: dict) -> dict:
    return {c["name"]: c for c in report.get("checks", [])}


# --- doctor ---------------------------------------------------------------------------------------

def stand_in_links() -> list[Path]:
    from edgetrain.compat import armpl

    lib = armpl.find_libmxnet()
    if lib is None:
        raise StepFailed("mxnet is not installed in this environment")
    return [lib.parent / name for name in armpl.STAND_INS]


def mxnet_installed() -> bool:
    from importlib.util import find_spec

    return find_spec("mxnet") is not None


@step("doctor on a fresh install: a healthy device (Python >= 3.12, no mxnet yet) or the missing ArmPL")
def doctor_fresh():
    if not mxnet_installed():
        # Python >= 3.12: pip cannot install mxnet with its numpy<2 pin, so `pip install ".[host]"` left a device
        # install: healthy on the device side, and doctor says `--fix` makes it the host
        rc, rep, out, err = et("doctor", "--json", "-")
        expect(rep is not None, f"no JSON from doctor (exit {rc}): {tail(err)}")
        c = checks_of(rep)
        expect(rc == 0 and rep["healthy"] and rep.get("side") == "device",
               f"expected a healthy device before --fix, got exit {rc}, side {rep.get('side')}")
        expect("edgetrain doctor --fix" in c["side"]["message"], f"side: {c['side']['message']}")
        return f"a device install; doctor said: {c['side']['message'][:160]}"
    removed = []
    for link in stand_in_links():
        if link.is_symlink():
            link.unlink()
            removed.append(link.name)
    rc, rep, out, err = et("doctor", "--json", "-")
    expect(rep is not None, f"no JSON from doctor (exit {rc}): {tail(err)}")
    c = checks_of(rep)
    expect(rc == 1 and rep["healthy"] is False, f"expected exit 1 before --fix, got {rc}")
    expect(c["aarch64-armpl"]["status"] == "fail", f"aarch64-armpl: {c['aarch64-armpl']}")
    expect("libarmpl_lp64_mp.so" in c["mxnet-import"]["message"], f"mxnet-import: {c['mxnet-import']['message']}")
    expect("doctor --fix" in c["aarch64-armpl"]["fix"], f"fix line: {c['aarch64-armpl']['fix']}")
    return f"removed {removed or 'nothing'}; doctor said: {c['mxnet-import']['message'][:120]}"


@step("doctor --fix: links OpenBLAS/LAPACKE, libm, libc; then healthy")
def doctor_fix(fresh: bool):
    rc, rep, out, err = et("doctor", "--fix", "--json", "-")
    expect(rep is not None, f"no JSON from doctor --fix (exit {rc}): {tail(err)}")
    c = checks_of(rep)
    bad = {k: v["message"] for k, v in c.items() if v["status"] == "fail"}
    expect(rc == 0 and rep["healthy"], f"doctor --fix exit {rc}, failing: {bad}")
    expect(rep["machine"] == "aarch64", f"machine {rep['machine']}")
    expect(c["aarch64-armpl"]["details"].get("applicable") is True, "armpl check not applied on aarch64")
    linked = sorted(a["name"] for a in rep["fixed"] if a.get("action") == "symlink")
    pips = [a for a in rep["fixed"] if a.get("action") == "pip"]
    expect(all(a["exit_code"] == 0 for a in pips), f"doctor --fix could not install mxnet: {pips}")
    if fresh:
        expect(linked == ["libamath.so", "libarmpl_lp64_mp.so", "libastring.so"], f"fixed {linked}")
    for name in ("mxnet-compute", "onnxruntime"):
        expect(c[name]["status"] == "ok", f"{name}: {c[name]['message']}")
    print(render_checks(rep), flush=True)
    installed = f"installed by: {pips[0]['command']}; " if pips else ""
    return (f"{installed}linked {linked}; {c['mxnet-compute']['message']}; {c['mxnet-import']['message']}; "
            f"compat: {c['mxnet-compat']['message'] if 'mxnet-compat' in c else '?'}")


@step("doctor --fix again: idempotent, changes nothing")
def doctor_again():
    before = {p.name: os.lstat(p).st_ino for p in stand_in_links() if p.is_symlink()}
    rc, rep, out, err = et("doctor", "--fix", "--json", "-")
    expect(rep is not None and rc == 0 and rep["healthy"], f"exit {rc}: {tail(err)}")
    expect(rep["fixed"] == [], f"second --fix changed {rep['fixed']}")
    after = {p.name: os.lstat(p).st_ino for p in stand_in_links() if p.is_symlink()}
    expect(before == after and len(after) == 3, f"links changed: {before} -> {after}")
    return "no changes"


def render_checks(rep: dict) -> str:
    return "\n".join(f"     {c['status'].upper():<4} {c['name']:<14} {c['message']}" for c in rep["checks"])


# --- devices host ---------------------------------------------------------------------------------

@step("devices host: aarch64, labelled emulated")
def devices_host():
    rc, rep, out, err = et("devices", "host", "--json", "-")
    expect(rc == 0 and rep is not None, f"exit {rc}: {tail(err)}")
    expect(rep.get("arch") == "aarch64", f"arch {rep.get('arch')}")
    kernel = Path("/proc/sys/kernel/arch").read_text().strip() if Path("/proc/sys/kernel/arch").exists() else None
    if kernel and kernel != "aarch64":
        expect(rep.get("emulated") is True, f"kernel is {kernel} but emulated={rep.get('emulated')}")
    return f"arch {rep['arch']}, emulated {rep.get('emulated')}, cores {rep.get('cores_usable')}, isa {rep.get('isa')}"


# --- direct check (until export lands) -----------------------------------------------------------

def find_values(obj, pred, path=""):
    """(path, value) pairs anywhere in a JSON tree whose key satisfies ``pred``."""
    found = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{path}.{k}" if path else k
            if pred(k):
                found.append((p, v))
            found += find_values(v, pred, p)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found += find_values(v, pred, f"{path}[{i}]")
    return found


def check_verdicts(rep: dict):
    """Every passed/ok/valid-like flag in the result must be true."""
    flags = find_values(rep, lambda k: k.lower() in ("passed", "ok", "valid", "equal"))
    bad = [(p, v) for p, v in flags if v is False]
    expect(not bad, f"result says not passed: {bad}")
    return flags


def ort_runs(path: Path) -> str:
    code = ("import sys, numpy as np, onnxruntime as ort\n"
            "s = ort.InferenceSession(sys.argv[1], providers=['CPUExecutionProvider'])\n"
            "i = s.get_inputs()[0]\n"
            "shape = [d if isinstance(d, int) and d > 0 else 1 for d in i.shape]\n"
            "y = s.run(None, {i.name: np.random.rand(*shape).astype('float32')})[0]\n"
            "assert np.isfinite(y).all(); print(shape, y.shape)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True,
                          timeout=STEP_TIMEOUT)
    expect(proc.returncode == 0, f"onnxruntime cannot run {path.name}: {tail(proc.stderr)}")
    return proc.stdout.strip()


def run_verb(verb: str, args: list, work: Path, timeout: float = STEP_TIMEOUT) -> dict:
    try:
        rc, rep, out, err = et(verb, *args, "--json", "-", cwd=work, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        raise StepFailed(f"`edgetrain {verb}` did not finish in {timeout:.0f} s") from exc
    expect(rep is not None, f"exit {rc}, no JSON on stdout: {tail(err)}")
    expect(rc == 0, f"exit {rc}: {tail(err)}; result {json.dumps(rep)[:400]}")
    expect(isinstance(rep, dict), f"JSON result is not an object: {str(rep)[:200]}")
    return rep


@step("export + validate (ONNX equal to the Gluon model, loads in onnxruntime)")
def export_step(work: Path, state: dict):
    out = work / "digits.onnx"
    rep = run_verb("export", [MODEL, "-o", str(out)], work)
    flags = check_verdicts(rep)
    expect(out.exists(), f"{out} was not written; result {json.dumps(rep)[:300]}")
    state["onnx"] = out
    return f"{out.stat().st_size} bytes; verdicts {flags[:4]}; ort {ort_runs(out)}"


@step("quantize (int8, calibrated on builtin:digits)")
def quantize_step(work: Path, state: dict):
    out = work / "digits-int8.onnx"
    model = str(state.get("onnx") or MODEL)
    # emulation is ~10x slower: a small calibration set
    rep = run_verb("quantize", [model, "--calib", DATA, "-o", str(out), "--samples", "64"], work)
    check_verdicts(rep)
    produced = out if out.exists() else None
    expect(produced is not None, f"{out} was not written; result {json.dumps(rep)[:300]}")
    note = f"{out.stat().st_size} bytes"
    if out.suffix == ".onnx":
        note += f"; ort {ort_runs(out)}"
    return note


def kernel_arch() -> str:
    p = Path("/proc/sys/kernel/arch")
    return p.read_text().strip() if p.exists() else "aarch64"


@step("profile (timings labelled emulated)")
def profile_step(work: Path, state: dict):
    model = str(state.get("onnx") or MODEL)
    rep = run_verb("profile", [model, "--runs", "20", "--warmup", "2", "--threads", "2", "--device", "rpi4b-4gb"],
                   work)
    configs = rep.get("configs")
    expect(configs, f"no measured configurations in the result: {json.dumps(rep)[:300]}")
    lat = [(c.get("threads"), (c.get("latency") or {}).get("p50_ms")) for c in configs]
    expect(all(isinstance(v, (int, float)) and v > 0 for _, v in lat), f"latency p50 missing: {lat}")
    provenance = sorted({c.get("provenance") for c in configs})
    if kernel_arch() != "aarch64":
        expect((rep.get("host") or {}).get("emulated") is True, f"host not labelled emulated: {rep.get('host')}")
        expect(provenance == ["emulated"], f"timings under QEMU labelled {provenance}, not emulated")
        timed = [f for f in rep.get("figures", []) if "latency" in str(f.get("name", f)).lower()]
        wrong = [f for f in timed if f.get("provenance") not in ("emulated", "modelled")]
        expect(not wrong, f"latency figures not labelled emulated: {wrong[:2]}")
        verdict = (rep.get("verdict") or {}).get("latency") or {}
        if verdict:
            expect(verdict.get("provenance") == "emulated" and verdict.get("p50_ms") is None,
                   f"device latency claimed from an emulated run: {verdict}")
    return f"host p50 ms by threads {lat}; provenance {provenance}"


@step("finetune: one short epoch, --threads 2, a memory budget")
def finetune_step(work: Path, state: dict):
    out = work / "finetuned"
    rep = run_verb("finetune", [MODEL, "--data", DATA, "--epochs", "1", "--threads", "2", "--memory-budget",
                                "1500MB", "-o", str(out)], work)
    check_verdicts(rep)
    expect(out.exists(), f"{out} was not written")
    peaks = find_values(rep, lambda k: "peak" in k.lower() and "mb" in k.lower())
    numbers = [v for _, v in peaks if isinstance(v, (int, float))]
    expect(numbers, f"no peak memory figure in the result: {json.dumps(rep)[:300]}")
    expect(max(numbers) <= 1500, f"peak RSS {max(numbers):.0f} MB over the 1500 MB budget")
    threads = find_values(rep, lambda k: k.lower() == "threads")
    expect(all(v == 2 for _, v in threads if isinstance(v, int)), f"threads reported {threads}")
    acc = find_values(rep, lambda k: "acc" in k.lower())
    return f"peak {str(peaks[:2])[:160]}; accuracy {str(acc[:2])[:120]}"


@step("the device loop from the shipped ONNX base, no mxnet: finetune --train-layers bias, predict")
def device_loop_step(work: Path, state: dict):
    """What a Pi runs: the host's export (edgetrain/_builtin/digits5.onnx) fine-tuned and used with
    onnxruntime, numpy and Pillow only; run before `doctor --fix` installs mxnet, and checked not loaded."""
    import edgetrain

    base = Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx"
    out = work / "device"
    rep = run_verb("finetune", [base, "--data", DATA, "--train-layers", "bias", "--epochs", "1", "--threads", "2",
                                "-o", out], work)
    check_verdicts(rep)
    model = out / "model.onnx"
    expect(model.is_file(), f"{model} was not written; result {json.dumps(rep)[:300]}")
    expect(rep.get("final_accuracy", 0) > 0.3, f"accuracy {rep.get('final_accuracy')} (ten classes: chance 0.1)")
    pred = run_verb("predict", [model, DATA, "--top-k", "1", "--format", "csv", "-o", work / "pred.csv"], work)
    top1 = (pred.get("accuracy") or {}).get("top1")
    expect(isinstance(top1, (int, float)) and top1 > 30, f"predict top-1 {top1}")
    probe = subprocess.run([sys.executable, "-c", "import sys, edgetrain.ops.predict, edgetrain.training; "
                            "sys.exit('mxnet loaded' if 'mxnet' in sys.modules else 0)"],
                           capture_output=True, text=True, timeout=STEP_TIMEOUT)
    expect(probe.returncode == 0, f"the device path loads mxnet: {tail(probe.stderr)}")
    return (f"mxnet installed: {mxnet_installed()}; finetune top-1 {rep['final_accuracy']:.3f} in {rep.get('seconds')} s, "
            f"peak {rep.get('peak_rss_mb')} MB; predict top-1 {top1:.1f}%")


def main(argv: list[str]) -> int:
    fresh = "--fresh" in argv
    work = Path(tempfile.mkdtemp(prefix="edgetrain-smoke-"))
    state: dict = {}
    device_loop_step(work, state)   # before doctor --fix: on Python >= 3.12 mxnet is not installed yet
    if fresh:
        doctor_fresh()
    doctor_fix(fresh)
    doctor_again()
    devices_host()
    steps = {"export": export_step, "quantize": quantize_step, "profile": profile_step,
             "finetune": finetune_step}
    for verb in VERBS:
        steps[verb](work, state)
    shutil.rmtree(work, ignore_errors=True)

    print("\n==== ARM smoke summary ====", flush=True)
    for name, status, dt, note in results:
        print(f"{status:<4} {dt:5.0f}s  {name}" + (f"  -- {note}" if status != "PASS" else ""), flush=True)
    n = {s: sum(r[1] == s for r in results) for s in ("PASS", "FAIL")}
    print(f"arm64 smoke: {n['PASS']} passed, {n['FAIL']} failed in {time.time() - t_start:.0f} s", flush=True)
    return 1 if n["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
