"""Replicas changed at run time (rule 16 of ``decide``, ``policies/draining.py``): added, drained,
put back and removed, table-driven like ``test_decisions_per_event`` (issue 18)."""

from __future__ import annotations

import pytest
from decide_helpers import (
    Case,
    arrive,
    fail,
    feed,
    finish,
    held_turns,
    make_state,
    placements,
    probe,
    runs,
    single,
)

from luftpause.scheduler.core import (
    Action,
    Event,
    GrantLease,
    Place,
    ReplicaAdded,
    ReplicaDrained,
    ReplicaRemoved,
    ReplicaRestored,
    Resynced,
    RetireReplica,
    RevokeLease,
    Tick,
    decide,
    snapshot,
)


def added(name: str, models: tuple[str, ...] = ("m",), cap: int = 1, at: float = 0.0) -> ReplicaAdded:
    return ReplicaAdded(name, at, models, "generative", cap)


CASES = [
    Case(
        "an added replica takes the held turns of its models at once",
        [("a", ["m"], 1)],
        [arrive("t1", "r1"), arrive("t2", "r2"), arrive("t3", "r3", model="n")],
        added("b", ("m", "n"), cap=2),
        [Place("t2", "b")],
        {"t1": "a", "t2": "b"},
        [],
        {"r1": ("generating", "a"), "r2": ("generating", "b")},
    ),
    Case(
        "a model no replica served is routed once a replica serving it is added",
        [("a", ["m"], 1)],
        [added("b", ("n",))],
        arrive("t1", "r1", model="n"),
        [Place("t1", "b")],
        {"t1": "b"},
        [],
        {"r1": ("generating", "b")},
    ),
    Case(
        "a replica added under a name in the set is ignored",
        [("a", ["m"], 1)],
        [arrive("t1", "r1"), arrive("t2", "r2")],
        added("a", cap=5),
        [],
        {"t1": "a"},
        ["t2"],
        {"r1": ("generating", "a"), "r2": ("idle", None)},
    ),
    Case(
        "a draining replica takes no new run, though it has room",
        [("a", ["m"], 2), ("b", ["m"], 1)],
        [arrive("t1", "r1"), ReplicaDrained("a", 0.5)],
        arrive("t2", "r2"),
        [Place("t2", "b")],
        {"t1": "a", "t2": "b"},
        [],
        {"r1": ("generating", "a"), "r2": ("generating", "b")},
    ),
    Case(
        "a new run waits rather than go to a draining replica",
        [("a", ["m"], 2), ("b", ["m"], 1)],
        [arrive("t1", "r1"), arrive("t2", "r2"), ReplicaDrained("a", 0.5)],
        arrive("t3", "r3"),
        [],
        {"t1": "a", "t2": "b"},
        ["t3"],
        {"r1": ("generating", "a"), "r2": ("generating", "b"), "r3": ("idle", None)},
    ),
    Case(
        "a run paused on a tool there comes back to its draining replica",
        [("a", ["m"], 2), ("b", ["m"], 2)],
        [arrive("t1", "r1"), finish("t1", tools=True), ReplicaDrained("a", 1.5)],
        arrive("t2", "r1", at=2.0),
        [Place("t2", "a")],
        {"t2": "a"},
        [],
        {"r1": ("generating", "a")},
    ),
    Case(
        "a run that went idle on a draining replica moves",
        [("a", ["m"], 2), ("b", ["m"], 2)],
        [arrive("t1", "r1"), finish("t1"), ReplicaDrained("a", 1.5)],
        arrive("t2", "r1", at=2.0),
        [Place("t2", "b")],
        {"t2": "b"},
        [],
        {"r1": ("generating", "b")},
    ),
    Case(
        "a slot freeing on a draining replica goes to a pinned turn, not to a new run",
        [("a", ["m"], 1)],
        [
            arrive("t1", "r1"),
            arrive("t2", "r2"),
            arrive("t3", "r1", at=0.5),  # r1 overlaps itself: pinned to a
            ReplicaDrained("a", 0.6),
        ],
        finish("t1", tools=True),  # r1 pauses on a tool there: still pinned
        [Place("t3", "a")],
        {"t3": "a"},
        ["t2"],
        {"r1": ("generating", "a"), "r2": ("idle", None)},
    ),
    Case(
        "a drained replica put back takes new runs again",
        [("a", ["m"], 1), ("b", ["m"], 1)],
        [ReplicaDrained("a", 0.0), arrive("t1", "r1"), arrive("t2", "r2")],
        ReplicaRestored("a", 1.0),
        [Place("t2", "a")],
        {"t1": "b", "t2": "a"},
        [],
        {"r1": ("generating", "b"), "r2": ("generating", "a")},
    ),
    Case(
        "a replica with nothing placed is removed at once",
        [("a", ["m"], 1), ("b", ["m"], 1)],
        [arrive("t1", "r1")],
        ReplicaRemoved("b", 1.0),
        [RetireReplica("b")],
        {"t1": "a"},
        [],
        {"r1": ("generating", "a")},
    ),
    Case(
        "a replica removed with a turn in flight keeps it and takes nothing more",
        [("a", ["m"], 2), ("b", ["m"], 1)],
        [arrive("t1", "r1"), ReplicaRemoved("a", 0.5)],
        arrive("t2", "r1", at=1.0),  # r1 generates on a: the removal moves it
        [Place("t2", "b")],
        {"t1": "a", "t2": "b"},
        [],
        {"r1": ("generating", "b")},
    ),
    Case(
        "the last turn of a removed replica ending retires it",
        [("a", ["m"], 2), ("b", ["m"], 1)],
        [arrive("t1", "r1"), ReplicaRemoved("a", 0.5)],
        finish("t1", tools=True),
        [RetireReplica("a")],
        {},
        [],
        {"r1": ("tool_paused", None)},  # its prefix left with a: it goes anywhere next
    ),
    Case(
        "a turn pinned to a replica being removed goes elsewhere",
        [("a", ["m"], 1), ("b", ["m"], 1)],
        [arrive("t1", "r1"), arrive("t2", "r2"), arrive("t3", "r1", at=0.5), finish("t2", at=0.6)],
        ReplicaRemoved("a", 1.0),
        [Place("t3", "b")],
        {"t1": "a", "t3": "b"},
        [],
        {"r1": ("generating", "b"), "r2": ("idle", "b")},
    ),
    Case(
        "a removal put back before its replica left keeps it",
        [("a", ["m"], 2)],
        [arrive("t1", "r1"), ReplicaRemoved("a", 0.5), arrive("t2", "r2", at=0.6)],
        ReplicaRestored("a", 0.7),
        [Place("t2", "a")],
        {"t1": "a", "t2": "a"},
        [],
        {"r1": ("generating", "a"), "r2": ("generating", "a")},
    ),
    Case(
        "a draining single-pass replica takes nothing",
        [("a", ["m"], 1), ("s", ["m"], 1, "single_pass"), ("s2", ["m"], 1, "single_pass")],
        [ReplicaDrained("s", 0.0)],
        single("d1"),
        [Place("d1", "s2")],
        {"d1": "s2"},
        [],
        {},
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_replica_set(case: Case) -> None:
    state = make_state(case.replicas)
    feed(state, case.before)
    state, actions = decide(state, case.event)
    assert actions == case.actions
    assert placements(state) == case.placed
    assert held_turns(state) == case.held
    assert runs(state) == case.runs
    for replica in state.replicas.values():
        assert replica.inflight == sum(1 for p in state.placed.values() if p.replica == replica.name)


def test_an_added_replica_is_ordered_after_the_others_and_shown() -> None:
    state = make_state([("a", ["m"], 1)])
    feed(state, [added("b", cap=3), ReplicaDrained("b", 1.0)])
    status = snapshot(state, 1.0)
    assert [(r["name"], r["capacity"], r["draining"]) for r in status["replicas"]] == [
        ("a", 1, False),
        ("b", 3, True),
    ]
    assert state.replicas["b"].index == 1 and status["counters"]["replicas_added"] == 1
    # equally loaded: the replica configured first wins the tie, the added one is last
    assert feed(state, [ReplicaRestored("b", 2.0), arrive("t1", "r1", at=2.0)]) == [Place("t1", "a")]


def test_a_removed_and_re_added_replica_holds_no_old_run() -> None:
    state = make_state([("a", ["m"], 1), ("b", ["m"], 1)])
    feed(state, [arrive("t1", "r1"), finish("t1", tools=True), ReplicaRemoved("a", 1.5)])
    assert "a" not in state.replicas and runs(state) == {"r1": ("tool_paused", None)}
    feed(state, [added("a", at=2.0), arrive("t2", "r2", at=2.0), arrive("t4", "r4", at=2.0)])
    assert placements(state) == {"t2": "b", "t4": "a"}  # the new a is ordered after b
    feed(state, [finish("t2", at=2.1)])
    # a is full and b has room: r1, paused on the old a, is not pinned to the new one
    assert feed(state, [arrive("t3", "r1", at=2.2)]) == [Place("t3", "b")]


def events_lessee() -> list[Event]:
    return [Resynced("dp", 0.0, (), (), takes_leases=True)]


def test_a_draining_replica_is_never_leased_and_its_leases_are_withdrawn() -> None:
    state = make_state([("a", ["m"], 2), ("b", ["m"], 2)])
    state.leasing = True
    grants = feed(state, events_lessee())
    assert {(a.replica, a.count) for a in grants if isinstance(a, GrantLease)} == {("a", 2), ("b", 2)}
    actions = feed(state, [ReplicaDrained("a", 1.0)])
    assert [a for a in actions if isinstance(a, RevokeLease)] == [RevokeLease("dp", "a", actions[0].epoch)]  # type: ignore[union-attr]
    assert state.replicas["a"].leased == 0
    later = feed(state, [Tick(2.0), probe("a", at=2.5), finish("never", at=3.0)])
    assert not [a for a in later if isinstance(a, GrantLease) and a.replica == "a"]


def test_a_replica_removed_with_leases_out_is_retired_once_they_are_withdrawn() -> None:
    state = make_state([("a", ["m"], 2), ("b", ["m"], 2)])
    state.leasing = True
    feed(state, events_lessee())
    actions: list[Action] = feed(state, [ReplicaRemoved("a", 1.0)])
    assert isinstance(actions[0], RevokeLease) and actions[-1] == RetireReplica("a")
    assert "a" not in state.replicas and "a" not in state.lessees["dp"]
    assert snapshot(state, 1.0)["leases"] == {"dp": {"b": 2}}


def test_a_removed_replica_with_a_failing_turn_is_retired_when_it_fails() -> None:
    state = make_state([("a", ["m"], 1)])
    feed(state, [arrive("t1", "r1"), ReplicaRemoved("a", 0.5), arrive("t2", "r2", at=0.6)])
    assert held_turns(state) == ["t2"]  # no replica left to take it
    assert feed(state, [fail("t1", at=1.0)]) == [RetireReplica("a")]
    assert state.replicas == {} and held_turns(state) == ["t2"]
    assert feed(state, [added("c", at=2.0)]) == [Place("t2", "c")]
