"""`edgetrain quantize`: an int8 model calibrated on the user's data, within the accuracy budget they set.

Steps: get an fp32 ONNX model (export a Gluon MODEL, or take an exported .onnx), pre-process it (shape
inference, BatchNorm folding), calibrate once on ``--calib`` samples, quantize with the scheme the target
CPU calls for, and, with ``--val``, compare top-1 against fp32. While the drop exceeds ``max_drop``, keep
the nodes that lose the most signal in fp32 and quantize again (calibration is reused). The best model
is always written; the result's ``failed_checks`` say whether it is within budget.
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
from ..int8 import (DYNAMIC_OPS, Candidate, NodeError, Quantizer, SchemeRecord, calibration_reader,
                    check_memory_plan, check_not_quantized, check_symbol_not_quantized, dynamic_applies, load_calibration,
                    load_validation, measure, memory_plan, node_errors, onnx_top1, prepare, quantize_mxnet, quantized_node_names,
                    rank_nodes, scheme_for, set_metadata, static_candidates, stride_for)
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
        check_memory_plan(plan, profile.name, pre.input_shape)
        notes.append(f"memory plan: about {plan.need_mb:.0f} MB at the peak ({plan.peak_phase}), within "
                     f"{profile.name}'s memory budget of {plan.budget_mb:.0f} MB")
    full_calib, calib_ds = load_calibration(calib, pre, samples)
    val_ds = load_validation(val, pre, num_classes) if val else None
    _check_fits(onnx_model.path, calib_ds.batch([0]), "--calib", threads)
    if samples > len(full_calib):
        notes.append(f"--calib has {len(full_calib)} samples, fewer than --samples {samples}: calibrated on all")

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
    cap = len(quantized) // 2 if opts.max_fp32_nodes is None else min(opts.max_fp32_nodes, len(quantized))

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
    allowed = _allowed_kinds(opts.scheme, output)
    metadata = onnx_model.metadata

    def write(path: Path, name: str, kept_nodes: list[str], final: bool) -> None:
        """The model written to -o, atomically; while the search runs, the best so far (final False)."""
        record = {"scheme": name, "precision": "fp32" if name == "fp32" else "int8", "method": method,
                  "calibration_samples": len(calib_ds), "nodes_kept_fp32": kept_nodes, "tool": "edgetrain quantize",
                  "search": "done" if final else "stopped before the end: the best candidate so far"}
        staged = tmp / "staged.onnx"
        staged.write_bytes(Path(path).read_bytes())
        set_metadata(staged, metadata, record)
        with atomic_path(output, "-o") as dst:
            dst.write_bytes(staged.read_bytes())

    search = None
    if measured:
        from ..int8 import fastest

        search = _scheme_candidates(onnx_model, prepared, quantizer_for, scheme, best_path, kept,
                                    accuracy.int8_top1, val_ds, accuracy.fp32_top1, max_drop, threads, host, tmp,
                                    progress)
        loads = [host_load()]
        _measure(search, pre.batch_shape(1), threads, write, kept, progress, allowed)
        loads.append(host_load())
        chosen = fastest([c for c in search if c.kind in allowed])
        if chosen is None:  # every candidate allowed failed to run: the rule's model (int8) is still good
            chosen = next(c for c in search if c.rule)
            notes.append("no candidate could be timed; the rule's scheme was written")
        host_quiet = _host_quiet(loads, host)
        warnings_timed = _timing_warnings(search, chosen, host_quiet, opts.scheme, output)
        chosen.chosen = True
        kept = kept if chosen.kind == "static" else []
        best_path = chosen.path
        scheme_record = _measured_scheme(chosen, search, scheme, host, threads)
        scheme_record.host_quiet = host_quiet
        if chosen.kind == "fp32":
            notes.append("fp32 was the fastest candidate within the budget on this CPU: the fp32 model was written "
                         "(no int8 scheme ran faster here)")
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
    if search is not None:
        latency = _measured_latency(search, threads, pre, host) if opts.latency else None
    else:
        latency = (_latency(onnx_model.path, written, pre.batch_shape(1), threads, profile,
                            stage(progress, "latency")) if opts.latency else None)
    warnings = ([scheme.warning] if scheme.warning and search is None else []) + warnings_timed
    if within_budget is False:
        warnings.append(f"no mix of int8 and fp32 nodes met --max-drop {max_drop:g}: kept the best "
                        f"(drop {accuracy.drop:.2f} pts with {len(kept)} node(s) in fp32)")
    return QuantizeResult(
        model=model, output=str(output), backend="onnxruntime", scheme=scheme_record,
        calibration=Calibration(method, len(calib_ds), calib), accuracy=accuracy, steps=steps,
        nodes_kept_fp32=kept, size=Int8Size.of(fp32_bytes, int8_bytes), latency=latency, onnx_exportable=True,
        warnings=warnings, notes=notes, node_errors=node_errors)


def _scheme_measured(opts: QuantizeOptions, profile, host) -> bool:
    """Whether the scheme is chosen by timing the candidates in child processes: where quantize runs on the
    device's CPU (or with no --device), unless --scheme rule."""
    return opts.scheme != "rule" and (profile is None or host.matches(profile))


