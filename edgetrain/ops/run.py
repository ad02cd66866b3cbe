"""`edgetrain run`: the steps of a recipe, in order, into one run folder.

Each step runs as the matching edgetrain command in its own child process (`python -m edgetrain VERB
... --json RUNDIR/steps/VERB.json`), so a recipe is exactly the chain of commands a user could type,
each step gets its thread cap applied before mxnet loads and its own peak-memory figure, and a step
that crashes cannot take the run down with it. Its output goes to RUNDIR/logs/VERB.log.

Run folder::

    recipe.yaml            the recipe as run (resume refuses a different one)
    data/train.npz, data/val.npz   the held-out split, when the recipe asks for one (same for every step)
    finetune/              the fine-tuned PREFIX model, metrics.json, checkpoint
    model.onnx, model_int8.onnx   export and quantize artifacts
    profile.html           the profile step's report
    steps/VERB.json        each step's result;  logs/VERB.log  each step's output
    result.json, report.html
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from .. import child
from ..data import load_data
from ..errors import UsageError
from ..fileio import atomic_path, atomic_write_text, file_digest
from ..models import load_gluon
from ..options import COMMANDS
from ..fleet.report import read_report as read_fleet_report
from ..recipes import ORIGIN_FILE, LoadedRecipe, check_recipe
from ..results import step_passed
from ..run_report import write_run_report

EXIT_STATUS = {0: "done", 1: "failed", 2: "bad input", 3: "budget not met"}


@dataclass
class StepRun:
    name: str
    status: str              # done | failed | bad input | budget not met | skipped (complete) | not run
    exit_code: int | None
    seconds: float
    command: list[str]
    log: str
    result: dict | None = None
    error: str | None = None


@dataclass
class RunResult:
    recipe: str
    source: str
    rundir: str
    device: str
    steps: list[StepRun] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    report: str | None = None
    exit_code: int = 0
    failed_step: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class _Artifacts:
    """What the steps so far have made; each step takes its input from here."""

    model: str                    # the current Gluon MODEL (the recipe's, then the fine-tuned one)
    train: str
    val: str | None
    fp32_onnx: str | None = None
    int8_onnx: str | None = None


def run_recipe(loaded: LoadedRecipe, rundir: str | Path | None = None, device: str | None = None,
               threads: int | None = None, resume: bool = False,
               progress: Callable[[str], None] | None = None) -> RunResult:
    """Run every step of ``loaded``; stop at the first that fails. Returns the whole run's result."""
    say = progress or (lambda msg: None)
    recipe = loaded.recipe
    profile = check_recipe(loaded, device)
    rundir = Path(rundir) if rundir else _new_rundir(recipe.name)
    _prepare_rundir(rundir, loaded, resume)
    threads = threads or recipe.threads
    result = RunResult(recipe.name, loaded.source, str(rundir), profile.name)

    art = _Artifacts(model=loaded.resolve(recipe.model), train=loaded.resolve(recipe.data),
                     val=loaded.resolve(recipe.val))
    if recipe.val_split:
        art.train, art.val = _split_data(loaded, rundir, art.model, say)

    device_ref = loaded.device_ref(device)
    total = len(recipe.steps)
    ran_again = False
    for i, step in enumerate(recipe.steps, 1):
        json_path = rundir / "steps" / f"{step.name}.json"
        log_path = rundir / "logs" / f"{step.name}.log"
        if step.name == "report":
            run = _report_step(result, rundir, step.options, loaded)
            result.steps.append(run)
            say(f"[{i}/{total}] report: {run.result['path']}")
            continue
        argv = _command(step, art, rundir, device_ref, threads, json_path, resume)
        # once a step runs again, every later step does too: its inputs may have changed
        if resume and not ran_again and _complete(json_path, step.name, rundir, say):
            run = StepRun(step.name, "skipped (complete)", 0, 0.0, argv, str(log_path), _read_json(json_path))
            say(f"[{i}/{total}] {step.name}: already complete, skipped")
        else:
            say(f"[{i}/{total}] {step.name}: edgetrain {' '.join(argv)}")
            run = _run_child(step.name, argv, json_path, log_path, say)
            ran_again = True
        result.steps.append(run)
        if run.exit_code not in (0, 3):
            result.exit_code = 1 if run.exit_code != 2 else 2
            result.failed_step = step.name
            say(f"[{i}/{total}] {step.name} {run.status} (exit {run.exit_code}): {run.error or 'see ' + run.log}")
            break
        if run.exit_code == 3:
            result.exit_code = 3
            result.failed_step = result.failed_step or step.name
        say(f"[{i}/{total}] {step.name} {run.status} in {run.seconds:.1f} s")
        if run.exit_code == 0 and not run.status.startswith("skipped"):
            _seal(step.name, rundir)
        _advance(step.name, run, art, rundir)

    result.summary = summarize(result)
    _write_json_atomic(rundir / "result.json", result.to_dict())
    return result


