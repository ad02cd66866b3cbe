"""Real models for the profile tests (built in code) and the memory model's graph arithmetic.

The builders are imported by the other profile tests (tests/ is on the path).
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import pytest
import yaml


def conv_gemm_onnx(path: Path, channels: int = 8, hw: int = 16, classes: int = 10, batch="N") -> Path:
    """Conv -> Relu -> Flatten -> Gemm with random initializers; input x: [batch, 3, hw, hw]."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.RandomState(0)
    w = numpy_helper.from_array(rng.randn(channels, 3, 3, 3).astype("float32"), "W")
    b = numpy_helper.from_array(rng.randn(channels).astype("float32"), "B")
    g = numpy_helper.from_array(rng.randn(classes, channels * hw * hw).astype("float32"), "G")
    nodes = [helper.make_node("Conv", ["x", "W", "B"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Flatten", ["r"], ["f"]),
             helper.make_node("Gemm", ["f", "G"], ["y"], transB=1)]
    graph = helper.make_graph(nodes, "convgemm",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, hw, hw])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, classes])], [w, b, g])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def bad_factories(folder: Path) -> str:
    """A module with factories whose models crash (SIGSEGV) or hang when run; returns its name."""
    (folder / "edgetrain_badnets.py").write_text(textwrap.dedent('''
        import ctypes, time
        from mxnet import gluon

        class Crash(gluon.HybridBlock):
            def hybrid_forward(self, F, x):
                ctypes.string_at(0)  # reads address 0: a real segmentation fault in native code
                return x

        class Hang(gluon.HybridBlock):
            def hybrid_forward(self, F, x):
                time.sleep(3600)
                return x

        def crashing_net():
            return Crash()

        def hanging_net():
            return Hang()
    '''))
    return "edgetrain_badnets"


def user_profile(folder: Path, base: str = "x86-64-generic", **changes) -> Path:
    """A device profile YAML derived from a bundled one, with top-level keys replaced."""
    from edgetrain.devices import load_device

    data = load_device(base).to_dict()
    data.update(changes)
    path = folder / f"{data['name']}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


# --- the memory model ---------------------------------------------------------------------------------

def test_onnx_stats_weights_and_live_activations(tmp_path):
    from edgetrain.measure.memory_model import onnx_stats

    path = conv_gemm_onnx(tmp_path / "m.onnx", channels=8, hw=16, classes=10)
    st = onnx_stats(path, [2, 3, 16, 16], batch=2)
    assert st.weights_bytes == 4 * (8 * 3 * 3 * 3 + 8 + 10 * 8 * 16 * 16)
    assert st.conv_weights_bytes == 4 * (8 * 3 * 3 * 3 + 8)
    act = 4 * 2 * 8 * 16 * 16  # c, r and f each hold batch x 8 x 16 x 16 floats
    # At most two of them are alive at once (an op's input and its output).
    assert st.activation_peak_bytes == 2 * act
    assert st.activation_total_bytes == 3 * act + 4 * 2 * 10
    assert st.input_bytes == 4 * 2 * 3 * 16 * 16


def test_mxnet_stats_of_a_prefix(tiny_prefix):
    from edgetrain.measure.memory_model import mxnet_stats

    st, info = mxnet_stats(str(tiny_prefix), with_info=True)
    assert st.weights_bytes > 0 and 0 < st.conv_weights_bytes <= st.weights_bytes
    assert st.activation_peak_bytes > 0 and st.activation_total_bytes >= st.activation_peak_bytes
    assert info["preprocess"]["input_shape"] == [1, 16, 16]


def test_prediction_adds_up_and_names_its_parts(tmp_path):
    from edgetrain.measure.memory_model import MB, onnx_stats, predict

    st = onnx_stats(conv_gemm_onnx(tmp_path / "m.onnx"), [1, 3, 16, 16])
    p = predict("onnxruntime", st, baseline_mb=60.0)
    assert p.peak_rss_mb == pytest.approx(p.baseline_mb + p.weights_mb + p.activations_mb + p.other_mb)
    assert p.weights_mb > st.weights_bytes / MB  # runtimes keep more than one copy
    d = p.to_dict()
    assert d["provenance"] == "modelled" and "baseline 60 MB" in d["source"]


def test_runtime_baseline_is_measured_once_in_a_child():
    from edgetrain.measure import memory_model

    first = memory_model.runtime_baseline_mb("onnxruntime")
    assert 20 < first < 1000
    assert memory_model.runtime_baseline_mb("onnxruntime") == first  # cached for the process
