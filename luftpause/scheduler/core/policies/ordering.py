"""Order of held turns: arrival order.

Reads: the held turn's arrival number ``seq``. The key is fixed when a turn is filed (queues are
heaps on it); a policy that orders by service class first would return ``(class rank, seq)`` here.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.held import HeldTurn


def order_key(turn: HeldTurn) -> tuple[int, ...]:
    """Smaller goes first."""
    return (turn.seq,)


def first(heads: Iterable[HeldTurn | None]) -> HeldTurn | None:
    """Which of several queue heads gets a freed slot: the smallest key, ``None`` if all are empty."""
    best: HeldTurn | None = None
    best_key: tuple[int, ...] = ()
    for turn in heads:
        if turn is None:
            continue
        key = order_key(turn)
        if best is None or key < best_key:
            best, best_key = turn, key
    return best