def _new_rundir(name: str) -> Path:
    """./edgetrain-run-NAME, or -2, -3, ... so that running the same command again never clashes."""
    base = Path(f"edgetrain-run-{name}")
    candidate, n = base, 1
    while candidate.exists():
        n += 1
        candidate = Path(f"{base}-{n}")
    return candidate


def _prepare_rundir(rundir: Path, loaded: LoadedRecipe, resume: bool) -> None:
    recipe_copy = rundir / "recipe.yaml"
    if resume:
        if not recipe_copy.is_file():
            raise UsageError("nothing to resume: no recipe.yaml in the run folder", str(rundir),
                             "run without --resume to start a new run there")
        if recipe_copy.read_text(encoding="utf-8") != loaded.text:
            raise UsageError("the run folder was made by a different recipe", str(rundir),
                             "resume with the same recipe, or start a new run folder with -o")
        return
    if rundir.exists() and (not rundir.is_dir() or any(rundir.iterdir())):
        raise UsageError("run folder already exists and is not empty", str(rundir),
                         "choose a new one with -o, or continue it with --resume")
    try:
        for sub in ("steps", "logs"):
            (rundir / sub).mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create the run folder: {exc.strerror}", str(rundir), "choose another -o") from None

    atomic_write_text(recipe_copy, loaded.text, "run folder")
    # Where the recipe came from: `run --resume RUNDIR` needs no recipe argument, and its relative paths
    # still resolve against the recipe's own folder.
    atomic_write_text(rundir / ORIGIN_FILE, json.dumps({"source": loaded.source, "base": str(loaded.base)}) + "\n",
                      "run folder")


def _split_data(loaded: LoadedRecipe, rundir: Path, model_ref: str, say) -> tuple[str, str]:
    """Hold out ``val_split`` of the data once, as .npz files every step reads (the same held-out set)."""
    train_path, val_path = rundir / "data" / "train.npz", rundir / "data" / "val.npz"
    if train_path.is_file() and val_path.is_file():
        return str(train_path), str(val_path)
    import numpy as np

    recipe = loaded.recipe
    pre = load_gluon(model_ref).preprocess  # the raw pixels are stored at the model's input size
    ds = load_data(loaded.resolve(recipe.data), pre)
    train, val = ds.split(recipe.val_split, seed=recipe.seed)
    train_path.parent.mkdir(parents=True, exist_ok=True)
    for part, path in ((train, train_path), (val, val_path)):
        raw = part.raw_batch(np.arange(len(part)))
        as_bytes = np.round(raw * 255.0)
        if np.allclose(raw * 255.0, as_bytes, atol=1e-3):  # 8-bit images: store them as such (4x smaller)
            raw = as_bytes.astype(np.uint8)
        with atomic_path(path, "run folder") as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, data=raw, label=part.labels, class_names=np.array(ds.class_names))
    say(f"held out {len(val)} of {len(ds)} samples ({recipe.val_split:.0%}, seed {recipe.seed}) for validation")
    return str(train_path), str(val_path)


