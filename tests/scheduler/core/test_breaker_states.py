"""The circuit breaker's states (rule 17 of decide, luftpause.scheduler.core.policies.breaker):
each transition, the failure window and the half-open trial limit."""

from __future__ import annotations

import pytest
from decide_helpers import arrive, fail, feed, finish, held_turns, make_state, placements, probe

from luftpause.scheduler.core import BreakerChanged, Place, State, TurnFailed, snapshot
from luftpause.scheduler.core.policies import breaker
from luftpause.scheduler.core.policies.breaker import Settings, Transition
from luftpause.scheduler.core.policies.limits import Protection
from luftpause.scheduler.core.state import Replica


def _replica(state: str = "closed", faults: tuple[float, ...] = (), opened_at: float = 0.0) -> Replica:
    replica = make_state([("a", ["m"], 4)]).replicas["a"]
    replica.breaker = state  # type: ignore[assignment]
    replica.fault_times.extend(faults)
    replica.opened_at = opened_at
    return replica


ON = Settings(failures=3, window_s=10.0, open_s=5.0, success_threshold=2, trial_turns=1)

# (case, replica's state, its fault times, opened at, what happens, settings, transition, state after)
CASES = [
    ("closed: a failure below the threshold", "closed", (1.0,), 0.0, ("fail", 2.0), ON, None, "closed"),
    (
        "closed: the threshold within the window opens",
        "closed",
        (1.0, 2.0),
        0.0,
        ("fail", 3.0),
        ON,
        Transition("closed", "open", "3 failed turns within 10 s"),
        "open",
    ),
    (
        "closed: failures older than the window do not count",
        "closed",
        (1.0, 2.0),
        0.0,
        ("fail", 11.5),
        ON,
        None,
        "closed",
    ),
    ("closed: a client leaving is no failure", "closed", (1.0, 2.0), 0.0, ("left", 3.0), ON, None, "closed"),
    ("closed: the breaker off counts nothing", "closed", (), 0.0, ("fail", 3.0), Settings(), None, "closed"),
    (
        "closed: an unreachable engine opens at once, even off",
        "closed",
        (),
        0.0,
        ("unreachable", 3.0),
        Settings(),
        Transition("closed", "open", "engine unreachable"),
        "open",
    ),
    ("closed: a probe changes nothing", "closed", (), 0.0, ("probe", 3.0), ON, None, "closed"),
    (
        "open: a healthy probe before open_s leaves it open",
        "open",
        (),
        10.0,
        ("probe", 14.9),
        ON,
        None,
        "open",
    ),
    (
        "open: a healthy probe after open_s makes it half-open",
        "open",
        (),
        10.0,
        ("probe", 15.0),
        ON,
        Transition("open", "half_open", "a healthy probe"),
        "half_open",
    ),
    ("open: an unhealthy probe leaves it open", "open", (), 10.0, ("sick", 20.0), ON, None, "open"),
    ("open: a failure changes nothing", "open", (), 10.0, ("fail", 20.0), ON, None, "open"),
    (
        "half-open: a trial turn failing opens it again",
        "half_open",
        (),
        10.0,
        ("fail", 20.0),
        ON,
        Transition("half_open", "open", "a trial turn failed"),
        "open",
    ),
    (
        "half-open: an unhealthy probe opens it again",
        "half_open",
        (),
        10.0,
        ("sick", 20.0),
        ON,
        Transition("half_open", "open", "an unhealthy probe"),
        "open",
    ),
    (
        "half-open: one success below the threshold",
        "half_open",
        (),
        10.0,
        ("finish", 20.0),
        ON,
        None,
        "half_open",
    ),
    (
        "half-open: the only success needed closes it",
        "half_open",
        (),
        10.0,
        ("finish", 20.0),
        Settings(failures=3, success_threshold=1),
        Transition("half_open", "closed", "1 trial turns finished"),
        "closed",
    ),
    (
        "half-open: a client leaving is no failure",
        "half_open",
        (),
        10.0,
        ("left", 20.0),
        ON,
        None,
        "half_open",
    ),
]


def _apply(replica: Replica, what: str, at: float, settings: Settings) -> Transition | None:
    match what:
        case "fail":
            return breaker.failed(replica, True, at, settings)
        case "left":
            return breaker.failed(replica, False, at, settings)
        case "unreachable":
            return breaker.failed(replica, True, at, settings, unreachable=True)
        case "finish":
            return breaker.finished(replica, settings)
        case "probe" | "sick":
            return breaker.probed(replica, what == "probe", at, settings)
    raise AssertionError(what)


