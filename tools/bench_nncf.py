"""edgetrain's accuracy-budget search against NNCF's quantize_with_accuracy_control, on the same ONNX
model, the same preprocessed data and the same budget.

NNCF's dependencies do not fit edgetrain's environment (numpy < 1.24 for mxnet), so it runs in its own:

    python -m venv /tmp/nncf-venv && /tmp/nncf-venv/bin/pip install nncf onnx onnxruntime
    .venv/bin/python tools/bench_nncf.py prepare WORK            # edgetrain: model, data, edgetrain's search
    /tmp/nncf-venv/bin/python tools/bench_nncf.py nncf WORK      # NNCF's search on the same files
    .venv/bin/python tools/bench_nncf.py time WORK               # both int8 files and fp32, fresh processes
    .venv/bin/python tools/bench_nncf.py table WORK

The case: edgetrain's shipped 5-digit CNN, validated on 450 real digits, calibrated on 300 others shot
under-exposed (pixels x0.25: a camera at dusk), budget 1 point of top-1. The all-int8 model then loses
far more than the budget, so both searches have work to do: which nodes to give back to fp32.
"""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

MAX_DROP = 1.0  # points of top-1
CALIB_SCALE = float(os.environ.get("BENCH_CALIB_SCALE", "0.25"))  # under-exposed calibration images
ROUNDS = 7


