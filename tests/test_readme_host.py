"""The README's own-Gluon-model example runs as written, in a fresh interpreter, with whatever numpy this
environment has (CI runs it on numpy 1.23 and on numpy 2): its script, then its export command."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from clitools import run_edgetrain

README = Path(__file__).resolve().parents[1] / "README.md"


def _example() -> tuple[str, str]:
    text = README.read_text(encoding="utf-8")
    start = text.index("Your own Gluon model, on the host")
    script = re.search(r"```python\n(.*?)```", text[start:], re.S).group(1)
    command = re.search(r"```sh\n(.*?)```", text[start:], re.S).group(1).strip()
    return script, command


def test_the_readmes_own_model_example_runs_as_written(tmp_path):
    script, command = _example()
    assert script.splitlines()[0].startswith("import edgetrain")
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "mynet-symbol.json").is_file() and (tmp_path / "mynet-0000.params").is_file()
    args = command.split()
    assert args[0] == "edgetrain"
    res = run_edgetrain(*args[1:], cwd=tmp_path)
    assert res.code == 0, res.err
    assert (tmp_path / "mynet.onnx").is_file()
