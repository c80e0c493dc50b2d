"""Order of held turns: interactive first; then the root caller with the fewest in-flight turns
(its own and all its sub-callers', :mod:`.caller_tree`); then, within that root, the caller with
the fewest in-flight turns of its own; then the turn's rank among its caller's (:mod:`.run_order`:
by default, its run's start: the run that started first goes first); then arrival order.

So root callers share the pool fairly with each other, and the sub-callers of one root share that
root's part fairly among themselves: a caller key's holder that spreads its turns over a hundred
narrowed callers (``team-a/job-1`` ... ``team-a/job-100``) gets the share of one root, ``team-a``,
against a key with one caller (docs/architecture.md "Rules").

Reads: the held turn's service class, its caller's and its root's placed turns right now, its rank
and its arrival number ``seq``. Placed turns are counted in the pool the turn waits for: generative
turns (``State.caller_inflight``, ``State.root_inflight``) for a held generative turn, single-pass
turns (``State.single_pass_inflight``, ``State.single_pass_root_inflight``) for a held single-pass
one (absent = 0). Both caller terms change while turns wait, so the held queues
(:mod:`luftpause.scheduler.core.held`) file turns by class, root and caller and look the keys up
when they pick, instead of fixing them when a turn is filed. A caller flooding the pool thus never
starves another: each placement raises its counts, and the other caller's turn comes first.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from luftpause.scheduler.core.policies.caller_tree import root

if TYPE_CHECKING:
    from luftpause.scheduler.core.events import ServiceClass
    from luftpause.scheduler.core.held import HeldTurn

CLASS_RANK: dict[ServiceClass, int] = {"interactive": 0, "batch": 1}
"""Smaller goes first."""

OrderKey = tuple[int, int, int, float, int]


def order_key(
    turn: HeldTurn, caller_inflight: Mapping[str, int], root_inflight: Mapping[str, int]
) -> OrderKey:
    """``(class rank, root's in-flight turns, caller's in-flight turns, rank, arrival number)``:
    smaller goes first. ``root_inflight`` is keyed by root (:func:`.caller_tree.root`), each the
    sum of ``caller_inflight`` over the callers under it."""
    return (
        CLASS_RANK[turn.service_class],
        root_inflight.get(root(turn.caller), 0),
        caller_inflight.get(turn.caller, 0),
        turn.rank,
        turn.seq,
    )


def first(
    heads: Iterable[HeldTurn | None], caller_inflight: Mapping[str, int], root_inflight: Mapping[str, int]
) -> HeldTurn | None:
    """Which of several queue heads gets a freed slot: the smallest key, ``None`` if all are empty."""
    best: HeldTurn | None = None
    best_key: OrderKey = (0, 0, 0, 0.0, 0)
    for turn in heads:
        if turn is None:
            continue
        key = order_key(turn, caller_inflight, root_inflight)
        if best is None or key < best_key:
            best, best_key = turn, key
    return best