@pytest.mark.parametrize(
    ("state", "faults", "opened_at", "event", "settings", "transition", "after"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_each_transition(
    state: str,
    faults: tuple[float, ...],
    opened_at: float,
    event: tuple[str, float],
    settings: Settings,
    transition: Transition | None,
    after: str,
) -> None:
    replica = _replica(state, faults, opened_at)
    assert _apply(replica, *event, settings) == transition
    assert replica.breaker == after
    if transition is not None and after == "open":
        assert replica.opened_at == event[1] and replica.failures == 0


def test_a_half_open_breaker_closes_after_success_threshold_trials_in_a_row_only() -> None:
    replica = _replica("half_open")
    assert breaker.finished(replica, ON) is None
    assert breaker.finished(replica, ON) == Transition("half_open", "closed", "2 trial turns finished")
    # a failure between the trials starts them again (open, then half-open afresh)
    replica = _replica("half_open")
    breaker.finished(replica, ON)
    breaker.failed(replica, True, 1.0, ON)
    breaker.probed(replica, True, 6.0, ON)
    assert replica.breaker == "half_open" and breaker.finished(replica, ON) is None


@pytest.mark.parametrize(
    ("settings", "error"),
    [
        (dict(failures=-1), "breaker_failures"),
        (dict(window_s=0.0), "breaker_window_s"),
        (dict(open_s=-1.0), "breaker_open_s"),
        (dict(success_threshold=0), "breaker_success_threshold"),
        (dict(trial_turns=0), "breaker_trial_turns"),
    ],
)
def test_settings_out_of_range_are_refused(settings: dict[str, float], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        Settings(**settings)  # type: ignore[arg-type]


# -- through decide ---------------------------------------------------------------------------------


def _two(protection: Protection, cap: int = 4) -> State:
    state = make_state([("a", ["m"], cap), ("b", ["m"], cap)])
    state.protection = protection
    return state


def test_a_half_open_replica_takes_its_trial_turns_only_the_others_go_elsewhere() -> None:
    state = _two(Protection(breaker_trial_turns=2, breaker_success_threshold=2))
    feed(state, [arrive("t0", "r0")])
    assert placements(state) == {"t0": "a"}
    feed(state, [TurnFailed("t0", 1.0, "engine a: refused", unreachable=True)])
    assert state.replicas["a"].breaker == "open"
    feed(state, [probe("a", at=2.0), probe("b", at=2.0)])
    assert state.replicas["a"].breaker == "half_open"
    feed(state, [arrive(f"t{i}", f"r{i}", at=2.0 + i / 10) for i in range(1, 7)])
    on_a = [turn for turn, replica in placements(state).items() if replica == "a"]
    assert len(on_a) == 2  # its two trial turns, never more
    assert len(placements(state)) == 6 and not held_turns(state)
    assert snapshot(state, 3.0)["replicas"][0]["breaker"] == "half_open"
    # one trial finishes: one more trial may go there, still no more than two at once
    feed(state, [finish(on_a[0], at=3.0), arrive("t7", "r7", at=3.1), arrive("t8", "r8", at=3.2)])
    assert sum(1 for replica in placements(state).values() if replica == "a") == 2
    # the second success in a row closes it: full capacity again
    actions = feed(state, [finish(on_a[1], at=4.0)])
    assert BreakerChanged("a", "half_open", "closed", "2 trial turns finished") in actions
    assert state.breaker_transitions == {
        ("a", "closed", "open"): 1,
        ("a", "open", "half_open"): 1,
        ("a", "half_open", "closed"): 1,
    }


def test_a_half_open_replica_alone_holds_the_turns_beyond_its_trials() -> None:
    state = make_state([("a", ["m"], 4)])
    state.protection = Protection(breaker_failures=1)
    feed(state, [arrive("t0", "r0"), fail("t0", at=1.0), probe("a", at=2.0)])
    feed(state, [arrive("t1", "r1", at=2.1), arrive("t2", "r2", at=2.2)])
    assert placements(state) == {"t1": "a"} and held_turns(state) == ["t2"]
    actions = feed(state, [finish("t1", at=3.0)])  # the trial finished: closed, the held turn goes
    assert actions[0] == BreakerChanged("a", "half_open", "closed", "1 trial turns finished")
    assert Place("t2", "a") in actions


def test_a_failed_trial_opens_it_again_and_open_s_counts_afresh() -> None:
    state = make_state([("a", ["m"], 4)])
    state.protection = Protection(breaker_failures=1, breaker_open_s=10.0)
    feed(state, [arrive("t0", "r0"), fail("t0", at=1.0)])
    assert feed(state, [probe("a", at=5.0)]) == []  # open for 4 s only
    feed(state, [probe("a", at=11.0), arrive("t1", "r1", at=11.5)])
    assert placements(state) == {"t1": "a"}
    feed(state, [fail("t1", at=12.0)])
    assert state.replicas["a"].breaker == "open" and state.replicas["a"].opened_at == 12.0
    assert feed(state, [probe("a", at=21.0)]) == []
    assert feed(state, [probe("a", at=22.0)])[0] == BreakerChanged(
        "a", "open", "half_open", "a healthy probe"
    )
    assert state.counters.breaker_trips == 2 and state.counters.breaker_closes == 0


def test_failures_spread_wider_than_the_window_never_open_it() -> None:
    state = make_state([("a", ["m"], 4)])
    state.protection = Protection(breaker_failures=2, breaker_window_s=5.0)
    for i in range(6):
        feed(state, [arrive(f"t{i}", f"r{i}", at=i * 6.0), fail(f"t{i}", at=i * 6.0 + 1)])
    assert state.replicas["a"].breaker == "closed" and state.counters.breaker_trips == 0
    feed(state, [arrive("u", "ru", at=34.0), fail("u", at=35.0)])  # 4 s after the last one
    assert state.replicas["a"].breaker == "open"
