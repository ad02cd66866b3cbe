"""Outputs never overwrite inputs: every command x every output option x every way of naming an input
file again (same spelling, another spelling, a symlink, a hard link, a file its PREFIX expands to) is
an error (exit 2) before any work, and the input is left byte for byte."""
from __future__ import annotations

import hashlib
import itertools
import os
from pathlib import Path

import numpy as np
import pytest

from clitools import assert_user_error
from edgetrain.errors import UsageError
from edgetrain.fileio import check_outputs

SPELLINGS = ("same", "dotted", "absolute", "symlink", "hardlink")


def _alias(path: Path, how: str, work: Path) -> str:
    """Another name for ``path`` (relative names are relative to ``work``, the command's cwd)."""
    if how == "same":
        return os.path.relpath(path, work)
    if how == "dotted":
        (work / "sub").mkdir(exist_ok=True)
        return f"./sub/../{os.path.relpath(path, work)}"
    if how == "absolute":
        return str(path.resolve())
    link = work / f"alias-{how}-{path.name}"
    if not link.exists():
        (os.symlink if how == "symlink" else os.link)(path, link)
    return link.name


@pytest.fixture(scope="module")
def work(tmp_path_factory):
    """A user's folder: a PREFIX, an exported .onnx, an .npz, a params file."""
    from edgetrain.models import load_gluon, save_prefix

    root = tmp_path_factory.mktemp("outputs")
    model = load_gluon("edgetrain.nets:digits_cnn")
    save_prefix(model, root / "net")
    model.block.save_parameters(str(root / "w.params"))
    rng = np.random.RandomState(0)
    np.savez(root / "d.npz", data=rng.randint(0, 255, (20, 16, 16)).astype(np.uint8), label=np.arange(20) % 10)
    from edgetrain.convert import build_onnx  # the one Gluon->ONNX converter

    (root / "net.onnx").write_bytes(build_onnx(model, opset=13, dynamic_batch=True).SerializeToString())
    return root


def _digest(folder: Path) -> dict:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir()) if p.is_file()
            and not p.name.startswith("alias-")}


# command -> (argv template, {input option: file}) ; {out} is replaced by the colliding name
COMMANDS = {
    "quantize-onnx": (["quantize", "net.onnx", "--calib", "d.npz", "--val", "d.npz"], ("-o", "--json")),
    "quantize-gluon": (["quantize", "net", "--calib", "d.npz"], ("-o", "--json")),
    "export": (["export", "net", "--data", "d.npz"], ("-o", "--json")),
    "export-params": (["export", "edgetrain.nets:digits_cnn", "--params", "w.params"], ("-o", "--json")),
    "profile": (["profile", "net.onnx"], ("--report", "--json")),
    "inspect": (["inspect", "net", "--data", "d.npz"], ("--json",)),
}
INPUT_FILES = {"quantize-onnx": ["net.onnx", "d.npz"], "quantize-gluon": ["net-symbol.json", "net-0000.params",
               "net-edgetrain.json", "d.npz"], "export": ["net-symbol.json", "net-0000.params", "net-edgetrain.json",
               "d.npz"], "export-params": ["w.params"], "profile": ["net.onnx"],
               "inspect": ["net-0000.params", "d.npz"]}


def _cases():
    spell = itertools.cycle(SPELLINGS)
    for command, (_argv, outs) in COMMANDS.items():
        for out_opt in outs:
            for target in INPUT_FILES[command]:
                yield command, out_opt, target, next(spell)


CASES = list(_cases())


@pytest.mark.parametrize("case", CASES, ids=["-".join(c) for c in CASES])
def test_output_naming_an_input_is_refused_before_work(cli, work, case):
    command, out_opt, target, how = case
    argv, outs = COMMANDS[command]
    before = _digest(work)
    name = _alias(work / target, how, work)
    args = list(argv)
    for opt in outs:  # the other outputs go to fresh names
        args += [opt, name if opt == out_opt else f"fresh{opt.strip('-')}.out"]
    res = cli(*args, cwd=work, timeout=120)
    assert_user_error(res, 2, "overwrite the input")
    assert _digest(work) == before
    assert not [p for p in work.iterdir() if p.name.startswith("fresh")]


@pytest.mark.parametrize("command", ["quantize-onnx", "export", "profile"])
def test_two_outputs_naming_one_file_refused(cli, work, command):
    argv, outs = COMMANDS[command]
    res = cli(*argv, outs[0], "same.out", outs[-1] if len(outs) > 1 else "--json", "./same.out", cwd=work, timeout=120)
    assert_user_error(res, 2, "name the same file")
    assert not (work / "same.out").exists()


def test_finetune_outdir_holding_the_input_model_refused(cli, work, tmp_path):
    import shutil

    out = tmp_path / "run"
    out.mkdir()
    for f in ("net-symbol.json", "net-0000.params", "net-edgetrain.json"):
        shutil.copy(work / f, out / f.replace("net", "model"))
    before = _digest(out)
    res = cli("finetune", out / "model", "--data", work / "d.npz", "-o", out, "--epochs", "1", timeout=120)
    assert_user_error(res, 2, "overwrite the input MODEL")
    assert _digest(out) == before
    res = cli("finetune", work / "net", "--data", out / "metrics.json", "-o", out, timeout=120)
    assert res.code == 2  # data not found or a collision: never training


@pytest.mark.parametrize("how", SPELLINGS)
@pytest.mark.parametrize("member", ["", "-symbol.json", "-0000.params", "-edgetrain.json"])
def test_check_outputs_library_matrix(work, tmp_path, how, member):
    """The helper itself, on every spelling of every file a PREFIX expands to."""
    target = work / f"net{member}" if member else work / "net.onnx"
    name = _alias(target, how, work)
    cwd = os.getcwd()
    os.chdir(work)
    try:
        with pytest.raises(UsageError, match="overwrite the input"):
            check_outputs({"MODEL": "net" if member else "net.onnx"}, {"-o": name})
        check_outputs({"MODEL": "net"}, {"-o": "elsewhere.onnx", "--json": "-"})
        # an output PREFIX writes PREFIX-symbol.json etc.: it collides with an input named like one of them
        if member:
            with pytest.raises(UsageError, match="overwrite the input"):
                check_outputs({"--data": str(target)}, {"-o": "net"}, prefix_outputs=("-o",))
    finally:
        os.chdir(cwd)
