"""What runs in the fresh child process of one profile configuration.

``python -m edgetrain.measure.child SPEC.json`` reads a spec written by ``edgetrain.measure.profiling``, runs
load -> first inference -> warm-up -> timed runs -> per-op timings, and writes one JSON result to
``spec["result"]``. The parent set the thread caps in our environment before this interpreter started,
so OpenMP/MXNet read them at import. A user's error (a model that does not load) is written as
``{"error": ...}``; anything else (a crash, a signal) is left for the parent to notice.

``python -m edgetrain.measure.child --baseline RUNTIME`` prints the resident memory of a process that
has only imported the runtime and run a trivial graph: the baseline the memory model adds to.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

from .. import _lazy
from ..cputime import cpu_seconds
from ..fileio import temp_dir
from ..procmem import peak_rss_mb, rss_mb

# Per-op timings come from a second, profiled session after the timed runs: the profiler slows every
# node down, so its figures are for "where the time goes", never for the latency itself.
OP_PROFILE_RUNS = 20


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "--baseline":
        print(json.dumps(baseline(argv[1])), flush=True)
        return 0
    if len(argv) != 1:
        print("usage: python -m edgetrain.measure.child SPEC.json | --baseline RUNTIME", file=sys.stderr)
        return 2
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    from ..errors import EdgetrainError

    try:
        mode = spec.get("mode")
        result = plan(spec) if mode == "plan" else paired(spec) if mode == "paired" else run(spec)
    except EdgetrainError as exc:
        result = _error(exc)
    try:
        Path(spec["result"]).write_text(json.dumps(result), encoding="utf-8")
    except OSError as exc:  # a full disk or ulimit -f cut the result: say that instead, in a few bytes
        from ..fileio import is_disk_full, scratch_error

        if not is_disk_full(exc):
            raise
        Path(spec["result"]).write_text(json.dumps(_error(scratch_error(exc, Path(spec["result"]).parent))),
                                        encoding="utf-8")
    return 0


def _error(exc) -> dict:
    return {"error": {"type": type(exc).__name__, "what": exc.what, "where": exc.where, "fix": exc.fix}}


# --- the stages ---------------------------------------------------------------------------------------

def run(spec: dict) -> dict:
    runtime = spec["runtime"]
    out: dict = {"runtime": runtime, "threads": spec["threads"], "pid": os.getpid()}
    mem = {"start_rss_mb": rss_mb()}
    t0 = time.perf_counter()
    if runtime == "onnxruntime":
        import numpy  # noqa: F401  (part of the runtime's baseline, as in a deployed app)
        onnxruntime = _lazy.onnxruntime()
        out["runtime_version"] = onnxruntime.__version__
    else:
        import numpy  # noqa: F401
        mxnet = _lazy.mxnet()
        out["runtime_version"] = mxnet.__version__
    out["import_s"] = time.perf_counter() - t0
    mem["after_import_rss_mb"], mem["after_import_hwm_mb"] = rss_mb(), peak_rss_mb()

    rapl = _rapl_reader()
    t0 = time.perf_counter()
    runner = OrtRunner(spec) if runtime == "onnxruntime" else MxnetRunner(spec)
    out["load_s"] = time.perf_counter() - t0
    mem["after_load_rss_mb"], mem["after_load_hwm_mb"] = rss_mb(), peak_rss_mb()
    out["input"] = {"name": runner.input_name, "shape": list(runner.x.shape), "dtype": str(runner.x.dtype)}

    t0 = time.perf_counter()
    runner.infer()
    out["first_inference_ms"] = (time.perf_counter() - t0) * 1000
    for _ in range(spec["warmup"]):
        runner.infer()

    meter, power_spec = _power_meter(spec)
    if meter is not None:
        meter.start()
        meter.idle()  # the idle board, this process asleep, just before the timed runs
    elif power_spec.get("log"):
        idle_t0 = time.time()
        time.sleep(power_spec.get("idle_s", 0))  # an idle stretch the meter's log can show too
        out["wall_idle"] = [idle_t0, time.time()]
    out["loadavg_before"] = _loadavg()
    lat, cpu = [], []
    energy_start = rapl() if rapl else None
    wall_t0 = meter.begin() if meter is not None else time.time()
    wall0 = time.perf_counter()
    for _ in range(spec["runs"]):
        c0 = cpu_seconds()
        t0 = time.perf_counter()
        runner.infer()
        lat.append((time.perf_counter() - t0) * 1000)
        # CPU time of the process: at 1 thread it leaves out the time this host gave to other processes
        cpu.append((cpu_seconds() - c0) * 1000)
    wall = time.perf_counter() - wall0
    energy_end = rapl() if rapl else None
    out["wall_timed"] = [wall_t0, time.time()]
    if meter is not None or power_spec.get("log"):
        out["power"] = _measure_power(meter, power_spec, runner, wall_t0, spec["runs"], out)
    out["loadavg_after"] = _loadavg()
    out["latencies_ms"] = lat
    out["cpu_ms"] = cpu
    out["timed_wall_s"] = wall
    mem["final_rss_mb"], mem["peak_rss_mb"] = rss_mb(), peak_rss_mb()
    out["memory"] = mem
    if energy_start is not None and energy_end is not None:
        from ..energy import rapl_delta_j

        joules = rapl_delta_j(energy_start, energy_end)
        if joules is not None:
            out["rapl"] = {"joules": joules, "seconds": wall, "runs": spec["runs"],
                           "domains": sorted(energy_start["domains"])}
    # After VmHWM is read: the profiled session's own memory must not count.
    load0 = _loadavg()
    out["ops"] = runner.op_profile(min(OP_PROFILE_RUNS, spec["runs"])) if spec.get("op_profile", True) else \
        {"available": False, "note": "per-op profiling switched off"}
    if out["ops"].get("available"):  # how busy the host was around the breakdown (the parent judges it)
        out["ops"]["loadavg"] = max((x for x in (load0, _loadavg()) if x is not None), default=None)
    return out


def paired(spec: dict) -> dict:
    """The model and the speed reference timed in turns in one process, at 1 thread, in CPU time.

    A busy host slows both alike when they alternate within milliseconds (a shared core, caches, the
    clock), so their ratio holds where two runs minutes apart drift; CPU time leaves out the time the
    host gave to other processes. ``rounds`` rounds of ``per_round`` model runs then one reference run;
    ``round_ratios`` holds each round's ratio, the median of its model runs' CPU time over the reference's
    (the estimate takes the median of those).
    """
    model = OrtRunner(spec["model"]) if spec["model"]["runtime"] == "onnxruntime" else MxnetRunner(spec["model"])
    ref = OrtRunner(spec["reference"]) if spec["reference"]["runtime"] == "onnxruntime" else \
        MxnetRunner(spec["reference"])
    for _ in range(max(int(spec.get("warmup", 10)), 1)):
        model.infer()
    for _ in range(3):
        ref.infer()
    c0 = cpu_seconds()
    ref.infer()
    ref_ms = (cpu_seconds() - c0) * 1000
    c0 = cpu_seconds()
    model.infer()
    model_ms = max((cpu_seconds() - c0) * 1000, 1e-3)
    # About as much model time as reference time per round, at most 10 model runs.
    per_round = int(min(10, max(1, round(ref_ms / model_ms))))
    out = {"model_cpu_ms": [], "model_wall_ms": [], "ref_cpu_ms": [], "ref_wall_ms": [], "per_round": per_round,
           "rounds": spec["rounds"], "loadavg_before": _loadavg(),
           "runtime_version": (_lazy.onnxruntime() if spec["reference"]["runtime"] == "onnxruntime"
                               else _lazy.mxnet()).__version__}

    def timed(runner, cpu, wall):
        c0, t0 = cpu_seconds(), time.perf_counter()
        runner.infer()
        wall.append((time.perf_counter() - t0) * 1000)
        cpu.append((cpu_seconds() - c0) * 1000)

    out["round_ratios"] = []
    for _ in range(spec["rounds"]):
        model.infer()  # untimed: the reference run just before has evicted the model from the caches
        for _ in range(per_round):
            timed(model, out["model_cpu_ms"], out["model_wall_ms"])
        timed(ref, out["ref_cpu_ms"], out["ref_wall_ms"])
        # This round's median model CPU time over the reference's, timed back to back: the host's state
        # (load, caches, clock) is as near the same for both as it gets, so the ratio is taken per round.
        out["round_ratios"].append(statistics.median(out["model_cpu_ms"][-per_round:]) /
                                   max(out["ref_cpu_ms"][-1], 1e-6))
    out["loadavg_after"] = _loadavg()
    return out


def _power_meter(spec: dict):
    """The board's power meter when this machine has a source (edgetrain.energy), else None."""
    power_spec = spec.get("power") or {}
    if not power_spec.get("measure"):
        return None, power_spec
    from .. import energy

    source = energy.detect()
    if source is None:
        return None, power_spec
    return energy.PowerMeter(source, idle_s=power_spec.get("idle_s", energy.DEFAULT_IDLE_S)), power_spec


