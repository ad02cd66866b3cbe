"""The tune run: the trials of a grid, trained by the fine-tune job (edgetrain.training) within the device's
budgets, the best one kept.

Set-up, before any training: the grid read and every point checked as finetune checks it; DATA (and --val, or
the held-out split) decoded once into OUTDIR/data/*.npz, which every trial reads; each distinct trained part
(train_layers, batch_size) loaded once and its memory plan made, so that a point that would not fit
--memory-budget is skipped before it runs (a grid none of whose points fits is refused, exit 2).

Then the schedule (schedule.py): a trial is a FinetuneJob in OUTDIR/trials/NNN; it moves up a rung by resuming
its own checkpoint with more epochs (the job's resume gives the weights of an uninterrupted run). The trials of
head/last:N share their frozen features through one FeatureStore: computed once per frozen part. Every rung's
result goes to the journal (journal.py) before the next starts: after a power cut, ``--resume`` replays it and
only the interrupted rung of one trial goes on, from that trial's last epoch checkpoint.
"""
from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
import shutil
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .. import procmem, runtime
from ..errors import RunFailed, UsageError
from ..fileio import atomic_path, file_digest, write_npz
from ..options import FinetuneOptions, TuneOptions, parse_train_layers
from ..results import ProgressFn, Result, report
from . import schedule
from .grid import Grid, read_grid
from .journal import FORMAT, Journal

TRIALS_DIR, DATA_DIR, LOCK = "trials", "data", ".tune.lock"
MODEL, CSV, JSON, REPORT = "model.onnx", "trials.csv", "tune.json", "report.html"
LATENCY_RUNS = 30
OUTPUT_RESERVE_S = 0.25  # of --time-budget, kept for writing the outputs (the model, the table, the report)
# what a resume must find as it was: changed, the trials would not be the same ones
SAME_ON_RESUME = {"model": "MODEL", "data": "DATA", "val": "held-out data", "grid": "grid", "epochs": "--epochs",
                  "strategy": "--strategy", "eta": "--eta", "trials": "--trials", "seed": "--seed", "objective": "objective"}


@dataclass
class Trial:
    number: int                  # 1-based, in grid order among the points tried
    config: dict                 # lr (None: finetune's default), optimizer, batch_size, train_layers, epochs
    status: str = "pending"      # pending | running | stopped | finished | skipped | failed | not run
    why: str = ""                # why it stopped, was skipped, failed or was not run
    rungs: list[dict] = field(default_factory=list)   # one record per rung reached (journal facts)
    lr_used: float | None = None
    estimate_mb: float | None = None
    latency_ms: float | None = None
    energy_mj: float | None = None

    @property
    def epochs_run(self) -> int:
        return self.rungs[-1]["epochs"] if self.rungs else 0

    @property
    def accuracy(self) -> float | None:
        return self.rungs[-1]["val_accuracy"] if self.rungs else None

    @property
    def seconds(self) -> float:
        return sum(r["seconds"] for r in self.rungs)

    @property
    def cpu_seconds(self) -> float:
        return sum(r.get("cpu_seconds", 0.0) for r in self.rungs)

    @property
    def peak_mb(self) -> float | None:
        peaks = [r["peak_mb"] for r in self.rungs if r.get("peak_mb") is not None]
        return max(peaks) if peaks else None

    @property
    def joules(self) -> float | None:
        js = [r["joules"] for r in self.rungs if r.get("joules") is not None]
        return sum(js) if js else None

    def label(self) -> str:
        return " ".join(f"{k}={v if v is not None else 'default'}" for k, v in self.config.items())

    def row(self, objective: str, chosen: bool) -> dict:
        return {"trial": self.number, **self.config, "lr_used": self.lr_used,
                "status": "chosen" if chosen else self.status, "why": self.why, "epochs_run": self.epochs_run,
                "accuracy_by_rung": [{"epochs": r["epochs"], "val_accuracy": r["val_accuracy"],
                                      "device_seconds": round(sum(q["seconds"] for q in self.rungs[:i + 1]), 4)}
                                     for i, r in enumerate(self.rungs)],
                "val_accuracy": self.accuracy, "device_seconds": round(self.seconds, 4),
                "cpu_seconds": round(self.cpu_seconds, 4),
                "train_seconds": round(sum(r["train_seconds"] for r in self.rungs), 4),
                "feature_seconds": round(sum(r["feature_seconds"] for r in self.rungs), 4),
                "peak_mb": self.peak_mb, "estimate_mb": self.estimate_mb,
                "energy_j": self.joules, "energy_provenance": _energy_label(self.rungs),
                "latency_ms": self.latency_ms, "energy_per_inference_mj": self.energy_mj,
                "score": score(self, objective) if self.rungs else None}


