"""The device's whole loop from an ONNX file, with no mxnet importable: fine-tune (every --train-layers
choice), then quantize, predict and profile what it wrote. MXNet exists only on the host, which exports the
base model once: here the shipped digits base (trained on digits 0-4, taught all ten on the device), whose
export ships too (edgetrain/_builtin/digits5.onnx, written by `edgetrain export edgetrain.nets:pretrained_digits
-o edgetrain/_builtin/digits5.onnx`; a test holds it equal to a fresh export where mxnet is installed).

"No mxnet" is enforced, not assumed: every process of the loop (and its children) finds an ``mxnet``
package that raises ImportError, ahead of any real one on PYTHONPATH. CI also runs this file in an
environment where mxnet was never installed (the ``device`` stage)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import re

import numpy as np
import pytest

import edgetrain
from edgetrain.training import ort_forward, ort_train

from clitools import assert_user_error, run_edgetrain

LAYERS = ("head", "last:2", "bias", "lite", "all")


@pytest.fixture(scope="module")
def device_env(tmp_path_factory):
    blocker = tmp_path_factory.mktemp("device") / "mxnet"
    blocker.mkdir()
    (blocker / "__init__.py").write_text("raise ImportError('No module named mxnet (this is the device)')\n")
    path = os.pathsep.join(p for p in (str(blocker.parent), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "EDGETRAIN_CACHE_DIR": ""}


SHIPPED = Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx"


@pytest.fixture(scope="module")
def host_export(tmp_path_factory):
    """What the host hands the device: the digits base as ONNX, and 600 training / 200 held-out digits."""
    from edgetrain.data import load_data
    from edgetrain.preprocess import Preprocess

    folder = tmp_path_factory.mktemp("host")
    shutil.copyfile(SHIPPED, folder / "digits5.onnx")
    x, y = load_data("builtin:digits", Preprocess(input_shape=(1, 8, 8), mean=(0.0,), std=(1.0,))).arrays(800)
    np.savez(folder / "train.npz", data=x[:600, 0], label=y[:600])
    np.savez(folder / "val.npz", data=x[600:, 0], label=y[600:])
    return folder


def test_the_device_has_no_mxnet(device_env):
    """The blocker works: a plain import of mxnet fails in the device's environment."""
    proc = subprocess.run([sys.executable, "-c", "import mxnet"], env={**os.environ, **device_env},
                          capture_output=True, text=True)
    assert proc.returncode != 0 and "this is the device" in proc.stderr


@pytest.mark.parametrize("layers", LAYERS)
def test_finetune_quantize_predict_profile_on_the_device(layers, host_export, device_env, tmp_path):
    out = tmp_path / "run"
    ft = run_edgetrain("finetune", host_export / "digits5.onnx", "--data", host_export / "train.npz",
                       "--val", host_export / "val.npz", "-o", out, "--train-layers", layers,
                       # every weight at its default rate (0.001, chosen on MobileNetV2) learns slower here
                       "--epochs", "6" if layers == "all" else "4", "--json", "-", env=device_env)
    assert ft.code == 0, ft.err
    result = ft.json()
    model = out / "model.onnx"
    assert result["model"] == str(model) and model.is_file()
    assert result["replaced_head"] and result["classes"] == [str(i) for i in range(10)]
    assert result["final_accuracy"] > 0.6, result  # ten classes: chance is 0.1
    assert not (out / "frozen.onnx").exists() and not (out / "features.cache").exists()

    pred = run_edgetrain("predict", model, host_export / "val.npz", "--json", "-", env=device_env)
    assert pred.code == 0, pred.err
    top1 = pred.json()["accuracy"]["top1"] / 100  # predict reports percent
    # the same weights in ONNX Runtime as in the NumPy evaluation: at most one of 200 answers may differ
    assert abs(top1 - result["final_accuracy"]) <= 1 / 200 + 1e-9, (top1, result["final_accuracy"])

    quant = run_edgetrain("quantize", model, "--calib", host_export / "train.npz", "--val", host_export / "val.npz",
                          "-o", tmp_path / "int8.onnx", "--max-drop", "100", "--json", "-", env=device_env)
    assert quant.code == 0, quant.err
    assert (tmp_path / "int8.onnx").is_file()

    prof = run_edgetrain("profile", tmp_path / "int8.onnx", "--runs", "5", "--warmup", "1", "--json", "-",
                         env=device_env)
    assert prof.code == 0, prof.err
    assert prof.json()["best"]["p50_ms"] > 0


