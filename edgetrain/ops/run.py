"""`edgetrain run`: the steps of a recipe, in order, into one run folder.

Each step is its command's work (``edgetrain.cli.VERB.call``) on the typed options its kind
(``recipes.STEPS``) builds, never a command line parsed again, in its own child process (edgetrain.cli.step):
its thread cap is applied before mxnet loads, its peak memory is its own, and a crash cannot take the run
down with it. Its output goes to RUNDIR/logs/VERB.log, after the command line a user would type for it.

Run folder::

    recipe.yaml            the recipe as run (resume refuses a different one)
    data/train.npz, data/val.npz   the held-out split, when the recipe asks for one (same for every step)
    finetune/              the fine-tuned PREFIX model (model.onnx from an ONNX base), metrics.json, checkpoint
    tune/                  the tuned model.onnx, trials.csv, tune.json, report.html, the trials' checkpoints
    model.onnx, model_int8.onnx   export and quantize artifacts
    profile.html           the profile step's report
    steps/VERB.json        each step's result;  logs/VERB.log  each step's output
    steps/VERB.options.json  the options it ran with
    result.json, report.html
"""
from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from .. import _lazy, child
from ..data import load_data
from ..errors import UsageError
from ..fileio import atomic_path, atomic_write_text, file_digest, write_npz
from ..models import load_gluon, load_onnx
from ..fleet.report import read_report as read_fleet_report
from ..options import Options
from ..recipes import ORIGIN_FILE, STEPS, Artifacts, LoadedRecipe, check_recipe, model_is_onnx
from ..results import Result, step_passed
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

    @property
    def outcome(self) -> str:
        return f"{self.status} (exit {self.exit_code}): {self.error or 'see ' + self.log}"


@dataclass
class RunResult(Result):
    recipe: str
    source: str
    rundir: str
    device: str
    steps: list[StepRun] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    report: str | None = None
    # the run's exit code is its steps': the first failing step's 1 or 2 (the run stops there), else 3 if
    # a step's check failed, else 0; a field (set as the steps run), not derived from failed_checks
    exit_code: int = 0  # type: ignore[assignment]
    failed_step: str | None = None
    # each distinct "warning: ..." line the steps printed, once (a step's log keeps its own copy): the
    # thread cap a device asks for is capped in every step, and said once for the run (issue 26)
    warnings: list[str] = field(default_factory=list)

    def checks(self) -> list[str]:
        return [f"step '{s.name}' {s.outcome}" for s in self.steps if s.exit_code]