def _scheme_candidates(onnx_model, prepared: Path, quantizer_for, rule, rule_path: Path, kept: list[str],
                       rule_top1, val_ds, fp32_top1, max_drop: float, threads: int, host, tmp: Path, progress):
    """fp32, the rule's model (already searched for the budget), the other static schemes with the same
    nodes kept in fp32, and dynamic int8 where it applies; each with its size and (with --val) top-1."""
    cands = [Candidate("fp32", "fp32", None, onnx_model.path, top1=fp32_top1,
                       drop=0.0 if fp32_top1 is not None else None, within_budget=True)]
    for i, s in enumerate(static_candidates(rule, host.arch, dict(host.isa))):
        c = Candidate(s.name, "static", s, rule=i == 0)
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
    report = stage(progress, "candidates' top-1") or (lambda done, total: None)
    for k, c in enumerate(cands):
        if c.path is not None:
            c.size_bytes = Path(c.path).stat().st_size
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


def _allowed_kinds(scheme: str, output: Path) -> tuple[str, ...]:
    """The candidates ``--scheme`` may write: ``int8`` and ``qdq`` insist on int8; ``auto`` may write fp32,
    unless -o names an int8 file (issue 26: fp32 "1.00x smaller" in a file named *_int8.onnx)."""
    if scheme == "qdq":
        return ("static",)
    if scheme == "int8" or (scheme == "auto" and names_int8(output)):
        return ("static", "dynamic")
    return ("fp32", "static", "dynamic")


def names_int8(path: Path) -> bool:
    """Whether a file name says int8 (``model_int8.onnx``, ``net-INT8.onnx``): what the user will take it for."""
    return "int8" in Path(path).name.lower()


def _host_quiet(loads: list, host) -> dict:
    """energy.reliability of the scheme timings: the 1-minute load average before and after them."""
    from ..energy import reliability

    known = [x for x in loads if x is not None]
    return reliability(None, max(known) if known else None, host.cores_usable)


def _timing_warnings(cands, chosen, host_quiet: dict, scheme: str, output: Path) -> list[str]:
    """What a user must know about a choice made from timings: a busy host, and fp32 outrunning the int8
    written because it was asked for."""
    out = []
    if not host_quiet["reliable"]:
        hint = "pass --scheme int8 to insist on int8, or " if chosen.kind == "fp32" else ""
        out.append(f"the scheme was chosen from timings on a busy host ({'; '.join(host_quiet['reasons'])}): "
                   f"{chosen.name} may not be the fastest on a quiet one; {hint}quantize again when the host is idle")
    fp32 = next((c for c in cands if c.kind == "fp32" and c.eligible), None)
    if chosen.kind != "fp32" and fp32 is not None and chosen.p50_ms is not None and fp32.p50_ms < chosen.p50_ms:
        why = ("-o names an int8 file" if scheme == "auto" else f"--scheme {scheme} asks for int8")
        out.append(f"fp32 ran faster here ({fp32.p50_ms:.3f} ms against {chosen.p50_ms:.3f} ms for {chosen.name}); "
                   f"the int8 model was written because {why}" +
                   ("; name -o without 'int8' to let --scheme auto write fp32" if scheme == "auto" else ""))
    return out


def _measure(cands, batch_shape, threads: int, write, kept: list[str], progress,
             allowed: tuple[str, ...] = ("fp32", "static", "dynamic")) -> None:
    """Time the candidates in fresh processes; write the best so far (of the ``allowed`` kinds) as soon as
    it is known."""
    best = {"p50": None}

    def saved(c) -> None:
        if c.kind in allowed and c.eligible and (best["p50"] is None or c.p50_ms < best["p50"]):
            best["p50"] = c.p50_ms
            write(c.path, c.name, kept if c.kind == "static" else [], final=False)

    measure(cands, batch_shape, threads, on_measured=saved, progress=stage(progress, "time candidates"))


def _measured_scheme(chosen, cands, rule, host, threads: int) -> SchemeRecord:
    others = sorted((c for c in cands if c.eligible and c is not chosen), key=lambda c: c.p50_ms)
    runner_up = (f"; next {others[0].name} {others[0].p50_ms:.3f} ms" if others else "")
    budget = "within the accuracy budget" if chosen.top1 is not None or chosen.kind == "fp32" else \
        "(accuracy not checked: no --val)"
    measured = dict(name=chosen.name, target=f"this host ({host.cpu}, {host.arch})", measured=True, rule=rule,
                    candidates=list(cands),
                    reason=f"measured: the fastest of {sum(c.eligible for c in cands)} candidates {budget}, "
                           f"p50 {chosen.p50_ms:.3f} ms at batch 1, {threads} thread(s), each timed in fresh "
                           f"processes{runner_up}; ONNX Runtime's rule would have chosen {rule.name}")
    if chosen.scheme is not None:
        return SchemeRecord.of(chosen.scheme, **measured)
    return SchemeRecord(format="fp32" if chosen.kind == "fp32" else "dynamic", **measured)


def _measured_latency(cands, threads: int, pre, host) -> Int8Latency:
    fp32 = next(c for c in cands if c.kind == "fp32")
    chosen = next(c for c in cands if c.chosen)
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