def _flags(command: str, options, skip=()) -> list[str]:
    """The options a recipe step sets, as the command's flags (an option left out: the command's default)."""
    declared = COMMANDS[command]
    argv = []
    for name in type(options).model_fields:  # declaration order: the same command line every run
        value = getattr(options, name)
        if value is None or name in skip:
            continue
        on, _, off = declared.fields[name].flag.partition("/")
        if isinstance(value, bool):
            argv += [on] if value else [off] if off else []
        elif isinstance(value, (list, tuple)):
            argv += [on, ",".join(map(str, value))]
        elif name == "rate":  # parsed to inferences per hour; the flag takes N/h
            argv += [on, f"{value:g}/h"]
        else:
            argv += [on, str(value)]
    return argv


def _command(step, art: _Artifacts, rundir: Path, device: str, threads, json_path: Path, resume: bool) -> list[str]:
    o = step.options
    common = ["--device", device, "--json", str(json_path)]
    if threads and not (step.name == "profile" and o.threads):  # a profile sweep replaces the single cap
        common += ["--threads", str(threads)]
    if step.name == "finetune":
        argv = ["finetune", art.model, "--data", art.train, "-o", str(rundir / "finetune"), *_flags(step.name, o)]
        argv += ["--val", art.val] if art.val else []
        argv += ["--resume"] if resume and (rundir / "finetune").is_dir() else []
    elif step.name == "quantize":
        out = rundir / ("model_int8" if o.backend == "mxnet" else "model_int8.onnx")
        argv = ["quantize", art.model, "--calib", art.train, "-o", str(out), *_flags(step.name, o)]
        argv += ["--val", art.val] if art.val else []
    elif step.name == "export":
        argv = ["export", art.model, "-o", str(rundir / "model.onnx"), "--data", art.val or art.train, *_flags(step.name, o)]
    elif step.name == "profile":
        target = {"fp32": art.fp32_onnx, "int8": art.int8_onnx}.get(o.target) or art.int8_onnx or art.fp32_onnx
        if target is None:
            raise UsageError(f"profile target '{o.target}' has no model yet", "recipe steps",
                             "put an export or quantize step before profile")
        argv = ["profile", target, "--report", str(rundir / "profile.html"), *_flags("profile", o, skip=("target",))]
    else:  # pragma: no cover - the schema allows no other step
        raise AssertionError(step.name)
    return argv + common


def _run_child(name: str, argv: list[str], json_path: Path, log_path: Path, say) -> StepRun:
    """Run one step; its output is logged in full and echoed line by line as progress."""
    if json_path.exists():
        json_path.unlink()  # a stale result must not pass for this run's
    started = time.monotonic()
    last_error = None
    with open(log_path, "w", encoding="utf-8") as log:
        log.write("$ edgetrain " + " ".join(argv) + "\n")
        log.flush()

        def on_line(line: str) -> None:
            nonlocal last_error
            log.write(line)
            text = line.rstrip("\r\n")
            if text.startswith("Error:"):
                last_error = text[len("Error:"):].strip()
            if text.strip():
                say(f"    {text}")

        # the one launcher: own process group, dies with us (PDEATHSIG), killed on Ctrl-C/SIGTERM
        code = child.run(child.python_argv("edgetrain", *argv), what=f"step {name}",
                         env={"PYTHONUNBUFFERED": "1"}, on_line=on_line).code
    seconds = time.monotonic() - started
    status = EXIT_STATUS.get(code, "failed")
    if code < 0:
        last_error = f"killed by signal {-code}"
    return StepRun(name, status, code, seconds, argv, str(log_path), _read_json(json_path), last_error)


def _advance(name: str, run: StepRun, art: _Artifacts, rundir: Path) -> None:
    """Record the step's artifact so the next step takes it: found by its place in THIS run folder, never
    by the path an earlier run wrote in steps/*.json (a moved run folder must not point back at the old one)."""
    if name == "finetune":
        if Path(f"{rundir / 'finetune' / 'model'}-symbol.json").exists():
            art.model = str(rundir / "finetune" / "model")
    elif name == "quantize":
        if (rundir / "model_int8.onnx").exists():
            art.int8_onnx = str(rundir / "model_int8.onnx")
    elif name == "export":
        art.fp32_onnx = str(rundir / "model.onnx")


# What each step leaves in the run folder (relative to it): sealed with their SHA-256 when the step
# passes, checked before --resume skips it.
_STEP_FILES = {"finetune": ("finetune/model-symbol.json", "finetune/model-0000.params", "finetune/model-edgetrain.json"),
               "quantize": ("model_int8.onnx", "model_int8-symbol.json", "model_int8-0000.params"),
               "export": ("model.onnx",), "profile": ("profile.html",)}