def prepare(work: Path) -> None:
    import numpy as np

    import edgetrain
    from edgetrain.data import load_data
    from edgetrain.models import load_onnx

    work.mkdir(parents=True, exist_ok=True)
    assert edgetrain.export("edgetrain.nets:pretrained_digits", work / "fp32.onnx").passed
    pre = load_onnx(work / "fp32.onnx").preprocess
    raw = load_data("builtin:digits", pre)
    keep = np.flatnonzero(raw.labels < 5)
    rng = np.random.RandomState(0)
    rng.shuffle(keep)
    val_idx, cal_idx = keep[:450], keep[450:750]
    pix = lambda idx: np.stack([raw._raw(int(i))[..., 0] for i in idx])  # noqa: E731  8x8 in 0..1
    np.savez(work / "val.npz", data=pix(val_idx), label=raw.labels[val_idx])
    np.savez(work / "calib.npz", data=pix(cal_idx) * CALIB_SCALE, label=raw.labels[cal_idx])
    # the tensors the model sees, preprocessed by edgetrain, for NNCF
    val = load_data(str(work / "val.npz"), pre)
    cal = load_data(str(work / "calib.npz"), pre)
    np.savez(work / "inputs.npz", val_x=val.batch(np.arange(len(val))), val_y=val.labels,
             calib_x=cal.batch(np.arange(len(cal))), input_name=np.array(pre.input_name))
    t0 = time.perf_counter()
    res = edgetrain.quantize(work / "fp32.onnx", calib=str(work / "calib.npz"), val=str(work / "val.npz"),
                             output=work / "edgetrain_int8.onnx", max_drop=MAX_DROP, threads=1, latency=False,
                             scheme="rule")
    seconds = time.perf_counter() - t0
    a = res.accuracy
    out = {"tool": "edgetrain", "fp32_top1": a.fp32_top1, "int8_top1": a.int8_top1, "drop": a.drop,
           "evaluations": 1 + len(res.steps), "samples_evaluated": (1 + len(res.steps)) * a.samples,
           "kept_fp32": res.nodes_kept_fp32, "seconds": seconds,
           "steps": [(s.step, len(s.kept_fp32), round(s.int8_top1, 2)) for s in res.steps], "passed": res.passed}
    (work / "edgetrain.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


def run_nncf(work: Path) -> None:
    import nncf
    import numpy as np
    import onnx
    import onnxruntime as ort

    d = np.load(work / "inputs.npz")
    name = str(d["input_name"])
    val = list(zip(d["val_x"], d["val_y"]))
    calib = list(d["calib_x"])
    evaluations = {"n": 0, "samples": 0}

    def validate(model, data) -> float:
        data = list(data)
        evaluations["n"] += 1  # NNCF also calls it one sample at a time to rank quantizers
        evaluations["samples"] += len(data)
        so = ort.SessionOptions()
        so.intra_op_num_threads = 1
        sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
        correct = 0
        for x, y in data:
            correct += int(sess.run(None, {name: x[None]})[0].argmax() == y)
        return correct / len(data)

    model = onnx.load(str(work / "fp32.onnx"))
    t0 = time.perf_counter()
    q = nncf.quantize_with_accuracy_control(
        model, calibration_dataset=nncf.Dataset(calib, lambda x: {name: x[None]}),
        validation_dataset=nncf.Dataset(val), validation_fn=validate, max_drop=MAX_DROP / 100.0,
        drop_type=nncf.DropType.ABSOLUTE, subset_size=len(calib))
    seconds = time.perf_counter() - t0
    onnx.save(q, str(work / "nncf_int8.onnx"))
    fp32_top1 = 100 * validate(model, val)
    int8_top1 = 100 * validate(q, val)
    evaluations["n"] -= 2  # the two above are the benchmark's, not the search's
    evaluations["samples"] -= 2 * len(val)
    out = {"tool": f"nncf {nncf.__version__}", "fp32_top1": fp32_top1, "int8_top1": int8_top1,
           "drop": fp32_top1 - int8_top1, "evaluations": evaluations["n"],
           "samples_evaluated": evaluations["samples"], "kept_fp32": fp32_compute_nodes(q),
           "seconds": seconds}
    (work / "nncf.json").write_text(json.dumps(out, indent=1))
    print(json.dumps(out, indent=1))


def fp32_compute_nodes(proto) -> list[str]:
    """Conv/Gemm/MatMul nodes that no DequantizeLinear feeds: what the model runs in fp32."""
    dq = {o for n in proto.graph.node if n.op_type == "DequantizeLinear" for o in n.output}
    return [n.name or n.output[0] for n in proto.graph.node
            if n.op_type in ("Conv", "Gemm", "MatMul") and not any(i in dq for i in n.input)]


CHILD = """
import json, sys, time
import numpy as np, onnxruntime as ort
so = ort.SessionOptions(); so.intra_op_num_threads = 1; so.inter_op_num_threads = 1
s = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
i = s.get_inputs()[0]
x = np.random.RandomState(0).standard_normal([1] + [d for d in i.shape[1:]]).astype(np.float32)
for _ in range(20): s.run(None, {i.name: x})
t = []
for _ in range(300):
    t0 = time.perf_counter(); s.run(None, {i.name: x}); t.append(time.perf_counter() - t0)
print(json.dumps(float(np.percentile(t, 50) * 1000)))
"""


def time_models(work: Path) -> None:
    files = {"fp32": work / "fp32.onnx", "edgetrain int8": work / "edgetrain_int8.onnx",
             "nncf int8": work / "nncf_int8.onnx"}
    got = {k: [] for k in files}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for r in range(ROUNDS):
        for k, f in (list(files.items()) if r % 2 == 0 else list(files.items())[::-1]):
            out = subprocess.run([sys.executable, "-c", CHILD, str(f)], capture_output=True, text=True, env=env,
                                 check=True).stdout
            got[k].append(json.loads(out))
    res = {k: {"p50_ms": statistics.median(v), "rounds": v} for k, v in got.items()}
    (work / "latency.json").write_text(json.dumps(res, indent=1))
    print(json.dumps({k: round(v["p50_ms"], 4) for k, v in res.items()}))


def table(work: Path) -> None:
    lat = json.loads((work / "latency.json").read_text())
    print(f"budget {MAX_DROP} pt top-1; 450 validation digits, 300 under-exposed calibration digits; "
          f"latency batch 1, 1 thread, median of {ROUNDS} fresh processes")
    print(f"{'tool':16} {'fp32 top-1':>10} {'int8 top-1':>10} {'drop':>6} {'evals':>6} {'samples':>8} "
          f"{'fp32 nodes':>10} {'search s':>8} {'p50 ms':>8}")
    for key, name in (("edgetrain", "edgetrain int8"), ("nncf", "nncf int8")):
        r = json.loads((work / f"{key}.json").read_text())
        print(f"{r['tool']:16} {r['fp32_top1']:10.2f} {r['int8_top1']:10.2f} {r['drop']:6.2f} {r['evaluations']:6d} "
              f"{r['samples_evaluated']:8d} {len(r['kept_fp32']):10d} {r['seconds']:8.1f} {lat[name]['p50_ms']:8.4f}")
    print(f"{'fp32':16} {'':10} {'':10} {'':6} {'':6} {'':8} {'':10} {'':8} {lat['fp32']['p50_ms']:8.4f}")


if __name__ == "__main__":
    mode, work = sys.argv[1], Path(sys.argv[2])
    {"prepare": prepare, "nncf": run_nncf, "time": time_models, "table": table}[mode](work)
