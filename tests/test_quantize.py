"""edgetrain.ops.quantize: real MXNet export, real ONNX Runtime calibration/quantization, real data."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clitools import run_edgetrain
from edgetrain.errors import UsageError

def trained_digits_dir(tmp_path_factory) -> Path:
    """digits_cnn trained on 70% of builtin:digits by `edgetrain finetune --train-layers all` (a child
    process, as a user would), once per session: OUT/model, calib.npz (the training split as raw 8x8
    pixels in [0, 1]) and val.npz (the held-out 30%, never trained on)."""
    out = tmp_path_factory.getbasetemp() / "trained_digits"
    if not (out / "digits10-symbol.json").exists():
        from edgetrain.data import load_data
        from edgetrain.preprocess import Preprocess

        out.mkdir(parents=True, exist_ok=True)
        raw = load_data("builtin:digits", Preprocess((1, 8, 8), mean=(0.0,), std=(1.0,))).split(0.3, 0)
        for name, split in (("calib", raw[0]), ("val", raw[1])):
            x, y = split.arrays()
            np.savez(out / f"{name}.npz", data=x[:, 0], label=y)
        res = run_edgetrain("finetune", "edgetrain.nets:digits_cnn", "--data", out / "calib.npz", "--val",
                            out / "val.npz", "--train-layers", "all", "--epochs", "30", "--lr", "0.003",
                            "--threads", "1", "-o", out / "run")  # from random weights: BatchNorm's statistics
        # stay the initial ones (the ONNX graph's constants), so more epochs at a larger rate than fine-tuning's
        assert res.code == 0, res.err[-3000:]
        for f in (out / "run").glob("model*"):
            f.rename(out / f.name.replace("model", "digits10", 1))
    return out


@pytest.fixture(scope="session")
def trained(tmp_path_factory) -> Path:
    return trained_digits_dir(tmp_path_factory)


@pytest.fixture(scope="session")
def zeros_npz(tmp_path_factory) -> Path:
    """Calibration data that represents nothing: blank images give useless activation ranges."""
    path = tmp_path_factory.mktemp("zeros") / "zeros.npz"
    np.savez(path, data=np.zeros((8, 8, 8), np.float32), label=np.arange(8) % 2)
    return path


@pytest.fixture(scope="session")
def int8_result(trained, tmp_path_factory):
    from edgetrain.api import quantize

    out = tmp_path_factory.mktemp("int8") / "digits_int8.onnx"
    return quantize(str(trained / "digits10"), str(trained / "calib.npz"), out, val=str(trained / "val.npz"),
                    max_drop=1.0, max_fp32_nodes=0, threads=1, scheme="rule")


def test_trained_digits_lose_at_most_one_point_in_int8(int8_result):
    a = int8_result.accuracy
    assert a.checked and a.samples == 539                 # the held-out 30%, never trained on
    assert a.fp32_top1 > 95.0                             # a real model, not chance
    assert a.drop <= 1.0, a
    assert int8_result.passed and int8_result.nodes_kept_fp32 == []  # all int8, no fallback
    assert int8_result.calibration.method == "minmax" and int8_result.calibration.samples == 300


@pytest.mark.parametrize("device", ["rpi4b-4gb", "x86-64-generic"])
def test_each_target_scheme_also_stays_within_one_point(trained, tmp_path, device):
    from edgetrain.devices import load_device
    from edgetrain.api import quantize

    res = quantize(str(trained / "digits10"), str(trained / "calib.npz"), tmp_path / "m.onnx",
                   val=str(trained / "val.npz"), max_fp32_nodes=0, device=load_device(device), threads=1,
                   latency=False)
    assert res.scheme.target.startswith(device) and res.accuracy.drop <= 1.0, (res.scheme, res.accuracy)


def test_int8_file_is_smaller_and_carries_the_fp32_metadata_but_its_own_precision(int8_result, trained, tmp_path):
    import onnx

    from edgetrain.convert import export_onnx
    from edgetrain.models import load_gluon, load_onnx

    fp32 = load_onnx(export_onnx(load_gluon(str(trained / "digits10")), tmp_path / "fp32.onnx", opset=13))
    int8 = load_onnx(int8_result.output)
    assert int8.preprocess == fp32.preprocess
    for key, value in fp32.metadata.items():
        assert int8.metadata[key] == (value if key != "edgetrain.precision" else "int8"), key
    record = json.loads(int8.metadata["edgetrain.quantization"])
    assert record["scheme"] == int8_result.scheme.name and record["nodes_kept_fp32"] == []
    ops = {n.op_type for n in onnx.load(int8_result.output).graph.node}
    assert {"QuantizeLinear", "DequantizeLinear", "Conv"} <= ops
    assert int8_result.size.int8_bytes < int8_result.size.fp32_bytes
    lat = int8_result.latency
    assert lat.fp32_p50_ms > 0 and lat.int8_p50_ms > 0 and lat.threads == 1
    assert lat.measured_on.startswith("this host")


def test_int8_runs_in_plain_onnxruntime_without_edgetrain(int8_result, trained):
    script = r"""
