"""A job's build, kept for the next job of the process that trains the same part the same way (a tune's trials).

A build is what a fine-tune job makes before its first step and that depends on neither its optimizer settings
nor its seed's order of batches: the model loaded and its exporter quirks undone, the output layer resized, the
lite modules added, the trained part's gradient graph, the ONNX Runtime step graph and its session, and the
memory plan the session was probed at. On the tune's 15-point digits grid that was 0.4 s of 2.3 s of trials
(tools/bench_tune.py's task, 21 jobs). A later job with the same key (MODEL, --train-layers, batch size, seed,
data, budget, threads: ``FinetuneJob.build_key``) takes the build instead of making it, the trained arrays first
set back to the values the build loaded (``OnnxEngine.reset``), so its run is the run it would have been alone
(tests/test_tune_builds.py: the weights bit for bit). A resumed run takes it only if its checkpoint's plan is
the build's (the micro-batch and where the step runs decide the arithmetic); else it builds its own.

One build at a time: a job with another key lets the held one go before it makes its own, so the process
holds no more than one job does (the tuner runs a rung's trials of one kind together). What is let go is
dropped by reference (``OnnxEngine.release``), not left to the collector: the tuner freezes what is alive
between trials out of the collector's reach (gc.freeze), a build among it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..preprocess import Preprocess
from .engine import Engine
from .memplan import Costs, MemoryPlan


@dataclass
class Build:
    """A job's build from loading the model on, before its memory plan is made (kept in the store planned)."""
    engine: Engine           # the OnnxEngine; bound to the job running it, none between jobs
    preprocess: Preprocess   # the model's preprocessing (the data is read for it)
    notes: list[str]         # what loading said (the job that takes it says it too)
    initial: dict            # what the graph does not hold of the loaded arrays

    def planned(self, plan: MemoryPlan, costs: Costs, features: str) -> PlannedBuild:
        return PlannedBuild(self.engine, self.preprocess, self.notes, self.initial, plan, costs, features)


@dataclass
class PlannedBuild(Build):
    """A build with the memory plan its session was probed at: the only kind the store keeps and a job takes."""
    plan: MemoryPlan         # a job takes a copy
    costs: Costs
    features: str            # with a frozen part: its features' key in the feature store (there, or not taken)


class BuildStore:
    def __init__(self) -> None:
        self.key: str | None = None
        self.build: PlannedBuild | None = None
        self.made = 0     # builds kept
        self.reused = 0   # builds taken by a later job

    def get(self, key: str) -> PlannedBuild | None:
        return self.build if key == self.key else None

    def put(self, key: str, build: PlannedBuild) -> None:
        self.release()
        self.key, self.build = key, build
        self.made += 1

    def release(self) -> None:
        if self.build is not None:
            self.build.engine.release()
        self.key, self.build = None, None