def _energy_label(rungs: list[dict]) -> str | None:
    labels = sorted({r["energy_provenance"] for r in rungs if r.get("energy_provenance")})
    return "+".join(labels) or None


def score(trial: Trial, objective: str, rung: dict | None = None) -> float:
    """Accuracy in points, less the objective's weight times the trial model's latency (ms) or energy (mJ)."""
    acc = (rung or trial.rungs[-1])["val_accuracy"] or 0.0
    kind, _, weight = objective.partition(":")
    cost = {"latency": trial.latency_ms, "energy": trial.energy_mj}.get(kind) or 0.0
    return 100.0 * acc - (float(weight) * cost if weight else 0.0)


def rank_key(trial: Trial, objective: str, rung: dict | None = None):
    """Best first: the objective, then less device time, then lower peak memory, then grid order."""
    return (-score(trial, objective, rung), round(trial.seconds, 3), trial.peak_mb or 0.0, trial.number)


@dataclass
class TuneResult(Result):
    model: str | None
    outdir: str
    strategy: str
    objective: str
    grid: dict
    points: int
    tried: int
    rungs: list[dict]
    trials: list[dict]
    chosen: dict | None
    seconds: float
    trial_seconds: float
    shared_seconds: dict
    cpu_seconds: float
    trial_cpu_seconds: float
    overhead_seconds: float
    overhead_pct: float
    epochs_run: int
    grid_epochs: int
    features: dict
    peak_rss_mb: float | None
    budget_mb: float | None
    time_budget_s: float | None
    stopped_by_time: bool
    csv: str
    report: str
    resumed: bool = False
    notes: list[str] = field(default_factory=list)

    def checks(self) -> list[str]:
        failed = []
        if self.budget_mb and self.peak_rss_mb and self.peak_rss_mb > self.budget_mb:
            failed.append(f"peak RSS {self.peak_rss_mb:.0f} MB went over the memory budget {self.budget_mb:.0f} MB")
        if self.time_budget_s is not None:
            epoch_s = max([r["device_seconds"] / max(r["epochs_run"], 1) for r in self.trials if r["epochs_run"]],
                          default=0.0)
            if self.seconds > self.time_budget_s + epoch_s:
                failed.append(f"the run took {self.seconds:.1f} s, more than one trial-epoch ({epoch_s:.1f} s) over "
                              f"the time budget {self.time_budget_s:.0f} s")
        return failed


# --- set-up ------------------------------------------------------------------------------------------------

def _source_fp(ref: str | None) -> str | None:
    """What identifies DATA to a resume: a built-in's name, a file's SHA-256, a folder's file names, sizes and
    modification times."""
    if ref is None or ref.startswith("builtin:"):
        return ref
    path = Path(ref)
    if path.is_file():
        return file_digest(path)
    h = hashlib.sha256()
    for p in sorted(path.rglob("*")):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.relative_to(path)}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _point_options(point: dict, opts: TuneOptions, **more) -> dict:
    return {"epochs": opts.epochs, "seed": opts.seed, **point, **more}


def check_points(points: list[dict], opts: TuneOptions) -> None:
    """Every point as finetune would read it (data and OUTDIR stand-ins): its first refusal is the grid's."""
    for point in points:
        try:
            FinetuneOptions.parse(_point_options(point, opts, data="DATA", out="OUTDIR"))
        except UsageError as exc:
            raise UsageError(f"finetune refuses the grid point {_text(point)}: {exc.what}", "--grid", exc.fix) from None


def _text(point: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in point.items())


def _configs(points: list[dict], opts: TuneOptions) -> list[dict]:
    return [{"lr": p.get("lr"), "optimizer": p.get("optimizer", "adam"), "batch_size": p.get("batch_size", 32),
             "train_layers": p.get("train_layers", "head"), "epochs": p.get("epochs", opts.epochs)} for p in points]


