"""What a fine-tune of an ONNX file trains comes from the roles of its initializers (roles.py), whatever ops
make its classifier, and every graph predict runs is either trained or refused in one line.

The models are built in code (onnx_heads): each form of output layer exporters write, times each
``--train-layers`` choice, fine-tuned by the real CLI; what trained is read from the file it wrote (an
initializer whose values changed), never from what the run says it trained. Then the exporters' quirks, as a
class: each applied to a model, fine-tuned in each mode, and the outcome is exit 0 with a model predict runs,
or exit 2 with one ``Error:`` line."""
from __future__ import annotations

import numpy as np
import onnx
import pytest

import onnx_heads as H
from clitools import assert_user_error, run_edgetrain
from edgetrain.errors import UsageError
from edgetrain.training import roles
from edgetrain.training.onnx_grad import GradGraph, logits_name


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    """Digits as the models' 16x16 input takes them: five classes (the models' own) and ten (a resize)."""
    from edgetrain.data import load_data
    from edgetrain.preprocess import Preprocess

    folder = tmp_path_factory.mktemp("digits")
    x, y = load_data("builtin:digits", Preprocess(input_shape=(1, 8, 8), mean=(0.0,), std=(1.0,))).arrays(600)
    np.savez(folder / "five.npz", data=x[y < 5][:240, 0], label=y[y < 5][:240])
    np.savez(folder / "ten.npz", data=x[:240, 0], label=y[:240])
    return folder


def _finetune(model, data, out, mode, *extra):
    return run_edgetrain("finetune", model, "--data", data, "-o", out, "--train-layers", mode, "--epochs", "1",
                         "--allow-chance", "--seed", "3", *extra)


def _changed(before: dict, after: dict) -> set:
    """The initializers of the input whose values (or shape) the written model changed; one the written model
    lacks counts as changed."""
    return {n for n, v in before.items() if n not in after or after[n].shape != v.shape or not np.array_equal(after[n], v)}


def _expected(built: H.Built, mode: str) -> set:
    return {"bias": built.bias_set(), "lite": built.bias_set(), "head": set(built.classifier),
            "last:1": set(built.classifier), "last:2": set(built.last2), "all": set(built.weights)}[mode]


def _statistics(built: H.Built, mode: str) -> set:
    """The running statistics training mode moves (engine_onnx.BATCH_STATS: all, last:N, lite): of every BatchNorm
    the trained part holds (lite: every one); head and bias keep the file's."""
    if mode not in ("all", "lite", "last:2"):
        return set()
    gammas = [n for n in (built.weights if mode != "last:2" else built.last2) if "_gamma" in n]   # (tf2onnx's names)
    return {n.replace("_gamma", s) for n in gammas for s in ("_mean", "_var")}


# ---------------------------------------------------------------------------------------- the roles, in-process
@pytest.mark.parametrize("head", H.HEADS)
def test_the_classifier_is_found_whatever_ops_make_it(head):
    built = H.classifier(head, classes=5)
    graph = built.proto.graph
    found = roles.graph_classifier(graph, logits_name(built.proto))
    assert found.names == built.classifier and found.outputs == 5
    assert found.form == {"gemm": "Gemm", "gemm_transb0": "Gemm", "matmul_add": "MatMul+Add", "add_matmul": "MatMul+Add",
                          "matmul": "MatMul"}.get(head, "1x1 Conv")
    shapes = roles.float_shapes(graph)
    assert roles.layer_biases(graph.node, shapes) == built.biases + built.classifier[1:]
    assert set(GradGraph(built.proto, "bias+head").trainable) == built.bias_set()
    assert set(GradGraph(built.proto, "head").trainable) == set(built.classifier)


@pytest.mark.parametrize("head", sorted(H.UNRECOGNISED))
def test_an_unrecognised_classifier_is_a_usage_error_naming_the_node(head):
    built = H.classifier(head, classes=5)
    with pytest.raises(UsageError, match="classifier is not recognised") as err:
        roles.graph_classifier(built.proto.graph, logits_name(built.proto), "m.onnx")
    assert "\n" not in str(err.value) and "(m.onnx)" in str(err.value)
    with pytest.raises(UsageError, match="classifier is not recognised|cannot differentiate Transpose"):
        GradGraph(built.proto, "bias+head")   # (a Transpose making the weight is refused first, as an op)


# ------------------------------------------------------------------------------------------ the CLI, head x mode
@pytest.mark.parametrize("mode", H.MODES)
@pytest.mark.parametrize("head", H.HEADS)
def test_what_each_mode_trains_is_what_the_roles_say(head, mode, digits, tmp_path):
    """Five classes in the data, five in the model: nothing is resized, so every initializer of the written model
    that differs from the input's was trained, and exactly the ones the roles name differ (the classifier's
    weight among them; no frozen conv weight)."""
    built = H.classifier(head, classes=5)
    src = H.save(built.proto, tmp_path / "in.onnx")
    res = _finetune(src, digits / "five.npz", tmp_path / "run", mode, "--json", "-")
    assert res.code == 0, res.err
    after = H.initializers(tmp_path / "run" / "model.onnx")
    expected = _expected(built, mode)
    assert _changed(H.initializers(src), after) == expected | _statistics(built, mode)
    assert built.classifier[0] in expected
    added = sum(v.size for n, v in after.items() if n.startswith("lite") and n.endswith(("_weight", "_bias")))
    assert res.json()["trained_parameters"] == sum(after[n].size for n in expected) + added
    assert (mode == "lite") == (added > 0)


