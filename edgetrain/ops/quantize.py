"""`edgetrain quantize`: an int8 model calibrated on the user's data, within the accuracy budget they set.

Steps: get an fp32 ONNX model (export a Gluon MODEL, or take an exported .onnx), pre-process it (shape
inference, BatchNorm folding), calibrate once on ``--calib`` samples, quantize with the scheme the target
CPU calls for, and, with ``--val``, compare top-1 against fp32. While the drop exceeds ``max_drop``, keep
the nodes that lose the most signal in fp32 and quantize again (calibration is reused). The best model
is always written; the result's ``failed_checks`` say whether it is within budget.

What is written is int8, whatever ``-o`` is called and whichever ``--scheme``: fp32 is timed as the
reference, never written. Where it ran faster than every int8 candidate, ``fp32_fastest`` and a note say so
beside the int8 figures (issue 37).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from .. import _lazy
from ..convert import check_batch_sizes
from ..errors import RunFailed, UsageError
from ..figures import Calibration, Chance, Int8Accuracy, Int8Latency, Int8Size
from ..fileio import atomic_path, check_output_path, temp_dir
from ..host import detect_host, host_load
from ..int8 import (DYNAMIC_OPS, Candidate, NodeError, Quantizer, SchemeRecord, calibration_notes,
                    calibration_reader, check_memory_plan, check_not_quantized, check_symbol_not_quantized,
                    dynamic_applies, int8_weight_count, load_calibration, load_validation, measure, memory_plan,
                    node_errors, onnx_top1, prepare, quantize_mxnet, quantized_node_names, rank_nodes, scheme_for,
                    set_metadata, static_candidates, stride_for)
from ..models import load_onnx, parse_model_ref
from ..options import QuantizeOptions
from ..procmem import release_freed_memory
from ..results import ProgressFn, Result, stage
from ..runners import OrtRunner
from ..runtime import current_threads

RANKING_SAMPLES = 8    # samples compared activation by activation to rank nodes: every activation is held in memory
MAX_STEPS = 12
INT8_BATCH_RTOL = 0.05  # a batch vs its samples one by one, int8: a few quantization steps of the largest output
NODE_ERROR_ROWS = 10   # nodes listed with their SQNR in the report (those that lose most)


@dataclass
class BudgetStep:
    step: int
    kept_fp32: list[str]        # every node in fp32 at this step (cumulative)
    added: list[str]            # the nodes this step moved to fp32
    int8_top1: float
    drop: float

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class QuantizeResult(Result):
    model: str
    output: str
    backend: str
    scheme: SchemeRecord
    calibration: Calibration
    accuracy: Int8Accuracy
    steps: list[BudgetStep]
    nodes_kept_fp32: list[str]
    size: Int8Size
    latency: Int8Latency | None  # None: --no-latency
    onnx_exportable: bool
    warnings: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    node_errors: list[NodeError] = field(default_factory=list)  # the nodes that lose most first
    # fp32 (timed as the reference, never written) ran faster on this host than every int8 candidate; None:
    # the scheme was not measured (--scheme rule, another device, --backend mxnet)
    fp32_fastest: bool | None = None

    def checks(self) -> list[str]:
        a = self.accuracy
        failed = []
        if a.over_budget:
            failed.append(f"int8 top-1 drop {a.drop:.2f} pts exceeds --max-drop {a.max_drop:g}: the best model "
                          "is kept; calibrate on more representative data, allow more --max-fp32-nodes, or raise "
                          "--max-drop")
        return failed + (a.chance.failures("int8") if a.chance else [])


def quantize(model: str, opts: QuantizeOptions, progress: ProgressFn | None = None) -> QuantizeResult:
    """Quantize MODEL to int8 calibrated on ``opts.calib``; see the module docstring.

    The device (``opts.device``, None for this host) chooses the int8 scheme and the thread count the
    latency is measured at (``opts.threads`` overrides it). ``max_fp32_nodes`` caps how many nodes the budget
    search may keep in fp32 (default: half the quantized nodes; beyond that the model is barely int8).
    """
    profile = opts.profile()
    threads = current_threads()  # the cap applied for these options (runtime.apply_threads)
    output = Path(opts.output)
    scheme = scheme_for(profile, per_channel=opts.per_channel)
    if opts.backend == "mxnet":
        fields = quantize_mxnet(model, opts, output, scheme=scheme, threads=threads, progress=progress)
        return QuantizeResult(**{**fields, "steps": [BudgetStep(**s) for s in fields["steps"]]})
    if output.suffix.lower() != ".onnx":
        raise UsageError("the onnxruntime backend writes an .onnx file", str(output), "name the output *.onnx")
    check_output_path(output, "-o")
    with temp_dir("quantize") as tmp:  # PID-named: a SIGKILLed run's is removed next time
        return _quantize_ort(model, opts, output, scheme, threads, progress, Path(tmp), profile)


def _fp32_onnx(model: str, workdir: Path, params, input_shape, progress=None, mean=None, std=None):
    """(OnnxModel of the fp32 graph, number of classes, notes) for a Gluon MODEL or an exported .onnx."""
    ref = parse_model_ref(model, accept_onnx=True)
    notes = []
    if ref.kind == "onnx":
        onnx_model = load_onnx(ref.onnx_file)
        if onnx_model.preprocess is None:
            raise UsageError("ONNX file has no edgetrain preprocessing record (metadata 'edgetrain.preprocess')",
                             model, "export it with `edgetrain export`, or pass the Gluon MODEL it came from")
        if input_shape and tuple(input_shape) != onnx_model.preprocess.input_shape:
            onnx_model.preprocess = onnx_model.preprocess.with_shape(tuple(input_shape))
        from ..models import with_norm

        onnx_model.preprocess = with_norm(onnx_model.preprocess, mean, std)
    else:
        if ref.kind == "prefix":
            check_symbol_not_quantized(ref.symbol_file, model)
        from ..convert import export_onnx
        from ..models import load_gluon

        gluon_model = load_gluon(model, params=params, input_shape=input_shape, mean=mean, std=std)
        if gluon_model.random_weights:
            notes.append("the model has random weights (no --params given): accuracy figures mean nothing until "
                         "it is trained")
        notes.extend(n for n in gluon_model.notes if "random weights" not in n)
        report = stage(progress, "export") or (lambda done, total: None)
        report(0, 1)
        path = export_onnx(gluon_model, workdir / "fp32.onnx", opset=13, dynamic_batch=True)
        report(1, 1)
        onnx_model = load_onnx(path)
        if onnx_model.preprocess is None:  # keep the preprocessing with the model whatever export did
            import json

            onnx_model.metadata["edgetrain.preprocess"] = json.dumps(gluon_model.preprocess.to_dict())
            onnx_model.preprocess = gluon_model.preprocess

    check_not_quantized(onnx_model.proto, model)
    return onnx_model, _num_classes(onnx_model), notes


def _num_classes(onnx_model) -> int:
    out = onnx_model.proto.graph.output[0].type.tensor_type.shape.dim
    return int(out[-1].dim_value) if out and out[-1].dim_value > 0 else 0


def _check_fits(fp32_path: Path, sample, where: str, threads: int) -> None:
    """Run one preprocessed sample through the fp32 model: calibration data that does not fit fails here."""
    try:
        OrtRunner(fp32_path, threads).infer(sample)
    except (MemoryError, ImportError, OSError) as exc:  # the runtime could not load or allocate: not the data's fault
        raise RunFailed(f"could not run the model once ({str(exc).splitlines()[0][:200]})", where,
                        "free memory, or raise the address-space limit (ulimit -v)") from None
    except Exception as exc:  # ORT raises InvalidArgument / Fail with a long message
        first = str(exc).splitlines()[0][:200]
        raise UsageError(f"samples of shape {','.join(map(str, sample.shape))} do not fit the model input: {first}",
                         where, "give data of the kind the model was built for, or pass --input-shape") from None
    release_freed_memory()  # the session is gone: its arena is not kept under the rest of the work


def _quantize_ort(model, opts: QuantizeOptions, output: Path, scheme, threads: int, progress, tmp: Path,
                  profile) -> QuantizeResult:
    calib, val, max_drop, method, samples = opts.calib, opts.val, opts.max_drop, opts.method, opts.samples

    onnx_model, num_classes, notes = _fp32_onnx(model, tmp, opts.params, opts.input_shape, progress,
                                                     mean=opts.mean, std=opts.std)
    pre = onnx_model.preprocess
    if profile is not None:  # the device's budget: a quantize that would not fit is refused before the work
        plan = memory_plan(onnx_model.path, pre.input_shape, float(profile.memory_budget_mb),
                           search=_scheme_measured(opts, profile, detect_host()))
        check_memory_plan(plan, profile.name)
        notes.append(f"memory plan: about {plan.need_mb:.0f} MB at the peak ({plan.peak_phase}), within "
                     f"{profile.name}'s memory budget of {plan.budget_mb:.0f} MB")
    full_calib, calib_ds = load_calibration(calib, pre, samples)
    val_ds = load_validation(val, pre, num_classes) if val else None
    _check_fits(onnx_model.path, calib_ds.batch([0]), "--calib", threads)
    notes.extend(calibration_notes(full_calib, calib_ds, samples, num_classes))

    prepared = tmp / "fp32_prepared.onnx"
    report = stage(progress, "pre-process") or (lambda done, total: None)
    report(0, 1)
    node_names = prepare(onnx_model.path, prepared)
    report(1, 1)
    reader = calibration_reader(calib_ds, pre.input_name, stage(progress, "calibrate"))

    def quantizer_for(s) -> Quantizer:  # every scheme reuses the one calibration (cached in tmp)
        return Quantizer(prepared, tmp, s, method, reader, len(calib_ds), stride_for(len(calib_ds)))

    quantizer = quantizer_for(scheme)
    candidate = tmp / "int8_0.onnx"
    quantizer.quantize(candidate)
    quantized = quantized_node_names(candidate, node_names)
    if not quantized or not int8_weight_count(candidate):
        ops = ", ".join(sorted({n.op_type for n in onnx_model.proto.graph.node}))
        raise UsageError(f"nothing in this model quantizes to int8 (its operators: {ops[:150]})", model,
                         "quantize a model with convolutions or dense layers (Conv, MatMul, Gemm), or deploy it "
                         "in fp32 as exported")
    # at most all but one node in fp32: the file written stays int8
    cap = (len(quantized) // 2 if opts.max_fp32_nodes is None
           else min(opts.max_fp32_nodes, len(quantized) - 1))

    steps: list[BudgetStep] = []
    best, accuracy, within_budget = (candidate, []), Int8Accuracy(checked=False, max_drop=max_drop), None
    if val_ds is not None:
        fp32_top1 = onnx_top1(onnx_model.path, val_ds, threads, stage(progress, "fp32 top-1"))
        int8_top1 = onnx_top1(candidate, val_ds, threads, stage(progress, "int8 top-1"))
        steps.append(BudgetStep(0, [], [], int8_top1, fp32_top1 - int8_top1))
        if fp32_top1 - int8_top1 > max_drop and cap > 0:
            ranking_ds = val_ds.sample(RANKING_SAMPLES)
            ranked = rank_nodes(prepared, candidate, quantized,
                                lambda: calibration_reader(ranking_ds, pre.input_name), tmp, threads)

            def trial(kept: list[str], step: int) -> tuple[Path, float]:
                path = quantizer.quantize(tmp / f"int8_{step}.onnx", kept)
                return path, onnx_top1(path, val_ds, threads, stage(progress, f"step {step} top-1"))

            best = _search(trial, [name for name, _ in ranked][:cap], steps, candidate, fp32_top1, max_drop)
        chosen = next(s for s in steps if s.kept_fp32 == best[1])
        within_budget = chosen.drop <= max_drop + 1e-9
        # a model at chance passes no budget worth having; random weights are at chance by construction
        chance = Chance.measure(chosen.int8_top1, val_ds.labels, num_classes or val_ds.num_classes,
                                allowed=bool(opts.allow_chance)
                                or onnx_model.metadata.get("edgetrain.random_weights") == "true")
        accuracy = Int8Accuracy(checked=True, fp32_top1=fp32_top1, int8_top1=chosen.int8_top1, drop=chosen.drop,
                                max_drop=max_drop, samples=len(val_ds), source=val, chance=chance)
        if within_budget is False:
            notes.append(f"searched up to {cap} of {len(quantized)} quantized nodes kept in fp32 "
                         "(--max-fp32-nodes)")
    else:
        notes.append("accuracy was not checked: pass --val DATA to measure the int8 model against fp32")

    best_path, kept = best
    host = detect_host()
    measured = _scheme_measured(opts, profile, host)
    metadata = onnx_model.metadata

    def write(path: Path, name: str, kept_nodes: list[str], final: bool) -> None:
        """The int8 model written to -o, atomically; while the search runs, the best so far (final False)."""
        record = {"scheme": name, "precision": "int8", "method": method,
                  "calibration_samples": len(calib_ds), "nodes_kept_fp32": kept_nodes, "tool": "edgetrain quantize",
                  "search": "done" if final else "stopped before the end: the best candidate so far"}
        staged = tmp / "staged.onnx"
        staged.write_bytes(Path(path).read_bytes())
        set_metadata(staged, metadata, record)
        with atomic_path(output, "-o") as dst:
            dst.write_bytes(staged.read_bytes())

    search, fp32_fastest = None, None
    if measured:
        from ..int8 import fastest

        search = _scheme_candidates(onnx_model, prepared, quantizer_for, scheme, best_path, kept,
                                    accuracy.int8_top1, val_ds, accuracy.fp32_top1, max_drop, threads, host, tmp,
                                    progress, qdq_only=opts.scheme == "qdq")
        loads = [host_load()]
        _measure(search, pre.batch_shape(1), threads, write, kept, progress)
        loads.append(host_load())
        chosen = fastest(search)
        if chosen is None:  # no int8 candidate ran within the budget: the rule's model, the accuracy search's best
            chosen = next(c for c in search if c.rule)
            notes.append("no int8 candidate both ran and stayed within the budget: the rule's scheme (the accuracy "
                         "search's best) was written")
        host_quiet = _host_quiet(loads, host)
        warnings_timed = _timing_warnings(chosen, host_quiet)
        chosen.chosen = True
        kept = kept if chosen.kind == "static" else []
        best_path = chosen.path
        scheme_record = _measured_scheme(chosen, search, scheme, host, threads)
        scheme_record.host_quiet = host_quiet
        fp32_fastest = _fp32_fastest(search, chosen, notes)
        if accuracy.checked and chosen.top1 is not None:
            accuracy.int8_top1, accuracy.drop = chosen.top1, chosen.drop
            within_budget = chosen.within_budget
    else:
        warnings_timed = []
        if opts.scheme != "rule":
            notes.append(f"the scheme was not measured: quantizing for {profile.name} on this host "
                         f"({host.cpu}, {host.arch}); ONNX Runtime's rule for its CPU was used (run quantize on "
                         "the device to choose by measurement)")
        else:
            notes.append("the scheme was not measured (--scheme rule): ONNX Runtime's rule for the CPU was used")
        scheme_record = SchemeRecord.of(scheme, measured=False, reason=scheme.reason + " (rule; not measured)")
    write(best_path, scheme_record.name, kept, final=True)
    written = tmp / "staged.onnx"  # the bytes -o got: read back from here, as -o may be a device or a FIFO
    batch = check_batch_sizes(written, pre, threads, str(output), rtol=INT8_BATCH_RTOL)
    notes.append("the model takes any batch size (checked at batch " + " and ".join(map(str, batch["checked_sizes"]))
                 + ")" if batch["dynamic"] else f"the model takes a fixed batch of {batch['batch']} (as its input)")
    node_errors = _node_errors(prepared, candidate, kept, val_ds or calib_ds, pre, tmp, notes, threads)

    fp32_bytes, int8_bytes = onnx_model.path.stat().st_size, written.stat().st_size
    if int8_bytes >= fp32_bytes:
        why = (f"{len(kept)} node(s) are kept in fp32 for accuracy, and quantizing the rest adds scales, zero "
               "points and nodes" if kept else "this model has too few weights for int8 to save more than the "
               "scales, zero points and extra nodes quantizing adds")
        notes.append(f"the int8 file is not smaller than the fp32 one ({int8_bytes:,} B against {fp32_bytes:,} B): "
                     f"{why}")
    latency = _measured_latency(search, threads, pre, host) if search is not None and opts.latency else None
    if latency is None and opts.latency:  # not measured, or the written model's timing failed
        latency = _latency(onnx_model.path, written, pre.batch_shape(1), threads, profile, stage(progress, "latency"))
    warnings = ([scheme.warning] if scheme.warning and search is None else []) + warnings_timed
    if within_budget is False:
        warnings.append(f"no mix of int8 and fp32 nodes met --max-drop {max_drop:g}: kept the best "
                        f"(drop {accuracy.drop:.2f} pts with {len(kept)} node(s) in fp32)")
    return QuantizeResult(
        model=model, output=str(output), backend="onnxruntime", scheme=scheme_record,
        calibration=Calibration(method, len(calib_ds), calib), accuracy=accuracy, steps=steps,
        nodes_kept_fp32=kept, size=Int8Size.of(fp32_bytes, int8_bytes), latency=latency, onnx_exportable=True,
        warnings=warnings, notes=notes, node_errors=node_errors, fp32_fastest=fp32_fastest)


def _scheme_measured(opts: QuantizeOptions, profile, host) -> bool:
    """Whether the scheme is chosen by timing the candidates in child processes: where quantize runs on the
    device's CPU (or with no --device), unless --scheme rule."""
    return opts.scheme != "rule" and (profile is None or host.matches(profile))


