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
