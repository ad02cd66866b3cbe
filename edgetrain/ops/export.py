"""Gluon -> ONNX, proven equal: translate, repair, record the preprocessing, then validate.

``export_onnx`` only writes the file. ``export`` is the command's work: it also loads the exact bytes in
an ONNX Runtime session with every graph optimisation on, runs the Gluon model (MXNet) and that session
on the same inputs (random batches shaped like real preprocessed images, plus real samples from DATA)
and compares every output (``compare.py``). An out-of-tolerance result is still written (so it can be
inspected) and reported with ``passed=False``; the CLI turns that into exit 3.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import _lazy
from ..compare import Comparison, compare_outputs, g_up, merge
from ..convert import BATCH_SIZES, build_onnx, writable, write_atomically
from ..data import load_data
from ..errors import RunFailed, UsageError
from ..figures import Chance
from ..measure import profile as run_profile
from ..models import load_gluon
from ..options import ExportOptions, ProfileOptions
from ..results import Figure, ProgressFn, Result, optional, report
from ..runners import OrtRunner
from ..runtime import current_threads

FP32_TOLERANCE = (1e-4, 1e-3)  # atol, rtol
FP16_TOLERANCE = (1e-2, 1e-2)  # fp16 keeps ~3 significant digits
RANDOM_BATCHES = 3
DATA_SAMPLES = 16
DYNAMIC_BATCH_SIZES = BATCH_SIZES  # a dynamic-batch export is validated at each (the policy every file follows)


@dataclass(kw_only=True)
class ExportAccuracy(Figure):
    """Top-1 of the ONNX model on the --data samples, against chance; ``checked`` False (and a ``note``)
    when the data's labels are not the model's classes."""

    checked: bool | None = optional()   # present only when False
    top1: float | None = optional()
    samples: int | None = optional()
    chance: Chance | None = optional()
    note: str | None = optional()


@dataclass
class TensorSpec(Figure):
    name: str
    shape: list[int | str | None]   # a symbolic dimension by its name ("batch"), None when unnamed
    dtype: str


@dataclass
class ValidationBatch(Figure):
    source: str                      # "random0".., or "data" (DATA's samples)
    batch: int


@dataclass
class ExportResult(Result):
    path: str
    size_bytes: int
    model: str
    opset: int
    precision: str  # "fp32" | "fp16"
    dynamic_batch: bool
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    ops: dict[str, int]
    comparison: object  # compare.Comparison
    validated_with: list[ValidationBatch]
    device: str | None
    threads: int
    seconds: dict[str, float]
    metadata_keys: list[str]
    random_weights: bool = False
    notes: list[str] = field(default_factory=list)
    # With --device: the profile command's latency verdict and energy budget for the written file.
    energy: dict | None = None
    accuracy: ExportAccuracy | None = None  # with --data

    def checks(self) -> list[str]:
        chance = self.accuracy.chance if self.accuracy is not None else None
        failed = chance.failures("ONNX model") if chance is not None else []
        if not self.comparison.passed:
            worst = self.comparison.failed[0] if self.comparison.failed else None
            if worst is None:
                failed.append("the ONNX model was not compared with the Gluon model")
            elif worst.error:  # NaN, a wrong shape: no tolerance would pass
                failed.append(f"ONNX output '{worst.name}' does not match the Gluon model: {worst.error}")
            else:
                failed.append(f"ONNX output '{worst.name}' differs from the Gluon model beyond tolerance (max abs "
                              f"{worst.max_abs:.3g}, max rel {worst.max_rel:.3g}; atol {self.comparison.atol:g}, "
                              f"rtol {self.comparison.rtol:g}); it would pass with --atol "
                              f"{g_up(self.comparison.atol_needed)}")
        return failed + list((self.energy or {}).get("failed_checks", []))


def export(model_ref: str, opts: ExportOptions, progress: ProgressFn | None = None) -> ExportResult:
    """Export MODEL to ``opts.output`` and validate it against the Gluon model.

    ``atol``/``rtol`` default to 1e-4/1e-3 (fp32) or 1e-2/1e-2 (``fp16``). The thread cap in force
    (runtime.apply_threads) is used for ONNX Runtime. With a device, the export ends with the energy-budget
    report for the written file (``battery_wh``, ``rate`` in inferences per hour, ``budget_mj``).
    """
    say = lambda message: report(progress, "export", message=message)  # noqa: E731
    params, input_shape, opset, dynamic_batch, fp16, data = (opts.params, opts.input_shape, opts.opset,
                                                             opts.dynamic_batch, opts.fp16, opts.data)
    battery_wh, rate, budget_mj = opts.battery_wh, opts.rate, opts.budget_mj
    default_atol, default_rtol = FP16_TOLERANCE if fp16 else FP32_TOLERANCE
    atol = default_atol if opts.atol is None else opts.atol
    rtol = default_rtol if opts.rtol is None else opts.rtol
    output = writable(Path(opts.output))
    profile = opts.profile()
    opts.carbon_grid()  # both --country and --grid-intensity: refused before the work
    if profile is None and any(v is not None for v in (battery_wh, rate, budget_mj, opts.country, opts.grid_intensity)):
        raise UsageError("an energy budget needs a device", "--battery-wh/--rate/--budget-mj/--country",
                         "add --device NAME (its power figures price the energy)")
    threads = current_threads()

    t0 = time.perf_counter()
    say(f"loading {model_ref}")
    model = load_gluon(model_ref, params=params, input_shape=input_shape, mean=opts.mean, std=opts.std)
    samples = _real_samples(data, model) if data else None
    t1 = time.perf_counter()
    say(f"translating to ONNX opset {opset}" + (" (fp16)" if fp16 else ""))
    proto = build_onnx(model, opset=opset, dynamic_batch=dynamic_batch, fp16=fp16)
    blob = proto.SerializeToString()
    t2 = time.perf_counter()
    say("loading in ONNX Runtime (all graph optimisations)")
    session = _session(blob, threads, model.ref.text)
    say("validating: Gluon (MXNet) vs ONNX Runtime")
    batches = _validation_batches(model, dynamic_batch, samples)
    expected, actual, described = [], [], []
    out_names = [o.name for o in proto.graph.output]
    for what, x in batches:
        expected.append(_gluon_outputs(model, x, out_names))
        actual.append(_ort_outputs(session, x, out_names, model.ref.text))
        described.append(ValidationBatch(what, int(x.shape[0])))
    accuracy = _data_accuracy(samples, batches, actual, out_names, model, opts)
    comparison: Comparison = _compare(expected, actual, atol, rtol)
    comparison.batches = len(batches)
    t3 = time.perf_counter()
    write_atomically(blob, output)

    notes = list(model.notes)
    ref_mag = max((o.expected_max_abs for o in comparison.outputs), default=0.0)
    if ref_mag < 10 * atol:
        notes.append(f"the Gluon model's outputs are tiny (max |y| = {ref_mag:.3g}), so an absolute tolerance of "
                     f"{atol:g} proves little; compare with real weights (--params) or judge by max rel error")
    if samples is not None and samples[1]:
        notes.extend(samples[1])
    result = ExportResult(
        path=str(output), size_bytes=len(blob), model=model.ref.text, opset=opset,
        precision="fp16" if fp16 else "fp32", dynamic_batch=dynamic_batch,
        inputs=_io(proto.graph.input), outputs=_io(proto.graph.output),
        ops=dict(sorted(Counter(n.op_type for n in proto.graph.node).items())),
        comparison=comparison, validated_with=described,
        device=profile.name if profile is not None else None, threads=threads,
        seconds={"load": round(t1 - t0, 3), "translate": round(t2 - t1, 3), "validate": round(t3 - t2, 3)},
        metadata_keys=[p.key for p in proto.metadata_props], random_weights=model.random_weights, notes=notes,
        accuracy=accuracy,
    )
    if profile is not None and comparison.passed:
        say(f"energy budget on {profile.name}: profiling the exported file")
        from ..fileio import STREAM, output_target, temp_dir

        def budget(path):
            return _energy_budget(path, profile, threads, battery_wh, rate, budget_mj, say, opts.country,
                                  opts.grid_intensity)

        if output_target(output)[0] == STREAM:  # -o /dev/null or a FIFO: profile the same bytes from a file
            with temp_dir("export") as folder:
                (folder / "model.onnx").write_bytes(blob)
                result.energy = budget(folder / "model.onnx")
        else:
            result.energy = budget(output)
    return result


ENERGY_WARMUP, ENERGY_RUNS = 5, 30


def _energy_budget(path: Path, profile, threads: int, battery_wh, rate, budget_mj, say, country=None,
                   grid_intensity=None) -> dict:
    """The profile command's device verdict and energy budget for the exported file (a short run)."""
    opts = ProfileOptions(device=profile, threads=[threads], warmup=ENERGY_WARMUP, runs=ENERGY_RUNS,
                          battery_wh=battery_wh, rate=rate, budget_mj=budget_mj, country=country,
                          grid_intensity=grid_intensity)
    pr = run_profile(str(path), opts, op_profile=False, progress=say)
    return {"runs": ENERGY_RUNS, "threads": threads, "latency": pr.verdict.get("latency"),
            "memory": pr.verdict.get("memory"), "report": pr.energy, "failed_checks": pr.failed_checks}