def _scheme_candidates(onnx_model, prepared: Path, quantizer_for, rule, rule_path: Path, kept: list[str],
                       rule_top1, val_ds, fp32_top1, max_drop: float, threads: int, host, tmp: Path, progress,
                       qdq_only: bool = False):
    """fp32 (the reference, never written), the rule's model (already searched for the budget), the other
    static schemes with the same nodes kept in fp32, and dynamic int8 where it applies; each with its size
    and (with --val) top-1. Dynamic int8 not smaller than every static model is excluded from writing, as is
    all but QDQ with ``qdq_only`` (--scheme qdq): they are still timed, for the table."""
    cands = [Candidate("fp32", "fp32", None, onnx_model.path, top1=fp32_top1,
                       drop=0.0 if fp32_top1 is not None else None, within_budget=True,
                       excluded="the fp32 reference: quantize writes an int8 model")]
    for i, s in enumerate(static_candidates(rule, host.arch, dict(host.isa))):
        c = Candidate(s.name, "static", s, rule=i == 0)
        if qdq_only and s.format != "QDQ":
            c.excluded = "--scheme qdq writes QDQ only"
        try:
            c.path = rule_path if i == 0 else quantizer_for(s).quantize(tmp / f"scheme_{i}.onnx", kept)
        except Exception as exc:  # a scheme ORT cannot build for this graph is reported, not fatal
            c.error = f"quantizing failed: {str(exc).splitlines()[0][:150]}"
        cands.append(c)
    if dynamic_applies(onnx_model.proto):
        quantize_dynamic, QuantType = _lazy.from_import("onnxruntime.quantization", "quantize_dynamic", "QuantType")
        from ..int8 import quiet_ort

        c = Candidate("dynamic (MatMul/Gemm int8)", "dynamic")
        try:
            with quiet_ort():
                quantize_dynamic(str(prepared), str(tmp / "dynamic.onnx"), weight_type=QuantType.QInt8,
                                 op_types_to_quantize=list(DYNAMIC_OPS))
            c.path = tmp / "dynamic.onnx"
        except Exception as exc:
            c.error = f"quantizing failed: {str(exc).splitlines()[0][:150]}"
        cands.append(c)
    for c in cands:
        if c.path is not None:
            c.size_bytes = Path(c.path).stat().st_size
    static = [c.size_bytes for c in cands if c.kind == "static" and c.size_bytes is not None]
    for c in cands:
        if c.kind == "dynamic" and qdq_only:
            c.excluded = "--scheme qdq writes QDQ only"
        elif c.kind == "dynamic" and c.size_bytes is not None and static and c.size_bytes >= min(static):
            c.excluded = (f"not smaller than the static int8 models ({c.size_bytes:,} B against {min(static):,} B: "
                          "its convolutions stay fp32)")
    report = stage(progress, "candidates' top-1") or (lambda done, total: None)
    for k, c in enumerate(cands):
        if c.kind == "fp32" or c.error is not None:
            continue
        if c.rule:
            c.top1 = rule_top1
        elif val_ds is not None:
            c.top1 = onnx_top1(c.path, val_ds, threads)
        if c.top1 is not None and fp32_top1 is not None:
            c.drop = fp32_top1 - c.top1
            c.within_budget = c.drop <= max_drop + 1e-9
        report(k + 1, len(cands))
    return cands


