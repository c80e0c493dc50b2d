"""The scheduler's core stays pure: no module under ``luftpause/scheduler/core`` imports ``asyncio``,
``grpc``, ``time``, ``os``, ``socket``, ``threading`` or ``random``.

Why: ``decide(state, event) -> (state, actions)`` is a function of its inputs and nothing else.
Time arrives inside events (``at``, ``now``), never from a clock; the network, files, the
environment, threads and chance belong to the shell (:mod:`luftpause.scheduler.host`,
:mod:`luftpause.scheduler.grpc_service`, :mod:`luftpause.scheduler.probes`). That is what lets the
same core be driven step by step by the Hypothesis state machine
(``test_decide_state_machine.py``), run in virtual time by the flood simulation
(:mod:`luftpause.testkit.sim.scheduler`), replay a recorded trace to the same decisions, and never
make a placement wait on IO. One import of a clock or a socket in the core would quietly end all
of that, so the rule is checked here, on the source (every form: ``import x``, ``import x.y``,
``from x import y``, inside functions and ``if TYPE_CHECKING:`` blocks too).
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path

import pytest

import luftpause.scheduler.core

CORE = Path(luftpause.scheduler.core.__file__).parent

FORBIDDEN = frozenset({"asyncio", "grpc", "time", "os", "socket", "threading", "random"})
"""Top-level modules the core may not import (a submodule, ``os.path`` or ``grpc.aio``, counts as
its top-level module)."""


def forbidden_imports(source: str, filename: str = "<source>") -> list[str]:
    """Every import of a :data:`FORBIDDEN` module in ``source``, as ``"line N: os"``, in order.

    Relative imports (``from .time import x``) name modules of the core itself and are allowed.
    Raises :class:`SyntaxError` for source that does not parse.
    """
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found += [(node.lineno, name) for name in names if name.split(".")[0] in FORBIDDEN]
    return [f"line {line}: {name}" for line, name in sorted(found)]


def impure_modules(folder: Path) -> dict[str, list[str]]:
    """Each module under ``folder`` (recursively) that imports a forbidden module, with what it imports."""
    found = {}
    for path in sorted(folder.rglob("*.py")):
        imports = forbidden_imports(path.read_text(encoding="utf-8"), str(path))
        if imports:
            found[str(path.relative_to(folder))] = imports
    return found


def test_no_module_of_the_scheduler_core_imports_io_a_clock_threads_or_chance() -> None:
    modules = list(CORE.rglob("*.py"))
    assert any(path.name == "decide.py" for path in modules), CORE  # the walk found the core
    assert any(path.parent.name == "policies" for path in modules), CORE  # and its subfolders
    assert impure_modules(CORE) == {}


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import os", ["line 1: os"]),
        ("import os.path", ["line 1: os.path"]),
        ("from os import environ", ["line 1: os"]),
        ("from time import monotonic", ["line 1: time"]),
        ("import asyncio as aio", ["line 1: asyncio"]),
        ("import grpc.aio", ["line 1: grpc.aio"]),
        ("from grpc import aio", ["line 1: grpc"]),
        ("import json, socket", ["line 1: socket"]),
        ("def later():\n    import threading\n", ["line 2: threading"]),
        ("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import random\n", ["line 3: random"]),
        ("import time\nimport os\n", ["line 1: time", "line 2: os"]),
    ],
)
def test_the_check_finds_every_form_of_a_forbidden_import(source: str, expected: list[str]) -> None:
    assert forbidden_imports(source) == expected


@pytest.mark.parametrize(
    "source",
    [
        "import dataclasses\nimport heapq\nfrom collections import OrderedDict",
        "from luftpause.scheduler.core.events import Tick",
        "from .time import window",  # a module of the core's own, not the standard library's
        "from . import policies",
        "import timeit_free_name\nimport osmosis\nimport grpcio_free",  # prefixes are not matches
        "t = 'import os'  # text, not an import",
    ],
)
def test_the_check_lets_the_cores_own_imports_through(source: str) -> None:
    assert forbidden_imports(source) == []


def test_a_module_added_to_the_core_that_reads_the_clock_fails_the_check(tmp_path: Path) -> None:
    """The rule applied to a copy of the core with one impure module added, in a subfolder too."""
    copy = tmp_path / "core"
    shutil.copytree(CORE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "deadline.py").write_text("import time\n\n\ndef now() -> float:\n    return time.monotonic()\n")
    (copy / "policies" / "env_knob.py").write_text("from os import environ\n\nKNOB = environ.get('K')\n")
    assert impure_modules(copy) == {
        "deadline.py": ["line 1: time"],
        str(Path("policies") / "env_knob.py"): ["line 1: os"],
    }
