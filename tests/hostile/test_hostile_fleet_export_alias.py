"""fleet serve with MODEL inside RUNDIR/model/ (issue 26, closing campaign): the run's end replaces that
folder with the exported global model in one rename, so `fleet serve X/model/model.onnx -o X` replaced the
user's base model with the fleet's (exit 0, the input gone). Now refused in one line, exit 2, before any
round and before anything is written to RUNDIR, for every spelling of the path."""
from __future__ import annotations

import importlib.util
import os
import shutil
from pathlib import Path

import pytest

import edgetrain
from clitools import assert_user_error, run_edgetrain

ONNX = Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx"
pytestmark = pytest.mark.skipif(importlib.util.find_spec("flwr") is None, reason="fleet needs flwr (numpy2 stage)")


@pytest.mark.parametrize("how", ["plain", "dotdot", "symlinked-rundir", "relative"])
def test_serve_model_inside_export_folder_refused(tmp_path, how):
    run = tmp_path / "X"
    (run / "model").mkdir(parents=True)
    model = run / "model" / "model.onnx"
    shutil.copy(ONNX, model)
    before = model.read_bytes()
    os.symlink(run, tmp_path / "link")
    model_arg, out = {"plain": (model, run), "dotdot": (run / "model" / ".." / "model" / "model.onnx", run),
                      "symlinked-rundir": (model, tmp_path / "link"),
                      "relative": ("X/model/model.onnx", "X")}[how]
    res = run_edgetrain("fleet", "serve", model_arg, "--val", "builtin:digits", "-o", out, "--port", "9393",
                        cwd=tmp_path, timeout=120)
    assert_user_error(res, 2, "replaces with the global model")
    assert model.read_bytes() == before
    assert sorted(p.name for p in run.iterdir()) == ["model"]