@pytest.mark.parametrize("mode", ["bias", "lite"])
@pytest.mark.parametrize("head", H.HEADS)
def test_a_new_class_count_resizes_the_classifier_and_leaves_frozen_layers(head, mode, digits, tmp_path):
    """Ten classes in the data, five in the model: the classifier (whatever its form) is what is resized, the
    frozen layers are the file's, and predict runs the model with ten outputs."""
    built = H.classifier(head, classes=5)
    src = H.save(built.proto, tmp_path / "in.onnx")
    res = _finetune(src, digits / "ten.npz", tmp_path / "run", mode, "--json", "-")
    assert res.code == 0, res.err
    assert res.json()["replaced_head"]
    model = tmp_path / "run" / "model.onnx"
    after = H.initializers(model)
    assert _changed(H.initializers(src), after) == _expected(built, mode) | set(built.class_targets) | \
        _statistics(built, mode)
    assert 10 in after[built.classifier[0]].shape and 5 not in after[built.classifier[0]].shape
    pred = run_edgetrain("predict", model, digits / "ten.npz", "--json", "-")
    assert pred.code == 0, pred.err


REFUSALS = [("conv3x3_gap", m) for m in H.MODES] + [(h, "bias") for h in sorted(H.UNRECOGNISED) if h != "conv3x3_gap"]


@pytest.mark.parametrize("head, mode", REFUSALS)
def test_an_unrecognised_classifier_is_refused_in_one_line(head, mode, digits, tmp_path):
    src = H.save(H.classifier(head, classes=5).proto, tmp_path / "in.onnx")
    assert run_edgetrain("predict", src, digits / "five.npz").code == 0   # a model predict runs
    res = _finetune(src, digits / "five.npz", tmp_path / "run", mode)
    assert_user_error(res, 2, "the model's classifier is not recognised", "Gemm, a MatMul")
    assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------- the exporters' quirks x mode
# the quirks refused in one line (the rest train), and words of the line
REFUSED = {"batch_in_reshape": "the model fixes its batch at 1: Reshape node"}
CASES = [(q, "gemm") for q in H.QUIRKS] + [("shared_bias", "matmul_add"), ("shared_bias", "conv1x1_flatten"),
                                            ("identity_between", "matmul_add"), ("inits_as_inputs", "matmul_add"),
                                            ("fixed_batch", "conv1x1_reshape"), ("dynamic_hw", "conv1x1_relu_gap"),
                                            ("constant_nodes", "conv1x1_reshape_n"), ("opset9", "conv1x1_reshape"),
                                            ("unsorted", "matmul_add")]


@pytest.fixture(scope="module")
def quirky(digits, tmp_path_factory):
    """(quirk, head) -> the model built with that quirk, saved once, and the model predict ran (the premise)."""
    folder, made = tmp_path_factory.mktemp("quirks"), {}

    def make(quirk, head):
        if (quirk, head) not in made:
            built = H.classifier(head, classes=8 if quirk == "shared_bias" else 5)
            H.QUIRKS[quirk](built)
            src = H.save(built.proto, folder / f"{quirk}-{head}.onnx")
            pred = run_edgetrain("predict", src, digits / "ten.npz")
            assert pred.code == 0, pred.err
            made[quirk, head] = built, src
        return made[quirk, head]
    return make


# each mode with ten classes (the classifier is resized); with the model's own five, bias (ONNX Runtime runs the
# whole step), and as slow tests lite and last:1 (its frozen part in ONNX Runtime)
RUNS = [(m, "ten") for m in ("bias", "lite", "last:1", "last:2", "all")] + [("bias", "five")] + \
    [pytest.param(m, "five", marks=pytest.mark.slow) for m in ("lite", "last:1")]


@pytest.mark.parametrize("mode, data", RUNS)
@pytest.mark.parametrize("quirk, head", CASES, ids=[f"{q}-{h}" for q, h in CASES])
def test_every_graph_predict_runs_is_trained_or_refused_in_one_line(quirk, head, mode, data, quirky, digits, tmp_path):
    """A shared bias's model has the first conv's 8 outputs so the classifier can share it (resized either way)."""
    built, src = quirky(quirk, head)
    res = _finetune(src, digits / f"{data}.npz", tmp_path / "run", mode)
    assert "Traceback" not in res.err, res.err
    if quirk in REFUSED:
        assert_user_error(res, 2, REFUSED[quirk])
        assert not (tmp_path / "run").exists()
        return
    assert res.code == 0, res.err
    model = tmp_path / "run" / "model.onnx"
    pred = run_edgetrain("predict", model, digits / f"{data}.npz", "--json", "-")
    assert pred.code == 0, pred.err
    before, after = H.initializers(src), H.initializers(model)
    # what the roles leave frozen is the file's: a shared tensor's other use too
    frozen = set(before) - _expected(built, mode) - set(built.class_targets) - _statistics(built, mode)
    assert not _changed({n: before[n] for n in frozen}, after), sorted(_changed({n: before[n] for n in frozen}, after))
    out = onnx.load(str(model)).graph
    assert [i.name for i in out.input] == ["data"]   # weights are not inputs of the model written


def test_an_output_type_declaring_another_class_count_is_not_recognised():
    built = H.classifier("gemm", classes=5)
    built.proto.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 7
    with pytest.raises(UsageError, match="the output has 7 classes where Gemm node 'gemm9' has 5 outputs"):
        roles.graph_classifier(built.proto.graph, logits_name(built.proto))