def _host_quiet(loads: list, host) -> dict:
    """energy.reliability of the scheme timings: the 1-minute load average before and after them."""
    from ..energy import reliability

    known = [x for x in loads if x is not None]
    return reliability(None, max(known) if known else None, host.cores_usable)


def _timing_warnings(chosen, host_quiet: dict) -> list[str]:
    """What a user must know about a choice made from timings: a busy host."""
    if host_quiet["reliable"]:
        return []
    return [f"the scheme was chosen from timings on a busy host ({'; '.join(host_quiet['reasons'])}): "
            f"{chosen.name} may not be the fastest on a quiet one; quantize again when the host is idle"]


def _fp32_fastest(cands, chosen, notes: list[str]) -> bool | None:
    """Whether fp32 (timed, never written) outran every int8 candidate timed; said in a note when it did,
    or when it outran the int8 model written. None: fp32 or no int8 candidate could be timed."""
    fp32 = next(c for c in cands if c.kind == "fp32")
    timed = [c for c in cands if c.kind != "fp32" and c.error is None and c.p50_ms is not None]
    if fp32.p50_ms is None or not timed:
        return None
    best = min(timed, key=lambda c: c.p50_ms)
    if fp32.p50_ms < best.p50_ms:
        # the fastest int8 may be one that was not written (not smaller, over the budget): the one written said too
        written = ("" if best is chosen or chosen.p50_ms is None else
                   f"; {best.name} was not written ({best.excluded or 'over the budget'}), "
                   f"the int8 model written, {chosen.name}, took {chosen.p50_ms:.3f} ms")
        notes.append(f"fp32 ran faster on this host than every int8 candidate ({fp32.p50_ms:.3f} ms against "
                     f"{best.p50_ms:.3f} ms for {best.name}, the fastest int8{written}): the int8 model was written, "
                     "as quantize always does; where speed matters more than size, deploy the fp32 model instead")
        return True
    if chosen.p50_ms is not None and fp32.p50_ms < chosen.p50_ms:
        notes.append(f"fp32 ran faster on this host than the int8 model written ({fp32.p50_ms:.3f} ms against "
                     f"{chosen.p50_ms:.3f} ms); the int8 candidates that beat it were over the budget or not "
                     "smaller")
    return False


