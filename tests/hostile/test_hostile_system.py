"""The system's edges (issue 26): a run refused before its folder exists, a run folder never overwritten by
the API, each note said once, ... Real child processes, real files; no mocks of the thing under test."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

import edgetrain
from clitools import assert_user_error, run_edgetrain
from edgetrain.errors import UsageError

BUILTIN = Path(edgetrain.__file__).parent / "_builtin"
PREFIX, ONNX = str(BUILTIN / "digits5"), str(BUILTIN / "digits5.onnx")


def _no_mxnet(tmp_path: Path) -> dict:
    """An environment where ``import mxnet`` fails as it does before `doctor --fix` (Python 3.13, no wheel):
    a real package named mxnet first on the path, raising what a missing one raises."""
    fake = tmp_path / "no-mxnet"
    (fake / "mxnet").mkdir(parents=True)
    (fake / "mxnet" / "__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'mxnet'\", name='mxnet')\n")
    return {"PYTHONPATH": os.pathsep.join([str(fake), *filter(None, [os.environ.get("PYTHONPATH")])])}


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


# --- 9. `edgetrain run` with no mxnet: refused before anything is made ------------------------------------

RUN_FORMS = {
    "default-folder": [],
    "new-folder": ["-o", "new-run"],
    "existing-empty-folder": ["-o", "empty-run"],
    "bundled-recipe-with-split": ["pi5", "-o", "pi5-run"],
}


@pytest.mark.parametrize("form", sorted(RUN_FORMS))
def test_run_without_mxnet_is_refused_before_its_run_folder_exists(tmp_path, form):
    work = tmp_path / "work"
    (work / "empty-run").mkdir(parents=True)
    before = _tree(work)
    res = run_edgetrain("run", *RUN_FORMS[form], cwd=work, env=_no_mxnet(tmp_path), timeout=300)
    assert_user_error(res, 2, "mxnet", "doctor --fix")
    assert _tree(work) == before  # nothing made, the empty folder still empty


def test_api_run_without_mxnet_leaves_nothing(tmp_path):
    import subprocess

    code = ("import edgetrain, sys\n"
            "try:\n    edgetrain.run(rundir=sys.argv[1], progress=None)\n"
            "except edgetrain.errors.UsageError as e:\n    print('REFUSED', e.exit_code, e)\n")
    env = {**os.environ, **_no_mxnet(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "r")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.stdout.startswith("REFUSED 2 mxnet"), proc.stdout + proc.stderr
    assert not (tmp_path / "r").exists()


# --- 10. the API's run(rundir=...) never overwrites a folder that is not its resumable run -----------------

def _other_run(folder: Path) -> None:
    folder.mkdir()
    (folder / "recipe.yaml").write_text("name: other\nmodel: x\ndata: builtin:digits\nsteps: [export]\n")


NOT_MINE = {
    "a-file-inside": lambda p: (p.mkdir(), (p / "keep.txt").write_text("mine")),
    "a-sub-folder-inside": lambda p: (p.mkdir(), (p / "sub").mkdir(), (p / "sub" / "keep.txt").write_text("x")),
    "another-recipes-run": _other_run,
    "a-regular-file": lambda p: p.write_text("mine"),
}


@pytest.mark.parametrize("resume", [False, True], ids=["new", "resume"])
@pytest.mark.parametrize("kind", sorted(NOT_MINE))
def test_api_run_refuses_a_rundir_that_is_not_its_own(tmp_path, kind, resume):
    target = tmp_path / "rundir"
    NOT_MINE[kind](target)
    before = {p: p.read_bytes() for p in [target, *target.rglob("*")] if p.is_file()}
    with pytest.raises(UsageError) as info:
        edgetrain.run(rundir=target, resume=resume, progress=None)
    assert info.value.exit_code == 2 and "\n" not in str(info.value)
    assert {p: p.read_bytes() for p in [target, *target.rglob("*")] if p.is_file()} == before


# --- 11. fine-tune says each note once ------------------------------------------------------------------

NOTE_CASES = {
    "factory-random-weights": ["edgetrain.nets:digits_cnn"],
    "prefix": [PREFIX],
    "onnx": [ONNX],
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(NOTE_CASES))
def test_finetune_says_each_note_once(tmp_path, case):
    res = run_edgetrain("finetune", *NOTE_CASES[case], "--data", "builtin:digits", "--epochs", "1",
                        "-o", tmp_path / "out", timeout=600)
    assert res.code in (0, 3), res.err
    notes = [re.sub(r"^note\s+", "", ln) for ln in (res.out + res.err).splitlines() if ln.startswith("note ")]
    assert notes, res.out + res.err
    repeated = {n for n in notes if notes.count(n) > 1}
    assert not repeated, repeated
