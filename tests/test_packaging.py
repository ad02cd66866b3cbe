"""What `pip install .` ships: every package of the source tree (a non-editable install has only these)."""
from __future__ import annotations

import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_every_edgetrain_package_is_shipped():
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "edgetrain").rglob("__init__.py")
             if "__pycache__" not in p.parts}
    found -= {"edgetrain._devices", "edgetrain._recipes"}  # mapped from devices/ and recipes/ (package-dir)
    assert found <= listed, f"not in pyproject's packages: {sorted(found - listed)}"
