"""The Python API never coerces a path with str() (issue 26): every function of the face edgetrain/__init__
names (quantize, export, finetune, profile, inspect, run, predict) takes each of its path arguments as str
or os.PathLike, and bytes through os.fsdecode; anything else (None, a number, a list, an empty string) is
one UsageError naming the argument, raised before any work, and nothing is written (before: export(model,
None) wrote a file named "None", bytes became "b'...'" names, predict(output=...) was ignored)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

import edgetrain
from edgetrain.errors import UsageError

BUILTIN = Path(edgetrain.__file__).parent / "_builtin"
PREFIX, ONNX = str(BUILTIN / "digits5"), str(BUILTIN / "digits5.onnx")

# function -> (the call with one argument replaced, the arguments a path may be given in)
SIGNATURES = {
    "quantize": (lambda a: edgetrain.quantize(a.get("model", ONNX), a.get("calib", "builtin:digits"),
                                              a.get("output", "q.onnx"), progress=None,
                                              **({"val": a["val"]} if "val" in a else {})),
                 ("model", "calib", "output", "val")),
    "export": (lambda a: edgetrain.export(a.get("model", "edgetrain.nets:pretrained_digits"), a.get("output", "e.onnx"),
                                          progress=None, **({"data": a["data"]} if "data" in a else {})),
               ("model", "output", "data")),
    "finetune": (lambda a: edgetrain.finetune(a.get("model", PREFIX), a.get("data", "builtin:digits"), a.get("out", "ft"),
                                              epochs=1, progress=None, **({"val": a["val"]} if "val" in a else {})),
                 ("model", "data", "out", "val")),
    "profile": (lambda a: edgetrain.profile(a.get("model", ONNX), runs=1, warmup=0, progress=None,
                                            **({"report": a["report"]} if "report" in a else {})),
                ("model", "report")),
    "inspect": (lambda a: edgetrain.inspect(a.get("model", PREFIX), **({"data": a["data"]} if "data" in a else {})),
                ("model", "data")),
    "run": (lambda a: edgetrain.run(a.get("recipe"), rundir=a.get("rundir"), progress=None), ("recipe", "rundir")),
    "predict": (lambda a: edgetrain.predict(a.get("model", ONNX), a.get("data", "builtin:digits"), progress=None,
                                            **({"output": a["output"]} if "output" in a else {})),
                ("model", "data", "output")),
    "tune": (lambda a: edgetrain.tune(a.get("model", ONNX), a.get("data", "builtin:digits"), a.get("out", "tn"),
                                      grid=a.get("grid", "lr=0.01,0.1"), epochs=1, progress=None),
             ("model", "data", "out")),   # grid is not a path: its bad values are tests/test_tune.py's
}
# positional arguments: None is refused too (a keyword option's None means its default, as on the CLI)
POSITIONAL = {"quantize": ("model", "calib", "output"), "export": ("model", "output"),
              "finetune": ("model", "data", "out"), "profile": ("model",), "inspect": ("model",),
              "run": (), "predict": ("model", "data"), "tune": ("model", "data", "out")}
BAD = {"None": None, "int": 5, "float": 2.5, "list": ["a.onnx"], "empty": "", "blank": "  "}


def test_the_signatures_cover_the_api_face():
    """A new API function must be added here: the promise is for every function __init__ names."""
    api = {name for name, mod in edgetrain._API.items() if mod == "api"}
    assert api == set(SIGNATURES)


def _bad_cases():
    for fn, (_call, params) in SIGNATURES.items():
        for param in params:
            for label, value in BAD.items():
                if value is None and param not in POSITIONAL[fn]:
                    continue
                yield fn, param, label


BAD_CASES = list(_bad_cases())


@pytest.mark.parametrize("case", BAD_CASES, ids=["-".join(c) for c in BAD_CASES])
def test_a_path_argument_that_is_not_a_path_is_one_usage_error(tmp_path, monkeypatch, case):
    fn, param, label = case
    monkeypatch.chdir(tmp_path)
    call, _params = SIGNATURES[fn]
    with pytest.raises(UsageError) as info:
        call({param: BAD[label]})
    line = info.value.line()
    assert "\n" not in line
    assert line.startswith(f"{param} must be a path (str or os.PathLike), not ") or line.startswith(
        f"{param} is an empty path"), line
    assert f"(edgetrain.{fn})" in line, line
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)  # nothing named "None", "5", "['a.onnx']"...


def _missing(kind: str, tmp_path: Path, param: str):
    name = str(tmp_path / f"missing-{param}.{'onnx' if param == 'model' else 'npz'}")
    if param == "recipe":
        name = name[:-4] + ".yaml"
    return {"bytes": os.fsencode(name), "Path": Path(name), "str": name}[kind], name


# a missing input given as bytes or a Path: the error names the decoded path (never "b'...'")
MISSING = [(fn, p) for fn, (_c, params) in SIGNATURES.items() for p in params
           if p in ("model", "calib", "data", "val", "recipe")]


@pytest.mark.parametrize("kind", ["bytes", "Path"])
@pytest.mark.parametrize("case", MISSING, ids=["-".join(c) for c in MISSING])
def test_bytes_and_pathlike_inputs_reach_the_command_decoded(tmp_path, monkeypatch, case, kind):
    fn, param = case
    monkeypatch.chdir(tmp_path)
    value, name = _missing(kind, tmp_path, param)
    call, _params = SIGNATURES[fn]
    with pytest.raises(UsageError) as info:
        call({param: value})
    line = info.value.line()
    assert "b'" not in line and "PosixPath" not in line, line
    assert Path(name).name in line, line


def test_bytes_and_pathlike_outputs_are_the_names_written(tmp_path, monkeypatch):
    """export to bytes and Path names, predict's output as bytes: the files bear the decoded names."""
    monkeypatch.chdir(tmp_path)
    edgetrain.export("edgetrain.nets:pretrained_digits", b"bytes.onnx", progress=None)
    edgetrain.export("edgetrain.nets:pretrained_digits", tmp_path / "path.onnx", progress=None)
    res = edgetrain.predict(os.fsencode(ONNX), b"builtin:digits", output=b"pred.csv", format="csv", progress=None,
                            batch=512)
    assert sorted(os.listdir(tmp_path)) == ["bytes.onnx", "path.onnx", "pred.csv"]
    lines = (tmp_path / "pred.csv").read_text().splitlines()
    assert lines[0].startswith("input,label,top1_label") and len(lines) == 1 + res.samples
    assert edgetrain.inspect(Path(PREFIX)) == edgetrain.inspect(os.fsencode(PREFIX)) == edgetrain.inspect(PREFIX)


