"""No module of edgetrain uses another module's private names: a name starting with ``_`` is its own module's
business. A private *module* (``_lazy``, ``_builtin``) belongs to its package and may be imported anywhere
inside that package. Checked over the whole package from the source (ast), so a new reach-in fails here."""
from __future__ import annotations

import ast
from pathlib import Path

import edgetrain

ROOT = Path(edgetrain.__file__).parent


def _module_name(path: Path) -> str:
    rel = path.relative_to(ROOT.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _resolve(current: str, is_package: bool, level: int, module: str | None) -> str:
    if level == 0:
        return module or ""
    base = current.split(".") if is_package else current.split(".")[:-1]
    base = base[:len(base) - (level - 1)]
    return ".".join(base + ([module] if module else []))


def _is_module(dotted: str) -> bool:
    path = ROOT.parent.joinpath(*dotted.split("."))
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def violations() -> list[str]:
    found = []
    for path in sorted(ROOT.rglob("*.py")):
        current = _module_name(path)
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(), str(path))
        modules: dict[str, str] = {}  # local name -> the edgetrain module it is bound to
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _resolve(current, is_package, node.level, node.module)
                if not target.startswith("edgetrain"):
                    continue
                for alias in node.names:
                    dotted = f"{target}.{alias.name}"
                    if _is_module(dotted):
                        modules[alias.asname or alias.name] = dotted
                        owner = target  # a private module is its package's
                        if _private(alias.name) and not (current + ".").startswith(owner + "."):
                            found.append(f"{current}: imports private module {dotted}")
                    elif _private(alias.name):
                        found.append(f"{current}: imports {alias.name} from {target}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("edgetrain") and alias.asname:
                        modules[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
                    and _private(node.attr) and not _is_module(f"{modules[node.value.id]}.{node.attr}")):
                found.append(f"{current}:{node.lineno}: uses {modules[node.value.id]}.{node.attr}")
    return found


def test_no_module_uses_another_modules_private_names():
    assert violations() == []


def test_the_check_finds_a_reach_in(tmp_path):
    """The check itself can fail: a module planted in a copy of the tree that reaches into another is found."""
    import shutil

    global ROOT
    copy = tmp_path / "edgetrain"
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__", "_builtin"))
    (copy / "planted.py").write_text("from .fileio import _nothing\nfrom . import child\nchild._hidden()\n")
    saved, ROOT = ROOT, copy
    try:
        found = violations()
    finally:
        ROOT = saved
    assert "edgetrain.planted: imports _nothing from edgetrain.fileio" in found
    assert any(v.startswith("edgetrain.planted:3: uses edgetrain.child._hidden") for v in found)