def _measure_power(meter, power_spec: dict, runner, wall_t0: float, runs: int, out: dict) -> dict:
    """Energy over the timed runs, extended by untimed inferences until the window holds enough samples."""
    from .. import energy

    min_window = float(power_spec.get("min_window_s") or 0.0)
    if meter is not None:
        min_window = max(min_window, energy.MIN_WINDOW_PERIODS * meter.period_s)
    extra = 0
    # the window's length, and the samples in it: a sampling thread running late on a busy host must not leave
    # fewer than MIN_WINDOW_PERIODS (bounded, in case the source stops answering)
    longest = max(4 * min_window, min_window + 5.0)
    while time.time() - wall_t0 < min_window or (
            meter is not None and meter.samples_since_begin() < energy.MIN_WINDOW_PERIODS
            and time.time() - wall_t0 < longest):
        runner.infer()
        extra += 1
    if meter is not None:
        meter.end()
        rec = meter.finish()
    else:
        rec = {"available": False, "source": "power-log", "note": "read from the power log by the parent"}
    rec["window_wall"] = [wall_t0, meter.window[1] if meter is not None else time.time()]
    rec["inferences"] = runs + extra
    rec["timed_runs"] = runs
    rec["extra_runs"] = extra
    rec["min_window_s"] = min_window
    return rec


