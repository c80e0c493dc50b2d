"""Picking a replica for a turn that may go anywhere: the one with the fewest in-flight turns.

Reads: each candidate's ``inflight`` and its configuration ``index`` (ties go to the replica
configured first, so the choice is deterministic).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica


def pick(candidates: Iterable[Replica]) -> Replica | None:
    """The least loaded of ``candidates`` (all with room), or ``None`` when there are none."""
    best: Replica | None = None
    for replica in candidates:
        if best is None or (replica.inflight, replica.index) < (best.inflight, best.index):
            best = replica
    return best
