"""The pause hold (``policies/pause_hold.py``): a tool-paused interactive run keeps its headroom
slot only for a TTL learned from the pauses its run or caller showed, so a session cut off in the
middle of a tool call gives its slot back (issue 12)."""

from __future__ import annotations

import pytest
from decide_helpers import arrive, feed, finish, make_state, placements

from luftpause.scheduler.core import Place, RunEnded, Tick, decide
from luftpause.scheduler.core.policies import pause_hold
from luftpause.scheduler.core.policies.pause_hold import PauseHold


@pytest.mark.parametrize(
    ("settings", "run_pauses", "caller_pauses", "expected"),
    [
        (PauseHold(), [], [], 10.0),  # nothing seen yet: the default
        (PauseHold(default_s=3.0), [], [], 3.0),
        (PauseHold(), [], [0.5, 0.2], 1.0),  # the caller's: 2 x 0.5, at least min_s
        (PauseHold(), [], [2.0, 4.0], 8.0),  # 2 x the longest
        (PauseHold(), [3.0], [20.0], 6.0),  # the run's own pauses win over its caller's
        (PauseHold(), [], [100.0], 60.0),  # at most max_s
        (PauseHold(factor=1.5, min_s=0.5), [0.1], [], 0.5),
        (PauseHold(mode="pause"), [0.5], [0.5], None),  # held for the whole pause
        (PauseHold(mode="off"), [], [], 10.0),  # no hold at all: holds() says so
    ],
)
def test_the_ttl_of_a_pause(
    settings: PauseHold, run_pauses: list[float], caller_pauses: list[float], expected: float | None
) -> None:
    assert pause_hold.ttl(settings, run_pauses, caller_pauses) == expected
    assert pause_hold.holds(settings) == (settings.mode != "off")


def test_history_keeps_the_last_pauses() -> None:
    history: list[float] = []
    for pause in range(pause_hold.HISTORY + 5):
        pause_hold.remember(history, float(pause))
    pause_hold.remember(history, -1.0)  # a clock that went backwards is no negative pause
    assert len(history) == pause_hold.HISTORY and history[-1] == 0.0 and history[0] == 6.0


@pytest.mark.parametrize(
    "bad", [{"mode": "forever"}, {"min_s": 0.0}, {"min_s": 5.0, "max_s": 1.0}, {"factor": 0.0}]
)
def test_bad_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        PauseHold(**bad)  # type: ignore[arg-type]


def test_a_session_cut_off_in_a_tool_call_gives_its_slot_back_at_its_ttl() -> None:
    """One slot: an interactive run pauses on a tool and never comes back; the batch turn held
    behind its headroom is placed at the first tick past the default TTL (10 s), not after 30 min."""
    state = make_state([("a", ["m"], 1)])
    feed(state, [arrive("i1", "ri", at=0.0), finish("i1", at=1.0, tools=True)])
    assert state.replicas["a"].reserved_for == {"ri"}
    actions = feed(state, [arrive("b1", "rb", at=2.0, cls="batch", caller="bulk"), Tick(10.9)])
    assert actions == [] and placements(state) == {}
    _, actions = decide(state, Tick(11.0))
    assert actions == [Place("b1", "a")]
    run = state.runs["ri"]
    assert run.phase == "tool_paused" and run.last_replica == "a" and run.hold_expired
    assert state.replicas["a"].reserved_for == set()
    # when it does come back it is still pinned to its replica, and goes first there
    feed(
        state, [arrive("i2", "ri", at=12.0), arrive("b2", "rb2", at=12.5, cls="batch"), finish("b1", at=13.0)]
    )
    assert placements(state) == {"i2": "a"}


def test_the_hold_is_learned_from_the_callers_pauses() -> None:
    """A caller whose runs came back within 0.4 s gets a 1 s hold (2 x 0.4, at least 1 s)."""
    state = make_state([("a", ["m"], 1)])
    feed(
        state,
        [
            arrive("i1", "r1", at=0.0, caller="ide"),
            finish("i1", at=1.0, tools=True),
            arrive("i2", "r1", at=1.4, caller="ide"),  # back after 0.4 s
            finish("i2", at=2.0),
            RunEnded("r1", 2.1),
            arrive("i3", "r2", at=3.0, caller="ide"),
            finish("i3", at=4.0, tools=True),  # this session is cut off
            arrive("b1", "rb", at=4.1, cls="batch", caller="bulk"),
        ],
    )
    assert state.caller_pauses["ide"] == pytest.approx([0.4])
    assert state.runs["r2"].hold_until == pytest.approx(5.0)
    assert placements(state) == {}
    _, actions = decide(state, Tick(5.0))
    assert actions == [Place("b1", "a")]


def test_a_run_that_comes_back_within_its_hold_finds_its_slot() -> None:
    state = make_state([("a", ["m"], 1)])
    feed(state, [arrive("i1", "ri", at=0.0), finish("i1", at=1.0, tools=True)])
    feed(state, [arrive("b1", "rb", at=1.5, cls="batch"), Tick(2.0), arrive("i2", "ri", at=2.5)])
    assert placements(state) == {"i2": "a"}  # the kept slot was there for it
    assert state.runs["ri"].pauses == pytest.approx([1.5])


def test_a_run_that_ends_gives_its_slot_back_at_once() -> None:
    state = make_state([("a", ["m"], 1)])
    feed(
        state,
        [
            arrive("i1", "ri", at=0.0),
            finish("i1", at=1.0, tools=True),
            arrive("b1", "rb", at=1.5, cls="batch"),
        ],
    )
    _, actions = decide(state, RunEnded("ri", 2.0))
    assert Place("b1", "a") in actions


@pytest.mark.parametrize(("mode", "placed_at_11"), [("pause", False), ("off", True)])
def test_the_modes_that_measure_the_hold(mode: str, placed_at_11: bool) -> None:
    """``pause``: held for the whole pause (as before the TTL); ``off``: no headroom at all."""
    state = make_state([("a", ["m"], 1)])
    state.pause_hold = PauseHold(mode=mode)  # type: ignore[arg-type]
    feed(
        state,
        [
            arrive("i1", "ri", at=0.0),
            finish("i1", at=1.0, tools=True),
            arrive("b1", "rb", at=2.0, cls="batch"),
        ],
    )
    feed(state, [Tick(11.0), Tick(600.0)])
    assert ("b1" in state.placed) == placed_at_11
