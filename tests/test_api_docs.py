"""The examples in docs/python-api.md run, in order, in one fresh interpreter (as a user's script)."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

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


def test_a_progress_that_is_not_a_function_is_refused_before_any_work(tmp_path):
    import pytest

    import edgetrain

    with pytest.raises(TypeError, match="progress must be a function"):
        edgetrain.finetune("edgetrain.nets:pretrained_digits", "builtin:digits", tmp_path / "out", progress="yes")
    assert not (tmp_path / "out").exists()
