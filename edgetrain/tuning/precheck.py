"""One point's memory plan, made in a fresh process (``python -m edgetrain.tuning.precheck SPEC``): what the
fine-tune job of that point would plan at its start, measured where nothing else has run. Made in the tuner's
own process, a plan measures whatever the plans before it left there (the first ONNX Runtime session's set-up,
a feature pass's threads: 30-60 MB here), and two points' plans disagree with what their trials will see.

The job plans as a trial would and stops before its first step (its stop signal set in advance). Prints one
JSON line: ``{"estimate_mb": X}``, ``{"refused": WHAT, "fix": FIX}`` (over the budget) or ``{"error": WHAT,
"where": WHERE, "fix": FIX}`` (a point finetune refuses).
"""
from __future__ import annotations

import json
import signal
import sys
from pathlib import Path


def plan(spec: dict) -> dict:
    from ..errors import UsageError
    from ..options import FinetuneOptions
    from ..training import FinetuneJob, Interrupted

    opts = FinetuneOptions.unchecked(**spec["options"])
    job = FinetuneJob(spec["model"], opts, val_split=None,
                      budget_mb=spec["budget_mb"], threads=spec["threads"], profile=opts.profile(),
                      progress=lambda info: None)
    job.stop.signum = signal.SIGTERM  # a plan, then a checkpoint and Interrupted before the first step
    try:
        job.run(False)
    except Interrupted:
        pass
    except UsageError as exc:
        if spec["budget_mb"] is not None and "memory budget" in exc.what:
            return {"refused": exc.what, "fix": exc.fix}
        return {"error": exc.what, "where": exc.where, "fix": exc.fix}
    return {"estimate_mb": float(job.plan.estimate_mb)}


def main(spec_path: str) -> None:
    from ..cli import cap_threads_early

    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    cap_threads_early(str(spec["threads"]) if spec.get("threads") else None)
    from .. import runtime

    runtime.quiet_libraries()
    runtime.apply_threads(spec.get("threads"), strict=False)
    sys.stdout.write(json.dumps(plan(spec)) + "\n")


if __name__ == "__main__":
    main(*sys.argv[1:])
