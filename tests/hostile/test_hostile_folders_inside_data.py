"""Folders inside folders (issue 26's class, closing campaign): an output folder that is an image DATA folder
or inside one -- finetune -o, fleet join's state folder (-o), fleet serve's RUNDIR inside --val -- wrote its
run files and logs/ there, and the next read of DATA found the extra class folders ('logs', 'run'), a class
count that no longer fits the model. Now one `Error:` line, exit 2, before anything is written into DATA."""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

import edgetrain
from clitools import assert_user_error, run_edgetrain
from edgetrain.errors import UsageError
from edgetrain.fileio import check_folder_outside_data

ONNX = str(Path(edgetrain.__file__).parent / "_builtin" / "digits5.onnx")


def _images(root: Path) -> Path:
    from PIL import Image

    for cls in ("a", "b"):
        (root / cls).mkdir(parents=True)
        for j in range(4):
            Image.new("L", (16, 16), 60 * j).save(root / cls / f"{j}.png")
    return root


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


SPELLINGS = {"itself": lambda d: d, "inside": lambda d: d / "run", "inside-a-class": lambda d: d / "a" / "run",
             "dotdot": lambda d: d / "a" / ".." / "run", "via-symlink": lambda d: d.parent / "link" / "run"}


@pytest.mark.parametrize("how", list(SPELLINGS))
def test_library_refuses_every_spelling(tmp_path, how):
    data = _images(tmp_path / "data")
    os.symlink(data, tmp_path / "link")
    with pytest.raises(UsageError, match="inside the image folder"):
        check_folder_outside_data(SPELLINGS[how](data), "-o", {"--data": str(data)})
    check_folder_outside_data(tmp_path / "elsewhere", "-o", {"--data": str(data), "--val": "builtin:digits"})


@pytest.mark.parametrize("how", ["inside", "inside-a-class"])
def test_finetune_outdir_inside_data_refused(tmp_path, how):
    data = _images(tmp_path / "data")
    before = _tree(data)
    res = run_edgetrain("finetune", ONNX, "--data", data, "--epochs", "1", "--train-layers", "bias", "-o",
                        SPELLINGS[how](data), timeout=120)
    assert_user_error(res, 2, "inside the image folder")
    assert _tree(data) == before


def test_finetune_outdir_inside_val_refused(tmp_path):
    val = _images(tmp_path / "val")
    res = run_edgetrain("finetune", ONNX, "--data", "builtin:digits", "--val", val, "--epochs", "1",
                        "--train-layers", "bias", "-o", val / "run", timeout=120)
    assert_user_error(res, 2, "--val")
    assert not (val / "run").exists()


@pytest.mark.skipif(shutil.which("flower-supernode") is None and not Path(sys.executable).with_name(
    "flower-supernode").exists(), reason="flwr not installed in this interpreter")
def test_fleet_join_state_inside_data_refused(tmp_path):
    data = _images(tmp_path / "data")
    before = _tree(data)
    res = run_edgetrain("fleet", "join", "127.0.0.1:9", "--data", data, "--max-wait", "5", "-o", data,
                        timeout=120)
    assert_user_error(res, 2, "inside the image folder")
    assert _tree(data) == before


@pytest.mark.parametrize("port", ["0", "65536", "99999"])
def test_fleet_join_port_out_of_range_refused(tmp_path, port):
    res = run_edgetrain("fleet", "join", f"127.0.0.1:{port}", "--data", "builtin:digits", "--max-wait", "5",
                        "-o", tmp_path / "state", timeout=120)
    if "flwr" in res.err and "install" in res.err:
        pytest.skip("flwr not installed in this interpreter")
    assert_user_error(res, 2, "ADDRESS")
