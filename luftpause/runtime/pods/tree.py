"""The shape limits of run trees: depth, running children per run, and pod names.

A run tree is at most ``[runtime] max_depth`` levels deep (a caller's run is level 1; each run's
level is fixed at spawn and journaled as a ``pod`` record, never recomputed from ancestors that may
have left the registry) and a run has at most ``[runtime] max_children`` running children (idle
ones hold nothing; a ``send`` re-opening one counts it again and is refused at the limit); beyond
them ``spawn`` is refused with the limit and its configuration key. Names are 1-64 printable
characters, never starting ``run-`` (kept for handles), unique among a spawner's running and idle
children.

Journal record::

    {"type": "pod", "handle", "depth"}      a run's level in its tree, fixed at spawn
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from luftpause.runtime.errors import PodRefused
from luftpause.runtime.runs.changes import NetworkChanges
from luftpause.runtime.runs.record import Run
from luftpause.runtime.runs.spec import MAX_NAME_CHARS
from luftpause.runtime.runs.store import Record, RecordStore

POD = "pod"
"""Journal record ``{"type": "pod", "handle", "depth"}``: a run's level in its tree, fixed at spawn."""


class TreeLimits:
    """Depths of the held runs and the checks of the module docstring; a run listener of the
    registry (it journals and replays the depths)."""

    record_types = frozenset({POD})

    def __init__(
        self, max_depth: int, max_children: int, journal: RecordStore | None, changes: NetworkChanges
    ) -> None:
        self.max_depth = max_depth
        self.max_children = max_children
        self.journal = journal
        self.changes = changes
        self.depths: dict[str, int] = {}
        """Each held run's level in its tree (1: a caller's run), fixed at spawn and journaled."""

    def depth(self, run: Run | None) -> int:
        """``run``'s level in its tree, as fixed at its spawn (a caller's run is 1; ``None``: 0).
        Never walked through ancestors, which may have left the registry; a run spawned before
        depths were kept counts as deep as the limit, so it spawns nothing more."""
        if run is None:
            return 0
        return self.depths.get(run.handle, self.max_depth)

    def check_spawn(self, parent: Run | None, name: str | None, siblings: Sequence[Run]) -> int:
        """Check a spawn under ``parent`` (``None``: by an MCP caller, ``siblings`` its top-level
        runs; else the parent's children): the depth and children limits, and ``name`` free among
        the running and idle ``siblings``. Returns the new run's level. Raises :class:`PodRefused`."""
        level = self.depth(parent) + 1
        if level > self.max_depth:
            raise PodRefused(
                f"depth limit: the new run would be at level {level} of its tree, beyond "
                f"[runtime] max_depth = {self.max_depth}"
            )
        self.check_running_children(parent, siblings)
        if name is not None:
            check_name(name)
            if any(r.name == name for r in siblings if r.pod_state != "stopped"):
                raise PodRefused(f"name {name!r} is taken among the spawner's running or idle children")
        return level

    def check_running_children(self, parent: Run | None, children: Sequence[Run]) -> None:
        """Refuse one more running child of ``parent`` beyond ``max_children`` (an MCP caller's
        top-level runs are not limited)."""
        if parent is None:
            return
        running = [r for r in children if r.pod_state == "running"]
        if len(running) >= self.max_children:
            raise PodRefused(
                f"children limit: run {parent.handle} has {len(running)} running children, "
                f"[runtime] max_children = {self.max_children}; wait for one to answer or stop one"
            )

    def record(self, run: Run, level: int) -> None:
        """Fix the new ``run``'s level (journaled)."""
        self.depths[run.handle] = level
        self.changes.bump()
        if self.journal is not None:
            self.journal.append({"type": POD, "handle": run.handle, "depth": level})

    # --- the run listener ------------------------------------------------------------------------

    def replay(self, record: Record) -> None:
        if record.get("type") != POD:
            return
        self.depths[str(record["handle"])] = int(record["depth"])  # raises: counted as damage

    def replayed(self, runs: Mapping[str, Run]) -> None:
        pass

    def run_ended(self, run: Run) -> None:
        pass

    def run_dropped(self, handle: str) -> None:
        self.depths.pop(handle, None)

    def snapshot(self) -> Iterable[Record]:
        for handle, depth in self.depths.items():
            yield {"type": POD, "handle": handle, "depth": depth}


def check_name(name: str) -> None:
    """Refuse a pod name that is not 1-64 printable characters without spaces at either end, holds
    a lone surrogate, or starts ``run-`` (kept for handles). Raises :class:`PodRefused`."""
    if not name or len(name) > MAX_NAME_CHARS or not name.isprintable() or name != name.strip():
        raise PodRefused(
            f"name {name!r}: expected 1 to {MAX_NAME_CHARS} printable characters, "
            "without spaces at either end"
        )
    if any(0xD800 <= ord(c) <= 0xDFFF for c in name):
        raise PodRefused(f"name {name!r}: not valid Unicode text (a lone surrogate)")
    if name.startswith("run-"):
        raise PodRefused(f"name {name!r}: names starting with 'run-' are kept for handles")