def fingerprint(model: str, opts: TuneOptions, grid: Grid, objective: str) -> dict:
    val = _source_fp(opts.val) if opts.val is not None else f"split {opts.val_split or 0.2}"
    return {"model": file_digest(Path(model)), "data": _source_fp(opts.data), "val": val, "grid": grid.to_dict(),
            "epochs": opts.epochs, "strategy": opts.strategy, "eta": opts.eta, "trials": opts.trials, "seed": opts.seed,
            "objective": objective}


def _lock(outdir: Path) -> int:
    fd = os.open(outdir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise UsageError("OUTDIR is in use by another tune run", str(outdir),
                         "wait for it to finish (or stop it), or choose another OUTDIR") from None
    return fd


def decode_data(model: str, opts: TuneOptions, folder: Path, budget_mb: float | None) -> tuple[Path, Path, int]:
    """DATA and the held-out data decoded once, at the model's input size, into FOLDER/train.npz and val.npz:
    every trial reads these. Each sample is what finetune's preprocessing makes of it before the mean and std
    (resized, on the [0, 1] scale; as bytes where it is exactly 8-bit), so a trial computes the same bits from
    it as from DATA, without decoding or resizing again. Returns their paths and the class count."""
    from dataclasses import replace

    from ..data import load_data
    from ..models import load_onnx
    from ..training import DEFAULT_VAL_SPLIT

    pre = load_onnx(model).preprocess
    c = pre.input_shape[0]
    plain = replace(pre, mean=(0.0,) * c, std=(1.0,) * c)  # x - 0 and x / 1 change no bit
    max_bytes = int(budget_mb * 2**20) if budget_mb else None
    ds = load_data(opts.data, plain, max_bytes=max_bytes)
    if opts.val is not None:
        val = load_data(opts.val, plain, where="--val", max_bytes=max_bytes)
        if val.class_names != ds.class_names:
            raise UsageError(f"--val classes ({', '.join(val.class_names[:8])}) differ from the training data's "
                             f"({', '.join(ds.class_names[:8])})", opts.val,
                             "give held-out data with the same class folders / labels")
        train = ds
    else:
        train, val = ds.split(opts.val_split or DEFAULT_VAL_SPLIT, seed=opts.seed)
    folder.mkdir(parents=True, exist_ok=True)
    paths = folder / "train.npz", folder / "val.npz"
    for part, path in zip((train, val), paths):
        x = np.empty((len(part), *pre.input_shape), np.float32)
        for first in range(0, len(part), 256):
            idx = np.arange(first, min(first + 256, len(part)))
            part.batch(idx, out=x[first:first + len(idx)])
        x = x.transpose(0, 2, 3, 1)  # N, H, W, C: as an .npz of images is read
        as_bytes = np.round(x * 255.0)
        if np.array_equal((as_bytes.astype(np.uint8).astype(np.float32) / np.float32(255.0)), x):
            x = as_bytes.astype(np.uint8)
        with atomic_path(path, "tune data") as tmp:
            with open(tmp, "wb") as fh:
                write_npz(fh, {"data": np.ascontiguousarray(x), "label": np.asarray(part.labels),
                               "class_names": np.array(ds.class_names)})
    return paths[0], paths[1], len(ds.class_names)


# --- the run -----------------------------------------------------------------------------------------------

class Tuner:
    def __init__(self, model: str, opts: TuneOptions, progress: ProgressFn | None):
        self.model, self.opts, self.progress = model, opts, progress
        self.outdir = Path(opts.out)
        self.journal = Journal(self.outdir / "journal.jsonl")
        self.budget_mb = opts.budget_mb()
        self.profile = opts.profile()
        self.threads = runtime.apply_threads(opts.thread_cap(), strict=False)
        self.notes: list[str] = []
        self.clock0 = time.monotonic()
        self.clock_before = 0.0   # seconds of the run before this process (a resume)
        self.timers = {"check": 0.0, "decode": 0.0, "precheck": 0.0, "latency": 0.0}  # shared work, not overhead
        self.cpu0 = time.process_time()
        self.setup_peak_mb: float | None = None
        self.trials: list[Trial] = []
        self.store = None
        self.stopped_by_time = False
        self.done_runs = 0

    def clock(self) -> float:
        return self.clock_before + time.monotonic() - self.clock0

    # --- before any training -----------------------------------------------------------------------------

    def check(self) -> tuple[Grid, list[dict], str]:
        opts = self.opts
        if opts.val is not None and opts.val_split is not None:
            raise UsageError("--val and --val-split both given", "--val", "give held-out data or a split fraction, "
                             "not both")
        if not str(self.model).lower().endswith(".onnx"):
            raise UsageError("tune trains from an ONNX file", self.model,
                             "export the model first (edgetrain export MODEL model.onnx) and tune model.onnx")
        if not Path(self.model).is_file():
            raise UsageError("MODEL not found", self.model, "give the path of an ONNX file edgetrain export wrote")
        grid = read_grid(opts.grid)
        objective = opts.objective
        if objective == "accuracy" and grid.objective:
            objective = grid.objective
        if objective.startswith("energy") and self.profile is None:
            raise UsageError("--objective energy needs the device's power figures", "--objective",
                             "give --device NAME, or use --objective latency:W")
        points = grid.points()
        check_points(points, opts)
        from ..fileio import check_folder_outside_data

        check_folder_outside_data(opts.out, "-o", {"--data": opts.data, "--val": opts.val})
        from ..models import load_onnx

        if load_onnx(self.model).preprocess is None:
            raise UsageError("the ONNX file has no edgetrain preprocessing record", self.model,
                             "export it with `edgetrain export` (its metadata says the input shape and mean/std)")
        return grid, points, objective

    def open_outdir(self, fp: dict) -> bool:
        """Check OUTDIR can take this run (a resume: that it is this run's); True if it resumes one."""
        out, opts = self.outdir, self.opts
        if out.exists() and not out.is_dir():
            raise UsageError("OUTDIR is a file", str(out), "give a folder (it is created if missing)")
        busy = out.is_dir() and any(out.iterdir())
        if not opts.resume:
            if busy:
                raise UsageError("OUTDIR is not empty", str(out), "pass --resume to continue the tune run there, or "
                                 "choose another (empty) OUTDIR")
            return False
        if not self.journal.exists():
            if busy and {p.name for p in out.iterdir()} - {DATA_DIR, ".precheck", LOCK}:
                raise UsageError("OUTDIR holds no tune run to resume (no journal.jsonl)", str(out),
                                 "choose another OUTDIR, or leave out --resume with an empty one")
            self.notes.append("--resume: no tune run in OUTDIR, starting from the beginning")
            return False
        self.journal.read()
        head = self.journal.header()
        if head is None:
            raise UsageError("OUTDIR's journal.jsonl is not a tune journal", str(out), "choose another OUTDIR")
        old = head["fingerprint"]
        changed = [SAME_ON_RESUME[k] for k in SAME_ON_RESUME if old.get(k) != json.loads(json.dumps(fp[k]))]
        if changed:
            raise UsageError(f"cannot resume: the tune run in OUTDIR was made with a different {', '.join(changed)}", str(out),
                             "resume with the same MODEL, data, --grid, --epochs, --strategy, --eta, --trials, --seed and "
                             "--objective, or start a new OUTDIR")
        return True

    def precheck(self) -> None:
        """Each distinct trained part (train_layers, batch_size) checked before any training: loaded as finetune
        loads it (a point finetune refuses, such as more layers than the model has, is refused here, exit 2) and,
        with a memory budget, its plan made in a fresh process (precheck.py): a point that would not fit is
        skipped before it runs; a grid none of whose points fits is refused, exit 2."""
        keys = [(t.config["train_layers"], t.config["batch_size"]) for t in self.trials]
        seen: dict[tuple, tuple[float | None, str]] = {}
        refusals: list[dict] = []
        scratch = self.outdir / ".precheck"
        for key in dict.fromkeys(keys):
            trial = self.trials[keys.index(key)]
            try:
                got = self._plan_of(trial, scratch) if self.budget_mb is not None else self._load_of(trial, scratch)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
            if "error" in got:
                raise UsageError(f"finetune refuses the grid point {trial.label()}: {got['error']}", "--grid",
                                 got["fix"])
            if "refused" in got:
                seen[key] = (None, f"would not fit: {got['refused']}")
                refusals.append(got)
            else:
                seen[key] = (got.get("estimate_mb"), "")
        for trial, key in zip(self.trials, keys):
            trial.estimate_mb, why = seen[key]
            if why:
                trial.status, trial.why = "skipped", why
        if self.trials and all(t.status == "skipped" for t in self.trials):
            import re

            def need(got: dict) -> float:
                m = re.search(r"needs about (\d+) MB", got["refused"])
                return float(m.group(1)) if m else math.inf

            least = min(refusals, key=need)  # the point that comes closest, and what would make it fit
            raise UsageError(f"no point of the grid fits the memory budget: {least['refused']}", "--memory-budget",
                             least["fix"])

    def _load_of(self, trial: Trial, scratch: Path) -> dict:
        """No budget: the point's model loaded here as its trial will load it (its errors are the user's)."""
        from ..training import FinetuneJob

        fopts = FinetuneOptions.unchecked(**self._finetune_values(trial, scratch, 1, resume=False))
        job = FinetuneJob(self.model, fopts, layers=parse_train_layers(trial.config["train_layers"]), val_split=None,
                          budget_mb=None, threads=self.threads, profile=self.profile, progress=lambda info: None)
        try:
            job.load()
        except UsageError as exc:
            return {"error": exc.what, "fix": exc.fix}
        finally:
            del job
            _release()
        return {}

    def _plan_of(self, trial: Trial, scratch: Path) -> dict:
        from .. import child

        spec = {"model": str(Path(self.model).resolve()), "budget_mb": self.budget_mb, "threads": self.threads,
                "options": self._finetune_values(trial, scratch, 1, resume=False)}
        scratch.mkdir(parents=True, exist_ok=True)
        path = scratch / "spec.json"
        path.write_text(json.dumps(spec), encoding="utf-8")
        done = child.run(child.python_argv("edgetrain.tuning.precheck", str(path)), what="the memory pre-check",
                         threads=self.threads)
        lines = [ln for ln in done.out.splitlines() if ln.startswith("{")]
        if done.code != 0 or not lines:
            raise RunFailed(f"the memory pre-check of {trial.label()} failed ({child.death(done.code)})",
                            str(self.outdir), (done.err or "").strip().splitlines()[-1][:200] if done.err else
                            "run it again with EDGETRAIN_DEBUG=1")
        return json.loads(lines[-1])

    def _finetune_values(self, trial: Trial, out: Path, epochs: int, resume: bool) -> dict:
        c = trial.config
        values = {"data": str(self.outdir / DATA_DIR / "train.npz"), "val": str(self.outdir / DATA_DIR / "val.npz"),
                  "out": str(out), "epochs": epochs, "optimizer": c["optimizer"], "batch_size": c["batch_size"],
                  "train_layers": c["train_layers"], "lr": c["lr"], "seed": self.opts.seed,
                  "memory_budget": self.budget_mb, "device": self.opts.device, "threads": self.opts.threads,
                  "resume": resume, "allow_chance": True}
        return values

    # --- the trials --------------------------------------------------------------------------------------

    def run_rung(self, trial: Trial, rung_index: int, target: int, n_rungs: int, total_runs: int) -> None:
        """Train ``trial`` up to ``target`` epochs (resuming its checkpoint) and journal the result."""
        from ..training import FinetuneJob, prepare_outdir

        tdir = self.outdir / TRIALS_DIR / f"{trial.number:03d}"
        has_checkpoint = prepare_outdir(tdir, resume=True)
        fopts = FinetuneOptions.unchecked(**self._finetune_values(trial, tdir, target, resume=has_checkpoint))
        where = f"trial {trial.number}/{len(self.trials)} rung {rung_index + 1}/{n_rungs}"

        def relay(info: dict) -> None:
            if info.get("phase") == "train":
                report(self.progress, "tune", message=f"{where}: epoch {info['epoch']}/{info['epochs']} step "
                       f"{info['step']}/{info['steps']}")

        job = FinetuneJob(self.model, fopts, layers=parse_train_layers(trial.config["train_layers"]), val_split=None,
                          budget_mb=self.budget_mb, threads=self.threads, profile=self.profile, progress=relay,
                          resume=has_checkpoint, feature_store=self.store)
        _reset_peak()
        before = trial.epochs_run
        t0, c0 = time.monotonic(), time.process_time()
        trial.status = "running"
        try:
            res = job.run(has_checkpoint)
        except RunFailed as exc:
            del job
            _release()
            trial.status, trial.why = "failed", exc.what
            self.journal.append({"kind": "failed", "trial": trial.number, "why": exc.what, "clock": self.clock()})
            return
        except UsageError as exc:  # the plan refused at run time (the budget, measured)
            del job
            _release()
            trial.status, trial.why = "skipped", f"would not fit (its plan, at its start): {exc.what}"
            self.journal.append({"kind": "skipped", "trial": trial.number, "why": trial.why, "clock": self.clock()})
            return
        seconds, cpu = time.monotonic() - t0, time.process_time() - c0
        trial.lr_used = job.lr
        del job
        if self.budget_mb is not None:
            _release()  # the next trial plans from this process's memory: what this one freed goes back (~80 ms)
        start = int((res.resumed_from or {}).get("epoch", before))  # a power cut may have left it further on
        new = res.epochs[start:]
        train_s = sum(e["seconds"] for e in new)
        record = {"kind": "rung", "trial": trial.number, "rung": rung_index, "epochs": len(res.epochs),
                  "val_accuracy": res.final_accuracy, "seconds": round(seconds, 4), "cpu_seconds": round(cpu, 4),
                  "train_seconds": round(train_s, 4),
                  "feature_seconds": res.feature_seconds, "peak_mb": res.peak_rss_mb, "lr_used": trial.lr_used,
                  "plan_mb": res.plan.get("estimate_mb"),
                  "joules": (res.energy or {}).get("joules"), "energy_provenance": (res.energy or {}).get("provenance"),
                  "history": [e.get("val_accuracy") for e in res.epochs], "trained": len(new),
                  "resumed_at": (res.resumed_from or {}).get("epoch"), "clock": None}
        record["clock"] = round(self.clock(), 4)
        self.journal.append(record)
        trial.rungs.append(record)
        trial.status = "finished" if len(res.epochs) >= trial.config["epochs"] else "stopped"
        self.done_runs += 1
        report(self.progress, "tune", self.done_runs, total_runs, final=True,
               message=f"{where} ({trial.label()}): {record['val_accuracy']:.3f} held-out at {record['epochs']} "
                       f"epoch{'s' if record['epochs'] != 1 else ''}, {seconds:.1f}s",
               eta_s=self.eta(total_runs))

    def eta(self, total_runs: int) -> float | None:
        done = [r["seconds"] for t in self.trials for r in t.rungs]
        if not done:
            return None
        return statistics.mean(done) * max(total_runs - self.done_runs, 0)

    def estimate_s(self, trial: Trial, epochs: int) -> float | None:
        """Seconds a run of ``epochs`` more epochs of ``trial`` would take: a line (set-up + epochs x an epoch's
        whole cost: its steps, held-out check and checkpoint) through the runs of the same trained part so far;
        from a single run length, all of its time counts as epochs (the set-up too: an over-estimate)."""
        kind = trial.config["train_layers"]
        runs = [(r["trained"], r["seconds"]) for t in self.trials if t.config["train_layers"] == kind
                for r in t.rungs if r.get("trained")]
        if not runs:
            runs = [(r["trained"], r["seconds"]) for t in self.trials for r in t.rungs if r.get("trained")]
        if not runs:
            return None
        ns = {n for n, _ in runs}
        if len(ns) > 1:
            n_mean = statistics.mean(n for n, _ in runs)
            s_mean = statistics.mean(sec for _, sec in runs)
            slope = sum((n - n_mean) * (sec - s_mean) for n, sec in runs) / sum((n - n_mean) ** 2 for n, _ in runs)
            per = max(slope, max(sec / n for n, sec in runs) / 4)
            setup = max(s_mean - per * n_mean, 0.0)
        else:
            per, setup = max(sec / n for n, sec in runs), 0.0
        return setup + per * epochs

    def within_time(self, trial: Trial, target: int) -> int:
        """The epochs ``trial`` may reach within --time-budget (``target`` if no budget, or it fits)."""
        budget = self.opts.time_budget
        if budget is None:
            return target
        left = budget - self.clock() - OUTPUT_RESERVE_S
        if left <= 0:
            return trial.epochs_run
        need = self.estimate_s(trial, target - trial.epochs_run)
        if need is None:  # nothing of this kind measured yet: one epoch, to learn what one costs
            return trial.epochs_run + 1
        if need <= left:
            return target
        fits = max((n for n in range(1, target - trial.epochs_run + 1) if self.estimate_s(trial, n) <= left),
                   default=0)
        return trial.epochs_run + max(0, min(fits, target - trial.epochs_run))

    def measure_model(self, trial: Trial, objective: str) -> None:
        """The latency (and modelled energy) of one inference of the trial's model, once per kind of graph."""
        if objective == "accuracy" or not trial.rungs:
            return
        kind = trial.config["train_layers"]
        got = self.journal.find("latency", train_layers=kind)
        if got is None:
            t0 = time.monotonic()
            ms = _latency_ms(self.outdir / TRIALS_DIR / f"{trial.number:03d}" / MODEL, self.threads)
            mj = None
            if self.profile is not None:
                from ..energy import energy_report

                mj = energy_report(ms, self.profile, threads=self.threads)["per_inference"]["total_mj"]
            got = {"kind": "latency", "train_layers": kind, "ms": ms, "mj": mj}
            self.journal.append(got)
            self.timers["latency"] += time.monotonic() - t0
        trial.latency_ms, trial.energy_mj = got["ms"], got["mj"]

    def replay(self) -> None:
        """The journal's facts back on the trials (a resume)."""
        for rec in self.journal.records[1:]:
            kind = rec.get("kind")
            if kind not in ("rung", "failed", "skipped"):
                continue
            if not 1 <= rec.get("trial", 0) <= len(self.trials):
                raise UsageError("OUTDIR's journal names a trial this grid does not have", str(self.journal.path),
                                 "start a new OUTDIR")
            trial = self.trials[rec["trial"] - 1]
            if kind == "rung":
                trial.rungs.append(rec)
                trial.lr_used = rec.get("lr_used")
                trial.status = "finished" if rec["epochs"] >= trial.config["epochs"] else "stopped"
                self.done_runs += 1
            else:
                trial.status, trial.why = kind, rec.get("why", "")
        clocks = [r["clock"] for r in self.journal.records if isinstance(r.get("clock"), (int, float))]
        self.clock_before = max(clocks, default=0.0)
        self.clock0 = time.monotonic()


def _release() -> None:
    """Give what a dropped job held back to the system: its graphs are cycles (gc), and glibc keeps a freed
    heap unless trimmed."""
    import ctypes
    import gc

    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def reached(trial: Trial, k: int) -> dict | None:
    """The trial's record at rung ``k`` (its last, when the time budget ran it an epoch at a time), or None."""
    return next((r for r in reversed(trial.rungs) if r["rung"] == k), None)


def _reset_peak() -> None:
    """Start the process's peak RSS (VmHWM) afresh, so that each trial's peak is its own (Linux)."""
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass


def _latency_ms(path: Path, threads: int | None, runs: int = LATENCY_RUNS) -> float:
    from .. import _lazy

    session = _lazy.ort_session(str(path), threads)
    inp = session.get_inputs()[0]
    shape = [1 if not isinstance(d, int) or d <= 0 else d for d in inp.shape]
    x = np.zeros(shape, np.float32)
    for _ in range(min(3, runs)):
        session.run(None, {inp.name: x})
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, {inp.name: x})
        times.append((time.perf_counter() - t0) * 1000.0)
    return float(statistics.median(times))


