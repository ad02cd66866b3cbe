"""The package's layout keeps its promises: no wing (subpackage) or module shadows an API function, and
other code uses a wing through its face (``__init__``), never through the wing's inner modules."""
from __future__ import annotations

import ast
import functools
import importlib
import inspect
import json
import subprocess
import sys
from pathlib import Path

import edgetrain

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "edgetrain"
WINGS = ("int8", "measure", "energy", "tuning")
OPTIONAL = {"flwr"}  # the fleet's extra: its modules need it to import (pip install edgetrain[fleet])

IMPORT_EVERYTHING = """
import importlib, inspect, json, pkgutil, sys, types
import edgetrain, edgetrain.api
missing = []
for m in pkgutil.walk_packages(edgetrain.__path__, "edgetrain."):
    if m.name == "edgetrain.__main__" or m.name.endswith(".__main__"):
        continue  # running it starts the CLI
    try:
        importlib.import_module(m.name)
    except ModuleNotFoundError as exc:
        if exc.name not in sys.argv[1:]:
            raise
        missing.append(m.name)
api = {n for n, where in edgetrain._API.items() if where == "api"}
print(json.dumps({
    "api": sorted(api),
    "still_api": sorted(n for n in api if getattr(edgetrain, n) is getattr(edgetrain.api, n)
                        and inspect.isfunction(getattr(edgetrain, n))),
    "shadowed": sorted(n for n in edgetrain._API if isinstance(vars(edgetrain).get(n), types.ModuleType)),
    "imported": sorted(k for k in sys.modules if k.startswith("edgetrain")),
    "missing": missing,
}))
"""


def test_importing_every_module_leaves_the_api_functions_in_place():
    """In a fresh interpreter, import every module and subpackage of edgetrain: ``edgetrain.quantize``,
    ``edgetrain.profile``, ... are still the functions of edgetrain.api, and no name of the API is a module."""
    proc = subprocess.run([sys.executable, "-c", IMPORT_EVERYTHING, *OPTIONAL], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"quantize", "export", "finetune", "profile", "inspect", "run", "predict"} <= set(out["api"])
    assert out["still_api"] == out["api"]
    assert out["shadowed"] == []
    assert {f"edgetrain.{w}" for w in WINGS} <= set(out["imported"])


def test_no_module_or_wing_is_named_like_an_api_name():
    names = {p.stem for p in PACKAGE.glob("*.py")} | {p.name for p in PACKAGE.iterdir() if p.is_dir()}
    assert not names & set(edgetrain._API), sorted(names & set(edgetrain._API))


def _face_names(face: Path) -> tuple[set[str], set[str]]:
    """(``__all__``, the names the face imports for type checkers) of a wing's ``__init__``."""
    tree = ast.parse(face.read_text(encoding="utf-8"))
    declared = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_FACE" for t in node.targets):
            declared = set(ast.literal_eval(node.value))
    typed = {a.asname or a.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 1
             for a in node.names}
    return declared, typed


def test_each_wing_face_names_what_it_hands_on():
    """``__all__`` of a face is its table, each name resolves in the wing, and the names imported for type
    checkers are the same names (so a reader and mypy see what the table hands on)."""
    for wing in WINGS:
        face = importlib.import_module(f"edgetrain.{wing}")
        declared, typed = _face_names(PACKAGE / wing / "__init__.py")
        assert sorted(declared) == face.__all__, wing
        assert typed == declared, (wing, sorted(typed ^ declared))
        for name in face.__all__:
            value = getattr(face, name)
            if inspect.isfunction(value) or inspect.isclass(value):
                assert value.__module__.startswith(f"edgetrain.{wing}."), (wing, name, value.__module__)


def _inner_imports(path: Path) -> list[str]:
    """The wing-inner modules that ``path`` imports, as dotted names (``edgetrain.int8.search``)."""
    rel = path.relative_to(REPO)
    here = ["edgetrain", *rel.parts[1:-1]] if rel.parts[0] == "edgetrain" else []
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for t in targets:
            parts = t.split(".")
            if len(parts) >= 3 and parts[0] == "edgetrain" and parts[1] in WINGS \
                    and (PACKAGE / parts[1] / f"{parts[2]}.py").exists():
                found.append(".".join(parts[:3]))
    return found


def test_other_code_uses_a_wing_through_its_face():
    """Outside a wing (edgetrain/, tools/), nothing imports the wing's inner modules."""
    offenders = []
    for path in sorted([*PACKAGE.rglob("*.py"), *(REPO / "tools").rglob("*.py")]):
        rel = path.relative_to(REPO)
        wing = rel.parts[1] if rel.parts[0] == "edgetrain" and len(rel.parts) > 2 else None
        for name in _inner_imports(path):
            if name.split(".")[1] != wing:
                offenders.append(f"{rel}: {name}")
    assert offenders == []


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@functools.lru_cache(maxsize=None)
def _face_modules(package: str) -> dict[str, str]:
    """A wing's face: name -> the module of the wing that defines it (its ``_FACE``/``_API`` mapping)."""
    init = PACKAGE.parent.joinpath(*package.split("."), "__init__.py")
    for node in ast.walk(ast.parse(init.read_text())) if init.is_file() else ():
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") in ("_FACE", "_API") for t in node.targets):
            return {k: f"{package}.{v}" for k, v in ast.literal_eval(node.value).items()}
    return {}


def _imports_run(path: Path, known: set[str]) -> set[str]:
    """The edgetrain modules ``path`` imports when it runs, at any depth (a function's lazy import too, and
    through a wing's face the module that defines the name; not what only a type checker reads, under
    ``if TYPE_CHECKING:``)."""
    me = _module_of(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    out: set[str] = set()

    def visit(node) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            base = ".".join(p for p in (base, node.module or "") if p)
            face = _face_modules(base) if base.startswith("edgetrain") else {}
            for a in node.names:   # `from . import x`: the submodule x where there is one
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base)
                if a.name in face:
                    out.add(face[a.name])
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in out if m in known and m != me}


def test_no_import_circle():
    """No module imports, at any depth, a module that imports it back (lazy imports count: a circle written
    with them still ties the two places together, and says one of them is in the wrong home)."""
    paths = {_module_of(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: _imports_run(p, set(paths)) for m, p in paths.items()}
    circles, done = [], set()
    for start in sorted(graph):   # each module's reach; a circle is a module that reaches itself
        seen, stack = set(), [(start, [start])]
        while stack:
            node, trail = stack.pop()
            for nxt in sorted(graph[node]):
                if nxt == start and frozenset(trail) not in done:
                    done.add(frozenset(trail))
                    circles.append(" -> ".join(trail + [start]))
                elif nxt not in seen and nxt != start:
                    seen.add(nxt)
                    stack.append((nxt, trail + [nxt]))
    assert circles == []
