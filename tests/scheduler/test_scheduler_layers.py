"""The scheduler's shape, checked on its source: no module of it, core or shell, imports another
process's package (the dataplane, the runtime) or the test kit. What it shares with a dataplane
sits beside both (``luftpause.tool_calls``, ``luftpause.v1``, ``luftpause.config``, ...;
docs/architecture.md "Processes"). The core's own purity is ``core/test_core_stays_pure.py``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import luftpause.scheduler

PACKAGE = Path(luftpause.scheduler.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))
OTHER_PROCESSES = ("luftpause.dataplane", "luftpause.runtime", "luftpause.testkit", "luftpause.top")


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
    return names


def test_every_module_of_the_scheduler_is_read() -> None:
    assert PACKAGE / "dataplanes.py" in MODULES and PACKAGE / "core" / "decide.py" in MODULES


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_nothing_is_imported_from_another_process(path: Path) -> None:
    wrong = {
        name
        for name in _imports(path)
        if any(name == other or name.startswith(other + ".") for other in OTHER_PROCESSES)
    }
    assert not wrong, f"{path.relative_to(PACKAGE)} imports {sorted(wrong)}"