def _session(blob: bytes, threads: int, where: str) -> OrtRunner:
    try:
        return OrtRunner(blob, threads)
    except Exception as exc:
        raise RunFailed(f"ONNX Runtime refused the exported model: {str(exc).splitlines()[0][:300]}", where,
                        "report this with the model; EDGETRAIN_DEBUG=1 shows the details") from exc


def _real_samples(data, model):
    ds = load_data(data, model.preprocess)
    x, labels = ds.arrays(DATA_SAMPLES)
    return x, list(ds.notes), labels


def _data_accuracy(samples, batches, actual, out_names, model, opts) -> ExportAccuracy | None:
    """Top-1 of the ONNX model on the --data samples (their labels), checked against chance."""
    if samples is None or len(samples) < 3 or model.num_classes < 2:
        return None

    logits = np.concatenate([np.asarray(out[out_names[0]]).reshape(len(x), -1)
                             for (what, x), out in zip(batches, actual) if what == "data"])
    labels = np.asarray(samples[2][: len(logits)])
    if logits.shape[1] != model.num_classes or labels.max(initial=0) >= model.num_classes:
        return ExportAccuracy(checked=False, note="the data's labels are not the model's classes")
    top1 = 100.0 * float(np.mean(np.argmax(logits, axis=1) == labels))
    # random weights are at chance by construction: that export checks the conversion, not the model
    chance = Chance.measure(top1, labels, model.num_classes, allowed=bool(opts.allow_chance or model.random_weights))
    return ExportAccuracy(top1=top1, samples=int(len(labels)), chance=chance)