def test_the_shipped_onnx_base_is_the_export_of_the_shipped_gluon_base(tmp_path):
    """The ONNX file the device tests start from is what `edgetrain export` makes of the Gluon base today."""
    pytest.importorskip("mxnet", reason="the host's check: needs mxnet to export")
    import onnx
    from onnx import numpy_helper

    res = run_edgetrain("export", "edgetrain.nets:pretrained_digits", "-o", tmp_path / "fresh.onnx")
    assert res.code == 0, res.err
    shipped, fresh = (onnx.load(str(p)) for p in (SHIPPED, tmp_path / "fresh.onnx"))
    assert [(n.op_type, list(n.input)) for n in shipped.graph.node] == [(n.op_type, list(n.input)) for n in fresh.graph.node]
    for a, b in zip(shipped.graph.initializer, fresh.graph.initializer):
        assert a.name == b.name and np.array_equal(numpy_helper.to_array(a), numpy_helper.to_array(b))
    meta = lambda m: {p.key: p.value for p in m.metadata_props if p.key != "edgetrain.version"}  # noqa: E731
    assert meta(shipped) == meta(fresh)


def test_an_onnx_file_without_edgetrain_metadata_is_refused_in_one_line(host_export, device_env, tmp_path):
    import onnx

    proto = onnx.load(str(host_export / "digits5.onnx"))
    del proto.metadata_props[:]
    onnx.save(proto, str(tmp_path / "bare.onnx"))
    res = run_edgetrain("finetune", tmp_path / "bare.onnx", "--data", host_export / "train.npz", "-o",
                        tmp_path / "out", env=device_env)
    assert_user_error(res, 2, "no edgetrain preprocessing record", "edgetrain export")
    assert not (tmp_path / "out").exists()


def test_last_n_beyond_the_models_layers_is_refused_in_one_line(host_export, device_env, tmp_path):
    res = run_edgetrain("finetune", host_export / "digits5.onnx", "--data", host_export / "train.npz", "-o",
                        tmp_path / "out", "--train-layers", "last:40", env=device_env)
    assert_user_error(res, 2, "last:40", "layer(s) that can train from the end")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("layers", ["bias", "lite"])
def test_a_budget_the_plan_cannot_meet_is_refused_before_training(layers, host_export, device_env, tmp_path):
    res = run_edgetrain("finetune", host_export / "digits5.onnx", "--data", host_export / "train.npz", "-o",
                        tmp_path / "out", "--train-layers", layers, "--memory-budget", "20MB", env=device_env)
    assert_user_error(res, 2, "memory budget 20 MB is too small")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("layers", ["bias", "lite"])
def test_onnx_runtime_runs_the_step_only_when_the_budget_holds_its_sessions(layers, host_export, device_env,
                                                                            tmp_path):
    """Without a budget bias/lite run their whole step in ONNX Runtime (one graph: forward and backward); under a
    budget NumPy's step meets but ONNX Runtime's sessions would not, the run says so, plans NumPy's, and stays
    within the budget."""
    common = ("finetune", host_export / "digits5.onnx", "--data", host_export / "train.npz", "--train-layers", layers,
              "--epochs", "1", "--threads", "1", "--allow-chance", "--json", "-")
    free = run_edgetrain(*common, "-o", tmp_path / "free", env=device_env)
    assert free.code == 0, free.err
    assert free.json()["plan"]["ort_step"] is True
    assert "onnxruntime" not in free.err, free.err   # no ONNX Runtime warning on the way
    # the smallest budget NumPy's step meets here (the refusal says it: it differs by Python and platform),
    # plus 5 MB: below what ONNX Runtime's sessions add (sessions_mb, 45 MB and more)
    floor = run_edgetrain(*common, "-o", tmp_path / "floor", "--memory-budget", "20MB", env=device_env)
    assert_user_error(floor, 2, "is too small")
    budget = int(re.search(r"a budget below (\d+) MB is impossible", floor.err).group(1)) + 5
    size = SHIPPED.stat().st_size
    assert min(ort_train.sessions_mb(size), ort_forward.sessions_mb(size)) > 5 + 10   # the premise: they cannot fit
    tight = run_edgetrain(*common, "-o", tmp_path / "tight", "--memory-budget", f"{budget}MB", env=device_env)
    assert tight.code == 0, tight.err
    r = tight.json()
    assert r["plan"]["ort_step"] is False and r["plan"]["ort_forward"] is False and 0 < r["peak_rss_mb"] <= budget, r
    assert any("the step runs in NumPy: ONNX Runtime's sessions" in n for n in r["notes"]), r["notes"]


