"""Child process for tests/test_runtime.py: apply a thread cap, run a conv loop, count busy threads.

argv: THREADS mxnet|ort. Prints {"busy": threads that did >10% of the CPU work, "total_cpu": s}.
"""
import json
import os
import sys
import time

threads = int(sys.argv[1])
which = sys.argv[2]
from edgetrain import _lazy, runtime
runtime.apply_threads(threads)
import numpy as np
def busy_threads():
    out = {}
    tck = os.sysconf("SC_CLK_TCK")
    for tid in os.listdir("/proc/self/task"):
        try:
            f = open(f"/proc/self/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[tid] = (int(f[11]) + int(f[12])) / tck
    return out
if which == "mxnet":
    import mxnet as mx
    x = mx.nd.random.uniform(shape=(8, 64, 56, 56))
    w = mx.nd.random.uniform(shape=(64, 64, 3, 3))
    before = busy_threads()
    t0 = time.time()
    while time.time() - t0 < 1.5:
        mx.nd.Convolution(x, w, kernel=(3, 3), num_filter=64, no_bias=True, pad=(1, 1)).wait_to_read()
else:
    import onnxruntime as ort
    from onnx import helper, TensorProto, numpy_helper
    W = numpy_helper.from_array(np.random.rand(64, 64, 3, 3).astype("float32"), "W")
    g = helper.make_graph([helper.make_node("Conv", ["x", "W"], ["y"], pads=[1,1,1,1])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64, 56, 56])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [W])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 13)])
    s = ort.InferenceSession(m.SerializeToString(), _lazy.ort_session_options(), providers=["CPUExecutionProvider"])
    x = np.random.rand(8, 64, 56, 56).astype("float32")
    before = busy_threads()
    t0 = time.time()
    while time.time() - t0 < 1.5:
        s.run(None, {"x": x})
after = busy_threads()
work = {t: after[t] - before.get(t, 0) for t in after}
total = sum(work.values())
print(json.dumps({"busy": sum(1 for v in work.values() if v > 0.1 * total), "total_cpu": total}))
