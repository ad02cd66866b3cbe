"""Which int8 scheme to quantize with, chosen from the target's CPU features, and why.

Follows ONNX Runtime's quantization guide
(https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html):

- "Data type selection": QDQ with signed int8 activations and weights (S8S8) is ORT's default and its
  first choice, balancing speed and accuracy on both ARM and x86 CPU kernels.
- "When and why do I need to try U8U8?": on x86-64 with AVX2/AVX-512 but without VNNI, ORT's int8 GEMM
  uses VPMADDUBSW, whose 16-bit intermediate sum can saturate (the "u8s8 saturation problem"); the
  guide's fix is ``reduce_range`` (7-bit weights) or U8U8. We take reduce_range: it keeps the S8S8 QDQ
  graph (the same file runs everywhere) and costs a little weight precision instead of speed. VNNI
  (VPDPBUSD) accumulates in 32 bits and does not saturate, so it gets the full 8-bit range.
- int8 pays off on CPUs with int8 dot-product instructions (x86 VNNI, ARMv8.2 SDOT); without either,
  int8 kernels may not beat fp32, so we warn rather than promise a speed-up.

Pure Python: it runs before any heavy library loads.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Int8Scheme:
    format: str              # "QDQ"
    activations: str         # "int8" (signed) or "uint8"
    weights: str             # "int8"
    reduce_range: bool       # 7-bit weights: avoids u8s8 saturation on x86 without VNNI
    per_channel: bool        # one weight scale per output channel
    target: str              # what the choice was made for, e.g. "rpi4b-4gb (aarch64: neon)"
    reason: str
    warning: str | None = None

    @property
    def name(self) -> str:
        kind = ("S8" if self.activations == "int8" else "U8") + ("S8" if self.weights == "int8" else "U8")
        extras = ["per-channel" if self.per_channel else "per-tensor"]
        if self.reduce_range:
            extras.append("reduce_range")
        return f"{self.format} {kind} ({', '.join(extras)})"

    def to_dict(self) -> dict:
        return {"name": self.name, **asdict(self)}


def choose_scheme(arch: str, isa: dict[str, bool], target: str, per_channel: bool = True) -> Int8Scheme:
    """The scheme for a target with ``arch`` ('aarch64' | 'x86_64') and ISA flags (neon, dotprod, avx2, vnni)."""
    features = [k for k in ("neon", "dotprod", "avx2", "vnni") if isa.get(k)]
    label = f"{target} ({arch}: {', '.join(features) or 'no int8 SIMD features recorded'})"
    fast_int8 = bool(isa.get("vnni")) or (arch == "aarch64" and bool(isa.get("dotprod")))
    warning = None
    if not fast_int8:
        warning = (f"{target} has neither x86 VNNI nor ARM dot-product instructions: int8 may not run faster "
                   "than fp32 there (it is still ~4x smaller); measure it with `edgetrain profile`")
    if arch == "x86_64" and not isa.get("vnni"):
        return Int8Scheme("QDQ", "int8", "int8", True, per_channel, label,
                          "x86-64 without VNNI: ONNX Runtime's AVX2/AVX-512 int8 kernels can saturate 16-bit "
                          "intermediate sums (u8s8 saturation); 7-bit weights (reduce_range) avoid it, as ORT's "
                          "quantization guide advises", warning)
    if arch == "x86_64":
        reason = "x86-64 with VNNI: signed int8 QDQ (S8S8), ORT's default; VNNI accumulates in 32 bits, no saturation"
    elif isa.get("dotprod"):
        reason = "ARM with dot-product (SDOT): signed int8 QDQ (S8S8), ORT's default and fastest on ARM"
    else:
        reason = "ARM without dot-product: signed int8 QDQ (S8S8), ORT's default (the saturation issue ORT documents is x86-only)"
    return Int8Scheme("QDQ", "int8", "int8", False, per_channel, label, reason, warning)


def scheme_for(profile=None, host=None, per_channel: bool = True) -> Int8Scheme:
    """From a DeviceProfile (``--device``), else from the host we run on."""
    if profile is not None:
        return choose_scheme(profile.arch, profile.isa.model_dump(), profile.name, per_channel)
    if host is None:
        from .devices import detect_host

        host = detect_host()
    return choose_scheme(host.arch, dict(host.isa), "this host", per_channel)