def _measure(cands, batch_shape, threads: int, write, kept: list[str], progress) -> None:
    """Time the candidates in fresh processes; write the best so far (of those that may be written) as soon
    as it is known."""
    best = {"p50": None}

    def saved(c) -> None:
        if c.writable and (best["p50"] is None or c.p50_ms < best["p50"]):
            best["p50"] = c.p50_ms
            write(c.path, c.name, kept if c.kind == "static" else [], final=False)

    measure(cands, batch_shape, threads, on_measured=saved, progress=stage(progress, "time candidates"))


def _measured_scheme(chosen, cands, rule, host, threads: int) -> SchemeRecord:
    others = sorted((c for c in cands if c.writable and c is not chosen), key=lambda c: c.p50_ms)
    runner_up = (f"; next {others[0].name} {others[0].p50_ms:.3f} ms" if others else "")
    budget = "within the accuracy budget" if chosen.top1 is not None else "(accuracy not checked: no --val)"
    p50 = f"p50 {chosen.p50_ms:.3f} ms" if chosen.p50_ms is not None else "not timed"
    n = sum(c.writable for c in cands)
    fp32 = next((c for c in cands if c.kind == "fp32" and c.p50_ms is not None), None)
    reference = f"; fp32 {fp32.p50_ms:.3f} ms (the reference, never written)" if fp32 is not None else ""
    measured = dict(name=chosen.name, target=f"this host ({host.cpu}, {host.arch})", measured=True, rule=rule,
                    candidates=list(cands),
                    reason=f"measured: the fastest of {n} int8 candidate{'s' if n != 1 else ''} {budget}, "
                           f"{p50} at batch 1, {threads} thread(s), each timed in fresh "
                           f"processes{runner_up}{reference}; ONNX Runtime's rule would have chosen {rule.name}")
    if chosen.scheme is not None:
        return SchemeRecord.of(chosen.scheme, **measured)
    return SchemeRecord(format="dynamic", **measured)