@pytest.mark.parametrize("layers,kill", [("head", "features:2"), ("bias", "step:7"), ("lite", "step:7")])
def test_a_power_cut_on_the_device_resumes_to_the_same_weights(layers, kill, host_export, device_env, tmp_path):
    """kill -9 during the feature pass (head) or mid-epoch (bias, lite), then --resume: the weights written are
    bit for bit those of a run that was never cut (the whole class, every phase and mode: test_finetune_resume)."""
    import onnx
    from onnx import numpy_helper

    def args(out):
        return ["finetune", host_export / "digits5.onnx", "--data", host_export / "train.npz", "-o", out,
                "--train-layers", layers, "--epochs", "2", "--batch-size", "32", "--threads", "1"]

    def weights(out):
        return {t.name: numpy_helper.to_array(t) for t in onnx.load(str(out / "model.onnx")).graph.initializer}

    assert run_edgetrain(*args(tmp_path / "whole"), env=device_env).code == 0
    cut = subprocess.run([sys.executable, "-m", "edgetrain", *map(str, args(tmp_path / "cut"))],
                         env={**os.environ, **device_env, "EDGETRAIN_TEST_KILL_AT": kill}, capture_output=True)
    assert cut.returncode == -9 and not (tmp_path / "cut" / "model.onnx").exists()
    res = run_edgetrain(*args(tmp_path / "cut"), "--resume", env=device_env)
    assert res.code == 0, res.err
    want, got = weights(tmp_path / "whole"), weights(tmp_path / "cut")
    assert want.keys() == got.keys() and all(np.array_equal(want[k], got[k]) for k in want)


def test_fine_tuning_an_onnx_file_never_overwrites_it(host_export, device_env, tmp_path):
    """MODEL is OUTDIR/model.onnx (a fine-tune of a fine-tune, into the same folder): refused, the file kept."""
    out = tmp_path / "run"
    out.mkdir()
    shutil.copyfile(host_export / "digits5.onnx", out / "model.onnx")
    before = (out / "model.onnx").read_bytes()
    res = run_edgetrain("finetune", out / "model.onnx", "--data", host_export / "train.npz", "-o", out, "--resume",
                        env=device_env)
    assert_user_error(res, 2, "would overwrite the input MODEL")
    assert (out / "model.onnx").read_bytes() == before


def test_an_op_the_gradient_code_lacks_is_one_line_and_no_model(host_export, device_env, tmp_path):
    """A ReLU turned Cos (ONNX Runtime runs it, onnx_grad has no backward for it): bias mode refuses it
    naming the op; head mode, whose frozen part runs it in ONNX Runtime, still trains."""
    import onnx

    proto = onnx.load(str(host_export / "digits5.onnx"))
    next(n for n in proto.graph.node if n.op_type == "Relu").op_type = "Cos"
    onnx.save(proto, str(tmp_path / "cos.onnx"))
    res = run_edgetrain("finetune", tmp_path / "cos.onnx", "--data", host_export / "train.npz", "-o",
                        tmp_path / "bias", "--train-layers", "bias", env=device_env)
    assert_user_error(res, 2, "cannot differentiate Cos node")
    assert not (tmp_path / "bias").exists()
    res = run_edgetrain("finetune", tmp_path / "cos.onnx", "--data", host_export / "train.npz", "-o",
                        tmp_path / "head", "--epochs", "1", env=device_env)
    assert res.code == 0, res.err


@pytest.mark.parametrize("layers", ["bias", "lite"])
def test_a_backward_onnx_cannot_write_trains_with_numpys_and_says_so(layers, host_export, device_env, tmp_path):
    """Max-pools whose windows overlap (3x3, stride 2: the same output size here): the step's ONNX graph has no
    form for their backward (MaxUnpool writes, it does not add), so the run says so in a note and trains with
    ONNX Runtime's forward and NumPy's backward, which covers them (lite, whose BatchNorm trains in training mode:
    NumPy's forward too, said in a note)."""
    import onnx

    proto = onnx.load(str(host_export / "digits5.onnx"))
    for node in (n for n in proto.graph.node if n.op_type == "MaxPool"):
        del node.attribute[:]
        node.attribute.extend([onnx.helper.make_attribute("kernel_shape", [3, 3]),
                               onnx.helper.make_attribute("strides", [2, 2]),
                               onnx.helper.make_attribute("pads", [1, 1, 1, 1])])
    onnx.save(proto, str(tmp_path / "overlap.onnx"))
    res = run_edgetrain("finetune", tmp_path / "overlap.onnx", "--data", host_export / "train.npz", "-o",
                        tmp_path / "run", "--train-layers", layers, "--epochs", "1", "--allow-chance", "--json", "-",
                        env=device_env)
    assert res.code == 0, res.err
    r = res.json()
    assert r["plan"]["ort_step"] is False and r["plan"]["ort_forward"] is (layers == "bias"), r["plan"]
    assert any(n.startswith("the backward runs in NumPy: cannot differentiate MaxPool node") and "overlapping" in n
               for n in r["notes"]), r["notes"]
    assert any(n.startswith("the forward runs in NumPy too: BatchNorm in training mode") for n in r["notes"]) is \
        (layers == "lite"), r["notes"]