def tune(model: str, opts: TuneOptions, progress: ProgressFn | None = None) -> TuneResult:
    """The whole run: check, decode, pre-check, the schedule, the outputs. See the module's docstring."""
    tuner = Tuner(model, opts, progress)
    grid, points, objective = tuner.check()
    tuner.timers["check"] = time.monotonic() - tuner.clock0
    tried = schedule.sample(points, opts.trials, opts.strategy, opts.seed)
    configs = _configs([points[i] for i in tried], opts)
    tuner.trials = [Trial(i + 1, c) for i, c in enumerate(configs)]
    fp = fingerprint(model, opts, grid, objective)
    resumed = tuner.open_outdir(fp)
    created = not tuner.outdir.exists()
    tuner.outdir.mkdir(parents=True, exist_ok=True)
    lock = _lock(tuner.outdir)
    try:
        return _run(tuner, grid, points, tried, objective, fp, resumed)
    except UsageError:
        if created and not any(r.get("kind") == "rung" for r in tuner.journal.records):
            shutil.rmtree(tuner.outdir, ignore_errors=True)  # a refusal before any trial leaves nothing behind
        raise
    finally:
        if tuner.store is not None:
            tuner.store.close()
        (tuner.outdir / LOCK).unlink(missing_ok=True)
        os.close(lock)


