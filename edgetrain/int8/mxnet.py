"""`--backend mxnet`: MXNet's own int8 (oneDNN) via ``mx.contrib.quantization.quantize_net_v2``.

Written as an MXNet PREFIX that `edgetrain profile --runtime mxnet` loads. Its limits (DESIGN.md): the
quantized graph has no ONNX translation, and MXNet stores the int8 weights as fp32 in the params file,
so the file is not smaller. There is no per-node fp32 fallback search here: the budget is checked and
reported, and the onnxruntime backend is the one that searches.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from .. import _lazy
from .accuracy import top1
from .calibration import calibration_notes, check_symbol_not_quantized, load_calibration, load_validation
from ..errors import UsageError
from ..figures import Calibration, Int8Accuracy, Int8Latency, Int8Size
from ..fileio import atomic_path, check_output_path, temp_dir
from ..host import detect_host
from ..models import load_gluon, parse_model_ref
from ..options import QuantizeOptions
from ..preprocess import sidecar_path, sidecar_text
from ..results import report, stage
from ..runners import time_runs
from ..runtime import quiet_libraries
from .scheme import SchemeRecord

CALIB_MODES = {"minmax": "naive", "entropy": "entropy"}
BATCH = 32


def quantize_mxnet(model: str, opts: QuantizeOptions, output: Path, *, scheme, threads: int, progress) -> dict:
    """The fields of the command's QuantizeResult (ops.quantize builds the record; the budget steps as dicts)."""
    calib, val, max_drop, method, samples, per_channel = (opts.calib, opts.val, opts.max_drop, opts.method,
                                                          opts.samples, opts.per_channel)

    if method not in CALIB_MODES:
        raise UsageError(f"calibration method '{method}' is not available with --backend mxnet", "--method",
                         "use minmax or entropy, or --backend onnxruntime")
    prefix = Path(str(output))
    if prefix.suffix.lower() == ".onnx":
        raise UsageError("--backend mxnet writes an MXNet PREFIX (PREFIX-symbol.json + PREFIX-0000.params); its "
                         "int8 graph cannot be exported to ONNX", str(output),
                         "give -o PREFIX without .onnx, or use --backend onnxruntime for an int8 .onnx")
    if str(model).lower().endswith(".onnx"):
        raise UsageError("--backend mxnet quantizes a Gluon MODEL, not an ONNX file", model,
                         "pass the PREFIX, zoo:NAME or pkg.module:function, or use --backend onnxruntime")
    ref = parse_model_ref(model)
    if ref.kind == "prefix":
        check_symbol_not_quantized(ref.symbol_file, model)
    for suffix in ("-symbol.json", "-0000.params"):
        check_output_path(Path(f"{prefix}{suffix}"), "-o")

    fp32 = load_gluon(model, params=opts.params, input_shape=opts.input_shape, mean=opts.mean, std=opts.std)
    pre = fp32.preprocess
    full, calib_ds = load_calibration(calib, pre, samples)
    val_ds = load_validation(val, pre, fp32.num_classes) if val else None
    notes = ["random weights: accuracy figures mean nothing until it is trained"] if fp32.random_weights else []
    notes.extend(calibration_notes(full, calib_ds, samples, fp32.num_classes))

    qnet = _quantize_net(fp32, calib_ds, method, per_channel, progress)

    def run_int8(x):
        mx = _lazy.mxnet()

        return qnet(mx.nd.array(x)).asnumpy()

    accuracy, within_budget, steps = Int8Accuracy(checked=False, max_drop=max_drop), None, []
    if val_ds is not None:
        f = top1(fp32.predict, val_ds, progress=stage(progress, "fp32 top-1"))
        q = top1(run_int8, val_ds, progress=stage(progress, "int8 top-1"))
        steps = [{"step": 0, "kept_fp32": [], "added": [], "int8_top1": q, "drop": f - q}]
        within_budget = f - q <= max_drop + 1e-9
        accuracy = Int8Accuracy(checked=True, fp32_top1=f, int8_top1=q, drop=f - q, max_drop=max_drop,
                                samples=len(val_ds), source=val)
    else:
        notes.append("accuracy was not checked: pass --val DATA to measure the int8 model against fp32")

    record = {"scheme": "mxnet-onednn-int8", "method": method, "calibration_samples": len(calib_ds),
              "granularity": "channel-wise" if per_channel else "tensor-wise", "tool": "edgetrain quantize"}
    fp32_bytes, int8_bytes = _save(fp32, qnet, prefix, record)
    x = np.random.RandomState(0).standard_normal(pre.batch_shape(1)).astype(np.float32)
    f_ms, q_ms = time_runs(fp32.predict, x).p50_ms, time_runs(run_int8, x).p50_ms

    host = detect_host()
    warnings = [scheme.warning] if scheme.warning else []
    if within_budget is False:
        warnings.append(f"int8 top-1 drop {accuracy.drop:.2f} pts exceeds --max-drop {max_drop:g}; the mxnet "
                        "backend does not search for nodes to keep in fp32 (--backend onnxruntime does)")
    notes.append("MXNet stores int8 weights as fp32 in the params file, so it is not smaller on disk")
    mx_scheme = SchemeRecord(name=f"MXNet oneDNN int8 ({record['granularity']}, auto int8/uint8 activations)",
                             format="mxnet-quantized-symbol", activations="auto", weights="int8", reduce_range=False,
                             per_channel=per_channel, target=scheme.target, warning=scheme.warning,
                             reason="MXNet's own quantization; runs only in MXNet built with oneDNN (x86-64, aarch64)")
    return dict(
        model=model, output=str(prefix), backend="mxnet", scheme=mx_scheme,
        calibration=Calibration(method, len(calib_ds), calib), accuracy=accuracy, steps=steps, nodes_kept_fp32=[],
        size=Int8Size.of(fp32_bytes, int8_bytes),
        latency=Int8Latency.of(f_ms, q_ms, threads, 1, "mxnet", f"this host ({host.cpu}, {host.arch})"),
        onnx_exportable=False, warnings=warnings, notes=notes)


