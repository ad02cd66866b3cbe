"""The int8 scheme chosen by measurement on the CPU that will run it (``quantize --scheme auto``).

The per-architecture rule (``scheme.choose_scheme``) is ONNX Runtime's advice, but users of every
runtime report int8 models that run *slower* than fp32 on some ARM cores (TensorFlow #41035: MobileNetV2
332 ms fp32 vs 538 ms int8 on a Pi 3; onnxruntime #20052). So where quantize runs on the hardware it
quantizes for, the candidates are built and timed:

- fp32 itself (the model as exported): the reference, timed but never written (quantize writes int8;
  where fp32 outruns every int8 candidate, the result says so beside the int8 figures, issue 37),
- QDQ S8S8 and U8S8, each with per-channel and per-tensor weight scales (U8S8 with 7-bit weights on x86
  without VNNI, as the rule says), and QOperator (QLinearConv/QLinearMatMul) with the rule's types and
  granularity,
- dynamic quantization (weights int8, activations quantized at run time) where it applies: a model with
  MatMul/Gemm nodes (on convolutions it makes ConvInteger, which ONNX Runtime runs slower than fp32). Its
  convolutions stay fp32, so on a conv net it is barely smaller (62,191 -> 62,101 B on the digits CNN):
  it may be written only where it is smaller than every static candidate (and, timed, faster).

Each is timed in a fresh process with the thread cap (``child.run``: nothing warm from the others), in
interleaved rounds (A B C ... A B C ...) so that a drifting machine does not favour one; its p50 is the
lowest of the rounds' medians. Those that may be written (``writable``: int8, within the accuracy budget,
not excluded) compete; the fastest is written. The best so far is written as soon as it is known, so a
search that is stopped keeps its result.

``python -m edgetrain.int8.search MODEL.onnx N,C,H,W`` is the child: it prints one JSON latency.
"""
from __future__ import annotations

import json
import os
import sys
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

from ..child import death, last_line, python_argv, run
from ..errors import RunFailed
from .scheme import Int8Scheme
from ..runners import OrtRunner

ROUNDS = 2
CHILD_TIMEOUT_S = 300.0
DYNAMIC_OPS = ("MatMul", "Gemm")


@dataclass
class Candidate:
    name: str                      # "fp32", "QDQ S8S8 (per-channel)", "dynamic (MatMul/Gemm int8)"
    kind: str                      # "fp32" | "static" | "dynamic"
    scheme: Int8Scheme | None = None
    path: Path | None = None
    size_bytes: int | None = None
    top1: float | None = None
    drop: float | None = None
    within_budget: bool | None = None   # None: accuracy not checked (no --val)
    p50_ms: float | None = None
    p90_ms: float | None = None
    rounds: list | None = None        # p50 of each round, ms
    pids: list | None = None          # the fresh process of each round
    threads: int | None = None        # the thread cap the children ran with
    rule: bool = False                 # what the per-architecture rule would have chosen
    chosen: bool = False
    error: str | None = None
    excluded: str | None = None        # why it is timed but may not be written (fp32; dynamic not smaller)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["scheme"] = self.scheme.to_dict() if self.scheme is not None else None
        d["path"] = None
        return d

    @property
    def eligible(self) -> bool:
        """Built, timed and within the accuracy budget (or not checked)."""
        return self.error is None and self.within_budget is not False and self.p50_ms is not None

    @property
    def writable(self) -> bool:
        """Eligible, and a model quantize may write: int8, not excluded."""
        return self.eligible and self.excluded is None and self.kind != "fp32"


def static_candidates(rule: Int8Scheme, arch: str, isa: dict) -> list[Int8Scheme]:
    """QDQ S8S8 and U8S8, per-channel and per-tensor, then QOperator with the rule's types and granularity;
    the rule's own scheme first."""
    u8_reduce = arch == "x86_64" and not isa.get("vnni")
    out = [rule]
    for acts, reduce in (("int8", False), ("uint8", u8_reduce)):
        for per_channel in (True, False):
            s = replace(rule, activations=acts, reduce_range=reduce, per_channel=per_channel, warning=None)
            if all(s.name != o.name for o in out):
                out.append(s)
    out.append(replace(rule, format="QOperator", warning=None))
    return out


def dynamic_applies(model_proto) -> bool:
    return any(n.op_type in DYNAMIC_OPS for n in model_proto.graph.node)


def time_in_child(path: Path, batch_shape, threads: int) -> dict:
    """One fresh process loads ``path`` and times it (warm-up excluded) with the thread cap."""
    done = run(python_argv("edgetrain.int8.search", str(path), ",".join(map(str, batch_shape))),
               what=f"timing {path.name}", timeout=CHILD_TIMEOUT_S, threads=threads, where="scheme search child")
    if done.code != 0:
        raise RunFailed(f"timing {path.name} {death(done.code)}{last_line(done.err)}", "scheme search child",
                        "EDGETRAIN_DEBUG=1 shows the child's output; --scheme rule skips the measurement")
    return json.loads(done.out.strip().splitlines()[-1])


def measure(candidates: list[Candidate], batch_shape, threads: int, rounds: int = ROUNDS,
            on_measured: Callable[[Candidate], None] | None = None,
            progress: Callable[[int, int], None] | None = None) -> None:
    """Time every candidate in fresh processes, interleaved; ``on_measured`` after each first estimate
    (the best so far can be saved), and again at the end for every candidate."""
    live = [c for c in candidates if c.error is None]
    total, done = len(live) * rounds, 0
    for r in range(rounds):
        for c in live:
            try:
                lat = time_in_child(c.path, batch_shape, threads)
            except RunFailed as exc:  # a candidate that crashes is reported, never written
                c.error = exc.what
                continue
            c.rounds = (c.rounds or []) + [lat["p50_ms"]]
            c.pids = (c.pids or []) + [lat["pid"]]
            c.threads = lat["threads"]
            c.p50_ms = min(c.rounds)
            c.p90_ms = lat["p90_ms"] if c.p90_ms is None else min(c.p90_ms, lat["p90_ms"])
            done += 1
            if progress:
                progress(done, total)
            if r == 0 and on_measured:
                on_measured(c)


def fastest(candidates: list[Candidate]) -> Candidate | None:
    """The fastest candidate that may be written (int8, within budget, not excluded); None if there is none."""
    writable = [c for c in candidates if c.writable]
    return min(writable, key=lambda c: c.p50_ms) if writable else None


def main(argv: list[str]) -> int:
    import numpy as np

    path, shape = argv[0], tuple(int(d) for d in argv[1].split(","))
    runner = OrtRunner(path)
    x = np.random.RandomState(0).standard_normal(shape).astype(np.float32)
    lat = runner.time(x, warmup=5, min_runs=20, max_runs=500, budget_s=1.0)
    print(json.dumps({**lat.to_dict(), "pid": os.getpid()}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