import json, sys
sys.modules["edgetrain"] = None          # any attempt to import edgetrain now fails
import numpy as np, onnxruntime as ort
try:
    import edgetrain
    raise SystemExit("edgetrain importable")
except ImportError:
    pass
sess = ort.InferenceSession(sys.argv[1], providers=["CPUExecutionProvider"])
d = np.load(sys.argv[2])
meta = json.loads(sess.get_modelmeta().custom_metadata_map["edgetrain.preprocess"])
mean, std = np.float32(meta["mean"][0]), np.float32(meta["std"][0])
x = np.stack([np.kron(img, np.ones((2, 2), np.float32)) for img in d["data"][:64]])[:, None]  # 8x8 -> 16x16
y = sess.run(None, {sess.get_inputs()[0].name: ((x - mean) / std).astype(np.float32)})[0]
print(json.dumps({"shape": list(y.shape), "top1": float((y.argmax(1) == d["label"][:64]).mean())}))
"""
    proc = subprocess.run([sys.executable, "-I", "-c", script, int8_result.output, str(trained / "val.npz")],
                          capture_output=True, text=True, timeout=120, cwd="/")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert out["shape"] == [64, 10] and out["top1"] > 0.8  # nearest-neighbour upscaling, still clearly right


def test_budget_search_keeps_the_costliest_nodes_in_fp32(trained, zeros_npz, tmp_path):
    from edgetrain.api import quantize

    res = quantize(str(trained / "digits10"), str(zeros_npz), tmp_path / "m.onnx", val=str(trained / "val.npz"),
                   max_drop=1.0, threads=1, latency=False, scheme="rule")
    first, last = res.steps[0], res.steps[-1]
    assert first.kept_fp32 == [] and first.drop > 10.0        # useless ranges wreck the all-int8 model
    assert len(res.steps) >= 2 and min(s.drop for s in res.steps[1:]) < first.drop / 5  # fp32 nodes mend it
    # Whether a mix meets the 1-point budget depends on the CPU's int8 kernels: within it on a Xeon with
    # VNNI, 5.6 points at best on an AMD EPYC without (measured): the verdict must say which, either way.
    best = min(res.steps, key=lambda s: s.drop)
    assert res.passed == (best.drop <= 1.0) and bool(res.failed_checks) != res.passed
    assert res.nodes_kept_fp32 == (last.kept_fp32 if res.passed else best.kept_fp32) and res.nodes_kept_fp32
    for before, after in zip(res.steps, res.steps[1:]):       # cumulative, one report per step
        assert after.kept_fp32 == before.kept_fp32 + after.added
    from edgetrain.models import load_onnx

    record = json.loads(load_onnx(tmp_path / "m.onnx").metadata["edgetrain.quantization"])
    assert record["nodes_kept_fp32"] == res.nodes_kept_fp32


def test_no_mix_within_budget_keeps_the_best_model(trained, zeros_npz, tmp_path):
    from edgetrain.api import quantize

    res = quantize(str(trained / "digits10"), str(zeros_npz), tmp_path / "m.onnx", val=str(trained / "val.npz"),
                   max_drop=0.5, max_fp32_nodes=0, threads=1, latency=False, scheme="rule")
    assert not res.passed and res.failed_checks and (tmp_path / "m.onnx").is_file()
    assert any("no mix" in w for w in res.warnings)


@pytest.mark.parametrize("method", ["entropy", "percentile"])
def test_histogram_methods_with_an_uneven_sample_count(trained, tmp_path, method):
    from edgetrain.api import quantize

    res = quantize(str(trained / "digits10"), str(trained / "calib.npz"), tmp_path / "m.onnx", method=method,
                   samples=7, threads=1, latency=False)
    assert res.calibration.samples == 7 and res.accuracy.to_dict() == {"checked": False, "max_drop": 1.0}
    assert any("not checked" in n for n in res.notes)


def test_exported_onnx_input_and_requantizing_is_refused(int8_result, trained, tmp_path):
    from edgetrain.convert import export_onnx
    from edgetrain.models import load_gluon
    from edgetrain.api import quantize

    fp32 = export_onnx(load_gluon(str(trained / "digits10")), tmp_path / "fp32.onnx", opset=13)
    res = quantize(str(fp32), str(trained / "calib.npz"), tmp_path / "q.onnx", samples=20, threads=1,
                   latency=False)
    assert Path(res.output).is_file()
    with pytest.raises(UsageError, match="already quantized"):
        quantize(int8_result.output, str(trained / "calib.npz"), tmp_path / "again.onnx", samples=5)
    assert not (tmp_path / "again.onnx").exists()


def test_mxnet_backend_writes_a_loadable_prefix(trained, tmp_path):
    from edgetrain.models import load_gluon
    from edgetrain.api import quantize

    res = quantize(str(trained / "digits10"), str(trained / "calib.npz"), tmp_path / "mx_int8", backend="mxnet",
                   val=str(trained / "val.npz"), samples=64, threads=1)
    assert res.backend == "mxnet" and res.onnx_exportable is False and res.passed
    assert res.accuracy.drop <= 1.0
    model = load_gluon(str(tmp_path / "mx_int8"))
    assert model.num_classes == 10 and model.preprocess.input_shape == (1, 16, 16)
    with pytest.raises(UsageError, match="already quantized"):
        quantize(str(tmp_path / "mx_int8"), str(trained / "calib.npz"), tmp_path / "again.onnx")
    with pytest.raises(UsageError, match="cannot be exported to ONNX"):
        quantize(str(trained / "digits10"), str(trained / "calib.npz"), tmp_path / "m.onnx", backend="mxnet")


@pytest.mark.parametrize("value", [-0.5, "abc", "nan", float("inf")])
def test_max_drop_must_be_a_non_negative_number(value, tmp_path):
    from edgetrain.api import quantize

    with pytest.raises(UsageError, match="--max-drop"):
        quantize("edgetrain.nets:digits_cnn", "builtin:digits", tmp_path / "m.onnx", max_drop=value)
    assert list(tmp_path.iterdir()) == []


def test_val_labels_outside_the_models_classes(tmp_path):
    from edgetrain.api import quantize

    np.savez(tmp_path / "val.npz", data=np.random.RandomState(0).rand(12, 8, 8).astype(np.float32),
             label=np.arange(12))
    with pytest.raises(UsageError, match="12 classes .* 5 outputs"):
        quantize("edgetrain.nets:pretrained_digits", "builtin:digits", tmp_path / "m.onnx",
                 val=str(tmp_path / "val.npz"), samples=5)
    assert list(tmp_path.iterdir()) == [tmp_path / "val.npz"]


def test_mobilenetv2_int8_file_is_at_least_3_5x_smaller(tmp_path):
    """The size figure for conv nets (issue 4). File size does not depend on the input size: 32x32 keeps it fast."""
    from edgetrain.api import quantize

    res = quantize("zoo:mobilenetv2_1.0", "builtin:digits", tmp_path / "mb.onnx", samples=4, input_shape=(3, 32, 32),
                   threads=1, latency=False, scheme="rule")
    assert res.size.fp32_bytes > 13_000_000 and res.size.ratio >= 3.5, res.size


def test_calibration_on_other_classes_than_the_models_outputs_is_said():
    """quantize calibrated on data whose classes are not the model's outputs without a word (issue 37). Not
    refused (calibration reads inputs only), but said: data with classes the model does not know, and a sample
    that covers only some of its classes; data of exactly its classes says nothing."""
    from edgetrain.data import load_data
    from edgetrain.int8 import calibration_notes
    from edgetrain.preprocess import default_for_shape

    ds = load_data("builtin:digits", default_for_shape((1, 8, 8)))
    assert calibration_notes(ds, ds.sample(64), 64, 10) == []
    beyond = calibration_notes(ds, ds.sample(64), 64, 5)
    assert len(beyond) == 1 and beyond[0].startswith("--calib has 10 classes (labels up to 9) but the model has 5 outputs")
    two = ds.subset(np.flatnonzero(ds.labels < 2))
    (some,) = calibration_notes(two, two.sample(64), 64, 10)
    assert some.startswith("the calibration sample covers 2 of the model's 10 classes")
    few = calibration_notes(ds, ds.sample(4), 4, 10)
    assert len(few) == 1 and "covers 4 of the model's 10 classes" in few[0] and "--samples at least 10" in few[0]
    assert calibration_notes(two, two.sample(64), 5000, None)[0].startswith(f"--calib has {len(two)} samples")


def test_the_note_reaches_the_result_and_the_terminal(tmp_path):
    """The 5-class digits base calibrated on all ten digits, as a user would run it."""
    res = run_edgetrain("quantize", "edgetrain.nets:pretrained_digits", "--calib", "builtin:digits", "-o",
                        tmp_path / "m.onnx", "--samples", "32", "--scheme", "rule", "--no-latency", "--json",
                        tmp_path / "r.json")
    assert res.code == 0, res.err
    note = "--calib has 10 classes (labels up to 9) but the model has 5 outputs"
    assert f"note       {note}" in res.out
    assert any(n.startswith(note) for n in json.loads((tmp_path / "r.json").read_text())["notes"])


def test_the_streamed_per_node_sqnr_is_onnx_runtimes_figure(tmp_path):
    """sensitivity.streamed_sqnr keeps two sums per activation and one sample at a time (quantize's memory on a
    512 MB board); ORT's collect_activations + compute_activation_error hold every sample's activations of both
    models (and a flattened copy of every tensor, matched or not). Same matching, same figure: on the shipped ONNX base
    and 24 digits, every activation within 1e-3 dB."""
    from onnxruntime.quantization.qdq_loss_debug import (collect_activations, compute_activation_error,
                                                         create_activation_matching,
                                                         modify_model_output_intermediate_tensors)

    import edgetrain
    from edgetrain.int8 import Quantizer, calibration_reader, load_calibration, prepare, scheme_for
    from edgetrain.int8.sensitivity import streamed_sqnr
    from edgetrain.models import load_onnx

    base = load_onnx(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx")
    _, ds = load_calibration("builtin:digits", base.preprocess, 24)
    prepare(base.path, tmp_path / "fp32.onnx")

    def reader():
        return calibration_reader(ds, base.preprocess.input_name)

    Quantizer(tmp_path / "fp32.onnx", tmp_path, scheme_for(None), "minmax", reader(), len(ds), 8).quantize(
        tmp_path / "int8.onnx")
    for name in ("fp32", "int8"):
        modify_model_output_intermediate_tensors(str(tmp_path / f"{name}.onnx"), str(tmp_path / f"{name}_aug.onnx"))
    fp32_acts = collect_activations(str(tmp_path / "fp32_aug.onnx"), reader())
    int8_acts = collect_activations(str(tmp_path / "int8_aug.onnx"), reader())
    matched = {k: m for k, m in create_activation_matching(int8_acts, fp32_acts).items() if "float" in m}
    theirs = {k: e["xmodel_err"] for k, e in compute_activation_error(matched).items()}

    ours = streamed_sqnr(tmp_path / "fp32.onnx", tmp_path / "int8.onnx", reader(), threads=1, workdir=tmp_path)
    assert len(theirs) >= 5 and ours.keys() == theirs.keys()
    worst = max(theirs, key=lambda k: abs(ours[k] - theirs[k]))
    assert abs(ours[worst] - theirs[worst]) < 1e-3, (worst, ours[worst], theirs[worst])
    assert len(set(np.round(list(ours.values()), 1))) > 1  # real figures, not one constant