def _loadavg() -> float | None:
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _rapl_reader():
    try:
        from ..energy import read_rapl
    except ImportError:
        return None
    return read_rapl if read_rapl() is not None else None


def _random_input(shape, dtype="float32"):
    import numpy as np

    # Real-looking values rather than zeros: some kernels take shortcuts on zeros/denormals.
    return np.random.RandomState(0).standard_normal(shape).astype(dtype)


class OrtRunner:
    def __init__(self, spec: dict):
        import numpy as np

        from ..errors import UsageError
        from .._lazy import ort_session

        self.spec = spec
        self.path = spec["model_file"]
        try:
            self.session = ort_session(self.path, spec["threads"])
        except Exception as exc:
            raise UsageError(f"ONNX Runtime cannot load the model: {str(exc).splitlines()[0][:300]}",
                             self.path, "check the model with `edgetrain inspect` or re-export it") from None
        inputs = self.session.get_inputs()
        self.feeds = {}
        for arg in inputs:
            shape = _concrete_shape(arg.shape, spec, arg.name)
            dtype = _ORT_TYPES.get(arg.type)
            if dtype is None:
                raise UsageError(f"input '{arg.name}' has type {arg.type}, which profile cannot fill",
                                 self.path, "profile a model with float or integer tensor inputs")
            # Integer inputs are usually indices or masks: zeros are always in range.
            self.feeds[arg.name] = _random_input(shape, dtype) if dtype.startswith("float") else np.zeros(shape, dtype)
        self.input_name = inputs[0].name
        self.x = self.feeds[self.input_name]

    def infer(self):
        return self.session.run(None, self.feeds)

    def op_profile(self, runs: int) -> dict:
        ort = _lazy.onnxruntime()

        from .._lazy import ort_session_options

        with temp_dir("ortprof") as tmp:
            opts = ort_session_options(self.spec["threads"])
            opts.enable_profiling = True
            opts.profile_file_prefix = str(Path(tmp) / "ort")
            sess = ort.InferenceSession(self.path, opts, providers=["CPUExecutionProvider"])
            sess.run(None, self.feeds)  # the first run also allocates; keep it out of the table
            for _ in range(runs):
                sess.run(None, self.feeds)
            trace = sess.end_profiling()
            events = json.loads(Path(trace).read_text(encoding="utf-8"))
        nodes = [e for e in events if e.get("cat") == "Node" and str(e.get("name", "")).endswith("_kernel_time")]
        # Drop the warm-up run's events: they are the first len(graph nodes) kernel events.
        per_run = len(nodes) // (runs + 1) if nodes else 0
        nodes = nodes[per_run:]
        return _op_table([(e["args"].get("op_name", "?"), e["dur"] / 1000.0) for e in nodes], runs,
                         "ONNX Runtime profiler (SessionOptions.enable_profiling), kernel time per node "
                         "after graph optimisation (fused nodes appear under the fused op type)")


