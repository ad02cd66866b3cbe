"""`edgetrain profile`: latency, peak memory and energy of a model, each figure labelled with how it
was obtained.

Orchestration only. Every configuration (one thread count) runs in a fresh child process
(``edgetrain.measure.child``) with the thread caps in its environment before anything loads, so
figures are not polluted by this process or by each other; a child that crashes, is killed or hangs is
reported as a failed run, never waited on forever. This process imports neither mxnet nor onnxruntime.

Before any timed child, the memory model predicts the peak RSS from the graph (in a "plan" child that
also exports a Gluon MODEL when ONNX Runtime is asked for), so the prediction can be checked against
the measurement it precedes.
"""
from __future__ import annotations

import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from .. import energy, envvars, runtime
from ..child import death, last_line, python_argv, run
from ..errors import RunFailed, UsageError
from ..fileio import temp_dir
from ..host import detect_host, oversubscribed
from ..models import parse_model_ref
from ..options import ProfileOptions
from ..results import ProgressFn, Result, report
from . import contention, memory_model, reference_net

RUNTIMES = ("onnxruntime", "mxnet")
# Generous: a zoo model under QEMU or on a Pi Zero takes minutes; a hang still ends.
DEFAULT_TIMEOUT_S = float(envvars.get("EDGETRAIN_PROFILE_TIMEOUT", "900"))
REFERENCE_RUNS, REFERENCE_WARMUP = 20, 3


# --- input checks -------------------------------------------------------------------------------------

# --- the result ---------------------------------------------------------------------------------------

def figure(name: str, value, unit: str, provenance: str, source: str) -> dict:
    """One reported number with how it was obtained: measured / estimated / modelled / emulated."""
    return {"name": name, "value": value, "unit": unit, "provenance": provenance, "source": source}


@dataclass
class ProfileResult(Result):
    model: str
    runtime: str
    model_file: str | None
    input_shape: list[int]
    batch: int
    warmup: int
    runs: int
    host: dict
    device: dict | None
    prediction: dict
    configs: list[dict]
    best: dict
    verdict: dict
    energy: dict | None
    host_energy: dict | None
    figures: list[dict]
    notes: list[str] = field(default_factory=list)
    # Whether the host was quiet while the figures were timed (energy.reliability), with or without a device;
    # its reasons, as the human output's warning lines, in ``warnings``.
    reliability: dict | None = None
    warnings: list[str] = field(default_factory=list)
    # Each configuration's idle stretch and timed window on this machine's clock, so a meter's export made after
    # the run can be attributed to them later (measure.attribution, `edgetrain energy attribute`).
    meter_windows: dict | None = None

    def checks(self) -> list[str]:
        """Budgets the run did not meet (memory fit, energy budget)."""
        out = []
        mem = self.verdict.get("memory")
        if mem and mem.get("fits") is False:
            out.append(f"peak memory {mem['peak_rss_mb']:.0f} MB does not fit the {mem['available_mb']} MB "
                       f"the {self._device_name()} leaves (RAM {mem['ram_mb']} MB - OS reserve {mem['os_reserve_mb']} MB)")
        budget = (self.energy or {}).get("budget")
        if budget and not budget["passed"]:
            out.append(f"energy per inference {budget['energy_mj']:.3g} mJ on {self._device_name()} is over the "
                       f"budget of {budget['budget_mj']:g} mJ")
        return out

    def _device_name(self) -> str:
        return (self.device or {}).get("name") or "device"


# --- children -----------------------------------------------------------------------------------------
# One launcher for every child (edgetrain/child.py): process group, PDEATHSIG, timeout, signal names.

def run_child(spec: dict, threads: int | None, what: str, timeout: float) -> dict:
    """Run one ``edgetrain.measure.child`` on ``spec`` and return its result; a crash or hang is RunFailed,
    a user's error reported by the child is re-raised as one here."""
    with temp_dir("profile") as tmp:
        spec = {**spec, "result": str(Path(tmp) / "result.json")}
        spec_path = Path(tmp) / "spec.json"
        spec_path.write_text(json.dumps(spec), encoding="utf-8")
        done = run(python_argv("edgetrain.measure.child", str(spec_path)), what=what, timeout=timeout,
                   threads=threads, where="profile child",
                   timeout_fix="raise --timeout if the model is just slow, or check it runs with `edgetrain inspect`")
        if envvars.get("EDGETRAIN_DEBUG") == "1" and done.err:
            sys.stderr.write(done.err)
        if done.code != 0:
            raise RunFailed(f"{what} {death(done.code)}{last_line(done.err)}", "profile child",
                            "check the model loads and runs (`edgetrain inspect MODEL`); "
                            "EDGETRAIN_DEBUG=1 shows the child's output")
        path = Path(spec["result"])
        if not path.exists():
            raise RunFailed(f"{what} exited without a result{last_line(done.err)}", "profile child",
                            "check the model with `edgetrain inspect MODEL`")
        result = json.loads(path.read_text(encoding="utf-8"))
    if "error" in result:
        e = result["error"]
        cls = UsageError if e["type"] == "UsageError" else RunFailed
        raise cls(e["what"], e.get("where"), e.get("fix"))
    return result


# --- statistics ---------------------------------------------------------------------------------------

