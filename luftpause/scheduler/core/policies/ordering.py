"""Order of held turns: interactive first; then the caller with the fewest in-flight turns; then
the turn's rank among its caller's (:mod:`.run_order`: by default, its run's start: the run that
started first goes first); then arrival order.

Reads: the held turn's service class, its caller's placed turns right now, its rank and its arrival
number ``seq``. A caller's placed turns are counted in the pool the turn waits for: generative turns
(``State.caller_inflight``) for a held generative turn, single-pass turns
(``State.single_pass_inflight``) for a held single-pass one (absent = 0). The caller term changes
while turns wait, so the held queues (:mod:`luftpause.scheduler.core.held`) file turns by class and
caller and look the key up when they pick, instead of fixing it when a turn is filed. A caller
flooding the pool thus never starves another: each placement raises its count, and the other
caller's turn comes first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.events import ServiceClass
    from luftpause.scheduler.core.held import HeldTurn

CLASS_RANK: dict[ServiceClass, int] = {"interactive": 0, "batch": 1}
"""Smaller goes first."""


def order_key(turn: HeldTurn, caller_inflight: Mapping[str, int]) -> tuple[int, int, float, int]:
    """``(class rank, caller's in-flight turns, rank, arrival number)``: smaller goes first."""
    return (CLASS_RANK[turn.service_class], caller_inflight.get(turn.caller, 0), turn.rank, turn.seq)


def first(heads: Iterable[HeldTurn | None], caller_inflight: Mapping[str, int]) -> HeldTurn | None:
    """Which of several queue heads gets a freed slot: the smallest key, ``None`` if all are empty."""
    best: HeldTurn | None = None
    best_key: tuple[int, int, float, int] = (0, 0, 0.0, 0)
    for turn in heads:
        if turn is None:
            continue
        key = order_key(turn, caller_inflight)
        if best is None or key < best_key:
            best, best_key = turn, key
    return best
