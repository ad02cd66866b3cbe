"""A tune run's records: a trial (its configuration and what each rung measured), how trials are ranked, and
the run's result (what --json writes and tune.json holds)."""
from __future__ import annotations

from dataclasses import dataclass, field

from ..results import Result


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


def work(trial: Trial) -> tuple:
    """What sets a trial's device time per epoch and its peak memory: its trained part and batch size (the rate,
    optimizer, momentum and weight decay change the numbers, not the work)."""
    return trial.config["train_layers"], trial.config["batch_size"]


def work_costs(trials: list[Trial]) -> dict[tuple, tuple[float, float]]:
    """Per kind of work (``work``): device seconds per epoch and peak MB, from the first rung's runs (every trial
    runs it before any cut, so a resume reads the same facts at every cut): the mean seconds per epoch, the
    highest peak."""
    runs: dict[tuple, list[dict]] = {}
    for t in trials:
        first = next((r for r in t.rungs if r["rung"] == 0 and r.get("trained")), None)
        if first is not None:
            runs.setdefault(work(t), []).append(first)
    return {k: (sum(r["seconds"] / r["trained"] for r in rs) / len(rs),
                max((r["peak_mb"] or 0.0) for r in rs)) for k, rs in runs.items()}


def rank_key(trial: Trial, objective: str, rung: dict | None = None, costs: dict | None = None):
    """Best first: the objective, then less device time, then lower peak memory, then grid order. With ``costs``
    (``work_costs``), the device time and memory are those of the trial's kind of work at its epochs: two trials
    of the same work tie on them and go in grid order. Measured per trial, a tie in held-out accuracy between two
    `lite` rates went to whichever run the machine's load slowed less (bench_tune seed 9: lr 0.003 and 0.03 both
    0.95 held-out at 6 epochs, 8.40 against 8.62 s in one run and 4.65 against 3.37 s in the next; the grid's pick,
    95.1% on the test set, became 91.1%)."""
    if costs and work(trial) in costs:
        per_epoch, peak = costs[work(trial)]
        epochs = (rung or trial.rungs[-1])["epochs"] if trial.rungs else 0
        return (-score(trial, objective, rung), round(per_epoch * epochs, 3), peak, trial.number)
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
            epoch_s = self.trial_epoch_s()
            if self.seconds > self.time_budget_s + epoch_s:
                failed.append(f"the run took {self.seconds:.1f} s, more than one trial-epoch ({epoch_s:.1f} s) over "
                              f"the time budget {self.time_budget_s:.0f} s")
        return failed

    def trial_epoch_s(self) -> float:
        """One trial-epoch as this run measured it: the most seconds a trial took per epoch in any one of its runs,
        its job's set-up with it (the tuner runs a trial an epoch at a time under --time-budget until it knows its
        cost), on this device at this load. --time-budget is kept to within it."""
        per = []
        for t in self.trials:
            seconds = epochs = 0.0
            for r in t["accuracy_by_rung"]:
                if r["epochs"] > epochs:
                    per.append((r["device_seconds"] - seconds) / (r["epochs"] - epochs))
                seconds, epochs = r["device_seconds"], r["epochs"]
        return max(per, default=0.0)


def reached(trial: Trial, k: int) -> dict | None:
    """The trial's record at rung ``k`` (its last, when the time budget ran it an epoch at a time), or None."""
    return next((r for r in reversed(trial.rungs) if r["rung"] == k), None)
