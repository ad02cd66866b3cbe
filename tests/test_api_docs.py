"""The examples in docs/python-api.md run, in order, in one fresh interpreter (as a user's script)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[1] / "docs" / "python-api.md"


def test_python_api_examples_run(tmp_path):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(encoding="utf-8"), re.S)
    assert len(blocks) >= 4
    script = tmp_path / "examples.py"
    script.write_text("\n".join(blocks))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "bad value 7 for --opset" in proc.stdout
    assert (tmp_path / "digits_int8.onnx").is_file() and (tmp_path / "run1" / "model-symbol.json").is_file()
    assert "0 ['finetune', 'export']" in proc.stdout  # the recipe ran both steps, exit 0
    assert "'epoch'" in proc.stdout  # a progress function received Progress events, an epoch's among them
    assert "epoch 2" in proc.stderr  # by default, the epoch lines reach stderr as on the command line


def test_every_api_function_is_documented_with_an_example():
    import edgetrain
    from edgetrain import api

    text = DOC.read_text(encoding="utf-8")
    functions = [name for name, module in edgetrain._API.items() if module == "api"]
    assert set(functions) >= {"quantize", "export", "finetune", "profile", "inspect", "run", "predict"}
    assert [name for name in functions if f"edgetrain.{name}(" not in text] == []
    assert all(callable(getattr(api, name)) and getattr(api, name).__doc__ for name in functions)


def test_the_readmes_default_normalisation_is_the_codes():
    from edgetrain.preprocess import default_norm

    readme = (DOC.parents[1] / "README.md").read_text(encoding="utf-8")
    grey, colour = default_norm(1), default_norm(3)
    fmt = lambda values: ",".join(f"{v:g}" for v in values)  # noqa: E731
    assert f"mean {fmt(grey[0])}, std {fmt(grey[1])} for one channel" in readme
    assert f"mean {fmt(colour[0])},\n  std {fmt(colour[1])} (ImageNet's) for three" in readme


@pytest.mark.parametrize("value", ["yes", 5, 2.5, True, b"stderr", ["stderr"]])
@pytest.mark.parametrize("function", ["finetune", "quantize", "export", "profile", "predict", "run"])
def test_a_progress_that_is_not_a_function_is_a_usage_error_before_any_work(tmp_path, function, value):
    """The docs promise a bad value raises edgetrain.UsageError, as the CLI prints it (progress=5 raised
    TypeError, issue 37)."""
    import edgetrain

    out = tmp_path / "out"
    call = {"finetune": lambda: edgetrain.finetune("edgetrain.nets:pretrained_digits", "builtin:digits", out,
                                                   progress=value),
            "quantize": lambda: edgetrain.quantize("edgetrain.nets:pretrained_digits", calib="builtin:digits",
                                                   output=out, progress=value),
            "export": lambda: edgetrain.export("edgetrain.nets:pretrained_digits", out, progress=value),
            "profile": lambda: edgetrain.profile("edgetrain.nets:pretrained_digits", progress=value),
            "predict": lambda: edgetrain.predict(tmp_path / "m.onnx", "builtin:digits", output=out, progress=value),
            "run": lambda: edgetrain.run(tmp_path / "r.yaml", rundir=out, progress=value)}[function]
    with pytest.raises(edgetrain.UsageError) as refused:
        call()
    line = refused.value.line()
    assert "for progress: not a function" in line and "(progress=)" in line and "\n" not in line
    assert list(tmp_path.iterdir()) == []


def test_every_python_name_the_readme_and_docs_use_resolves_after_import_edgetrain():
    """`edgetrain.energy.calibrate` (README) raised AttributeError after `import edgetrain` (issue 37, R7). Every
    dotted name under edgetrain the README and docs/ write resolves in a fresh interpreter as a user's script
    would reach it: an attribute chain from `import edgetrain`, or a module for `python -m` (a factory reference
    `edgetrain.nets:name` names its module, which must import)."""
    import json

    texts = [DOC.parents[1] / "README.md", *sorted(DOC.parent.glob("*.md"))]
    attrs, modules = set(), set()
    for path in texts:
        text = path.read_text(encoding="utf-8")
        for m in re.finditer(r"(?<![\w/.-])(edgetrain(?:\.[A-Za-z_]\w*)+)(:?)", text):
            name, factory = m.group(1), m.group(2)
            if name.endswith((".json", ".yaml", ".md", ".py", ".onnx", ".csv")):
                continue  # a file name (PREFIX-edgetrain.json is excluded by the look-behind)
            before = text[max(0, m.start() - 3):m.start()]
            (modules if factory or before == "-m " else attrs).add(name)
    assert "edgetrain.energy.calibrate" in attrs and "edgetrain.UsageError" in attrs, attrs
    probe = ("import importlib, json, sys\n"
             "import edgetrain\n"
             "bad = []\n"
             "for name in json.loads(sys.argv[1]):\n"
             "    obj = edgetrain\n"
             "    try:\n"
             "        for part in name.split('.')[1:]:\n"
             "            obj = getattr(obj, part)\n"
             "    except AttributeError as exc:\n"
             "        bad.append(f'{name}: {exc}')\n"
             "for name in json.loads(sys.argv[2]):\n"
             "    try:\n"
             "        importlib.import_module(name)\n"
             "    except ImportError as exc:\n"
             "        bad.append(f'{name}: {exc}')\n"
             "print(json.dumps(bad))\n")
    proc = subprocess.run([sys.executable, "-c", probe, json.dumps(sorted(attrs)), json.dumps(sorted(modules))],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == []


def test_a_wing_never_hides_an_api_function():
    """A module of the package is reached by attribute only where the face has no such name: `edgetrain.quantize`
    stays the function whatever has been imported (DESIGN.md)."""
    import importlib

    import edgetrain

    for name, module in edgetrain._API.items():
        if module == "api":
            assert callable(getattr(edgetrain, name)), name
            assert importlib.util.find_spec(f"edgetrain.{name}") is None, f"a module named like the API's {name}"