def _measured_latency(cands, threads: int, pre, host) -> Int8Latency | None:
    fp32 = next(c for c in cands if c.kind == "fp32")
    chosen = next(c for c in cands if c.chosen)
    if fp32.p50_ms is None or chosen.p50_ms is None:
        return None
    return Int8Latency.of(fp32.p50_ms, chosen.p50_ms, threads, 1, "onnxruntime",
                          f"this host ({host.cpu}, {host.arch}), each candidate in fresh processes "
                          f"(the written model: {chosen.name})")


def _node_errors(prepared: Path, all_int8: Path, kept: list[str], ds, pre, tmp: Path, notes,
                 threads: int) -> list[NodeError]:
    """Per-node SQNR of the all-int8 model against fp32 (the nodes that lose most first), and which of them
    the written model keeps in fp32: why a node was kept."""
    try:
        sample = ds.sample(RANKING_SAMPLES)
        rows = node_errors(prepared, all_int8, lambda: calibration_reader(sample, pre.input_name), tmp, threads)
    except Exception as exc:  # a diagnostic: its failure must not cost the user the model
        notes.append(f"per-node SQNR not measured: {str(exc).splitlines()[0][:150]}")
        return []
    for r in rows:
        r.kept_fp32 = r.node in kept
    return rows[:NODE_ERROR_ROWS]