_ORT_TYPES = {"tensor(float)": "float32", "tensor(float16)": "float16", "tensor(double)": "float64",
              "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8", "tensor(uint8)": "uint8"}


def _concrete_shape(shape, spec: dict, name: str) -> list[int]:
    from ..errors import UsageError

    wanted = spec.get("input_shape")  # [N, C, H, W] the parent resolved (from --input-shape or metadata)
    out = []
    for i, d in enumerate(shape):
        if isinstance(d, int) and d > 0:
            if i == 0 and d != spec["batch"]:
                raise UsageError(f"input '{name}' has a fixed batch of {d}, not {spec['batch']}", spec["model_file"],
                                 f"use --batch {d}, or export the model with a dynamic batch dimension")
            if i > 0 and wanted and len(wanted) == len(shape) and int(wanted[i]) != d:
                raise UsageError(f"input '{name}' has the fixed shape {list(shape)}, which --input-shape "
                                 f"{','.join(map(str, wanted))} contradicts", spec["model_file"],
                                 "drop --input-shape for this model, or give its own shape")
            out.append(d)
        elif i == 0:
            out.append(spec["batch"])
        elif wanted and len(wanted) == len(shape):
            out.append(int(wanted[i]))
        else:
            raise UsageError(f"input '{name}' has a dynamic dimension {i} ({d})", spec["model_file"],
                             "give the shape with --input-shape N,C,H,W")
    return out


class MxnetRunner:
    def __init__(self, spec: dict):
        mx = _lazy.mxnet()

        self.mx = mx
        model = _load_gluon_unrun(spec["model"], spec.get("params"), spec.get("chw"))
        model.block.hybridize()
        self.block = model.block
        self.input_name = model.preprocess.input_name
        self.x = _random_input(model.preprocess.batch_shape(spec["batch"]))
        self.x_nd = mx.nd.array(self.x, dtype="float32")

    def infer(self):
        out = self.block(self.x_nd)
        if isinstance(out, (list, tuple)):
            out = out[0]
        # Gluon is asynchronous: the time of an inference is until its output is readable.
        return out.asnumpy()

    def op_profile(self, runs: int) -> dict:
        profiler = _lazy.from_import("mxnet", "profiler")

        with temp_dir("mxprof") as tmp:
            # mx.runtime.Features() reports PROFILER off in the PyPI 1.9.1 wheel, yet the operator
            # profiler works there (measured); if it does not on some build, say so instead of guessing.
            try:
                profiler.set_config(profile_all=True, aggregate_stats=True, filename=str(Path(tmp) / "mx.json"))
                profiler.set_state("run")
                for _ in range(runs):
                    self.infer()
                self.mx.nd.waitall()
                profiler.set_state("stop")
                stats = json.loads(profiler.dumps(reset=True, format="json"))
            except Exception as exc:  # the profiler is optional; latency does not depend on it
                return {"available": False,
                        "note": f"MXNet's profiler is not usable in this build ({type(exc).__name__}: {exc})"}
        ops = (stats.get("Time") or {}).get("operator") or {}
        rows = []
        for name, st in ops.items():
            if name in ("WaitForVar", "DeleteVariable"):
                continue  # engine bookkeeping, not model operators
            rows.append((name, float(st.get("Total", 0.0)), int(st.get("Count", 0))))
        if not rows:
            return {"available": False, "note": "MXNet's profiler recorded no operator events in this build"}
        return _op_table_agg(rows, runs, "MXNet profiler (mx.profiler, aggregate operator stats) over the "
                                         "hybridized graph; works although mx.runtime.Features() lists "
                                         "PROFILER as off in the PyPI 1.9.1 wheel")


def _load_gluon_unrun(text: str, params, chw):
    """Load a Gluon MODEL without its check-run, so the first inference timed here is the real first."""
    from .. import models

    return models.load_gluon_unrun(text, params, tuple(chw) if chw else None)


