"""How much memory `edgetrain quantize` needs, known before it starts, and the refusal when a device's budget
is smaller (issue 36, item 5: the Pi Zero 2 W's 512 MB).

Quantizing one model (ONNX Runtime backend) goes through phases whose peaks do not overlap: each phase's
freed heap goes back to the system before the next (procmem.release_freed_memory), calibration runs one
sample at a time in strides whose outputs are two scalars per tensor, and the per-node SQNR pass
(sensitivity.streamed_sqnr) holds one sample's matched activations of the fp32 and the int8 model, not every
sample's, nor ORT's flattened copy of every tensor. Which phase peaks depends on the graph, and two terms
cover them:

- the weights: pre-processing (symbolic shape inference, the optimiser folding BatchNorm) and the sessions of
  the fp32 and int8 models (the latency measurement): ResNet-18's peak;
- the activations of the graph as quantize runs it (a BatchNormalization after a Conv folded into it, so not
  counted): calibration, the batch-size check (three samples at once), the per-node SQNR pass: MobileNetV2's,
  SqueezeNet's and the digits CNN's at large inputs;
- where the scheme is chosen by timing (quantize on the device's own CPU), each candidate timed in a child
  while the process holds its libraries: the child is an ONNX Runtime process running one model at batch 1.

    peak ~ max(WEIGHTS_MB + WEIGHTS_PER_WEIGHT x weights,
               ACTIVATIONS_MB + ACTIVATIONS_PER_WEIGHT x weights + PER_ACTIVATION x activations of one input,
               [timed:] SEARCH_MB + SEARCH_PER_WEIGHT x weights + SEARCH_PER_LIVE x live activations)

The coefficients were fitted here (x86-64, onnxruntime 1.32, Python 3.11, numpy 1.23; peak RSS of the whole
`edgetrain quantize --device` process, imports included, as ru_maxrss of the child) over four families, then
raised so that no measured peak here is above its plan (the process's peak moves by a few percent from run to
run, the heap's fragmentation, and between machines: CI's fresh venv peaked at 241.7 MB on the digits CNN at
400x400, 2.4% above its plan). Measured (each run) against planned, MB, the plan 3-8% above:

    digits CNN (symbolic H/W)  400x400 219-226 / 236   500x500 260-261 / 279   560x560 294-298 / 309
    MobileNetV2-1.0            96x96   209-216 / 224   224x224 292-293 / 303   320x320 408-409 / 421
    SqueezeNet 1.1             224x224 219-220 / 234   320x320 282-283 / 297
    ResNet-18 v1               160x160 419     / 440   224x224 418-420 / 440

The timed search's (a profile matching this host, its budget the Zero 2 W's) was measured once, MobileNetV2 at
96x96: 272 MB for the process and its timing child together (their PSS: the child's shared pages counted once;
the model gives 275); it was not refitted with the rest. aarch64's wheels load other native libraries: expect
tens of MB either way on a board, as the README says for the other commands.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import UsageError

MB = 1024 * 1024
WEIGHTS = "pre-processing and the models' sessions"
ACTIVATIONS = "calibration and per-node SQNR"
WEIGHTS_MB = 172.0             # the libraries, the process
WEIGHTS_PER_WEIGHT = 6.0       # the model, its shape-inferred and optimised copies, the fp32 and int8 sessions
ACTIVATIONS_MB = 160.0
ACTIVATIONS_PER_WEIGHT = 3.5   # the fp32 and int8 sessions' weights (the int8 model's dequantized copies)
PER_ACTIVATION = 2.15          # one input's tensors of the fp32 and int8 runs, returned to Python, and the batch check
# the timing child: ONNX Runtime's own factors (measure/memory_model.py: weights 1.75x + their conv re-layout
# 0.9x, live activations 2.5x), on top of the parent and the child's interpreter and libraries (fitted: 96x96)
SEARCH_MB = 240.0
SEARCH_PER_WEIGHT = 2.65
SEARCH_PER_LIVE = 2.5


@dataclass
class QuantizeMemoryPlan:
    """What quantize will need at its peak, from the graph, before any work."""

    need_mb: float
    budget_mb: float | None
    weights_mb: float
    activations_mb: float        # every tensor of one input, added up (a BatchNorm folded into its Conv not counted)
    peak_phase: str              # WEIGHTS, ACTIVATIONS or "scheme timing"
    input_shape: list[int]       # the one input the activations are of (N is 1 unless the graph fixes it)

    @property
    def fits(self) -> bool:
        return self.budget_mb is None or self.need_mb <= self.budget_mb

    def to_dict(self) -> dict:
        return {**asdict(self), "fits": self.fits}


def memory_plan(fp32_path: Path, input_shape, budget_mb: float | None, search: bool = False) -> QuantizeMemoryPlan:
    """The plan for quantizing ``fp32_path`` at ``input_shape`` (C, H, W) within ``budget_mb`` (None: none);
    ``search``: the scheme will be chosen by timing candidates in children."""
    from ..measure import onnx_stats

    stats = onnx_stats(fp32_path, [1, *input_shape])
    w, a = stats.weights_bytes / MB, (stats.activation_total_bytes - stats.folded_bytes) / MB
    weights = WEIGHTS_MB + WEIGHTS_PER_WEIGHT * w
    activations = ACTIVATIONS_MB + ACTIVATIONS_PER_WEIGHT * w + PER_ACTIVATION * a
    timed = (SEARCH_MB + SEARCH_PER_WEIGHT * w + SEARCH_PER_LIVE * stats.activation_peak_bytes / MB) if search else 0.0
    need, phase = max((weights, WEIGHTS), (activations, ACTIVATIONS), (timed, "scheme timing"))
    return QuantizeMemoryPlan(need, budget_mb, w, a, phase, list(stats.input_shape))


def check_memory_plan(p: QuantizeMemoryPlan, device: str) -> None:
    """Refuse, in one line, a plan that does not fit the device's memory budget."""
    if p.fits:
        return
    raise UsageError(f"quantizing needs about {p.need_mb:.0f} MB at its peak ({p.peak_phase}: {p.weights_mb:.1f} MB "
                     f"of weights, {p.activations_mb:.0f} MB of activations {_of_one_input(p.input_shape)}), more than "
                     f"{device}'s memory budget of {p.budget_mb:.0f} MB", "--device",
                     "quantize on the host (or a bigger board) and copy the int8 file to the device, or "
                     "quantize at a smaller --input-shape")


def _of_one_input(shape: list[int]) -> str:
    """'per sample at 1x16x16', or for a graph whose input fixes a batch 'for one input of 100000x1x16x16 (the
    batch of 100000 its graph fixes)': the figure is of what one run takes."""
    if not shape:
        return "per input"
    if shape[0] == 1:
        return f"per sample at {'x'.join(map(str, shape[1:]))}"
    return f"for one input of {'x'.join(map(str, shape))} (the batch of {shape[0]} its graph fixes)"