def run_recipe(loaded: LoadedRecipe, rundir: str | Path | None = None, device: str | None = None,
               threads: int | None = None, resume: bool = False,
               progress: Callable[[str], None] | None = None, carbon: dict | None = None) -> RunResult:
    """Run every step of ``loaded``; stop at the first that fails. Returns the whole run's result."""
    say = progress or (lambda msg: None)
    recipe = loaded.recipe
    profile = check_recipe(loaded, device)
    rundir = Path(rundir) if rundir else _new_rundir(recipe.name)
    # A recipe's Gluon model needs mxnet: a host without a loadable one (before `doctor --fix`) is told so before
    # the run folder exists, not after an empty one is left behind. One that starts from an ONNX file (a
    # device) never loads it.
    if not model_is_onnx(loaded):
        _lazy.mxnet()
    made = not rundir.exists()
    _prepare_rundir(rundir, loaded, resume)
    threads = threads or recipe.threads
    result = RunResult(recipe.name, loaded.source, str(rundir), profile.name)

    art = Artifacts(model=loaded.resolve(recipe.model), train=loaded.resolve(recipe.data),
                     val=loaded.resolve(recipe.val))
    if recipe.val_split:
        try:
            art.train, art.val = _split_data(loaded, rundir, art.model, say)
        except BaseException:
            if made and not resume:  # nothing ran yet: the folder this call made goes with it
                shutil.rmtree(rundir, ignore_errors=True)
            raise

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
        kind = STEPS[step.name]
        model, opts = step_options(step, art, rundir, device_ref, threads, resume, carbon)
        argv = [step.name, model, *opts.flags(), "--json", str(json_path)]  # the same work, as typed
        # once a step runs again, every later step does too: its inputs may have changed
        if resume and not ran_again and _complete(json_path, kind.files, rundir, step.name, say):
            run = StepRun(step.name, "skipped (complete)", 0, 0.0, argv, str(log_path), _read_json(json_path))
            say(f"[{i}/{total}] {step.name}: already complete, skipped")
        else:
            say(f"[{i}/{total}] {step.name}: edgetrain {' '.join(argv)}")
            run = _run_child(step.name, argv, model, opts, json_path, log_path, say, result.warnings)
            ran_again = True
        result.steps.append(run)
        if run.exit_code not in (0, 3):
            result.exit_code = 1 if run.exit_code != 2 else 2
            result.failed_step = step.name
            say(f"[{i}/{total}] {step.name} {run.outcome}")
            break
        if run.exit_code == 3:
            result.exit_code = 3
            result.failed_step = result.failed_step or step.name
        say(f"[{i}/{total}] {step.name} {run.status} in {run.seconds:.1f} s")
        if run.exit_code == 0 and not run.status.startswith("skipped"):
            _seal(step.name, kind.files, rundir)
        from_onnx = kind.from_onnx if str(model).lower().endswith(".onnx") else ()
        for attr, rel in ((kind.makes,) if kind.makes else ()) + kind.also_makes + from_onnx:
            made = rundir / rel  # found in THIS run folder, never where steps/*.json says (it may have been moved)
            if made.exists() or Path(f"{made}-symbol.json").exists():  # a file or a PREFIX
                setattr(art, attr, str(made))

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
    # the raw pixels are stored at the model's input size
    pre = load_onnx(model_ref).preprocess if model_ref.lower().endswith(".onnx") else load_gluon(model_ref).preprocess
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
                write_npz(fh, {"data": raw, "label": part.labels, "class_names": np.array(ds.class_names)})
    say(f"held out {len(val)} of {len(ds)} samples ({recipe.val_split:.0%}, seed {recipe.seed}) for validation")
    return str(train_path), str(val_path)


def step_options(step, art: Artifacts, rundir: Path, device: str, threads, resume: bool,
                 carbon: dict | None = None) -> tuple[str, Options]:
    """MODEL and the command's typed options for ``step``: what the recipe set (left out: the command's
    default), what the run folder supplies, the run's device and thread cap (a profile's own sweep stays),
    and the run's --country / --grid-intensity for the steps that price energy in CO2e (the run's wins over
    a step's own)."""
    kind, given = STEPS[step.name], step.options
    model, values = kind.inputs(art, rundir, given, resume)
    values.update({name: getattr(given, name) for name in kind.options.fields
                   if name in type(given).model_fields and getattr(given, name) is not None}, device=device)
    if threads and values.get("threads") is None:
        values["threads"] = threads
    given_carbon = {k: v for k, v in (carbon or {}).items() if v is not None}
    if given_carbon and "country" in kind.options.fields:
        values.update({"country": None, "grid_intensity": None, **given_carbon})
    return model, kind.options(**values)


def _run_child(name: str, argv: list[str], model: str, opts: Options, json_path: Path, log_path: Path,
               say, warned: list[str]) -> StepRun:
    """Run one step; its output is logged in full and echoed line by line as progress, except a warning
    already said in this run (``warned``, the run's distinct warnings, grows here)."""
    if json_path.exists():
        json_path.unlink()  # a stale result must not pass for this run's
    spec = json_path.with_name(f"{name}.options.json")
    _write_json_atomic(spec, {"command": name, "model": model, "options": opts.given(), "json": str(json_path)})
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
            if text.startswith("warning:"):
                said = text[len("warning:"):].strip()
                if said in warned:
                    return
                warned.append(said)
            if text.strip():
                say(f"    {text}")

        # the one launcher: own process group, dies with us (PDEATHSIG), killed on Ctrl-C/SIGTERM
        code = child.run(child.python_argv("edgetrain.cli.step", spec), what=f"step {name}",
                         env={"PYTHONUNBUFFERED": "1"}, on_line=on_line).code
    seconds = time.monotonic() - started
    status = EXIT_STATUS.get(code, "failed")
    if code < 0:
        last_error = f"killed by signal {-code}"
    return StepRun(name, status, code, seconds, argv, str(log_path), _read_json(json_path), last_error)


