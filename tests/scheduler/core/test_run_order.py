"""The run order (``policies/run_order.py``): among a caller's held turns of one class, the run that
started first goes first (program-level first-come first-served), so that under a flood a replica
serves a few runs at a time and their prefixes stay cached; ``turn`` (arrival order) and ``plas``
(least attained service first) are kept for measuring (issue 12)."""

from __future__ import annotations

import pytest
from decide_helpers import arrive, feed, finish, make_state, placements

from luftpause.scheduler.core import decide
from luftpause.scheduler.core.policies import run_order
from luftpause.scheduler.core.policies.run_order import RunOrder
from luftpause.scheduler.core.state import Run


def _run(order: int, attained: float) -> Run:
    return Run("r", "idle", None, "batch", "", 0.0, order=order, attained_s=attained)


@pytest.mark.parametrize(
    ("mode", "run", "seq", "expected"),
    [
        ("turn", _run(3, 9.0), 17, 17.0),  # arrival order: the turn's own number
        ("run", _run(3, 9.0), 17, 3.0),  # the run's start
        ("plas", _run(3, 9.0), 17, 9.0),  # the run's attained service, seconds
        ("run", None, 17, 17.0),  # no run (a single-pass turn): arrival
        ("plas", None, 5, 5.0),
    ],
)
def test_the_rank_of_a_turn(mode: RunOrder, run: Run | None, seq: int, expected: float) -> None:
    assert run_order.rank(mode, run, seq) == expected


def _flood(mode: RunOrder) -> dict[str, str]:
    """One slot. Run A waits at its first turn behind X, B behind A; A runs, pauses on a tool; B
    runs; C's first turn arrives, then A's second: who gets the slot when B finishes?"""
    state = make_state([("a", ["m"], 1)])
    state.run_order = mode
    feed(
        state,
        [
            arrive("x1", "X", at=0.0, cls="batch"),
            arrive("a1", "A", at=0.1, cls="batch"),
            arrive("b1", "B", at=0.2, cls="batch"),
            finish("x1", at=1.0),  # a1 placed
            finish("a1", at=2.0, tools=True),  # b1 placed; A pauses on a tool
            arrive("c1", "C", at=2.1, cls="batch"),
            arrive("a2", "A", at=2.5, cls="batch"),  # A is back after C's first turn arrived
        ],
    )
    decide(state, finish("b1", at=3.0))
    return placements(state)


@pytest.mark.parametrize(("mode", "placed"), [("run", "a2"), ("turn", "c1"), ("plas", "c1")])
def test_a_run_in_progress_goes_before_a_run_that_started_after_it(mode: RunOrder, placed: str) -> None:
    # plas: C has had no engine time yet, A one second, so C goes first
    assert _flood(mode) == {placed: "a"}


def test_the_run_order_comes_after_class_and_caller() -> None:
    """An interactive turn of a later run still goes before a batch turn of an earlier one, and a
    caller with fewer turns in flight before an earlier run of a busier caller."""
    state = make_state([("a", ["m"], 2)])
    feed(
        state,
        [
            arrive("x1", "X", at=0.0, cls="batch", caller="bulk"),
            arrive("x2", "Y", at=0.1, cls="batch", caller="bulk"),
            arrive("b1", "B", at=0.2, cls="batch", caller="bulk"),  # held, oldest
            arrive("c1", "C", at=0.3, cls="batch", caller="other"),  # held, caller with none in flight
            arrive("i1", "I", at=0.4, caller="ide"),  # held, interactive
        ],
    )
    order = []
    for turn, at in (("x1", 1.0), ("i1", 2.0)):  # bulk still has x2 in flight: "other" goes first
        _, actions = decide(state, finish(turn, at=at))
        order += [a.turn_id for a in actions]  # type: ignore[union-attr]
    assert order == ["i1", "c1"]