def _quantize_net(fp32, calib_ds, method, per_channel, progress):
    mx = _lazy.mxnet()
    quantization = _lazy.from_import("mxnet.contrib", "quantization")

    x, _ = calib_ds.arrays()
    name = fp32.preprocess.input_name

    class Reporting(mx.io.NDArrayIter):
        def next(self):
            batch = super().next()
            report(progress, "calibrate", min(self.cursor + self.batch_size, self.num_data), self.num_data)
            return batch

    # last_batch_handle="pad" repeats a few leading samples in the last batch: MXNet's collectors need
    # equal batch shapes, and repeating real samples does not widen the ranges.
    it = Reporting(data={name: x}, batch_size=min(BATCH, len(x)), last_batch_handle="pad")
    # MXNet's C++ side announces "Subgraph backend MKLDNN is activated" on stderr unless told not to;
    # it reads the variable when the graph is bound, so setting it here is in time.
    quiet_libraries()
    with _quiet_mxnet():
        return quantization.quantize_net_v2(
            fp32.block, quantized_dtype="auto", quantize_mode="full",
            quantize_granularity="channel-wise" if per_channel else "tensor-wise",
            calib_data=it, calib_mode=CALIB_MODES[method], num_calib_examples=len(x), ctx=mx.cpu())


def _save(fp32, qnet, prefix: Path, record: dict) -> tuple[int, int]:
    """Write PREFIX-symbol.json, PREFIX-0000.params and the preprocessing record; return (fp32, int8) bytes."""
    mx = _lazy.mxnet()

    # A SymbolBlock exports only the parameters its cached graph has bound: run it once first, or
    # PREFIX-0000.params comes out empty.
    zeros = mx.nd.zeros(fp32.preprocess.batch_shape(1))
    fp32.block(zeros)
    qnet(zeros)
    with temp_dir("mxnet_int8", dir=prefix.parent) as tmp:
        fp32.block.export(str(Path(tmp) / "fp32"), epoch=0)
        qnet.export(str(Path(tmp) / "int8"), epoch=0)
        fp32_bytes = (Path(tmp) / "fp32-0000.params").stat().st_size
        for suffix in ("-symbol.json", "-0000.params"):
            with atomic_path(Path(f"{prefix}{suffix}"), "-o") as dst:
                dst.write_bytes((Path(tmp) / f"int8{suffix}").read_bytes())
    with atomic_path(sidecar_path(prefix), "-o") as dst:
        dst.write_text(sidecar_text(fp32.preprocess, {"quantization": record}), encoding="utf-8")
    return fp32_bytes, Path(f"{prefix}-0000.params").stat().st_size


class _quiet_mxnet:
    """quantize_net_v2 warns about its own deprecation and logs each calibration stage; keep the terminal ours."""

    def __enter__(self):
        import contextlib
        import io
        import logging
        import warnings

        self._stack = contextlib.ExitStack()
        self._stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        self._stack.enter_context(contextlib.redirect_stdout(io.StringIO()))
        root = logging.getLogger()
        level = root.level
        root.setLevel(logging.ERROR)
        self._stack.callback(root.setLevel, level)

    def __exit__(self, *exc):
        return self._stack.__exit__(*exc)
