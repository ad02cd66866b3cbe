"""The tune run: the trials of a grid, trained by the fine-tune job (edgetrain.training) within the device's
budgets, the best one kept.

Set-up, before any training: the grid read and every point checked as finetune checks it; DATA (and --val, or
the held-out split) decoded once into OUTDIR/data/*.npz, which every trial reads; each distinct trained part
(train_layers, batch_size) loaded once and its memory plan made, so that a point that would not fit
--memory-budget is skipped before it runs (a grid none of whose points fits is refused, exit 2).

Then the schedule (schedule.py): a trial is a FinetuneJob in OUTDIR/trials/NNN; it moves up a rung by resuming
its own checkpoint with more epochs (the job's resume gives the weights of an uninterrupted run). The trials of
head/last:N share their frozen features through one FeatureStore: computed once per frozen part. Every rung's
result goes to the journal (journal.py), on the disk before the next checkpoint is written: after a power cut,
``--resume`` replays it and only the interrupted rung of one trial goes on, from that trial's last epoch checkpoint.
"""
from __future__ import annotations

import contextlib
import fcntl
import gc
import json
import math
import os
import shutil
import statistics
import time
from pathlib import Path

import numpy as np

from .. import procmem, runtime
from ..cputime import cpu_seconds
from ..errors import RunFailed, UsageError
from ..fileio import file_digest
from ..options import FinetuneOptions, TuneOptions
from ..results import ProgressFn, report
from . import schedule
from .grid import Grid, read_grid
from .inputs import configs_of, check_points, decode_data, fingerprint
from .journal import FORMAT, Journal
from .output import MODEL, TRIALS_DIR, write_outputs
from .records import Trial, TuneResult, rank_key, reached, work_costs

DATA_DIR, LOCK = "data", ".tune.lock"
LATENCY_RUNS = 30
OUTPUT_RESERVE_S = 0.25  # of --time-budget, kept for writing the outputs (the model, the table, the report)
# what a resume must find as it was: changed, the trials would not be the same ones
SAME_ON_RESUME = {"model": "MODEL", "data": "DATA", "val": "held-out data", "grid": "grid", "epochs": "--epochs",
                  "strategy": "--strategy", "eta": "--eta",
                  "min_rung": "--min-rung", "trials": "--trials", "seed": "--seed", "objective": "objective"}


# --- set-up ------------------------------------------------------------------------------------------------