def test_predict_output_is_written_in_its_format(tmp_path):
    """predict(output=...) was silently ignored: it now writes what `-o` writes, atomically."""
    for fmt in ("table", "csv", "jsonl"):
        out = tmp_path / f"p.{fmt}"
        res = edgetrain.predict(ONNX, "builtin:digits", output=out, format=fmt, top_k=2, batch=512, progress=None)
        text = out.read_text().splitlines()
        assert len(text) == res.samples + (0 if fmt == "jsonl" else 1), fmt
        assert res.predictions[0]["input"] in text[0 if fmt == "jsonl" else 1]


# --- the rest of the face: the ground functions __init__ names that take a path ------------------------------

def _pre():
    from edgetrain.preprocess import default_for_shape

    return default_for_shape((1, 8, 8))


FACE = {
    "load_gluon": lambda v: edgetrain.load_gluon(v),
    "load_onnx": lambda v: edgetrain.load_onnx(v),
    "parse_model_ref": lambda v: edgetrain.parse_model_ref(v),
    "load_data": lambda v: edgetrain.load_data(v, _pre()),
    "load_device": lambda v: edgetrain.load_device(v),
    "save_prefix": lambda v: edgetrain.save_prefix(edgetrain.load_gluon(PREFIX), v),
}
# the face's other names take no path: classes, results, errors, and functions of numbers or profiles
NO_PATH = {"list_profiles", "detect_host", "compare_outputs", "energy_report", "Preprocess", "Dataset",
           "EdgetrainError", "UsageError", "BudgetExceeded", "RunFailed", "QuantizeOptions", "ExportOptions",
           "FinetuneOptions", "ProfileOptions", "TuneOptions", "Result", "QuantizeResult", "ExportResult", "Progress",
           "Comparison"}


def test_the_face_is_covered():
    assert set(edgetrain._API) == set(SIGNATURES) | set(FACE) | NO_PATH


@pytest.mark.parametrize("label", ["None", "int", "float", "list", "empty"])
@pytest.mark.parametrize("fn", list(FACE))
def test_face_function_refuses_a_path_that_is_not_one(tmp_path, monkeypatch, fn, label):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as info:
        FACE[fn](BAD[label])
    line = info.value.line()
    assert " must be a path (str or os.PathLike), not " in line or "empty" in line, line
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("kind", ["bytes", "Path"])
@pytest.mark.parametrize("fn", [f for f in FACE if f != "save_prefix"])
def test_face_function_decodes_bytes_and_pathlike(tmp_path, fn, kind):
    name = str(tmp_path / "missing.npz")
    with pytest.raises(UsageError) as info:
        FACE[fn](os.fsencode(name) if kind == "bytes" else Path(name))
    assert "b'" not in info.value.line() and "missing.npz" in info.value.line(), info.value.line()


def test_save_prefix_writes_under_the_decoded_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    FACE["save_prefix"](b"bytes")
    FACE["save_prefix"](Path("path"))
    assert sorted(os.listdir(tmp_path)) == sorted(f"{p}-{s}" for p in ("bytes", "path")
                                                  for s in ("symbol.json", "0000.params", "edgetrain.json"))