def _op_table(events: list[tuple[str, float]], runs: int, source: str) -> dict:
    agg: dict[str, list[float]] = {}
    for op, ms in events:
        a = agg.setdefault(op, [0.0, 0])
        a[0] += ms
        a[1] += 1
    return _op_table_agg([(op, v[0], v[1]) for op, v in agg.items()], runs, source)


def _op_table_agg(rows: list[tuple[str, float, int]], runs: int, source: str) -> dict:
    total = sum(r[1] for r in rows) or 1.0
    table = [{"op": op, "calls_per_run": calls / runs, "ms_per_run": ms / runs, "share": ms / total}
             for op, ms, calls in sorted(rows, key=lambda r: -r[1])]
    return {"available": True, "runs": runs, "table": table, "total_ms_per_run": total / runs,
            "source": source, "provenance": "measured"}


# --- the plan: export if needed, graph statistics for the memory model ---------------------------------

def plan(spec: dict) -> dict:
    """Everything the parent needs before the timed children, done here so model code cannot crash it.

    A Gluon MODEL to be run by ONNX Runtime is exported first (``spec["export_to"]``); the graph
    statistics come from the file that will run (ONNX) or from the symbol (MXNet).
    """
    from . import memory_model

    out: dict = {"notes": []}
    if spec.get("reference_net"):
        # the speed reference's network, written without mxnet (a device has none)
        from . import reference_net

        side = int((spec.get("chw") or [3, 224, 224])[-1])
        Path(spec["export_to"]).write_bytes(reference_net.reference_onnx(spec["reference_net"], side=side,
                                                                dynamic_batch=spec["batch"] != 1))
        out["preprocess"] = {**reference_net.PREPROCESS, "input_shape": [3, side, side]}
        out["random_weights"] = True
        out["model_file"] = spec["export_to"]
    elif spec.get("export_to"):
        from ..convert import export_onnx
        from ..models import load_gluon

        model = load_gluon(spec["model"], params=spec.get("params"),
                           input_shape=tuple(spec["chw"]) if spec.get("chw") else None)
        export_onnx(model, spec["export_to"], opset=13, dynamic_batch=spec["batch"] != 1)
        out["preprocess"] = model.preprocess.to_dict()
        out["random_weights"] = model.random_weights
        out["notes"] += model.notes
        out["model_file"] = spec["export_to"]
    if spec["runtime"] == "onnxruntime":
        path = out.get("model_file") or spec["model_file"]
        if "preprocess" not in out:
            from ..models import load_onnx

            onnx_model = load_onnx(path)
            out["preprocess"] = onnx_model.preprocess.to_dict() if onnx_model.preprocess else None
            out["random_weights"] = False
        chw = spec.get("chw") or (out["preprocess"] or {}).get("input_shape")
        stats = memory_model.onnx_stats(path, [spec["batch"], *chw] if chw else None, spec["batch"])
    else:
        stats, info = memory_model.mxnet_stats(spec["model"], spec.get("params"), spec.get("chw"), spec["batch"],
                                               with_info=True)
        out.update(info)
    out["stats"] = stats.to_dict()
    return out


# --- the runtime baseline -----------------------------------------------------------------------------

def baseline(runtime: str) -> dict:
    """RSS after importing ``runtime`` and running a one-node graph (runtime + allocator start-up)."""
    import numpy as np

    if runtime == "onnxruntime":
        ort = _lazy.onnxruntime()

        after_import = rss_mb()
        TensorProto, helper = _lazy.from_import("onnx", "TensorProto", "helper")

        graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "baseline",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                                  [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
        model.ir_version = 8
        data = model.SerializeToString()
        before_session = rss_mb()
        sess = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
        sess.run(None, {"x": np.ones((1, 4), "float32")})
        # A deployed app does not import onnx: count ORT's import and its session start-up, not onnx.
        after = rss_mb()
        rss = None if None in (after_import, before_session, after) else after_import + (after - before_session)
    else:
        mx = _lazy.mxnet()

        mx.nd.relu(mx.nd.ones((1, 4))).asnumpy()
        rss = rss_mb()
    if rss is None:  # no /proc: the process's peak (getrusage) -- after start-up, about its resident size
        rss = peak_rss_mb()
    return {"runtime": runtime, "rss_mb": rss}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
