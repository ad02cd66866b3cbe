"""How much memory `edgetrain quantize` needs, known before it starts, and the refusal when a device's budget
is smaller (issue 36, item 5: the Pi Zero 2 W's 512 MB).

Quantizing one model (ONNX Runtime backend) goes through phases whose peaks do not overlap: each phase's
freed heap goes back to the system before the next (procmem.release_freed_memory), calibration runs one
sample at a time in strides whose outputs are two scalars per tensor, and the per-node SQNR pass
(sensitivity.streamed_sqnr) holds one sample's activations, not every sample's. Two phases set the peak:

- pre-processing (``quant_pre_process``: symbolic shape inference with sympy, ONNX Runtime's optimiser
  folding BatchNorm): the libraries plus a few copies of the weights;
- the SQNR pass: the fp32 and int8 models with every tensor an output, one sample's activations of each;
- where the scheme is chosen by timing (quantize on the device's own CPU), each candidate timed in a child
  while the process holds its libraries: the child is an ONNX Runtime process running one model at batch 1.

    peak ~ max(PREPARE_MB + PREPARE_PER_WEIGHT x weights, SQNR_MB + SQNR_PER_WEIGHT x weights
               + SQNR_PER_ACTIVATION x activations of one sample,
               [timed:] SEARCH_MB + SEARCH_PER_WEIGHT x weights + SEARCH_PER_LIVE x live activations)

The coefficients were measured here (x86-64, onnxruntime 1.32, Python 3.13, peak RSS of the whole
`edgetrain quantize` process, imports included, tools/bench_device_rss.py's sampler): MobileNetV2-1.0, 5
classes, at 96x96 (11.5 MB of weights, 17.6 MB of activations per sample): 244 MB; 160x160 (8.6, 40.6): 243 MB;
224x224 (8.6, 79.7): 302 MB; 320x320 (8.6, 162.6): 422 MB (the model gives 247, 246, 305, 429). With the
timed search (a profile matching this host, its budget the Zero 2 W's), 96x96: 272 MB for the process and its
timing child together (their PSS: the child's shared pages counted once; the model gives 275). aarch64's
wheels load other native libraries: expect tens of MB either way on a board, as the README says for the other
commands.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import UsageError

MB = 1024 * 1024
PREPARE_MB = 201.0             # 3 MB above 96x96's peak, as SQNR_MB
PREPARE_PER_WEIGHT = 4.0       # the model, its shape-inferred copy, the optimiser's session, the saved result
SQNR_MB = 168.0                # 3 MB above the fit through 224x224's and 320x320's peaks
SQNR_PER_WEIGHT = 2.0          # the two sessions' weights (fp32 and the int8 model's dequantized copies)
SQNR_PER_ACTIVATION = 1.5      # one sample's every tensor, fp32 and int8, returned to Python
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
    activations_mb: float        # every tensor of one input, added up
    peak_phase: str              # "pre-processing", "per-node SQNR" or "scheme timing"
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
    w, a = stats.weights_bytes / MB, stats.activation_total_bytes / MB
    prepare = PREPARE_MB + PREPARE_PER_WEIGHT * w
    sqnr = SQNR_MB + SQNR_PER_WEIGHT * w + SQNR_PER_ACTIVATION * a
    timed = (SEARCH_MB + SEARCH_PER_WEIGHT * w + SEARCH_PER_LIVE * stats.activation_peak_bytes / MB) if search else 0.0
    need, phase = max((prepare, "pre-processing"), (sqnr, "per-node SQNR"), (timed, "scheme timing"))
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
