"""The startup hold (rule 15) and the counters' balance, each with the input that broke them.

Hold: after a scheduler restart the first dataplane to resync got admissions before the others
had resynced their in-flight turns, so replicas were filled past capacity. Counters: turns
released by a resync were counted nowhere, so the counters did not balance.
"""

from __future__ import annotations

from decide_helpers import arrive, inflight, make_state, probe

from luftpause.scheduler.core import (
    AckResync,
    Action,
    DataplaneLost,
    Event,
    GrantLease,
    Place,
    Resynced,
    State,
    Tick,
    TurnAbandoned,
    decide,
    snapshot,
)


def feed(state: State, events: list[Event]) -> list[Action]:
    out: list[Action] = []
    for event in events:
        state, actions = decide(state, event)
        out.extend(actions)
    return out


def restart() -> State:
    """A restarted scheduler (hold 2 s), one replica of 2 slots; dp1 resyncs one turn at t=0.5."""
    state = make_state([("a", ["m"], 2)], resync_hold_s=2.0)
    feed(state, [Tick(0.0), Resynced("dp1", 0.5, (), (inflight("x1", "rx1", "a"),))])
    return state


def test_after_a_restart_no_turn_is_placed_until_the_others_could_resync() -> None:
    state = restart()
    assert feed(state, [arrive("t1", "r1", at=0.6)]) == []  # room for one, but held
    # dp2 resyncs its own in-flight turn: without the hold, a would now carry 3 turns of 2
    assert feed(state, [Resynced("dp2", 1.0, (), (inflight("x2", "rx2", "a"),))]) == [AckResync("dp2", 0, 1)]
    assert snapshot(state, 1.0)["startup_hold_s"] == 1.0
    assert feed(state, [Tick(2.0)]) == []  # the hold ends; a is full
    assert state.replicas["a"].inflight == 2  # within capacity: t1 waits for a slot, as it should
    assert [t.turn_id for t in state.held] == ["t1"]
    assert not state.holding


def test_held_turns_are_placed_when_the_hold_ends() -> None:
    state = make_state([("a", ["m"], 2), ("b", ["m"], 2)], resync_hold_s=2.0)
    feed(state, [Tick(0.0), Resynced("dp1", 0.5, (), (inflight("x1", "rx1", "a"),))])
    assert feed(state, [arrive("t1", "r1", at=0.6), arrive("t2", "r2", at=0.7)]) == []
    assert feed(state, [Tick(2.0)]) == [Place("t1", "b"), Place("t2", "a")]  # least loaded first
    assert snapshot(state, 2.0)["startup_hold_s"] == 0.0


def test_no_lease_is_granted_in_the_hold() -> None:
    state = make_state([("a", ["m"], 2)], resync_hold_s=2.0)
    feed(state, [Tick(0.0)])
    actions = feed(state, [Resynced("dp1", 0.5, (), (inflight("x1", "rx1", "a"),), takes_leases=True)])
    assert not [a for a in actions if isinstance(a, GrantLease)]
    assert feed(state, [Tick(2.5)]) == [GrantLease("dp1", "a", 1, 1, ("m",))]


def test_a_fresh_start_is_not_held() -> None:
    # empty resyncs show no restart: nothing is in flight anywhere that a later resync could add
    state = make_state([("a", ["m"], 2)], resync_hold_s=2.0)
    feed(state, [Tick(0.0), Resynced("dp1", 0.5, (), ())])
    assert feed(state, [arrive("t1", "r1", at=0.6)]) == [Place("t1", "a")]


def test_a_resync_after_the_hold_window_starts_no_hold() -> None:
    state = make_state([("a", ["m"], 2)], resync_hold_s=2.0)
    feed(state, [Tick(0.0), Resynced("dp1", 2.5, (), (inflight("x1", "rx1", "a"),))])
    assert feed(state, [arrive("t1", "r1", at=2.6)]) == [Place("t1", "a")]


def test_no_hold_when_configured_zero() -> None:
    state = make_state([("a", ["m"], 2)], resync_hold_s=0.0)
    feed(state, [Tick(0.0), Resynced("dp1", 0.0, (), (inflight("x1", "rx1", "a"),))])
    assert feed(state, [arrive("t1", "r1", at=0.0)]) == [Place("t1", "a")]


# -- counters ---------------------------------------------------------------------------------------


def test_turns_released_by_a_resync_are_counted_and_the_counters_balance() -> None:
    state = make_state([("a", ["m"], 2), ("s", ["m"], 1, "single_pass")])
    feed(
        state,
        [
            arrive("t1", "r1"),
            arrive("t2", "r2"),
            arrive("t3", "r3"),  # held
            TurnAbandoned("t3", 0.2),  # abandoned while held
            arrive("t4", "r4", at=0.3),  # held
            # dp lists t2 only: t1 is gone (released); x9 is adopted; t4 was running (held adopted)
            Resynced("dp", 1.0, (), (inflight("t2", "r2", "a"), inflight("t4", "r4", "a"))),
            probe("a", at=1.5, running=1, waiting=1),
        ],
    )
    counters = snapshot(state, 2.0)["counters"]
    assert counters["turns_released_resync"] == 1
    assert counters["held_adopted"] == 1
    assert (counters["abandoned"], counters["abandoned_held"], counters["abandoned_placed"]) == (1, 1, 0)
    (arrived, arrival_fates), (slotted, slot_fates) = state.balance()
    assert arrived == arrival_fates == 4
    assert slotted == slot_fates == 3  # t1, t2 admitted; t4 adopted


def test_turns_released_by_a_lost_dataplane_balance_too() -> None:
    state = make_state([("a", ["m"], 2)])
    feed(state, [arrive("t1", "r1"), DataplaneLost("dp", 1.0), Tick(61.0)])
    assert snapshot(state, 61.0)["counters"]["turns_released_lost_dataplane"] == 1
    assert state.balance() == ((1, 1), (1, 1))