def _validation_batches(model, dynamic_batch: bool, samples) -> list[tuple[str, np.ndarray]]:
    """Random batches that look like preprocessed images (uniform pixels, then mean/std), then real data."""
    pre = model.preprocess
    sizes = DYNAMIC_BATCH_SIZES if dynamic_batch else (1,)
    mean = np.asarray(pre.mean, dtype=np.float32).reshape(-1, 1, 1)
    std = np.asarray(pre.std, dtype=np.float32).reshape(-1, 1, 1)
    out = []
    for k in range(RANDOM_BATCHES):
        n = sizes[k % len(sizes)]
        pix = np.random.RandomState(k).rand(n, *pre.input_shape).astype(np.float32)
        out.append((f"random{k}", ((pix - mean) / std).astype(np.float32)))
    if samples is not None:
        x = samples[0]
        step = max(sizes)
        for start in range(0, len(x), step):
            chunk = x[start:start + step]
            if not dynamic_batch:  # a fixed-batch model takes one sample at a time
                out.extend(("data", chunk[i:i + 1]) for i in range(len(chunk)))
            else:
                out.append(("data", chunk))
    return out


def _gluon_outputs(model, x: np.ndarray, names: list[str]) -> dict:
    mx = _lazy.mxnet()

    out = model.block(mx.nd.array(x, dtype="float32"))
    outs = list(out) if isinstance(out, (list, tuple)) else [out]
    return {n: o.asnumpy() for n, o in zip(names, outs)}


def _ort_outputs(runner: OrtRunner, x: np.ndarray, names: list[str], where: str) -> dict:
    try:
        res = runner.run(x, names)
    except Exception as exc:
        raise RunFailed(f"ONNX Runtime failed to run the exported model: {str(exc).splitlines()[0][:300]}", where,
                        "report this with the model; EDGETRAIN_DEBUG=1 shows the details") from exc
    return dict(zip(names, res))


def _compare(expected: list[dict], actual: list[dict], atol: float, rtol: float):
    """One comparison over every batch: concatenated along the batch axis."""
    return compare_outputs(merge(expected), merge(actual), atol=atol, rtol=rtol)


def _io(values) -> list[TensorSpec]:
    helper = _lazy.from_import("onnx", "helper")

    out = []
    for v in values:
        t = v.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
        out.append(TensorSpec(v.name, shape, str(np.dtype(helper.tensor_dtype_to_np_dtype(t.elem_type)))))
    return out
