"""The dataplane's shape, checked on its source (as the scheduler's core is): it imports nothing of
the scheduler; its four groups are layers; its relay machine does no IO and reads no clock; no part
is handed a callback after it was built (``x.on_... = ...`` from outside); the turn's stages are
frozen.

The layers, bottom up (each may import those below it, never one above):

* shared: the top-level modules but ``wiring`` and ``command`` (``turn``, ``runs``, ``asgi``,
  ``errors``, ``sse``), ``apis/`` and ``observe/``: no group;
* ``intake/``: what a request becomes;
* ``link/``: the scheduler link (its replica set plans the front doors: intake);
* ``relay/``: one turn's answer (it reports to the link);
* ``server/``: the routes and a turn's whole life;
* ``wiring``: builds them all;
* ``command``: ``luftpause dataplane``, which serves what ``wiring`` built.

Imports under ``if TYPE_CHECKING:`` are left out: they name a type and run nothing (``turn.py``'s
``Relayed`` names the relay machine's ``Outcome``)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import luftpause.dataplane
from luftpause.dataplane.turn import Admitted, Relayed, Turn

PACKAGE = Path(luftpause.dataplane.__file__).parent
MODULES = sorted(PACKAGE.rglob("*.py"))


_TYPE_CHECKING = ("TYPE_CHECKING", "typing.TYPE_CHECKING")


def _imports(path: Path, typing_too: bool = True) -> set[str]:
    """Every module ``path`` imports, at its top or inside a function; without those under
    ``if TYPE_CHECKING:`` unless ``typing_too``."""
    tree = ast.parse(path.read_text())
    left_out: set[int] = set()
    if not typing_too:
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and ast.unparse(node.test) in _TYPE_CHECKING:
                left_out.update(id(inner) for stmt in node.body for inner in ast.walk(stmt))
    names: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in left_out:
            continue
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None:
            names.add(node.module)
    return names


LAYERS = ["intake", "link", "relay", "server"]
"""The four groups, bottom up; the shared modules are below them all, ``wiring`` and ``command``
above."""
TOP = ["wiring", "command"]


def _layer(module: str) -> int:
    """Where a module of the dataplane (dotted, ``luftpause.dataplane.`` dropped) stands: -1 shared,
    0-3 the groups in :data:`LAYERS`, 4 ``wiring``, 5 ``command``."""
    order = [*LAYERS, *TOP]
    head = module.split(".")[0]
    return order.index(head) if head in order else -1


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def test_the_folders_are_the_four_groups() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert {"intake", "relay", "link", "server"} <= folders
    assert (PACKAGE / "wiring.py").is_file()


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_nothing_is_imported_from_the_scheduler(path: Path) -> None:
    assert not {name for name in _imports(path) if name.startswith("luftpause.scheduler")}


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_each_group_imports_only_the_groups_below_it(path: Path) -> None:
    here = _layer(_module(path))
    above = sorted(
        name
        for name in _imports(path, typing_too=False)
        if name.startswith("luftpause.dataplane.")
        and _layer(name.removeprefix("luftpause.dataplane.")) > here
    )
    where = "shared" if here < 0 else [*LAYERS, *TOP][here]
    assert not above, f"{_module(path)} ({where}) imports {above}, above it (shared, {LAYERS}, {TOP})"


def test_the_layers_know_every_folder() -> None:
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert folders == {*LAYERS, "apis", "observe"}, "a new folder: give it its place in LAYERS"


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
