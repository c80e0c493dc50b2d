"""The runtime's parts import only what their package docstrings say they may (issue 16): the
layers of ``luftpause/runtime/__init__.py`` hold, so the path of a spawn is the path the imports
show and no part reaches one above it.

Read from the source with ``ast`` (imports under ``if TYPE_CHECKING:`` are for types only and are
not counted); no module is imported.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from repo_paths import ROOT

RUNTIME = ROOT / "luftpause" / "runtime"

# The part a module belongs to: its subpackage, or the top-level module itself.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "runs": {"errors"},
    "pods": {"errors", "runs"},
    "dataplane": {"errors"},
    "agent": {"errors", "runs", "dataplane"},
    "decide": {"errors", "dataplane"},
    "spawn": {"errors", "runs", "pods", "agent"},
    "mcp": {"errors", "runs", "pods", "dataplane", "agent", "decide", "spawn"},
    "web": {"errors", "runs", "pods"},
    "wiring": {"errors", "runs", "pods", "dataplane", "agent", "decide", "spawn", "mcp"},
    "server": {"errors", "runs", "pods", "dataplane", "agent", "decide", "spawn", "mcp", "web", "wiring"},
}


def _part(path: Path) -> str:
    relative = path.relative_to(RUNTIME)
    return relative.parts[0] if len(relative.parts) > 1 else relative.stem


def _runtime_imports(path: Path) -> list[tuple[int, str]]:
    """``(line, part)`` of each run-time import of a runtime part in ``path``."""
    tree = ast.parse(path.read_text(), str(path))
    type_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            type_only |= {id(child) for stmt in node.body for child in ast.walk(stmt)}
    found = []
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
            if node.module == "luftpause.runtime":
                names = [f"luftpause.runtime.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            parts = name.split(".")
            if parts[:2] == ["luftpause", "runtime"] and len(parts) > 2:
                found.append((node.lineno, parts[2]))
    return found


MODULES = sorted(p for p in RUNTIME.rglob("*.py") if p.name != "__init__.py")


@pytest.mark.parametrize("path", MODULES, ids=[str(p.relative_to(RUNTIME)) for p in MODULES])
def test_a_part_imports_only_the_parts_below_it(path: Path) -> None:
    part = _part(path)
    assert part in ALLOWED, f"{path}: a part the layers do not name; add it to luftpause/runtime/__init__.py"
    wrong = [
        (line, other)
        for line, other in _runtime_imports(path)
        if other != part and other not in ALLOWED[part]
    ]
    assert wrong == [], (
        f"{path.relative_to(RUNTIME)} ({part}) imports {wrong}; it may import {sorted(ALLOWED[part])}"
    )


def test_every_subpackage_says_what_it_owns_and_may_import() -> None:
    for package in sorted(p.parent for p in RUNTIME.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        assert "Owns:" in doc and "May import:" in doc, package