def _lock(outdir: Path) -> int:
    fd = os.open(outdir / LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise UsageError("OUTDIR is in use by another tune run", str(outdir),
                         "wait for it to finish (or stop it), or choose another OUTDIR") from None
    return fd


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
        # shared work, not overhead; "imports": loading the trainer's and the report's modules (what any run of
        # them pays once, like the interpreter's start, which no clock here counts)
        self.timers = {"check": 0.0, "imports": 0.0, "decode": 0.0, "precheck": 0.0, "latency": 0.0}
        self.cpu0 = cpu_seconds()
        self.setup_peak_mb: float | None = None
        self.trials: list[Trial] = []
        self.store = None
        self.builds = None   # the BuildStore: a trial of the kind just run takes its build (model, graphs, plan)
        self.built_kind: tuple | None = None   # (train_layers, batch_size) of the trial run last
        self.stopped_by_time = False
        self.settled = False   # _settle done (once, before the first trial's job)
        self.done_runs = 0
        self.objective = "accuracy"   # the run's (--objective, or the grid file's)
        self.train_rows = 0   # rows of the decoded training data (a rung of a fraction of an epoch is in steps)
        self.datasets: dict = {}  # the decoded data as the trials read it: read once (FinetuneJob data_store)

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
        # (a journal written before --min-rung existed ran whole-epoch rungs: its default)
        changed = [SAME_ON_RESUME[k] for k in SAME_ON_RESUME
                   if old.get(k, 1.0 if k == "min_rung" else None) != json.loads(json.dumps(fp[k]))]
        if changed:
            raise UsageError(f"cannot resume: the tune run in OUTDIR was made with a different {', '.join(changed)}", str(out),
                             "resume with the same MODEL, data, --grid, --epochs, --strategy, --eta, --min-rung, --trials, "
                             "--seed and "
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
        job = FinetuneJob(self.model, fopts, val_split=None,
                          budget_mb=None, threads=self.threads, profile=self.profile, progress=lambda info: None)
        try:
            job.load()
        except UsageError as exc:
            return {"error": exc.what, "fix": exc.fix}
        finally:
            del job
            procmem.release_freed_memory()
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
                  "train_layers": c["train_layers"], "lr": c["lr"], "momentum": c.get("momentum"),
                  "weight_decay": c.get("weight_decay", FinetuneOptions.fields["weight_decay"].default),
                  "seed": self.opts.seed,
                  "memory_budget": self.budget_mb, "device": self.opts.device, "threads": self.opts.threads,
                  "resume": resume, "allow_chance": True}
        return values

    # --- the trials --------------------------------------------------------------------------------------

    def steps_per_epoch(self, trial: Trial) -> int:
        return max(1, math.ceil(self.train_rows / trial.config["batch_size"]))

    def target_steps(self, trial: Trial, target: float) -> int:
        """The steps a run to ``target`` epochs stops at (a fraction of an epoch: the nearest step, at least one)."""
        return max(1, round(target * self.steps_per_epoch(trial)))

    def reached(self, trial: Trial, target: float) -> bool:
        """Whether ``trial`` has trained to ``target`` epochs, counted in the steps a run to it stops at: a rung of
        half an epoch of 45 steps stops at step 22 (0.4889 epochs), which is that rung reached (compared in
        epochs, 0.4889 < 0.5 ran the same stop again and again, forever)."""
        return round(trial.epochs_run * self.steps_per_epoch(trial)) >= self.target_steps(trial, target)

    def _job(self, trial: Trial, target: float, progress, write_model: bool):
        """The trial's FinetuneJob to ``target`` epochs, resuming its checkpoint (a fraction of an epoch: the job
        stops at that step)."""
        from ..training import FinetuneJob, prepare_outdir

        tdir = self.outdir / TRIALS_DIR / f"{trial.number:03d}"
        has_checkpoint = prepare_outdir(tdir, resume=True)
        spe = self.steps_per_epoch(trial)
        steps = self.target_steps(trial, target)
        stop_at = steps if steps % spe else None
        fopts = FinetuneOptions.unchecked(**self._finetune_values(trial, tdir, math.ceil(steps / spe),
                                                                  resume=has_checkpoint))
        job = FinetuneJob(self.model, fopts, val_split=None,
                          budget_mb=self.budget_mb, threads=self.threads, profile=self.profile, progress=progress,
                          resume=has_checkpoint, feature_store=self.store, stop_at_step=stop_at,
                          write_model=write_model, data_store=self.datasets, build_store=self.builds,
                          before_checkpoint=self.journal.sync)
        return job, has_checkpoint

    def ensure_model(self, trial: Trial) -> None:
        """The trial's model.onnx, written from its checkpoint if its runs left the file out (nothing trained)."""
        if (self.outdir / TRIALS_DIR / f"{trial.number:03d}" / MODEL).is_file():
            return
        job, has_checkpoint = self._job(trial, trial.epochs_run, lambda info: None, write_model=True)
        job.run(has_checkpoint)
        del job

    def run_rung(self, trial: Trial, rung_index: int, target: float, n_rungs: int, total_runs: int) -> None:
        """Train ``trial`` up to ``target`` epochs (resuming its checkpoint; a fraction of an epoch stops the job at
        that step) and journal the result."""
        where = f"trial {trial.number}/{len(self.trials)} rung {rung_index + 1}/{n_rungs}"

        def relay(info: dict) -> None:
            if info.get("phase") == "train":
                report(self.progress, "tune", message=f"{where}: epoch {info['epoch']}/{info['epochs']} step "
                       f"{info['step']}/{info['steps']}")

        # the model file only where it may be read: a trial trained in full, every run under a time budget (any
        # may be the last), every run when the objective measures the model; else the checkpoint holds the
        # weights, and ensure_model writes the file if such a trial is chosen
        final = target >= trial.config["epochs"] or self.opts.time_budget is not None \
            or self.objective != "accuracy"
        spe = self.steps_per_epoch(trial)
        kind = (trial.config["train_layers"], trial.config["batch_size"])
        if kind != self.built_kind:
            self.release_build()   # another part's build goes before this trial's memory is measured
        self.built_kind = kind
        if not self.settled:  # before the job exists: a frozen job (a cycle with its engine) would never be collected
            _settle(collect=self.budget_mb is not None)
            self.settled = True
        _reset_peak()
        before = trial.epochs_run
        # the trial's time from its folder and job on (its set-up, as a lone finetune's would be)
        t0, c0, waited = time.monotonic(), cpu_seconds(), self.journal.waited
        job, has_checkpoint = self._job(trial, target, relay, write_model=final)
        trial.status = "running"
        try:
            res = job.run(has_checkpoint)
        except RunFailed as exc:
            del job
            procmem.release_freed_memory()
            trial.status, trial.why = "failed", exc.what
            self.journal.append({"kind": "failed", "trial": trial.number, "why": exc.what, "clock": self.clock()})
            return
        except UsageError as exc:  # the plan refused at run time (the budget, measured)
            del job
            procmem.release_freed_memory()
            trial.status, trial.why = "skipped", f"would not fit (its plan, at its start): {exc.what}"
            self.journal.append({"kind": "skipped", "trial": trial.number, "why": trial.why, "clock": self.clock()})
            return
        # (a wait for the journal's last line, at the job's first checkpoint, is the tuner's, not the trial's)
        seconds, cpu = time.monotonic() - t0 - (self.journal.waited - waited), cpu_seconds() - c0
        trial.lr_used = job.lr
        del job
        if self.budget_mb is not None:
            # the next trial plans from this process's memory: what this one freed goes back (~80 ms), and what
            # is left alive (no job: it was collected) goes out of the collector's reach as _settle's did
            procmem.release_freed_memory()
            gc.freeze()
        # where this run started (a power cut may have left the checkpoint further on than the journal) and ended,
        # in epochs: whole ones plus the steps of one stopped inside
        resumed = res.resumed_from or {}
        start = int(resumed.get("epoch", int(before)))
        began = start + int(resumed.get("step", 0)) / spe if resumed else before
        inside = res.partial_epoch
        reached_epochs = len(res.epochs) + (inside["step"] / inside["steps"] if inside else 0.0)
        new = res.epochs[start:]
        # (an epoch begun in an earlier run counts its seconds there too: the epoch's record holds them all)
        train_s = sum(e["seconds"] for e in new) + (inside["seconds"] if inside else 0.0)
        record = {"kind": "rung", "trial": trial.number, "rung": rung_index, "epochs": _epochs(reached_epochs),
                  "val_accuracy": res.final_accuracy, "seconds": round(seconds, 4), "cpu_seconds": round(cpu, 4),
                  "train_seconds": round(train_s, 4),
                  "feature_seconds": res.feature_seconds, "peak_mb": res.peak_rss_mb, "lr_used": trial.lr_used,
                  "plan_mb": res.plan.get("estimate_mb"),
                  "joules": (res.energy or {}).get("joules"), "energy_provenance": (res.energy or {}).get("provenance"),
                  "history": [e.get("val_accuracy") for e in res.epochs],
                  "trained": _epochs(reached_epochs - began), "trained_parameters": res.trained_parameters,
                  "resumed_at": _epochs(began) if resumed else None, "clock": None}
        record["clock"] = round(self.clock(), 4)
        self.journal.append(record)
        trial.rungs.append(record)
        trial.status = "finished" if len(res.epochs) >= trial.config["epochs"] else "stopped"
        self.done_runs += 1
        report(self.progress, "tune", self.done_runs, total_runs, final=True,
               message=f"{where} ({trial.label()}): {record['val_accuracy']:.3f} held-out at {record['epochs']} "
                       f"epoch{'s' if record['epochs'] != 1 else ''}, {seconds:.1f}s",
               eta_s=self.eta(total_runs))

    def release_build(self) -> None:
        """The build held for the trials of one part let go (under a budget, its memory given back to the system):
        before a trial of another part, a latency measurement and the outputs, whose peaks it is no part of."""
        if self.builds is not None and self.builds.build is not None:
            self.builds.release()
            if self.budget_mb is not None:
                procmem.release_freed_memory()
        self.built_kind = None

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

    def within_time(self, trial: Trial, target: float) -> float:
        """The epochs ``trial`` may reach within --time-budget: ``target`` if no budget; else as far towards it as
        takes at most half the time left, or one epoch if only that fits. The estimate comes from the runs before,
        and misses by a share of the run's length when the load changes (a first epoch of 0.17 s at load 11, then
        13 epochs estimated at 2.25 s took 3.01 s): halving what is left keeps the last runs an epoch long, so the
        budget is overrun by at most about one trial-epoch's miss."""
        budget = self.opts.time_budget
        if budget is None:
            return target
        have = trial.epochs_run
        left = budget - self.clock() - OUTPUT_RESERVE_S
        if left <= 0:
            return have
        need = self.estimate_s(trial, target - have)
        if need is None:  # nothing of this kind measured yet: one epoch (or less, to the target), to learn its cost
            return min(target, math.floor(have) + 1)
        if need <= left / 2:
            return target
        stops = [e for e in range(math.floor(have) + 1, math.ceil(target)) if e < target] + [target]
        half = [e for e in stops if self.estimate_s(trial, e - have) <= left / 2]
        if half:
            return half[-1]
        return stops[0] if self.estimate_s(trial, stops[0] - have) <= left else have

    def measure_model(self, trial: Trial, objective: str) -> None:
        """The latency (and modelled energy) of one inference of the trial's model, once per kind of graph."""
        if objective == "accuracy" or not trial.rungs:
            return
        kind = trial.config["train_layers"]
        got = self.journal.find("latency", train_layers=kind)
        if got is None:
            self.release_build()
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


def _by_kind(trials: list[Trial]) -> list[Trial]:
    """A rung's trials in the order they run: those of one trained part (train_layers, batch size) together, the
    parts in the order they first come, so that each takes the build the one before it made (BuildStore)."""
    kinds: dict[tuple, list[Trial]] = {}
    for t in trials:
        kinds.setdefault((t.config["train_layers"], t.config["batch_size"]), []).append(t)
    return [t for group in kinds.values() for t in group]


def _trained_weights(trial: Trial) -> int:
    """How many weights the trial trains (a journal of an earlier edgetrain lacks it: as many as any other)."""
    return max((int(r.get("trained_parameters") or 0) for r in trial.rungs), default=0)


def _epochs(value: float) -> float | int:
    """Epochs as the journal and the table say them: a whole number as an int, a fraction to 4 places."""
    return int(round(value)) if abs(value - round(value)) < 1e-9 else round(value, 4)


def _settle(collect: bool) -> None:
    """Before the first trial's job is made: everything alive moved out of the collector's reach (gc.freeze): the
    jobs' own collections (their memory releases) then scan only the trials' objects, not the libraries' tens of
    thousands (a collection took 7-70 ms each here, dozens per trial). Never with a job alive: it is a cycle (job
    and engine), and frozen it, and all it holds, would never be freed. Under a memory budget (``collect``), what
    the set-up left is collected first (99 objects on bench_tune's task); without one it is frozen with the rest
    (9 objects of 41,500: the collection that found them took 20-50 ms). Once, not before every trial (21 of them
    took 36-105 ms of bench_tune's default run, 0.7-1.5% of it): what a trial leaves is collected after it under a
    budget (run_rung), else by the collector's own passes."""
    if collect:
        gc.collect()
    gc.freeze()


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
    tuner.objective = objective
    tuner.timers["check"] = time.monotonic() - tuner.clock0
    tried = schedule.sample(points, opts.trials, opts.strategy, opts.seed)
    configs = configs_of([points[i] for i in tried], opts)
    tuner.trials = [Trial(i + 1, c) for i, c in enumerate(configs)]
    fp = fingerprint(model, opts, grid, objective)
    resumed = tuner.open_outdir(fp)
    created = not tuner.outdir.exists()
    tuner.outdir.mkdir(parents=True, exist_ok=True)
    lock = _lock(tuner.outdir)
    try:
        return _run(tuner, grid, points, tried, objective, fp, resumed)
    except UsageError:
        with contextlib.suppress(OSError):
            tuner.journal.sync()
        if created and not any(r.get("kind") == "rung" for r in tuner.journal.records):
            shutil.rmtree(tuner.outdir, ignore_errors=True)  # a refusal before any trial leaves nothing behind
        raise
    finally:
        with contextlib.suppress(OSError):  # (a failed fsync was raised by the sync before the outputs)
            tuner.journal.close()
        if tuner.store is not None:
            tuner.store.close()
        if tuner.builds is not None:
            tuner.builds.release()
        (tuner.outdir / LOCK).unlink(missing_ok=True)
        os.close(lock)


def _run(tuner: Tuner, grid: Grid, points: list[dict], tried: list[int], objective: str, fp: dict,
         resumed: bool) -> TuneResult:
    t0 = time.monotonic()
    from .. import run_report  # noqa: F401  (the report's page, imported where it is written)
    from ..training import BuildStore, FeatureStore

    tuner.timers["imports"] = time.monotonic() - t0
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
    with np.load(data / "train.npz") as npz:
        tuner.train_rows = int(npz["label"].shape[0])
    tuner.timers["decode"] = time.monotonic() - t0
    t1 = time.monotonic()
    tuner.precheck()
    tuner.timers["precheck"] = time.monotonic() - t1
    tuner.setup_peak_mb = procmem.peak_rss_mb()
    head = [] if resumed else [{"format": FORMAT, "fingerprint": fp, "tried": tried, "clock": 0.0}]
    if not have:
        head.append({"kind": "data", "train": file_digest(data / "train.npz"), "val": file_digest(data / "val.npz")})
    if head:
        tuner.journal.append(*head)
    if resumed:
        tuner.replay()
        tuner.notes.append(f"resumed: {tuner.done_runs} trial rung(s) from the journal")
    tuner.store, tuner.builds = FeatureStore(), BuildStore()
    runnable = [t for t in tuner.trials if t.status != "skipped"]
    rungs = schedule.plan(opts.strategy, len(runnable), max(t.config["epochs"] for t in tuner.trials), opts.eta,
                          opts.min_rung)
    total_runs = sum(min(r.keep, len(runnable)) for r in rungs)
    alive = runnable
    for k, rung in enumerate(rungs):
        if k > 0:
            measured = [t for t in alive if reached(t, k - 1) is not None and t.status in ("stopped", "finished")]
            costs = work_costs(tuner.trials)
            measured.sort(key=lambda t: rank_key(t, objective, reached(t, k - 1), costs))
            alive = measured[:rung.keep]
            if k == len(rungs) - 1 and alive:  # into the last rung: the best of each trained part that trains more
                lead = _trained_weights(alive[0])  # weights than the leader, too (see schedule.py)
                for t in measured:
                    if all(a.config["train_layers"] != t.config["train_layers"] for a in alive) \
                            and _trained_weights(t) > lead:
                        alive.append(t)
            for t in measured:
                if t.status == "stopped" and t not in alive:
                    e = reached(t, k - 1)["epochs"]
                    t.why = f"not among the best {rung.keep} at rung {k} ({e} epoch{'s' if e != 1 else ''})"
        for trial in _by_kind(alive):
            if trial.status in ("failed", "skipped"):
                continue
            target = min(rung.epochs, trial.config["epochs"])
            if tuner.reached(trial, target):
                if reached(trial, k) is None:  # its own maximum came at an earlier rung: that record stands here
                    trial.rungs.append({**trial.rungs[-1], "rung": k, "seconds": 0.0, "cpu_seconds": 0.0,
                                        "train_seconds": 0.0, "feature_seconds": 0.0, "joules": None, "trained": 0})
                continue
            while not tuner.reached(trial, target) and trial.status not in ("failed", "skipped"):
                reach = tuner.within_time(trial, target)
                if reach <= trial.epochs_run:
                    tuner.stopped_by_time = True
                    break
                before = trial.epochs_run
                tuner.run_rung(trial, k, reach, len(rungs), total_runs)
                tuner.measure_model(trial, objective)
                if trial.epochs_run <= before and trial.status not in ("failed", "skipped"):  # a bug, not a loop
                    raise RuntimeError(f"tune: trial {trial.number} trained no further than {before} epochs "
                                       f"towards {target}")
            if tuner.stopped_by_time:
                if trial.rungs and not tuner.reached(trial, target):
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
    # the choice is among the trials trained to their own --epochs: a trial halving stopped early is not
    # comparable (bench_tune seed 4: lite lr 0.01 at 2 epochs, 0.96 held-out, was chosen over the finalist's
    # 0.94 at 6; its model scored 94.3% on the test set where the same point trained to 6 epochs scores 98.4%);
    # stopped by --time-budget (or none finished): the best so far, at whatever epochs it reached
    finished = [t for t in done if t.status == "finished"]
    costs = work_costs(tuner.trials)
    best = min(done if tuner.stopped_by_time or not finished else finished,
               key=lambda t: rank_key(t, objective, costs=costs))
    tuner.ensure_model(best)
    tuner.release_build()
    tuner.journal.sync()

    return write_outputs(tuner, grid, points, best, objective, rungs, resumed)
