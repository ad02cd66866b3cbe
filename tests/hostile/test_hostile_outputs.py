"""Outputs never overwrite inputs: every command x every output option x every way of naming an input
file again (same spelling, another spelling, a symlink, a hard link, a file its PREFIX expands to) is
an error (exit 2) before any work, and the input is left byte for byte."""
from __future__ import annotations

import hashlib
import itertools
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from clitools import CliResult, assert_user_error
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


# --- predict: an output onto an image DATA holds (issue 26) ---------------------------------------------

PREDICT_SOURCES = ("labelled-folder", "flat-folder", "one-image", "stdin")
ONNX = str(Path(__import__("edgetrain._builtin", fromlist=["x"]).__path__[0]) / "digits5.onnx")


def _predict_cases(every: bool):
    spell = itertools.cycle(SPELLINGS)
    for source in PREDICT_SOURCES:
        for opt in ("-o", "--json"):
            for how in (SPELLINGS if every else (next(spell),)):
                yield source, opt, how


def _predict_onto_image(cli, tmp_path, source, opt, how):
    from hostile import gen

    work = tmp_path / "w"
    work.mkdir()
    if source == "labelled-folder":
        gen.image_folder(work / "data")
        image, data, stdin = work / "data" / "b" / "2.png", "data", None
    else:
        (work / "data").mkdir()
        for i in range(3):
            (work / "data" / f"{i}.png").write_bytes(gen.good_png(seed=i))
        image = work / "data" / "1.png"
        data = {"flat-folder": "data", "one-image": "data/1.png", "stdin": "-"}[source]
        stdin = "".join(f"data/{i}.png\n" for i in range(3)) if source == "stdin" else None
    before = hashlib.sha256(image.read_bytes()).hexdigest()
    name = _alias(image, how, work)
    proc = subprocess.run([sys.executable, "-m", "edgetrain", "predict", ONNX, data, opt, name], cwd=work,
                          input=stdin, capture_output=True, text=True, timeout=120,
                          env={k: v for k, v in os.environ.items() if k != "EDGETRAIN_DEBUG"})
    assert_user_error(CliResult(proc.returncode, proc.stdout, proc.stderr), 2, "would overwrite the input")
    assert hashlib.sha256(image.read_bytes()).hexdigest() == before
    assert not proc.stdout.strip()  # refused before any prediction


PREDICT_FAST = list(_predict_cases(False))
PREDICT_ALL = [c for c in _predict_cases(True) if c not in PREDICT_FAST]


@pytest.mark.parametrize("case", PREDICT_FAST, ids=["-".join(c) for c in PREDICT_FAST])
def test_predict_output_onto_an_image_it_reads_is_refused(cli, tmp_path, case):
    """Before: `predict m.onnx DATA -o DATA/3/103.png` wrote the predictions over the image (exit 0), and so
    did --json onto an image listed on stdin."""
    _predict_onto_image(cli, tmp_path, *case)


@pytest.mark.slow
@pytest.mark.parametrize("case", PREDICT_ALL, ids=["-".join(c) for c in PREDICT_ALL])
def test_predict_output_onto_an_image_it_reads_is_refused_every_spelling(cli, tmp_path, case):
    _predict_onto_image(cli, tmp_path, *case)


# --- the Python API runs the same guard (issue 26: it bypassed it) -------------------------------------------

def _api_collision(name, work):
    import edgetrain

    if name == "export":
        return lambda: edgetrain.export("net", "alias-symlink-d.npz", data="d.npz", progress=None), "d.npz"
    if name == "quantize":
        return lambda: edgetrain.quantize("net.onnx", "d.npz", "./sub/../net.onnx", progress=None), "net.onnx"
    if name == "profile":
        if not (work / "alias-hard-net.md").exists():
            os.link(work / "net.onnx", work / "alias-hard-net.md")
        return lambda: edgetrain.profile("net.onnx", report="alias-hard-net.md", progress=None), "net.onnx"
    raise ValueError(name)


@pytest.mark.parametrize("name", ["export", "quantize", "profile"])
def test_api_output_naming_an_input_is_refused_before_work(work, name, monkeypatch):
    monkeypatch.chdir(work)
    (work / "sub").mkdir(exist_ok=True)
    if not (work / "alias-symlink-d.npz").exists():
        os.symlink("d.npz", work / "alias-symlink-d.npz")
    before = _digest(work)
    call, _target = _api_collision(name, work)
    with pytest.raises(UsageError, match="overwrite the input"):
        call()
    assert _digest(work) == before


def test_api_finetune_outdir_holding_its_model_refused(work, tmp_path, monkeypatch):
    import shutil

    import edgetrain

    out = tmp_path / "run"
    out.mkdir()
    for f in ("net-symbol.json", "net-0000.params", "net-edgetrain.json"):
        shutil.copy(work / f, out / f.replace("net", "model"))
    before = _digest(out)
    with pytest.raises(UsageError, match="overwrite the input MODEL"):
        edgetrain.finetune(out / "model", work / "d.npz", out, epochs=1, progress=None)
    assert _digest(out) == before


def test_api_predict_output_onto_an_image_refused(tmp_path):
    import edgetrain
    from hostile import gen

    data = gen.image_folder(tmp_path / "data")
    image = data / "a" / "1.png"
    before = image.read_bytes()
    for spelling in (image, str(image), tmp_path / "data" / "b" / ".." / "a" / "1.png"):
        with pytest.raises(UsageError, match="would overwrite the input"):
            edgetrain.predict(ONNX, data, output=spelling, progress=None)
    assert image.read_bytes() == before


@pytest.mark.parametrize("how", SPELLINGS)
@pytest.mark.parametrize("command", ["serve", "join"])
def test_fleet_json_onto_its_data_is_refused_before_any_round(cli, work, command, how):
    """Issue 26: `fleet serve --json` onto --val and `fleet join --json` onto --data were written over them."""
    before = _digest(work)
    name = _alias(work / "d.npz", how, work)
    if command == "serve":
        res = cli("fleet", "serve", "net", "--val", "d.npz", "-o", "run", "--json", name, cwd=work, timeout=120)
        assert_user_error(res, 2, "--json would overwrite the input --val")
    else:
        res = cli("fleet", "join", "127.0.0.1:9", "--data", "d.npz", "-o", "state", "--json", name, cwd=work,
                  timeout=120)
        assert_user_error(res, 2, "--json would overwrite the input --data")
    assert _digest(work) == before
    assert not (work / "run").exists() and not (work / "state").exists()