@pytest.mark.parametrize("layers", ["head", "bias"])
def test_a_diverging_run_on_the_device_fails_and_writes_no_model(layers, host_export, device_env, tmp_path):
    res = run_edgetrain("finetune", host_export / "digits5.onnx", "--data", host_export / "train.npz", "-o",
                        tmp_path / "run", "--train-layers", layers, "--lr", "1e30", "--epochs", "2", env=device_env)
    assert_user_error(res, 1, "training diverged", "no model was written")
    assert not (tmp_path / "run" / "model.onnx").exists()


def test_the_lite_model_written_computes_what_numpy_trained(host_export, device_env, tmp_path):
    """The lite modules are in the file as ordinary ONNX ops, trained (no longer zero), and ONNX Runtime computes
    from it the logits the NumPy engine computes from the same graph; the run's held-out accuracy is predict's."""
    import onnx
    import onnxruntime as ort
    from onnx import numpy_helper

    from edgetrain.data import load_data
    from edgetrain.models import load_onnx
    from edgetrain.training.onnx_grad import GradGraph

    out = tmp_path / "run"
    ft = run_edgetrain("finetune", host_export / "digits5.onnx", "--data", host_export / "train.npz", "--val",
                       host_export / "val.npz", "-o", out, "--train-layers", "lite", "--epochs", "3", "--json", "-",
                       env=device_env)
    assert ft.code == 0, ft.err
    proto = onnx.load(str(out / "model.onnx"))
    lite_ops = {n.op_type for n in proto.graph.node if n.name.startswith("lite")}
    assert lite_ops == {"AveragePool", "Conv", "Relu", "Reshape", "Expand", "Add"}, lite_ops
    projections = [numpy_helper.to_array(t) for t in proto.graph.initializer
                   if t.name.startswith("lite") and t.name.endswith("conv2_weight")]
    assert len(projections) == 3 and all(np.abs(w).max() > 0 for w in projections)
    assert json.loads({p.key: p.value for p in proto.metadata_props}["edgetrain.class_names"]) == [str(i) for i in range(10)]
    x, _ = load_data(str(host_export / "val.npz"), load_onnx(str(out / "model.onnx")).preprocess).arrays(200)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    theirs = session.run(None, {session.get_inputs()[0].name: x})[0]
    ours = GradGraph(proto, "bias").forward(x)[0]
    np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layers", ["head", "lite"])
def test_an_output_layer_that_is_a_1x1_conv_is_resized_and_trains(layers, host_export, device_env, tmp_path):
    """The Gluon zoo's MobileNetV2 classifies with a 1x1 Conv on pooled features, then a Flatten: the ONNX engine
    resizes it to the data's classes like a Gemm (5 outputs in the file, 10 classes in the data)."""
    import onnx

    from onnx_models import Builder

    b = Builder((1, 1, 16, 16), seed=12)
    x = b.relu(b.bn(b.conv(b.input, 8, 3, stride=2)))
    x = b.relu(b.bn(b.conv(x, 16, 3)))
    proto = onnx.load_from_string(b.model(b.flatten(b.conv(b.gap(x), 5, 1))))
    proto.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    proto.graph.output[0].type.tensor_type.shape.dim[0].dim_param = "batch"
    shipped = {p.key: p.value for p in onnx.load(str(host_export / "digits5.onnx")).metadata_props}
    onnx.helper.set_model_props(proto, {k: v for k, v in shipped.items() if k != "edgetrain.source_model"})
    onnx.save(proto, str(tmp_path / "convhead.onnx"))
    out = tmp_path / "run"
    ft = run_edgetrain("finetune", tmp_path / "convhead.onnx", "--data", host_export / "train.npz", "--val",
                       host_export / "val.npz", "-o", out, "--train-layers", layers, "--epochs", "3", "--json", "-",
                       "--allow-chance", env=device_env)
    assert ft.code == 0, ft.err
    assert ft.json()["replaced_head"] and ft.json()["classes"] == [str(i) for i in range(10)]
    pred = run_edgetrain("predict", out / "model.onnx", host_export / "val.npz", "--json", "-", env=device_env)
    assert pred.code == 0, pred.err
    assert abs(pred.json()["accuracy"]["top1"] / 100 - ft.json()["final_accuracy"]) <= 1 / 200 + 1e-9
