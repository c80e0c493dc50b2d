"""The dataplane's shape, checked on its source (as the scheduler's core is): it imports nothing of
the scheduler; its relay machine does no IO and reads no clock; no part is handed a callback after
it was built (``x.on_... = ...`` from outside); the turn's stages are frozen."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import luftpause.dataplane
from luftpause.dataplane.turn import Admitted, Relayed, Turn

PACKAGE = Path(luftpause.dataplane.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
    return names


def test_the_folders_are_the_four_groups() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert {"intake", "relay", "link", "server"} <= folders
    assert (PACKAGE / "wiring.py").is_file()


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_nothing_is_imported_from_the_scheduler(path: Path) -> None:
    assert not {name for name in _imports(path) if name.startswith("luftpause.scheduler")}


def test_the_relay_machine_does_no_io_and_reads_no_clock() -> None:
    imported = _imports(PACKAGE / "relay" / "machine.py")
    roots = {name.split(".")[0] for name in imported}
    assert not roots & {"asyncio", "socket", "time", "granian", "grpc", "httptools", "selectors"}
    assert not {
        name
        for name in imported
        if name.startswith(("luftpause.dataplane.server", "luftpause.dataplane.link"))
    }
    source = (PACKAGE / "relay" / "machine.py").read_text()
    assert "async def" not in source and "await " not in source


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_no_callback_is_assigned_to_a_part_after_it_was_built(path: Path) -> None:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if (
                    isinstance(target, ast.Attribute)
                    and target.attr.startswith("on_")
                    and not (isinstance(target.value, ast.Name) and target.value.id == "self")
                ):
                    raise AssertionError(
                        f"{path.name}:{node.lineno}: {ast.unparse(target)} assigned from outside"
                    )


@pytest.mark.parametrize("stage", [Turn, Admitted, Relayed])
def test_the_turns_stages_are_frozen(stage: type) -> None:
    assert dataclasses.is_dataclass(stage)
    assert stage.__dataclass_params__.frozen  # type: ignore[attr-defined]
