"""Which int8 scheme to quantize with, chosen from the target's CPU features, and why.

ONNX Runtime's advice, in ``onnxruntime.quantization.quantize_static``'s docstring ("Choosing parameters
for CPU inference", onnxruntime 1.32) and its quantization guide
(https://onnxruntime.ai/docs/performance/model-optimizations/quantization.html, "Data type selection"
and "When and why do I need to try U8U8?"):

- Format: QDQ, which ORT's CPU kernels are optimised for.
- ARM (Cortex-A): signed int8 activations and weights (S8S8), ``reduce_range`` off.
- x86-64 with VNNI: uint8 activations, int8 weights (U8S8), ``reduce_range`` off: x86's int8
  instructions (VPMADDUBSW, VPDPBUSD) multiply u8 by s8 natively, and VNNI accumulates in 32 bits.
- x86-64 without VNNI: U8S8 with ``reduce_range`` (7-bit weights): AVX2/AVX-512 VPMADDUBSW adds pairs
  of u8*s8 products into a saturating 16-bit lane (the "u8s8 saturation problem"); 7-bit weights keep
  the sum in range.
- int8 pays off on CPUs with int8 dot-product instructions (x86 VNNI, ARMv8.2 SDOT); without either,
  int8 kernels may not beat fp32, so we warn rather than promise a speed-up.

Measured here (MobileNetV2-1.0, 224x224, 1 thread, x86-64 with AVX-512 VNNI, ORT 1.32): S8S8 QDQ ran
barely faster than fp32 (~14 ms vs ~15 ms), U8S8 QDQ about twice as fast (~7.5 ms): following the
per-architecture advice matters, and S8S8 is not used for x86 targets.

Pure Python: it runs before any heavy library loads.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from ..results import Figure


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


@dataclass(kw_only=True)
class SchemeRecord(Figure):
    """The scheme of the model a quantize run wrote, and why: a QuantizeResult's ``scheme``. The int8
    parameters are None when the fastest candidate was fp32 or dynamic int8; ``measured`` is None for
    --backend mxnet (which does not measure); ``rule`` and ``candidates`` are there when it was measured."""

    name: str
    format: str                      # "QDQ", "fp32", "dynamic", "mxnet-quantized-symbol"
    target: str
    reason: str
    activations: str | None = None
    weights: str | None = None
    reduce_range: bool | None = None
    per_channel: bool | None = None
    warning: str | None = None
    measured: bool | None = None
    rule: Int8Scheme | None = None   # what ONNX Runtime's rule would have chosen
    candidates: list | None = None   # every candidate timed (int8.search.Candidate), the written one chosen
    host_quiet: dict | None = None   # energy.reliability of those timings: a busy host makes them doubtful

    @classmethod
    def of(cls, scheme: Int8Scheme, **changes) -> "SchemeRecord":
        return cls(**{"name": scheme.name, **asdict(scheme), **changes})

    def to_dict(self) -> dict:
        # the keys in the order the records had before they were typed: the int8 parameters (and warning)
        # only for an int8 scheme; reason after target for one, after measured for fp32 or dynamic
        int8 = self.activations is not None
        d: dict[str, Any] = {"name": self.name, "format": self.format}
        if int8:
            d.update(activations=self.activations, weights=self.weights, reduce_range=self.reduce_range,
                     per_channel=self.per_channel)
        d["target"] = self.target
        if int8:
            d.update(reason=self.reason, warning=self.warning)
        if self.measured is not None:
            d["measured"] = self.measured
        d["reason"] = self.reason
        if self.rule is not None:
            d["rule"] = self.rule.to_dict()
        if self.candidates is not None:
            d["candidates"] = [c.to_dict() for c in self.candidates]
        if self.host_quiet is not None:
            d["host_quiet"] = self.host_quiet
        return d


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
        return Int8Scheme("QDQ", "uint8", "int8", True, per_channel, label,
                          "x86-64 without VNNI: uint8 activations x int8 weights (U8S8) as x86's int8 instructions "
                          "take them, with 7-bit weights (reduce_range) against the u8s8 saturation of AVX2/AVX-512 "
                          "16-bit sums, as ONNX Runtime advises", warning)
    if arch == "x86_64":
        return Int8Scheme("QDQ", "uint8", "int8", False, per_channel, label,
                          "x86-64 with VNNI: uint8 activations x int8 weights (U8S8), full range, as ONNX Runtime "
                          "advises; VNNI multiplies u8 by s8 natively and accumulates in 32 bits (no saturation)",
                          warning)
    if isa.get("dotprod"):
        reason = ("ARM with dot-product (SDOT): signed int8 activations and weights (S8S8), as ONNX Runtime "
                  "advises for ARM")
    else:
        reason = ("ARM without dot-product: signed int8 activations and weights (S8S8), as ONNX Runtime advises "
                  "for ARM (the u8s8 saturation issue is x86-only)")
    return Int8Scheme("QDQ", "int8", "int8", False, per_channel, label, reason, warning)


def scheme_for(profile=None, host=None, per_channel: bool = True) -> Int8Scheme:
    """From a DeviceProfile (``--device``), else from the host we run on."""
    if profile is not None:
        return choose_scheme(profile.arch, profile.isa.model_dump(), profile.name, per_channel)
    if host is None:
        from ..host import detect_host

        host = detect_host()
    return choose_scheme(host.arch, dict(host.isa), "this host", per_channel)
