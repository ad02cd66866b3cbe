"""Every environment variable edgetrain reads is declared once (edgetrain.envvars) and documented in the
README; the code reads them only through envvars.get, so a new variable cannot go undeclared."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import edgetrain
from edgetrain import envvars

ROOT = Path(edgetrain.__file__).parent
README = Path(__file__).resolve().parents[1] / "README.md"   # the checkout's, not beside the installed package


def _sources() -> dict[Path, str]:
    return {p: p.read_text() for p in ROOT.rglob("*.py") if p.name != "envvars.py"}


def test_the_code_reads_the_environment_only_through_envvars():
    direct = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p, text in _sources().items()
              for m in re.finditer(r"(os\.environ\.get|os\.getenv)\(\s*\"?([A-Z_]+)", text)
              if m.group(2) not in envvars.PASSED_THROUGH]
    assert direct == []


def test_every_declared_variable_is_read_somewhere():
    text = "\n".join(_sources().values())
    unread = [name for name in envvars.DECLARED if name not in text]
    assert unread == []


def test_the_readme_documents_exactly_the_declared_variables():
    table = dict(re.findall(r"^\| `([A-Z_]+)` \| (.+) \|$", README.read_text(encoding="utf-8"), flags=re.M))
    assert table == envvars.DECLARED


def test_an_undeclared_variable_is_a_bug():
    with pytest.raises(KeyError, match="EDGETRAIN_NOT_A_THING is not declared"):
        envvars.get("EDGETRAIN_NOT_A_THING")
