"""The pause hold (``policies/pause_hold.py``): a tool-paused interactive run keeps its headroom
slot only for a TTL sized from the pauses its caller showed and the wait a slot of its replica saves
(mode ``cost``, issue 23), so a session cut off in the middle of a tool call gives its slot back
(issue 12) and the long tail of a heavy-tailed tool does not keep slots idle; ``ttl`` (a multiple of
the longest recent pause, the rule before) is kept for measuring."""

from __future__ import annotations

import pytest
from decide_helpers import arrive, feed, finish, make_state, placements

from luftpause.config import parse_config
from luftpause.scheduler.core import Place, RunEnded, Tick, decide
from luftpause.scheduler.core.policies import pause_hold
from luftpause.scheduler.core.policies.pause_hold import PauseHold
from luftpause.scheduler.core.state import State, new_state

TTL = PauseHold(mode="ttl")


@pytest.mark.parametrize(
    ("settings", "run_pauses", "caller_pauses", "expected"),
    [
        (TTL, [], [], 10.0),  # nothing seen yet: the default
        (PauseHold(mode="ttl", default_s=3.0), [], [], 3.0),
        (TTL, [], [0.5, 0.2], 1.0),  # the caller's: 2 x 0.5, at least min_s
        (TTL, [], [2.0, 4.0], 8.0),  # 2 x the longest
        (TTL, [3.0], [20.0], 6.0),  # the run's own pauses win over its caller's
        (TTL, [], [100.0], 60.0),  # at most max_s
        (PauseHold(mode="ttl", factor=1.5, min_s=0.5), [0.1], [], 0.5),
        (PauseHold(mode="pause"), [0.5], [0.5], None),  # held for the whole pause
        (PauseHold(mode="off"), [], [], 10.0),  # no hold at all: holds() says so
    ],
)
def test_the_ttl_of_a_pause(
    settings: PauseHold, run_pauses: list[float], caller_pauses: list[float], expected: float | None
) -> None:
    assert pause_hold.ttl(settings, run_pauses, caller_pauses, saved_s=0.5) == expected
    assert pause_hold.holds(settings) == (settings.mode != "off")


def test_history_keeps_the_last_pauses() -> None:
    history: list[float] = []
    for pause in range(pause_hold.HISTORY + 5):
        pause_hold.remember(history, float(pause))
    pause_hold.remember(history, -1.0)  # a clock that went backwards is no negative pause
    assert len(history) == pause_hold.HISTORY and history[-1] == 0.0 and history[0] == 6.0
    callers: list[float] = []
    for pause in range(pause_hold.CALLER_HISTORY + 3):
        pause_hold.remember(callers, float(pause), pause_hold.CALLER_HISTORY)
    assert len(callers) == pause_hold.CALLER_HISTORY and callers[0] == 3.0


