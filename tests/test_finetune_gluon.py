"""A Gluon model given to finetune trains through the one engine (its ONNX export) and comes back as Gluon
files: for every --train-layers choice the written PREFIX computes what the written model.onnx computes,
the export is made once (mxnet only in its child) and cached, and a checkpoint of the engines that are gone
is refused in one line."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clitools import assert_user_error, run_edgetrain

BASE = "edgetrain.nets:pretrained_digits"   # trained on the digits 0-4: five outputs
FIXTURES = Path(__file__).parent / "fixtures" / "old_checkpoints"


@pytest.mark.parametrize("layers", ["head", "last:2", "bias", "all"])
def test_the_written_prefix_computes_what_the_written_onnx_computes(layers, digits_folder, tmp_path):
    """Three image classes replace the base's ten outputs; whatever trains, the PREFIX the host reads next and
    the model.onnx the device reads are the same model (outputs on real images, and the class count)."""
    import mxnet as mx
    import onnxruntime as ort

    from edgetrain.data import load_data
    from edgetrain.models import load_gluon, load_onnx

    out = tmp_path / "o"
    res = run_edgetrain("finetune", BASE, "--data", digits_folder, "-o", out, "--epochs", "2", "--train-layers", layers,
                        "--threads", "1", "--allow-chance", "--json", "-", cwd=tmp_path)
    assert res.code == 0, res.err
    r = res.json()
    assert r["replaced_head"] and r["model"] == str(out / "model") and r["trained_parameters"] > 0
    onnx_model = load_onnx(out / "model.onnx")
    x = load_data(str(digits_folder), onnx_model.preprocess).arrays(8)[0]
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    want = session.run(None, {session.get_inputs()[0].name: x})[0]
    gluon = load_gluon(str(out / "model"))
    got = gluon.block(mx.nd.array(x)).asnumpy()
    assert got.shape == want.shape == (8, 3)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert gluon.num_classes == 3


def test_lite_from_a_gluon_model_writes_the_onnx_model_and_says_why_no_prefix(digits_folder, tmp_path):
    out = tmp_path / "o"
    res = run_edgetrain("finetune", BASE, "--data", digits_folder, "-o", out, "--epochs", "1", "--train-layers", "lite",
                        "--threads", "1", "--allow-chance", "--json", "-", cwd=tmp_path)
    assert res.code == 0, res.err
    r = res.json()
    assert r["model"] == str(out / "model.onnx") and (out / "model.onnx").is_file()
    assert not (out / "model-symbol.json").exists()
    assert any("no Gluon form" in n for n in r["notes"]), r["notes"]


NO_MXNET = """
import json, sys
import edgetrain
r = edgetrain.finetune(sys.argv[1], data=sys.argv[2], out=sys.argv[3], train_layers=sys.argv[4], epochs=2, threads=1)
print(json.dumps({"mxnet_imported": "mxnet" in sys.modules, "notes": r.notes}))
"""


@pytest.mark.parametrize("layers", ["head", "last:2", "bias", "lite", "all"])
def test_the_export_is_made_once_and_a_damaged_cache_entry_is_made_again(layers, digits_npz, tmp_path):
    """mxnet only in the first run's child (the export), never in the process itself, and not even in a child
    once the export is cached; the cached run writes the same bytes; a damaged entry is never trusted."""
    env = {**os.environ, "EDGETRAIN_CACHE_DIR": str(tmp_path / "cache")}

    def run(name):
        proc = subprocess.run([sys.executable, "-c", NO_MXNET, BASE, str(digits_npz), str(tmp_path / name), layers],
                              cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        assert got["mxnet_imported"] is False, got["notes"]
        return got

    first, second = run("a"), run("b")
    assert any("mxnet only in that step" in n for n in first["notes"])
    assert any("no mxnet in this run" in n for n in second["notes"])
    assert not any("mxnet only in that step" in n for n in second["notes"])
    written = ["model.onnx"] + ([] if layers == "lite" else ["model-0000.params", "model-symbol.json"])
    for name in written:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    for f in (tmp_path / "cache").rglob("base.onnx"):
        f.write_bytes(b"damaged")
    third, fourth = run("c"), run("d")
    assert any("mxnet only in that step" in n for n in third["notes"]), "a damaged entry is never trusted"
    assert any("no mxnet in this run" in n for n in fourth["notes"]), "and it is replaced"


@pytest.mark.parametrize("fixture,engine", [("numpy-head.npz", "numpy-head"), ("mxnet-all.npz", "mxnet")])
def test_a_checkpoint_of_the_removed_engines_is_refused_in_one_line(fixture, engine, tiny_prefix, digits_npz, tmp_path):
    """Checkpoints the NumPy-tail and MXNet engines wrote (fixtures: their README says how) hold another graph's
    names and BatchNorm: --resume refuses them, naming the engine, and leaves OUTDIR as it was."""
    out = tmp_path / "o"
    out.mkdir()
    shutil.copyfile(FIXTURES / fixture, out / "checkpoint.npz")
    before = (out / "checkpoint.npz").read_bytes()
    res = run_edgetrain("finetune", tiny_prefix, "--data", digits_npz, "-o", out, "--epochs", "2", "--resume",
                        "--threads", "1", cwd=tmp_path)
    assert_user_error(res, 2, f"written by the '{engine}' engine of an earlier edgetrain", "no longer exists",
                      "new OUTDIR")
    assert (out / "checkpoint.npz").read_bytes() == before
    assert sorted(p.name for p in out.iterdir()) == ["checkpoint.npz"]
