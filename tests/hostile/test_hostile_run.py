"""`edgetrain run --resume` trusts no record blindly: a step is skipped only when its files are still
there and unchanged, and a moved run folder never points back at the old one."""
from __future__ import annotations

import json
import shutil

import pytest

from clitools import run_edgetrain

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    from cli.test_run_cli import quickstart_variant  # the reduced quickstart (fewer epochs, samples, runs)

    tmp = tmp_path_factory.mktemp("run-resume")
    recipe = quickstart_variant(tmp, ["finetune", "quantize", "export"])
    res = run_edgetrain("run", recipe, "-o", tmp / "run", cwd=tmp)
    assert res.code == 0, res.err[-3000:]
    return tmp, recipe


def _copy(finished, name):
    tmp, recipe = finished
    dst = tmp / name
    shutil.copytree(tmp / "run", dst, symlinks=True)
    return tmp, recipe, dst


def _statuses(run):
    return {s["name"]: s["status"] for s in json.loads((run / "result.json").read_text())["steps"]}


STEPS = ("finetune", "quantize", "export")
# damaged file -> the first step that must run again (it and every later step run; earlier ones are skipped)
DAMAGE = {
    "export-missing": ("model.onnx", "delete", "export"),
    "export-truncated": ("model.onnx", "truncate", "export"),
    "int8-bitflip": ("model_int8.onnx", "flip", "quantize"),
    "finetune-params-flip": ("finetune/model-0000.params", "flip", "finetune"),
    "finetune-symbol-missing": ("finetune/model-symbol.json", "delete", "finetune"),
    "seal-missing": ("steps/export.files.json", "delete", "export"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_resume_checks_each_steps_files(finished, case):
    rel, how, first = DAMAGE[case]
    if first == "finetune":  # in place: a copied run folder trips finetune's own path check (see below)
        tmp, recipe = finished
        run = tmp / f"fresh-{case}"
        res = run_edgetrain("run", recipe, "-o", run, cwd=tmp)
        assert res.code == 0, res.err[-3000:]
    else:
        tmp, recipe, run = _copy(finished, f"damaged-{case}")
    path = run / rel
    if how == "delete":
        path.unlink()
    elif how == "truncate":
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    res = run_edgetrain("run", recipe, "--resume", run, cwd=tmp)
    assert res.code == 0, res.err[-3000:]
    status = _statuses(run)
    for i, step in enumerate(STEPS):
        expected = "done" if i >= STEPS.index(first) else "skipped (complete)"
        assert status[step] == expected, (case, status)
    assert path.is_file()  # made again


def test_moved_run_folder_never_points_back(finished):
    tmp, recipe, run = _copy(finished, "before-move")
    moved = tmp / "moved-elsewhere" / "run"
    moved.parent.mkdir()
    shutil.move(str(run), str(moved))
    (moved / "model.onnx").unlink()  # export must run again, taking the fine-tuned model from the new place
    res = run_edgetrain("run", recipe, "--resume", moved, cwd=tmp)
    assert res.code == 0, res.err[-3000:]
    assert _statuses(moved)["export"] == "done"
    log = (moved / "logs" / "export.log").read_text()
    first = log.splitlines()[0]
    assert str(moved / "finetune" / "model") in first and "before-move" not in first, first
    assert not run.exists()


def test_moved_run_folder_resumes_finetune(finished):
    tmp, recipe, run = _copy(finished, "moved-finetune")
    (run / "finetune" / "model-0000.params").unlink()
    res = run_edgetrain("run", recipe, "--resume", run, cwd=tmp)
    assert res.code == 0, res.err[-3000:]
    # the finetune step took its checkpoint from the new place (it did not start again) and wrote the model
    assert "resumed from the checkpoint" in (run / "logs" / "finetune.log").read_text()
    assert (run / "finetune" / "model-0000.params").exists()