def _seal_path(rundir: Path, name: str) -> Path:
    return rundir / "steps" / f"{name}.files.json"


def _sha256(path: Path) -> str:
    return file_digest(path)


def _seal(name: str, rundir: Path) -> None:
    files = {rel: _sha256(rundir / rel) for rel in _STEP_FILES.get(name, ()) if (rundir / rel).is_file()}
    _write_json_atomic(_seal_path(rundir, name), {"files": files})


def _complete(json_path: Path, name: str = "", rundir: Path | None = None, say=None) -> bool:
    """A step is done only if its record says it passed (a step that exited 3 runs again on --resume) and
    the files it made are still there, unchanged (paths relative to the run folder)."""
    if not step_passed(_read_json(json_path)):
        return False
    if rundir is None:
        return True
    seal = _read_json(_seal_path(rundir, name))
    files = (seal or {}).get("files")
    problem = None
    if not isinstance(files, dict) or (_STEP_FILES.get(name) and not files):
        problem = "no record of its files"
    else:
        for rel, digest in files.items():
            path = rundir / rel
            if not path.is_file():
                problem = f"{rel} is missing"
                break
            if _sha256(path) != digest:
                problem = f"{rel} changed since the step ran"
                break
    if problem and say:
        say(f"    {name}: {problem}; running it again")
    return problem is None


def _read_json(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def _write_json_atomic(path: Path, data: dict) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, default=str) + "\n", "run folder")


def _report_step(result: RunResult, rundir: Path, options, loaded: LoadedRecipe) -> StepRun:
    started = time.monotonic()
    result.summary = summarize(result)
    path = rundir / f"report.{options.format}"
    fleet = loaded.resolve(options.fleet)
    fleets = [read_fleet_report(fleet, f"{loaded.source}, report step, field 'fleet'")] if fleet else []
    write_run_report(result, path, fleets)
    result.report = str(path)
    return StepRun("report", "done", 0, time.monotonic() - started, [], "",
                   {"path": str(path), **({"fleet": fleet} if fleet else {})})


def summarize(result: RunResult) -> dict:
    """The figures a user looks for first, from the steps' results (absent where a step did not run)."""
    by = {s.name: (s.result or {}) for s in result.steps}
    q, e, p, f = by.get("quantize", {}), by.get("export", {}), by.get("profile", {}), by.get("finetune", {})
    ft_acc = f.get("final_accuracy")
    latency = _dig(p, "verdict", "latency") or {}
    if latency.get("p50_ms") is None and p.get("best"):
        latency = p["best"]  # no device estimate possible: the host measurement, labelled as such
    figures = {
        "finetune_accuracy_pct": ft_acc * 100 if ft_acc is not None else None,
        "accuracy_fp32_pct": _dig(q, "accuracy", "fp32_top1"),
        "accuracy_int8_pct": _dig(q, "accuracy", "int8_top1"),
        "accuracy_drop_pts": _dig(q, "accuracy", "drop"),
        "size_fp32_bytes": _dig(q, "size", "fp32_bytes") or e.get("size_bytes"),
        "size_int8_bytes": _dig(q, "size", "int8_bytes"),
        "export_passed": e.get("passed"),
        "latency_p50_ms": latency.get("p50_ms"),
        "latency_provenance": latency.get("provenance"),
        "peak_rss_mb": _dig(p, "verdict", "memory", "peak_rss_mb") or _dig(p, "best", "peak_rss_mb"),
        "energy_per_inference_mj": _dig(p, "energy", "per_inference", "total_mj"),
        "energy_provenance": _dig(p, "energy", "per_inference", "provenance"),
        "battery_life_days": _dig(p, "energy", "daily", "battery_days"),
        "battery_wh": _dig(p, "energy", "daily", "battery_wh"),
        "rate_per_h": _dig(p, "energy", "daily", "rate_per_h"),
    }
    return {k: v for k, v in figures.items() if v is not None}


def _dig(d: dict, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d