def _seal(name: str, made: tuple[str, ...], rundir: Path) -> None:
    """What the step left in the run folder (``made``, relative to it), with their SHA-256."""
    files = {rel: file_digest(rundir / rel) for rel in made if (rundir / rel).is_file()}
    _write_json_atomic(rundir / "steps" / f"{name}.files.json", {"files": files})


def _complete(json_path: Path, made: tuple[str, ...], rundir: Path, name: str, say=None) -> bool:
    """A step is done only if its record says it passed (a step that exited 3 runs again on --resume) and
    the files it made are still there, unchanged (paths relative to the run folder)."""
    if not step_passed(_read_json(json_path)):
        return False
    files = (_read_json(rundir / "steps" / f"{name}.files.json") or {}).get("files")
    problem = None
    if not isinstance(files, dict) or (made and not files):
        problem = "no record of its files"
    else:
        for rel, digest in files.items():
            path = rundir / rel
            if not path.is_file():
                problem = f"{rel} is missing"
                break
            if file_digest(path) != digest:
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
        # the comparison's verdict alone: a failed chance or energy check is not "ONNX differs from Gluon"
        "export_passed": _dig(e, "comparison", "passed"),
        "latency_p50_ms": latency.get("p50_ms"),
        "latency_provenance": latency.get("provenance"),
        "peak_rss_mb": _dig(p, "verdict", "memory", "peak_rss_mb") or _dig(p, "best", "peak_rss_mb"),
        "energy_per_inference_mj": _dig(p, "energy", "per_inference", "total_mj"),
        "energy_provenance": _dig(p, "energy", "per_inference", "provenance"),
        "energy_per_inference_uncertainty_mj": _dig(p, "energy", "per_inference", "uncertainty", "plus_minus_mj"),
        # the interval's two ends (+a/−b), what the run's report writes; the ± above only for a symmetric one
        "energy_per_inference_plus_mj": _end(_dig(p, "energy", "per_inference"), "plus"),
        "energy_per_inference_minus_mj": _end(_dig(p, "energy", "per_inference"), "minus"),
        "finetune_energy_j": _dig(f, "energy", "joules"),
        "finetune_energy_uncertainty_j": _dig(f, "energy", "uncertainty", "plus_minus_j"),
        "finetune_energy_plus_j": _end(_dig(f, "energy"), "plus"),
        "finetune_energy_minus_j": _end(_dig(f, "energy"), "minus"),
        "finetune_energy_provenance": _dig(f, "energy", "provenance"),
        "carbon_per_inference_g": _dig(p, "energy", "carbon", "per_inference_g"),
        "carbon_per_day_g": _dig(p, "energy", "carbon", "per_day_g"),
        "finetune_carbon_g": _dig(f, "energy", "carbon", "grams"),
        # 0 g/kWh (a fully renewable supply) is a figure: the finetune's only where the profile has none
        "carbon_g_per_kwh": _first(_dig(step, "energy", "carbon", "g_co2e_per_kwh") for step in (p, f)),
        "carbon_intensity_source": _first(_dig(step, "energy", "carbon", "intensity", "source") for step in (p, f)),
        "battery_life_days": _dig(p, "energy", "daily", "battery_days"),
        "battery_wh": _dig(p, "energy", "daily", "battery_wh"),
        "rate_per_h": _dig(p, "energy", "daily", "rate_per_h"),
    }
    return {k: v for k, v in figures.items() if v is not None}


def _end(record: dict | None, which: str) -> float | None:
    """One end of an energy record's interval (``EnergyRecord``: plus or minus), None where it has none."""
    from ..energy import EnergyRecord

    if not isinstance(record, dict) or (record.get("total_mj") is None and record.get("joules") is None):
        return None
    return getattr(EnergyRecord.of(record), which)


def _first(values):
    return next((v for v in values if v is not None), None)


def _dig(d: dict, *keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d