def _search(trial, order: list[str], steps: list[BudgetStep], first: Path, fp32_top1: float,
            max_drop: float) -> tuple[Path, list[str]]:
    """Keep nodes in fp32 in ``order`` (costliest first) until the drop is within ``max_drop``.

    Steps grow 1, 1, 2, 2, 4, 4, ... nodes so a large model needs at most MAX_STEPS re-quantizations, while
    a small one is searched node by node. Appends a BudgetStep per trial; returns the best (path, nodes).
    """
    best, best_drop = (first, []), steps[0].drop
    kept: list[str] = []
    size, pos = 1, 0
    while pos < len(order) and len(steps) <= MAX_STEPS:
        added = order[pos:pos + size]
        pos += len(added)
        kept = kept + added
        path, top1 = trial(kept, len(steps))
        steps.append(BudgetStep(len(steps), list(kept), added, top1, fp32_top1 - top1))
        if fp32_top1 - top1 < best_drop:
            best, best_drop = (path, list(kept)), fp32_top1 - top1
        if best_drop <= max_drop:
            break
        if len(steps) % 2 == 1:
            size *= 2
    return best


def _latency(fp32_path: Path, int8_path: Path, batch_shape, threads: int, profile, progress=None) -> Int8Latency:
    host = detect_host()
    report = progress or (lambda done, total: None)
    report(0, 2)
    fp32 = OrtRunner(fp32_path, threads).time(batch_shape=batch_shape)
    report(1, 2)
    int8 = OrtRunner(int8_path, threads).time(batch_shape=batch_shape)
    report(2, 2)
    if profile is not None and host.matches(profile):
        where = f"this host ({host.cpu}), which matches {profile.name}"
    elif profile is not None and host.arch != profile.arch:
        where = (f"this host ({host.cpu}, {host.arch}), not on {profile.name}: the int8 scheme is chosen for "
                 f"{profile.arch} and may take a slower path here; profile it on the device")
    elif profile is not None:
        where = f"this host ({host.cpu}, {host.arch}), not on {profile.name}: relative figures only"
    else:
        where = f"this host ({host.cpu}, {host.arch})"
    return Int8Latency.of(fp32.p50_ms, int8.p50_ms, threads, batch_shape[0], "onnxruntime", where)