def _run(tuner: Tuner, grid: Grid, points: list[dict], tried: list[int], objective: str, fp: dict,
         resumed: bool) -> TuneResult:
    from ..training import FeatureStore

    opts = tuner.opts
    t0 = time.monotonic()
    data = tuner.outdir / DATA_DIR
    have = resumed and all((data / f).is_file() for f in ("train.npz", "val.npz"))
    if have:
        rec = tuner.journal.find("data")
        have = rec is not None and rec.get("train") == file_digest(data / "train.npz") \
            and rec.get("val") == file_digest(data / "val.npz")
    if not have:
        train, val, _ = decode_data(tuner.model, opts, data, tuner.budget_mb)
    tuner.timers["decode"] = time.monotonic() - t0
    t1 = time.monotonic()
    tuner.precheck()
    tuner.timers["precheck"] = time.monotonic() - t1
    tuner.setup_peak_mb = procmem.peak_rss_mb()
    if not resumed:
        tuner.journal.append({"format": FORMAT, "fingerprint": fp, "tried": tried, "clock": 0.0})
    if not have:
        tuner.journal.append({"kind": "data", "train": file_digest(data / "train.npz"),
                              "val": file_digest(data / "val.npz")})
    if resumed:
        tuner.replay()
        tuner.notes.append(f"resumed: {tuner.done_runs} trial rung(s) from the journal")
    tuner.store = FeatureStore()
    runnable = [t for t in tuner.trials if t.status != "skipped"]
    rungs = schedule.plan(opts.strategy, len(runnable), max(t.config["epochs"] for t in tuner.trials), opts.eta)
    total_runs = sum(min(r.keep, len(runnable)) for r in rungs)
    alive = runnable
    for k, rung in enumerate(rungs):
        if k > 0:
            measured = [t for t in alive if reached(t, k - 1) is not None and t.status in ("stopped", "finished")]
            measured.sort(key=lambda t: rank_key(t, objective, reached(t, k - 1)))
            alive = measured[:rung.keep]
            if k == len(rungs) - 1:  # into the last rung: the best of each trained part too (see schedule.py)
                for t in measured:
                    if all(a.config["train_layers"] != t.config["train_layers"] for a in alive):
                        alive.append(t)
            for t in measured:
                if t.status == "stopped" and t not in alive:
                    e = reached(t, k - 1)["epochs"]
                    t.why = f"not among the best {rung.keep} at rung {k} ({e} epoch{'s' if e != 1 else ''})"
        for trial in alive:
            if trial.status in ("failed", "skipped"):
                continue
            target = min(rung.epochs, trial.config["epochs"])
            if trial.epochs_run >= target:
                if reached(trial, k) is None:  # its own maximum came at an earlier rung: that record stands here
                    trial.rungs.append({**trial.rungs[-1], "rung": k, "seconds": 0.0, "cpu_seconds": 0.0,
                                        "train_seconds": 0.0, "feature_seconds": 0.0, "joules": None, "trained": 0})
                continue
            while trial.epochs_run < target and trial.status not in ("failed", "skipped"):
                reach = tuner.within_time(trial, target)
                if reach <= trial.epochs_run:
                    tuner.stopped_by_time = True
                    break
                tuner.run_rung(trial, k, reach, len(rungs), total_runs)
                tuner.measure_model(trial, objective)
            if tuner.stopped_by_time:
                if trial.rungs and trial.epochs_run < target:
                    trial.why = f"time budget: stopped at {trial.epochs_run} of {target} epochs"
                break
        if tuner.stopped_by_time:
            break
    for trial in tuner.trials:
        tuner.measure_model(trial, objective)
        if trial.status == "pending":
            trial.status = "not run"
            trial.why = "time budget" if tuner.stopped_by_time else "not among the best at an earlier rung"
        elif trial.status == "stopped" and not trial.why:
            trial.why = "time budget" if tuner.stopped_by_time else "stopped"
    done = [t for t in tuner.trials if t.rungs]
    if not done and all(t.status == "skipped" for t in tuner.trials):
        raise UsageError(f"no point of the grid fits the memory budget: {tuner.trials[0].why}", "--memory-budget",
                         "raise --memory-budget, or search modes that train less (train_layers=head,last:2)")
    if not done:
        why = "; ".join(sorted({t.why for t in tuner.trials if t.why}))[:300]
        raise RunFailed(f"no trial finished ({why or 'none ran'})", str(tuner.outdir),
                        "lower the learning rates searched, or raise --time-budget / --memory-budget")
    best = min(done, key=lambda t: rank_key(t, objective))
    from .output import write_outputs

    return write_outputs(tuner, grid, points, best, objective, rungs, resumed)