def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), without importing numpy here."""
    xs = sorted(values)
    if not xs:
        return math.nan
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def latency_summary(lat: list[float]) -> dict:
    n = len(lat)
    mean = sum(lat) / n
    std = math.sqrt(sum((x - mean) ** 2 for x in lat) / n)
    p50 = percentile(lat, 50)
    p99 = percentile(lat, 99)
    return {"mean_ms": mean, "p10_ms": percentile(lat, 10), "p50_ms": p50, "p90_ms": percentile(lat, 90), "p99_ms": p99,
            "min_ms": min(lat), "max_ms": max(lat), "std_ms": std, "spread_p99_p50": p99 / p50 if p50 else None,
            "runs": n}


def flag_busy_ops(ops: dict | None, cores: int) -> None:
    """An op breakdown measured on a busy host says so beside it (``busy_host``, ``busy_note``): the time other
    processes take lands on whichever op was running ("Flatten 89%" under load), so its shares are doubtful."""
    if not ops or not ops.get("available"):
        return
    load = ops.get("loadavg")
    ops["busy_host"] = oversubscribed(load, cores)
    if ops["busy_host"]:
        ops["busy_note"] = (f"measured on a busy host (1-minute load {load:.1f}, above its {cores} usable cores): "
                            "other processes' time lands on whichever op was running, so the shares are doubtful; "
                            "profile again on a quiet host")


def _summarise_config(raw: dict, label: str, source: str) -> dict:
    mem = raw["memory"]
    return {
        "threads": raw["threads"],
        "pid": raw["pid"],
        "runtime_version": raw.get("runtime_version"),
        "import_s": raw["import_s"],
        "load_s": raw["load_s"],
        "first_inference_ms": raw["first_inference_ms"],
        "latency": latency_summary(raw["latencies_ms"]),
        "latencies_ms": raw["latencies_ms"],
        "cpu_latency": latency_summary(raw["cpu_ms"]) if raw.get("cpu_ms") else None,
        "memory": {
            "peak_rss_mb": mem["peak_rss_mb"],
            "runtime_mb": mem["after_import_hwm_mb"],
            "load_mb": mem["after_load_hwm_mb"] - mem["after_import_hwm_mb"],
            "inference_mb": mem["peak_rss_mb"] - mem["after_load_hwm_mb"],
            "raw": mem,
        },
        "ops": raw.get("ops"),
        "rapl": raw.get("rapl"),
        "power": raw.get("power"),
        "wall_timed": raw.get("wall_timed"),
        "wall_idle": raw.get("wall_idle"),
        "loadavg": max((x for x in (raw.get("loadavg_before"), raw.get("loadavg_after")) if x is not None),
                       default=None),
        "input": raw.get("input"),
        "provenance": label,
        "source": source,
    }


# --- the work -----------------------------------------------------------------------------------------

def profile(model: str, opts: ProfileOptions, op_profile: bool = True,
            progress: ProgressFn | None = None) -> ProfileResult:
    """Profile MODEL: one fresh child per thread count, then the device verdict and energy budget.

    ``opts.power_log`` is a USB power meter's CSV recorded during the run (``energy.read_power_log``),
    aligned to the timed runs' wall-clock window afterwards. Raises UsageError for bad input before any work.
    """
    runtime_name, threads, batch, warmup, runs = opts.runtime, opts.threads, opts.batch, opts.warmup, opts.runs
    battery_wh, rate, budget_mj, input_shape, params = (opts.battery_wh, opts.rate, opts.budget_mj,
                                                        opts.input_shape, opts.params)
    timeout, power_log, device = opts.timeout or DEFAULT_TIMEOUT_S, opts.power_log, opts.profile()

    say = lambda message: report(progress, "profile", message=message)  # noqa: E731
    thread_list, rate_per_h = threads, rate
    meter = opts.power_log is not None or opts.meter_export  # a meter logs now: hold the windows it needs
    power_log = opts.power_log_spec()  # read now (with its --power-log-voltage/-start): a bad log costs seconds
    prof = device
    grid = opts.carbon_grid()  # an unknown country or both figures refused now, before the work
    if prof is None and grid is not None:
        raise UsageError("grams of CO2e need the device's energy figures", "--country/--grid-intensity",
                         "add --device NAME (see `edgetrain devices list`)")
    if prof is None and (battery_wh or rate_per_h or budget_mj):
        raise UsageError("the energy budget needs the device's power figures", "--device",
                         "add --device NAME (see `edgetrain devices list`)")
    host = detect_host()
    if prof is not None and budget_mj is not None and not host.matches(prof) and prof.speed.method == "unknown":
        raise UsageError(f"cannot check --budget-mj: {prof.name} has no speed figure to estimate its latency "
                         "from this host", "--budget-mj",
                         "run `edgetrain profile` on the device itself, or use a profile with a speed reference")
    if thread_list is None:
        thread_list = [prof.default_threads if prof is not None else runtime.current_threads()]
    thread_list, capped_note = ran_threads(thread_list)

    ref = parse_model_ref(model, accept_onnx=True)
    is_onnx = ref.kind == "onnx"
    runtime_name = runtime_name or ("onnxruntime" if is_onnx else "mxnet")
    if runtime_name not in RUNTIMES:
        raise UsageError(f"unknown runtime '{runtime_name}'", "--runtime", "use onnxruntime or mxnet")
    if is_onnx and runtime_name == "mxnet":
        raise UsageError("an .onnx file cannot run in MXNet", "--runtime",
                         "use --runtime onnxruntime, or give the Gluon MODEL it came from")
    chw = list(input_shape) if input_shape else None
    notes: list[str] = [capped_note] if capped_note else []

    with temp_dir("profile_model") as tmp:
        base_spec = {"runtime": runtime_name, "batch": batch, "chw": chw, "params": params, "model": str(model),
                     "power": {"measure": True, "idle_s": energy.DEFAULT_IDLE_S, "log": meter,
                               "min_window_s": energy.POWER_LOG_MIN_WINDOW_S if meter else 0.0}}
        if is_onnx:
            base_spec["model_file"] = str(Path(model).resolve())
        plan_spec = {**base_spec, "mode": "plan"}
        if runtime_name == "onnxruntime" and not is_onnx:
            plan_spec["export_to"] = str(Path(tmp) / "model.onnx")
            say("exporting the Gluon model to ONNX (opset 13) for ONNX Runtime")
        say("analysing the graph (memory prediction)")
        planned = run_child(plan_spec, 1, "the model analysis", timeout)
        if planned.get("model_file"):
            base_spec["model_file"] = planned["model_file"]
        notes += planned.get("notes", [])
        stats = memory_model.GraphStats(**planned["stats"])
        prediction = memory_model.predict(runtime_name, stats, bool(planned.get("random_weights")))
        pre = planned.get("preprocess") or {}
        if chw is None and pre.get("input_shape"):
            chw = list(pre["input_shape"])
            base_spec["chw"] = chw
        base_spec["input_shape"] = [batch, *chw] if chw else None

        label, where = _timing_label(host)
        configs = []
        for i, t in enumerate(thread_list):
            say(f"running {runtime_name} with {t} thread(s) ({i + 1}/{len(thread_list)}): "
                f"{warmup} warm-up + {runs} timed runs, in a fresh process")
            raw = run_child({**base_spec, "threads": t, "warmup": warmup, "runs": runs, "op_profile": op_profile},
                            t, f"the {runtime_name} run with {t} thread(s)", timeout)
            configs.append(_summarise_config(raw, label, where))
            flag_busy_ops(configs[-1]["ops"], host.cores_usable)
        # Before the model file goes with the temporary folder.
        paired_ref = _paired_reference(prof, host, label, thread_list, base_spec, warmup, timeout, say)
    input_shape_full = (configs[0].get("input") or {}).get("shape") or base_spec["input_shape"] or []
    if power_log is not None:
        read: dict = {}
        for c in configs:  # the meter's log, aligned to the window each child recorded
            c["power"] = log_power(power_log, c, read, energy.board_watts(prof))
    elif meter:
        for c in configs:
            if c.get("power") and not c["power"].get("available"):
                c["power"]["note"] = ("a meter recorded this window (--meter-export): give its export to `edgetrain "
                                      "energy attribute` for the measured energy")

    best = min(configs, key=lambda c: c["latency"]["p50_ms"])
    best_summary = {"threads": best["threads"], "p50_ms": best["latency"]["p50_ms"],
                    "mean_ms": best["latency"]["mean_ms"], "p99_ms": best["latency"]["p99_ms"],
                    "spread_p99_p50": best["latency"]["spread_p99_p50"],
                    "peak_rss_mb": best["memory"]["peak_rss_mb"],
                    "provenance": label, "source": where}
    peak = max(c["memory"]["peak_rss_mb"] for c in configs)
    prediction_d = prediction.to_dict()
    prediction_d["measured_peak_rss_mb"] = best["memory"]["peak_rss_mb"]
    prediction_d["error_pct"] = 100.0 * (prediction.peak_rss_mb - best["memory"]["peak_rss_mb"]) / \
        best["memory"]["peak_rss_mb"]

    verdict: dict = {}
    energy_d = None
    if prof is not None:
        verdict["memory"] = _memory_verdict(peak, prof, host)
        verdict["latency"] = _latency_verdict(best, configs, prof, host, label, timeout, say, paired_ref)
        lat = verdict["latency"]
        if lat.get("p50_ms") is not None:
            timed = next((c for c in configs if c["threads"] == lat["threads"]), best)
            on_device = host.matches(prof)
            measured = energy.measured_per_inference(timed.get("power")) if on_device else None
            reliable = energy.reliability(timed["latency"]["spread_p99_p50"], timed.get("loadavg"), host.cores_usable,
                                          (lat.get("reference") or {}).get("host_spread_p99_p50"),
                                          contention=(lat.get("paired") or {}).get("contention"))
            energy_d = energy.energy_report(lat["p50_ms"], prof, battery_wh=battery_wh, rate_per_h=rate_per_h,
                                            budget_mj=budget_mj, latency_label=lat["provenance"],
                                            latency_source=lat["source"], threads=lat["threads"],
                                            p10_ms=lat.get("p10_ms"), p90_ms=lat.get("p90_ms"), reliable=reliable,
                                            p50_range_ms=lat.get("p50_range_ms"),
                                            measured=measured)
            energy_d["reliability"] = reliable
            carbon = energy.carbon_of_report(energy_d, grid)
            if carbon is not None:
                energy_d["carbon"] = carbon
        else:
            energy_d = {"device": prof.name, "available": False,
                        "note": f"no energy estimate: {lat['note']}"}
    if energy_d is not None and energy_d.get("reliability") is not None:
        host_quiet = energy_d["reliability"]
    else:
        host_quiet = energy.reliability(best["latency"]["spread_p99_p50"], best.get("loadavg"), host.cores_usable)
    warnings = [f"the latency and energy figures are unreliable: {reason}" for reason in host_quiet["reasons"]]
    host_energy = _host_energy(configs, prof is None or host.matches(prof))
    if prof is not None and host.matches(prof) and energy_d is not None and host_energy.get("available"):
        # On the device itself RAPL measures what the model only estimates; it covers the CPU package,
        # not the board at the wall, so the modelled figure stays beside it.
        mine = next((h for h in host_energy["configs"] if h["threads"] == best["threads"]), None)
        if mine is not None:
            energy_d["measured_per_inference"] = energy.EnergyRecord.of(dict(mine), "mJ", "device")
    result = ProfileResult(
        model=str(model), runtime=runtime_name,
        model_file=str(model) if is_onnx else None,
        input_shape=list(input_shape_full), batch=batch, warmup=warmup, runs=runs,
        host=_host_summary(host), device=_device_summary(prof) if prof is not None else None,
        prediction=prediction_d, configs=configs, best=best_summary, verdict=verdict, energy=energy_d,
        host_energy=host_energy, figures=[], notes=notes, reliability=host_quiet, warnings=warnings,
        meter_windows=meter_windows(configs, prof is not None and host.matches(prof), meter,
                                    energy.board_watts(prof)))
    result.figures = collect_figures(result)
    return result



def ran_threads(asked: list[int]) -> tuple[list[int], str | None]:
    """The thread counts that run: each asked for capped to the cores as every cap is (``runtime.cap_to_cores``,
    which warns), repeats dropped; and a note saying so when that changed them. Every figure and label (the
    configurations, best, the energy's busy cores) is then of the count that ran, never of the one asked for."""
    ran = list(dict.fromkeys(runtime.cap_to_cores(int(t)) for t in asked))
    if ran == [int(t) for t in asked]:
        return ran, None
    return ran, (f"threads {','.join(str(t) for t in asked)} asked for, {','.join(str(t) for t in ran)} ran: "
                 f"capped to the {runtime.usable_cores()} core(s) this process may use "
                 "(EDGETRAIN_ALLOW_OVERSUBSCRIBE=1 keeps the count asked for)")


def _timing_label(host) -> tuple[str, str]:
    if host.emulated:
        return "emulated", (f"timed under emulation on this host ({'; '.join(host.emulation_evidence)}): "
                            "says nothing about the device's speed")
    return "measured", f"timed on this host ({host.arch}, {host.cpu}, {host.cores_usable} usable cores)"


def _memory_verdict(peak_mb: float, prof, host) -> dict:
    available = prof.ram_mb - prof.os_reserve_mb
    same = host.matches(prof)
    return {
        "peak_rss_mb": peak_mb,
        "ram_mb": prof.ram_mb,
        "os_reserve_mb": prof.os_reserve_mb,
        "os_reserve_why": prof.os_reserve_why,
        "available_mb": available,
        "headroom_mb": available - peak_mb,
        "fits": peak_mb <= available,
        "memory_budget_mb": prof.memory_budget_mb,
        "within_memory_budget": peak_mb <= prof.memory_budget_mb,
        "provenance": "measured" if same else "estimated",
        "source": ("VmHWM measured on the device itself" if same else
                   f"VmHWM measured on this host ({host.arch}) taken as the device's: the same runtime on "
                   f"{prof.arch} loads different native libraries, so expect tens of MB either way"),
    }


def _latency_verdict(best: dict, configs: list[dict], prof, host, label: str, timeout: float, say,
                     paired_ref: dict | None = None) -> dict:
    lat = best["latency"]
    out = {"threads": best["threads"], "host_p50_ms": lat["p50_ms"], "host_mean_ms": lat["mean_ms"]}
    if label == "emulated":
        return {**out, "provenance": "emulated", "mean_ms": None, "p50_ms": None,
                "note": "timings were taken under emulation, which says nothing about the device's speed",
                "source": "emulated run on this host"}
    if host.matches(prof):
        return {**out, "provenance": "measured", "factor": 1.0, "mean_ms": lat["mean_ms"], "p50_ms": lat["p50_ms"],
                "p10_ms": lat.get("p10_ms"), "p90_ms": lat["p90_ms"],
                "p99_ms": lat["p99_ms"], "source": f"measured on this host, which matches {prof.name}"}
    method = prof.speed.method
    if method == "host":
        return {**out, "provenance": "estimated", "factor": 1.0, "mean_ms": lat["mean_ms"], "p50_ms": lat["p50_ms"],
                "p10_ms": lat.get("p10_ms"), "p90_ms": lat["p90_ms"], "p99_ms": lat["p99_ms"],
                "source": f"{prof.name} speed.method is 'host': the device is taken to be as fast as this host "
                          f"({host.cpu}); factor 1"}
    if method == "reference_latency":
        refp = prof.speed.reference
        # The ratio holds at the reference's thread count: use that configuration when it was swept.
        same = next((c for c in configs if c["threads"] == refp.threads), None)
        if same is not None:
            best, lat = same, same["latency"]
            out.update(threads=same["threads"], host_p50_ms=lat["p50_ms"], host_mean_ms=lat["mean_ms"])
        host_ref = paired_ref or reference_latency_ms(refp, timeout, say)
        # Paired (1 thread): the model and the reference timed in turns in one process, in CPU time, so a
        # busy host slows both alike; otherwise two separate wall-clock runs.
        pr = host_ref.get("paired")
        ratio = (pr or {}).get("ratio")
        if ratio:
            # The device's p50 is its published reference figure x the median of the per-round model/reference
            # ratios: the reference time the model's p50 is set against is the one that median implies.
            base, ref_ms = pr["model_cpu"], pr["model_cpu"]["p50_ms"] / ratio["p50"]
        else:
            base, ref_ms = (pr["model_cpu"], host_ref["cpu_p50_ms"]) if pr else (lat, host_ref["p50_ms"])
        basis = ("CPU time per inference, timed in turns with the reference (median of the per-round ratios)"
                 if ratio else "CPU time per inference, timed in turns with the reference" if pr else "latency")
        factor = refp.latency_ms / ref_ms
        extra = {}
        if ratio:
            drift = (pr.get("contention") or {}).get("drift") or 1.0
            # Down to the figure the host's contention measured would leave (contention.py): a busy neighbour
            # lifts whole runs, which the spread of one run's rounds does not show.
            extra = {"p50_range_ms": [refp.latency_ms * min(ratio["p10"], ratio["p50"] / drift),
                                      refp.latency_ms * ratio["p90"]],
                     "p50_range_source": f"the device's reference latency x the p10-p90 of the {ratio['rounds']} "
                                         "per-round model/reference ratios, reaching down to the median ratio / "
                                         f"the contention measured ({drift:.3f}): where the p50 estimate may fall"}
        return {**out, "provenance": "estimated", "factor": factor, "basis": "paired_cpu_time" if pr else "wall_clock",
                **extra,
                "paired": {k: v for k, v in pr.items() if k != "model_cpu"} if pr else None,
                "mean_ms": base["mean_ms"] * factor,
                "p50_ms": base["p50_ms"] * factor, "p99_ms": base["p99_ms"] * factor,
                "p10_ms": base["p10_ms"] * factor, "p90_ms": base["p90_ms"] * factor,
                "reference": {"model": refp.model, "input": refp.input, "threads": refp.threads,
                              "device_ms": refp.latency_ms, "device_runtime": refp.runtime,
                              "host_ms": host_ref["p50_ms"], "host_cpu_ms": host_ref.get("cpu_p50_ms"),
                              "host_runtime": host_ref["runtime"],
                              "host_spread_p99_p50": host_ref.get("spread_p99_p50"),
                              "source": refp.source},
                "source": (f"host {basis} x {factor:.3g} = {prof.name}'s published {refp.model} {refp.input}x"
                           f"{refp.input} {refp.threads}-thread latency {refp.latency_ms} ms ({refp.runtime}) / this "
                           f"host's {ref_ms:.3g} ms {basis} on the same network ({host_ref['runtime']}, "
                           f"{refp.threads} thread(s)); this model measured at {best['threads']} thread(s)"
                           + ("" if best["threads"] == refp.threads else
                              f" (sweep --threads {refp.threads} to compare like with like)")
                           + (f"; this host has only {host.cores_usable} cores for the reference's "
                              f"{refp.threads} threads" if refp.threads > host.cores_usable else ""))}
    return {**out, "provenance": "estimated", "mean_ms": None, "p50_ms": None,
            "note": f"{prof.name} has no speed figure (speed.method 'unknown'), so no device latency is "
                    "estimated; run `edgetrain profile` on the device itself",
            "source": prof.speed.note or "profile speed.method unknown"}


_reference_cache: dict[tuple, dict] = {}


def device_speed(prof, host=None, timeout: float = DEFAULT_TIMEOUT_S, say=None) -> dict:
    """How long the device takes for what this host did in one second of CPU time: ``factor``, as profile scales a
    latency in CPU time (``_latency_verdict``): the device's published reference latency / this host's p50 CPU time
    on the same network at the reference's thread count, timed in a fresh child (``basis`` 'cpu'; 'wall' where the
    child gave no CPU times). CPU time leaves out the time a busy host gave to other processes: at a load of 20 on
    2 cores a fine-tune's wall time swung 2.3-3.4 s where its CPU time stayed 0.23-0.27 s. ``factor`` 1 on the
    device itself or for a profile whose speed is the host's; None where nothing says (emulation, speed.method
    'unknown'), with why in ``source``."""
    host = host or detect_host()
    if host.matches(prof):
        return {"factor": 1.0, "provenance": "measured", "source": f"this host is {prof.name}"}
    if host.emulated:
        return {"factor": None, "provenance": "emulated",
                "source": "this host runs under emulation, which says nothing about the device's speed"}
    method = prof.speed.method
    if method == "host":
        return {"factor": 1.0, "provenance": "estimated",
                "source": f"{prof.name} speed.method is 'host': the device is taken to be as fast as this host "
                          f"({host.cpu}); factor 1"}
    if method != "reference_latency":
        return {"factor": None, "provenance": "estimated",
                "source": f"{prof.name} has no speed figure (speed.method '{method}'): no device time is modelled"}
    refp = prof.speed.reference
    ref, age = _kept_reference(refp, host), None
    if ref is not None:
        age = time.time() - ref["at"]
    else:
        ref = {**reference_latency_ms(refp, timeout, say), "at": time.time()}
        _keep_reference(refp, host, ref)
    basis = "cpu" if ref.get("cpu_p50_ms") else "wall"
    host_ms = ref["cpu_p50_ms"] if basis == "cpu" else ref["p50_ms"]
    factor = refp.latency_ms / host_ms
    return {"factor": factor, "provenance": "estimated", "method": "reference_latency", "basis": basis,
            "reference": {"model": refp.model, "input": refp.input, "threads": refp.threads,
                          "device_ms": refp.latency_ms, "device_runtime": refp.runtime, "host_ms": host_ms,
                          "host_wall_ms": ref["p50_ms"], "host_cpu_ms": ref.get("cpu_p50_ms"),
                          "host_runtime": ref["runtime"], "host_spread_p99_p50": ref.get("spread_p99_p50"),
                          "source": refp.source},
            "source": (f"{factor:.3g} = {prof.name}'s published {refp.model} {refp.input}x{refp.input} "
                       f"{refp.threads}-thread latency {refp.latency_ms} ms ({refp.runtime}) / this host's "
                       f"{host_ms:.3g} ms p50 {'CPU time' if basis == 'cpu' else 'latency'} on the same network "
                       f"({ref['runtime']}), "
                       + ("timed after the run" if age is None else
                          f"timed {age:.0f} s before the run ended, kept in the per-user cache for {SPEED_KEPT_S:g} s")
                       + ")")}


# A fine-tune (a tune's trials, a fleet device's rounds) times the speed reference once; later runs within this many
# seconds reuse it from the per-user cache (SPEED_FILE), so that the same job gives the same factor, and a round
# does not spend seconds on it each time.
SPEED_KEPT_S = 600.0
SPEED_FILE = "device-speed-reference.json"


def _reference_key(refp, host) -> str:
    return f"{host.cpu}|{host.cores_usable}|{refp.model}|{refp.input}|{refp.threads}|{refp.runtime}"


def _kept_reference(refp, host) -> dict | None:
    from ..fileio import cache_root

    root = cache_root()
    try:
        kept = json.loads((root / SPEED_FILE).read_text(encoding="utf-8")).get(_reference_key(refp, host))
        # every figure the factor is made of a finite positive number (a cache another edgetrain wrote, or an
        # edited one, gave a negative or NaN energy with exit 0, or a traceback), else timed again
        if (0 <= time.time() - float(kept["at"]) <= SPEED_KEPT_S and isinstance(kept["runtime"], str)
                and _positive(kept["p50_ms"]) and (kept.get("cpu_p50_ms") is None or _positive(kept["cpu_p50_ms"]))):
            return kept
    except (OSError, TypeError, ValueError, KeyError, AttributeError):
        pass  # none kept, unreadable or stale: timed again
    return None


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value > 0


def _keep_reference(refp, host, ref: dict) -> None:
    from ..fileio import atomic_write_text, cache_root

    root = cache_root()
    if root is None:
        return
    try:
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(root / SPEED_FILE, json.dumps({_reference_key(refp, host): ref}), "speed reference")
    except (OSError, UsageError):
        pass  # a read-only or full cache folder: timed every time


def paired_ratio(raw: dict) -> dict:
    """The model/reference CPU-time ratio of a paired child: the median of its per-round ratios (each round
    times the model, then the reference, back to back), their p10-p90 (the measured spread the estimate's
    uncertainty carries) and, beside them, the ratio of the two medians (how it was taken before)."""
    ratios = raw["round_ratios"]
    return {"p50": percentile(ratios, 50), "p10": percentile(ratios, 10), "p90": percentile(ratios, 90),
            "rounds": len(ratios), "by_round": ratios, "ratio_of_medians": percentile(raw["model_cpu_ms"], 50) /
            max(percentile(raw["ref_cpu_ms"], 50), 1e-9),
            "source": "median over the rounds of (the median CPU time of the round's model runs / the reference's "
                      "CPU time in the same round)"}


# Measured here (2026-12-03, 2 cores, tools/energy_repeat.py): at a load of 3-6 the median of the per-round
# ratios still moved 3-24% between runs (a busy neighbour shifts a whole run's rounds, not single rounds);
# 240 rounds did no better than 60 in interleaved runs (largest/smallest 1.03-1.27 either way).
PAIRED_ROUNDS = 60


def _paired_reference(prof, host, label, thread_list, base_spec, warmup, timeout, say) -> dict | None:
    """The reference timed in turns with the model, when the device's latency is to be estimated from a
    1-thread reference and the model ran at 1 thread; None otherwise (the separate reference run)."""
    if prof is None or label == "emulated" or host.matches(prof) or prof.speed.method != "reference_latency":
        return None
    if prof.speed.reference.threads != 1 or 1 not in thread_list:
        return None
    return reference_latency_ms(prof.speed.reference, timeout, say,
                                paired_with={**base_spec, "threads": 1, "warmup": warmup})


def reference_latency_ms(refp, timeout: float = DEFAULT_TIMEOUT_S, say=None, paired_with: dict | None = None) -> dict:
    """This host's p50 on the profile's reference workload, in a fresh child; cached for this process.

    A zoo name runs as ONNX in ONNX Runtime (the closest host runtime to the fp32 CPU kernels the published
    figures come from): MobileNetV2-1.0, every shipped profile's reference, written without mxnet
    (reference_net: a device has none), another zoo name exported; a runtime named 'mxnet' runs in MXNet. With
    ``paired_with`` (a model's 1-thread run spec) the reference and that model are timed in turns in one
    child (``child.paired``) and the result carries the model's CPU times too (not cached).
    """
    key = (refp.model, refp.input, refp.threads, refp.runtime)
    if paired_with is None and key in _reference_cache:
        return _reference_cache[key]
    model = refp.model if (":" in refp.model or "/" in refp.model) else f"zoo:{refp.model}"
    rt = "mxnet" if refp.runtime == "mxnet" else "onnxruntime"
    if say:
        say(f"measuring the speed reference {refp.model} {refp.input}x{refp.input} at {refp.threads} thread(s) "
            f"on this host ({rt})")
    with temp_dir("reference") as tmp:
        spec = {"runtime": rt, "batch": 1, "model": model, "params": None}

        def analyse(chw):
            plan = {**spec, "mode": "plan", "chw": chw}
            if rt == "onnxruntime":
                plan["export_to"] = str(Path(tmp) / "reference.onnx")
                if model.startswith("zoo:") and model[4:] in reference_net.BUILT:
                    plan["reference_net"] = model[4:]   # written without mxnet: the device has none
            return run_child(plan, 1, "the speed reference analysis", timeout)

        square = [refp.input, refp.input]
        # Zoo networks take 3 channels; a MODEL reference keeps its own channel count.
        info = analyse([3, *square] if model.startswith("zoo:") else None)
        chw = list((info.get("preprocess") or {}).get("input_shape") or [3, *square])
        if chw[1:] != square:
            chw = [chw[0], *square]
            info = analyse(chw)
        run_spec = {**spec, "chw": chw, "input_shape": [1, *chw], "threads": refp.threads,
                    "warmup": REFERENCE_WARMUP, "runs": REFERENCE_RUNS, "op_profile": False}
        if rt == "onnxruntime":
            run_spec["model_file"] = info["model_file"]
        if paired_with is not None:
            if say:
                say(f"timing the model and the speed reference in turns ({PAIRED_ROUNDS} rounds, 1 thread)")
            raw = run_child({"mode": "paired", "model": paired_with, "reference": run_spec, "rounds": PAIRED_ROUNDS,
                             "warmup": paired_with.get("warmup", 10)}, 1,
                            "the model and the speed reference in turns", timeout)
            summary = latency_summary(raw["ref_wall_ms"])
            loads = [x for x in (raw.get("loadavg_before"), raw.get("loadavg_after")) if x is not None]
            ratio = paired_ratio(raw)
            return {"p50_ms": summary["p50_ms"], "mean_ms": summary["mean_ms"],
                    "spread_p99_p50": latency_summary(raw["ref_cpu_ms"])["spread_p99_p50"],
                    "cpu_p50_ms": percentile(raw["ref_cpu_ms"], 50),
                    "runtime": f"{rt} {raw.get('runtime_version')}",
                    "paired": {"model_cpu": latency_summary(raw["model_cpu_ms"]),
                               "model_cpu_p50_ms": percentile(raw["model_cpu_ms"], 50),
                               "model_wall_p50_ms": percentile(raw["model_wall_ms"], 50),
                               "reference_cpu_p50_ms": percentile(raw["ref_cpu_ms"], 50),
                               "reference_wall_p50_ms": summary["p50_ms"], "rounds": raw["rounds"],
                               "per_round": raw["per_round"], "loadavg": max(loads) if loads else None,
                               "ratio": ratio,
                               "contention": contention.measure(
                                   raw["model_cpu_ms"], raw["ref_cpu_ms"], ratio["p50"],
                                   f"{detect_host().cpu}|{refp.model}|{refp.input}|{rt} {raw.get('runtime_version')}",
                                   _model_key(paired_with))}}
        raw = run_child(run_spec, refp.threads, "the speed reference run", timeout)
    summary = latency_summary(raw["latencies_ms"])
    out = {"p50_ms": summary["p50_ms"], "mean_ms": summary["mean_ms"], "spread_p99_p50": summary["spread_p99_p50"],
           "runtime": f"{rt} {raw.get('runtime_version')}"}
    if raw.get("cpu_ms"):
        out["cpu_p50_ms"] = percentile(raw["cpu_ms"], 50)
    _reference_cache[key] = out
    return out


def _model_key(spec: dict) -> str | None:
    """What identifies the model timed (its ONNX file's digest, its batch and input), for contention's memory."""
    path = spec.get("model_file")
    if not path:
        return None
    import hashlib

    try:
        digest = hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return None
    return f"{digest} batch {spec.get('batch')} input {spec.get('input_shape') or spec.get('chw')}"


def _host_energy(configs: list[dict], on_device: bool = False) -> dict | None:
    """This machine's measurements: RAPL (always of this host's CPU package) and its board sensor or meter log
    (of the device when this machine is it, else of the host: "host, measured", never the device's headline)."""
    per = []
    for c in configs:
        if c.get("rapl"):
            e = energy.rapl_per_inference(c["rapl"], c["rapl"]["runs"])
            per.append(energy.EnergyRecord.of({"threads": c["threads"], **e}, "mJ", "host"))
    board = host_board(configs, on_device)
    out: dict = {"available": bool(per), "configs": per} if per else \
        {"available": False, "provenance": "measured",
         "note": "RAPL (/sys/class/powercap/intel-rapl*/energy_uj) is not readable on this host; no measured energy"}
    if board:
        out["board"] = board  # this machine's board sensor or meter log, whatever device was asked about
    else:
        notes = [c["power"]["note"] for c in configs if (c.get("power") or {}).get("note")]
        out["board_note"] = notes[0] if notes else (
            "no board power source on this machine (Pi 5 PMIC via vcgencmd, Jetson INA3221, hwmon power sensor) "
            "and no --power-log: energy is modelled")
    return out


def host_board(configs: list[dict], on_device: bool) -> list:
    """Each configuration's measurement by this machine's board sensor or meter log, as an ``EnergyRecord`` of
    the device (this machine is it) or of the host."""
    board = []
    for c in configs:
        m = energy.measured_per_inference(c.get("power"))
        if m is not None:
            board.append(energy.EnergyRecord.of({"threads": c["threads"], **m}, "mJ", "device" if on_device else "host"))
    return board


def meter_windows(configs: list[dict], on_device: bool, held: bool, board_w=None) -> dict:
    """Where a meter's log is read for each configuration: its idle stretch and timed window (Unix s)."""
    from .. import __version__

    return {"command": "profile", "edgetrain_version": __version__, "clock": "Unix seconds on this machine's clock",
            "held_for_a_meter": held, "on_device": on_device, "board_w": board_w,
            "configs": [{"threads": c["threads"], "timed": (c.get("power") or {}).get("window_wall") or c.get("wall_timed"),
                         "idle": c.get("wall_idle"),
                         **{k: (c.get("power") or {}).get(k) for k in ("inferences", "timed_runs", "extra_runs")}}
                        for c in configs]}


def log_power(path, config: dict, read: dict | None = None, board_w: tuple[float, float] | None = None) -> dict:
    """A configuration's measured record from the meter's log, over the window its child recorded. ``read``: a
    dict the calls for one run's configurations share, so the log is read once (by the first), not once each.
    ``board_w``: the device's idle and busy watts, which the log's figures must be near (else refused)."""
    rec = config.get("power") or {}
    window = rec.get("window_wall") or config.get("wall_timed")
    idle = config.get("wall_idle") or ((rec.get("idle") or {}).get("t0"), (rec.get("idle") or {}).get("t1"))
    idle = tuple(idle) if idle and None not in idle else None
    if read is not None and "log" not in read:
        read["log"] = energy.parse_power_log(path, near=window[0])
    measured = energy.log_record(path, tuple(window), idle, read.get("log") if read is not None else None, board_w)
    for k in ("inferences", "timed_runs", "extra_runs", "min_window_s"):
        if k in rec:
            measured[k] = rec[k]
    if rec.get("available"):  # a board source measured too: keep it beside the meter
        measured["board_sensor"] = {k: rec.get(k) for k in ("source", "joules", "samples", "idle_w", "detail")}
    return measured


def _host_summary(host) -> dict:
    return {"arch": host.arch, "cpu": host.cpu, "cores_usable": host.cores_usable, "ram_mb": host.ram_mb,
            "os": host.os, "python": host.python, "emulated": host.emulated,
            "emulation_evidence": host.emulation_evidence}


def _device_summary(prof) -> dict:
    return {"name": prof.name, "title": prof.title, "arch": prof.arch, "cores": prof.cores, "ram_mb": prof.ram_mb,
            "os_reserve_mb": prof.os_reserve_mb, "memory_budget_mb": prof.memory_budget_mb,
            "idle_w": prof.power.idle_w.value, "load_w": prof.power.load_w.value,
            "idle_source": prof.power.idle_w.source, "load_source": prof.power.load_w.source,
            "speed_method": prof.speed.method}


def collect_figures(r: ProfileResult) -> list[dict]:
    """Every headline number with its provenance and source, for the report's provenance table."""
    figs = []
    for c in r.configs:
        lat = c["latency"]
        t = c["threads"]
        figs.append(figure(f"host latency p50, {t} thread(s)", lat["p50_ms"], "ms", c["provenance"], c["source"]))
        figs.append(figure(f"host latency p99, {t} thread(s)", lat["p99_ms"], "ms", c["provenance"], c["source"]))
        figs.append(figure(f"peak RSS (VmHWM), {t} thread(s)", c["memory"]["peak_rss_mb"], "MB",
                           "emulated" if c["provenance"] == "emulated" else "measured",
                           "VmHWM of the fresh child process running this configuration"))
    p = r.prediction
    figs.append(figure("predicted peak RSS (before running)", p["peak_rss_mb"], "MB", "modelled", p["source"]))
    mem = r.verdict.get("memory")
    if mem:
        figs.append(figure(f"memory available on {r.device['name']}", mem["available_mb"], "MB", "modelled",
                           f"profile RAM {mem['ram_mb']} MB - OS reserve {mem['os_reserve_mb']} MB "
                           f"({mem['os_reserve_why']})"))
        figs.append(figure(f"peak RSS on {r.device['name']}", mem["peak_rss_mb"], "MB", mem["provenance"], mem["source"]))
    lat = r.verdict.get("latency")
    if lat and lat.get("mean_ms") is not None:
        figs.append(figure(f"latency mean on {r.device['name']}", lat["mean_ms"], "ms", lat["provenance"], lat["source"]))
        figs.append(figure(f"latency p50 on {r.device['name']}", lat["p50_ms"], "ms", lat["provenance"], lat["source"]))
    elif lat:
        figs.append(figure(f"latency on {r.device['name']}", None, "ms", lat["provenance"], lat["note"]))
    e = r.energy or {}
    for key in ("per_inference", "modelled_per_inference"):
        pi = e.get(key)
        if not pi:
            continue
        figs.append(figure("energy per inference (total)", pi["total_mj"], "mJ", pi["provenance"], pi["source"]))
        if pi.get("above_idle_mj") is not None:
            figs.append(figure("energy per inference (above idle)", pi["above_idle_mj"], "mJ", pi["provenance"],
                               pi["source"]))
        if pi.get("spread"):
            sp = pi["spread"]
            figs.append(figure("energy per inference at p10 latency", sp["p10"]["total_mj"], "mJ", pi["provenance"],
                               sp["source"]))
            figs.append(figure("energy per inference at p90 latency", sp["p90"]["total_mj"], "mJ", pi["provenance"],
                               sp["source"]))
    if e.get("daily"):
        d = e["daily"]
        figs.append(figure("energy per day", d["energy_wh_per_day"], "Wh", d["provenance"], d["source"]))
        if "battery_hours" in d:
            figs.append(figure("battery life", d["battery_hours"], "h", d["provenance"],
                               f"{d['battery_wh']} Wh / average {d['average_power_w']:.3g} W"))
    for h in (r.host_energy or {}).get("configs", []):
        figs.append(figure(f"host energy per inference (RAPL), {h['threads']} thread(s)", h["total_mj"], "mJ",
                           "measured", h["source"]))
    for h in (r.host_energy or {}).get("board", []):
        figs.append(figure(f"board energy per inference ({h['meter']}), {h['threads']} thread(s)", h["total_mj"], "mJ",
                           "measured", h["source"]))
    if r.reliability is not None:  # the timing behind latency and energy: was the host quiet?
        for f in figs:
            if "latency" in f["name"] or "energy" in f["name"] or "battery" in f["name"]:
                f["reliable"] = r.reliability["reliable"]
    return figs