@pytest.mark.parametrize(
    "bad",
    [{"mode": "forever"}, {"min_s": 0.0}, {"min_s": 5.0, "max_s": 1.0}, {"factor": 0.0}, {"worth": 0.0}],
)
def test_bad_settings_are_refused(bad: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        PauseHold(**bad)


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
    """``ttl``: a caller whose runs came back within 0.4 s gets a 1 s hold (2 x 0.4, at least 1 s)."""
    state = make_state([("a", ["m"], 1)])
    state.pause_hold = TTL
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
    state.pause_hold = PauseHold(mode=mode)
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


# -- the cost model (mode "cost", the default) -------------------------------------------------------


@pytest.mark.parametrize(
    ("pauses", "gain_s", "expected"),
    [
        ([0.5] * 10, 1.0, 0.5),  # regular half-second tools: held for all of it
        ([0.5] * 10, 0.4, 0.0),  # ... unless what a return saves is less than the half second idle
        ([1.0, 1.0, 1.0, 60.0], 4.0, 1.0),  # the minute-long tool is not worth its slot
        ([1.0, 1.0, 1.0, 60.0], 400.0, 60.0),  # unless a return saves more than a minute of slot
        ([3.0, 1.0, 2.0], 10.0, 3.0),  # order does not matter
        ([], 5.0, 0.0),
    ],
)
def test_the_best_hold_weighs_the_wait_saved_against_the_slot_kept(
    pauses: list[float], gain_s: float, expected: float
) -> None:
    assert pause_hold.best_hold(pauses, gain_s) == expected


def test_the_best_hold_is_the_largest_value_over_every_hold() -> None:
    """The closed form against the value evaluated directly at every candidate hold."""
    pauses = [0.2, 0.4, 0.4, 1.5, 2.0, 7.0, 30.0, 61.0]
    gain = 3.0

    def value(t: float) -> float:
        back = sum(1 for p in pauses if p <= t) / len(pauses)
        idle = sum(min(p, t) for p in pauses) / len(pauses)
        return gain * back - idle

    candidates = [0.0, *pauses, *(p + 0.05 for p in pauses), *(p - 0.05 for p in pauses)]
    best = max(candidates, key=value)
    assert value(pause_hold.best_hold(pauses, gain)) == pytest.approx(value(best))


@pytest.mark.parametrize(
    ("run_pauses", "caller_pauses", "saved_s", "expected"),
    [
        ([], [], 0.5, 10.0),  # nothing seen yet: the default
        ([], [0.5, 0.5], None, 10.0),  # no turn finished on the replica yet: the default
        ([], [0.5, 0.5], 0.2, 0.5),  # worth 8 x 0.2 s = 1.6 slot-seconds > 0.5 s idle
        ([], [0.5, 0.5], 0.05, 0.0),  # 0.4 slot-seconds < 0.5 s idle: no hold
        ([9.0], [0.5, 0.5], 0.2, 0.5),  # the caller's distribution, which holds the run's own pauses
        ([0.5], [], 0.2, 0.5),  # the run's own while its caller has shown none
        ([], [0.5] * 9 + [500.0], 100.0, 60.0),  # at most max_s
    ],
)
def test_the_cost_ttl(
    run_pauses: list[float], caller_pauses: list[float], saved_s: float | None, expected: float
) -> None:
    assert pause_hold.ttl(PauseHold(), run_pauses, caller_pauses, saved_s) == expected


def test_the_wait_saved_is_a_turn_over_the_slots_and_the_turn_time_a_moving_mean() -> None:
    assert pause_hold.saved_wait(None, 8) is None
    assert pause_hold.saved_wait(4.0, 8) == 0.5
    assert pause_hold.saved_wait(4.0, 0) == 4.0
    mean = pause_hold.learn_turn_time(None, 2.0)
    assert mean == 2.0
    assert pause_hold.learn_turn_time(mean, 12.0) == pytest.approx(3.0)
    assert pause_hold.learn_turn_time(mean, -1.0) == pytest.approx(1.8)  # no negative turn time


def _heavy_tailed_caller(state_pauses: list[float]) -> State:
    """One slot; caller ``ide``'s runs showed ``state_pauses``; its run ``ri`` pauses at 11.0."""
    state = make_state([("a", ["m"], 1)])
    state.caller_pauses["ide"] = list(state_pauses)
    feed(state, [arrive("i1", "ri", at=10.0, caller="ide"), finish("i1", at=11.0, tools=True)])
    return state


def test_a_caller_whose_long_tools_are_rare_holds_only_the_short_ones() -> None:
    """Nine pauses of 0.5 s and one of 60 s, turns of 1 s on a 1-slot replica: a return saves about
    1 s (8 slot-seconds); the 0.5 s pauses are worth holding, the minute is not, so the hold is
    0.5 s, not 2 x 60 s capped at 60 s as under ``ttl``."""
    state = _heavy_tailed_caller([0.5] * 9 + [60.0])
    run = state.runs["ri"]
    assert run.hold_until == pytest.approx(11.5)
    assert state.replicas["a"].reserved_for == {"ri"}
    feed(state, [arrive("b1", "rb", at=11.2, cls="batch", caller="bulk")])
    assert placements(state) == {}
    _, actions = decide(state, Tick(12.0))
    assert actions == [Place("b1", "a")]


def test_a_caller_whose_tools_all_outlast_what_a_return_saves_keeps_no_slot() -> None:
    """Pauses of a minute each against a 1 s wait saved: no hold at all, not even until the next
    tick: the batch turn arriving during the pause is placed at once."""
    state = _heavy_tailed_caller([50.0, 60.0, 70.0])
    run = state.runs["ri"]
    assert run.hold_expired and run.hold_until is None
    assert state.replicas["a"].reserved_for == set()
    feed(state, [arrive("b1", "rb", at=11.2, cls="batch", caller="bulk")])
    assert placements(state) == {"b1": "a"}


def test_the_configuration_names_the_hold_and_its_worth() -> None:
    """``[scheduler] pause_hold`` and ``pause_hold_worth`` reach the core's state."""
    replica = '[[replicas]]\nname = "a"\nurl = "http://x"\nmodels = ["m"]\n'
    default = new_state(parse_config(replica, "f.toml"))
    assert default.pause_hold == PauseHold()
    chosen = new_state(
        parse_config('[scheduler]\npause_hold = "ttl"\npause_hold_worth = 4\n' + replica, "f.toml")
    )
    assert chosen.pause_hold == PauseHold(mode="ttl", worth=4.0)
