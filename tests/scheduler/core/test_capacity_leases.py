"""Capacity leases in the scheduler core (rule 14 of ``luftpause.scheduler.core.decide``).

Each test states one lease rule and fails without it: what is granted and to whom, what a lease
counts against, when it is withdrawn, what a turn placed under a lease does (also across a
revocation on the wire), and what becomes of leases when a dataplane is lost or resyncs.
"""

from __future__ import annotations

from decide_helpers import make_state

from luftpause.scheduler.core import (
    AckResync,
    Action,
    DataplaneLost,
    Event,
    GrantLease,
    InFlightRecord,
    LeasedTurnPlaced,
    Place,
    ReplicaProbed,
    Resynced,
    RevokeLease,
    RunRecord,
    State,
    TurnArrived,
    TurnFinished,
    decide,
    snapshot,
)

M = ("m",)


def feed(state: State, events: list[Event]) -> list[Action]:
    actions: list[Action] = []
    for event in events:
        state, out = decide(state, event)
        actions.extend(out)
    return actions


def lessee(dataplane: str = "dp", at: float = 0.0, turns: tuple[InFlightRecord, ...] = ()) -> Resynced:
    return Resynced(dataplane, at, (), turns, takes_leases=True)


def arrive(
    turn: str, run: str, at: float = 1.0, cls: str = "interactive", dataplane: str = "dp2"
) -> TurnArrived:
    return TurnArrived(turn, run, "m", cls, "", dataplane, at)  # type: ignore[arg-type]


def leased(
    turn: str,
    run: str,
    replica: str,
    epoch: int,
    at: float = 1.0,
    cls: str = "interactive",
    dataplane: str = "dp",
) -> LeasedTurnPlaced:
    return LeasedTurnPlaced(turn, run, "m", cls, "", dataplane, replica, epoch, at)  # type: ignore[arg-type]


def finish(turn: str, at: float = 2.0, tools: bool = False) -> TurnFinished:
    return TurnFinished(turn, at, "tool_calls" if tools else "stop", tools, 10, 5)


def probe(replica: str, at: float = 1.0, healthy: bool = True, running: int | None = None,
          waiting: int | None = None) -> ReplicaProbed:  # fmt: skip
    return ReplicaProbed(replica, at, healthy, running, waiting)


def held_by(state: State) -> dict[str, dict[str, int]]:
    return snapshot(state, 0.0)["leases"]  # type: ignore[no-any-return]


def test_a_lessee_is_granted_every_free_slot_after_its_resync_is_acknowledged() -> None:
    state = make_state([("a", ["m"], 2), ("b", ["m"], 3)])
    assert feed(state, [lessee()]) == [
        AckResync("dp", 0, 0),
        GrantLease("dp", "a", 2, 1, M),
        GrantLease("dp", "b", 3, 2, M),
    ]
    assert (state.replicas["a"].leased, state.replicas["b"].leased) == (2, 3)


def test_no_lease_without_asking_without_a_name_or_with_leasing_off() -> None:
    state = make_state([("a", ["m"], 2)])
    assert feed(state, [Resynced("dp", 0.0, (), ())]) == [AckResync("dp", 0, 0)]
    assert feed(state, [lessee("")]) == [AckResync("", 0, 0)]
    state = make_state([("a", ["m"], 2)])
    state.leasing = False
    assert feed(state, [lessee()]) == [AckResync("dp", 0, 0)]
    assert state.lessees == {}


def test_single_pass_replicas_are_never_leased() -> None:
    state = make_state([("a", ["m"], 1), ("s", ["m"], 4, "single_pass")])
    assert feed(state, [lessee()]) == [AckResync("dp", 0, 0), GrantLease("dp", "a", 1, 1, M)]


def test_lessees_share_the_free_slots_evenly_in_the_order_they_resynced() -> None:
    state = make_state([("a", ["m"], 3)])
    feed(state, [lessee("dp")])
    # dp holds all 3; dp2 gets what is free, which is nothing until dp's slots come back
    assert feed(state, [lessee("dp2", at=0.5)]) == [AckResync("dp2", 0, 0)]
    feed(state, [DataplaneLost("dp", 0.6)])
    assert held_by(state) == {"dp2": {"a": 3}}
    feed(state, [lessee("dp", at=0.7)])  # back: shares what is free (nothing)
    state = make_state([("a", ["m"], 5)])
    state.lessees = {"dp": {}, "dp2": {}}
    assert feed(state, [probe("a")]) == [GrantLease("dp", "a", 3, 1, M), GrantLease("dp2", "a", 2, 2, M)]


def test_leased_slots_count_against_capacity_and_give_way_to_a_turn_that_would_be_held() -> None:
    state = make_state([("a", ["m"], 2), ("b", ["m"], 2)])
    feed(state, [lessee()])
    # dp2 takes no leases: its turn finds every slot leased; it goes where it would with no lease
    # out (a: least loaded, first in a tie), whose lease is withdrawn, and what is left is leased
    assert feed(state, [arrive("t1", "r1")]) == [
        RevokeLease("dp", "a", 3),
        Place("t1", "a"),
        GrantLease("dp", "a", 1, 3, M),
    ]
    assert held_by(state) == {"dp": {"a": 1, "b": 2}}
    assert not state.held


def test_a_turn_freed_from_leases_goes_to_the_least_loaded_replica() -> None:
    state = make_state([("a", ["m"], 3), ("b", ["m"], 3)])
    feed(state, [arrive("t0", "r0", at=0.0)])  # on a
    feed(state, [lessee(at=0.5)])
    assert held_by(state) == {"dp": {"a": 2, "b": 3}}
    actions = feed(state, [arrive("t1", "r1")])
    assert Place("t1", "b") in actions  # b has no placed turn; a has one


def test_an_asking_turn_goes_where_it_would_with_no_lease_not_into_a_kept_slot() -> None:
    state = make_state([("a", ["m"], 2), ("b", ["m"], 2)])
    paused = (RunRecord("r9", "b", "tool_paused", "interactive", ""),)
    feed(state, [Resynced("dp2", 0.0, paused, ()), lessee(at=0.5)])
    assert held_by(state) == {"dp": {"a": 2, "b": 1}}  # b keeps one slot for r9
    # an interactive turn of a new run could take b's kept slot without touching a lease; it goes
    # to a (least loaded, first in a tie) as it would with no lease out
    assert feed(state, [arrive("t1", "r1")]) == [
        RevokeLease("dp", "a", 3),
        Place("t1", "a"),
        GrantLease("dp", "a", 1, 3, M),
    ]


def test_a_turn_pinned_to_another_full_replica_does_not_withdraw_a_lease() -> None:
    state = make_state([("a", ["m"], 1), ("b", ["m"], 1)])
    feed(state, [arrive("t1", "r1"), finish("t1", tools=True), arrive("t2", "r2")])  # r1 paused on a
    assert [p.replica for p in state.placed.values()] == ["a"]  # t2 on a (least loaded, a first)
    feed(state, [lessee(at=2.5)])
    assert held_by(state) == {"dp": {"b": 1}}
    # r1 comes back: pinned to a, which is full; b's lease stands (r1 cannot use b)
    assert feed(state, [arrive("t3", "r1", at=3.0)]) == []
    assert [t.turn_id for t in state.held] == ["t3"]
    assert held_by(state) == {"dp": {"b": 1}}


def test_no_grant_while_a_held_turn_may_take_the_replica() -> None:
    state = make_state([("a", ["m"], 1)])
    feed(state, [arrive("t1", "r1"), arrive("t2", "r2")])  # t2 held
    assert feed(state, [lessee(at=1.5)]) == [AckResync("dp", 0, 0)]
    # t1 ends: its slot goes to t2, not to a lease
    assert feed(state, [finish("t1")]) == [Place("t2", "a")]
    # t2 ends: nothing held, the slot is leased
    assert feed(state, [finish("t2", at=3.0)]) == [GrantLease("dp", "a", 1, 1, M)]


def test_a_leased_turn_takes_its_slot_and_is_placed_with_its_run_generating_there() -> None:
    state = make_state([("a", ["m"], 2)])
    feed(state, [lessee()])
    assert feed(state, [leased("t1", "r1", "a", 1)]) == []  # no answer, no new grant: no slot freed
    assert state.placed["t1"].replica == "a" and state.placed["t1"].dataplane_id == "dp"
    assert (state.runs["r1"].phase, state.runs["r1"].last_replica) == ("generating", "a")
    assert (state.replicas["a"].inflight, state.replicas["a"].leased) == (1, 1)
    counters = snapshot(state, 1.0)["counters"]
    assert (counters["leased"], counters["admitted"], counters["arrived"]) == (1, 1, 1)
    # its end frees the slot, which is leased again
    assert feed(state, [finish("t1")]) == [GrantLease("dp", "a", 1, 1, M)]
    assert state.runs["r1"].phase == "idle"


def test_a_turn_reported_twice_is_placed_once() -> None:
    state = make_state([("a", ["m"], 2)])
    feed(state, [lessee(), leased("t1", "r1", "a", 1)])
    assert feed(state, [leased("t1", "r1", "a", 1)]) == []
    assert (state.replicas["a"].inflight, state.replicas["a"].leased) == (1, 1)


def test_a_leased_turn_whose_admit_is_held_is_placed_and_its_admit_answered() -> None:
    state = make_state([("a", ["m"], 1)])
    feed(state, [arrive("t0", "r0"), arrive("t1", "r1", dataplane="dp")])  # t1 held
    feed(state, [lessee(at=1.5)])
    assert feed(state, [leased("t1", "r1", "a", 0, at=2.0)]) == [Place("t1", "a")]
    assert not state.held and state.replicas["a"].inflight == 2  # crossed: over capacity by one


def test_a_turn_used_under_a_revoked_lease_stands_and_is_counted_as_a_crossing() -> None:
    state = make_state([("a", ["m"], 1)])
    feed(state, [lessee()])
    # dp2's turn makes the scheduler withdraw dp's lease (epoch 1 -> 2) and place it
    assert feed(state, [arrive("t1", "r1")]) == [RevokeLease("dp", "a", 2), Place("t1", "a")]
    # dp had placed a turn under epoch 1 before it read the revocation
    assert feed(state, [leased("t2", "r2", "a", 1, at=1.1)]) == []
    assert state.replicas["a"].inflight == 2  # over by at most the slot dp held
    assert snapshot(state, 1.1)["counters"]["lease_crossings"] == 1
    # nothing more is leased or placed until the replica is back under its limit
    assert feed(state, [finish("t1")]) == []
    assert feed(state, [finish("t2", at=3.0)]) == [GrantLease("dp", "a", 1, 2, M)]


def test_a_queue_ill_health_or_lower_capacity_withdraws_the_lease() -> None:
    state = make_state([("a", ["m"], 4)])
    feed(state, [lessee()])
    assert feed(state, [probe("a", running=4, waiting=1)]) == [RevokeLease("dp", "a", 2)]
    assert feed(state, [probe("a", at=2.0, running=0, waiting=0)]) == [GrantLease("dp", "a", 4, 2, M)]
    assert feed(state, [probe("a", at=3.0, healthy=False)]) == [RevokeLease("dp", "a", 3)]
    assert feed(state, [probe("a", at=4.0)]) == [GrantLease("dp", "a", 4, 3, M)]
    feed(state, [leased("t1", "r1", "a", 3, at=4.5), leased("t2", "r2", "a", 3, at=4.5)])
    # the engine runs 3 with a queue forming: capacity 3; a queue withdraws the lease anyway
    assert feed(state, [probe("a", at=5.0, running=3, waiting=2)]) == [RevokeLease("dp", "a", 4)]


def test_headroom_for_a_paused_interactive_run_is_never_leased() -> None:
    state = make_state([("a", ["m"], 2)])
    feed(state, [lessee()])
    feed(state, [leased("t1", "r1", "a", 1)])
    # r1 pauses on a tool: its slot is now kept for it; 2 - 1 kept - 0 placed = 1, as leased
    assert feed(state, [finish("t1", tools=True)]) == []
    assert state.replicas["a"].reserved_for == {"r1"} and state.replicas["a"].leased == 1
    # a second paused run shrinks what may be leased below what is: withdrawn, then re-granted
    feed(state, [leased("t2", "r2", "a", 1, at=2.5)])
    assert feed(state, [finish("t2", at=3.0, tools=True)]) == []  # 2 - 2 kept: nothing to grant
    assert state.replicas["a"].leased == 0
    # r1 comes back under no lease (none left): it asks and takes its kept slot
    assert feed(state, [arrive("t3", "r1", at=4.0, dataplane="dp")]) == [Place("t3", "a")]


def test_a_lease_larger_than_what_headroom_leaves_is_withdrawn_and_the_rest_granted() -> None:
    state = make_state([("a", ["m"], 3)])
    feed(state, [lessee()])
    assert held_by(state) == {"dp": {"a": 3}}
    # dp2 resyncs an interactive run paused on a: one slot is kept; 3 leased > 3 - 1 kept
    paused = (RunRecord("r9", "a", "tool_paused", "interactive", ""),)
    assert feed(state, [Resynced("dp2", 1.0, paused, ())]) == [
        AckResync("dp2", 1, 0),
        RevokeLease("dp", "a", 2),
        GrantLease("dp", "a", 2, 2, M),
    ]


def test_a_lost_dataplane_returns_its_leases_to_the_other_lessees() -> None:
    state = make_state([("a", ["m"], 2)])
    feed(state, [lessee("dp"), lessee("dp2", at=0.5)])
    assert held_by(state) == {"dp": {"a": 2}, "dp2": {}}
    assert feed(state, [DataplaneLost("dp", 1.0)]) == [GrantLease("dp2", "a", 2, 2, M)]
    assert "dp" not in state.lessees


def test_a_resync_drops_the_old_leases_and_grants_fresh_ones_with_its_turns_adopted() -> None:
    state = make_state([("a", ["m"], 3)])
    feed(state, [lessee(), leased("t1", "r1", "a", 1)])
    # the stream broke; dp resyncs with t1 and t2 (placed under the old lease, report lost)
    turns = (
        InFlightRecord("t1", "r1", "a", "m", "interactive", ""),
        InFlightRecord("t2", "r2", "a", "m", "interactive", ""),
    )
    assert feed(state, [lessee(at=2.0, turns=turns)]) == [
        AckResync("dp", 0, 2),
        GrantLease("dp", "a", 1, 2, M),
    ]
    # a resync that takes no leases leaves it holding none
    assert feed(state, [Resynced("dp", 3.0, (), turns)]) == [AckResync("dp", 0, 2)]
    assert state.lessees == {} and state.replicas["a"].leased == 0


def test_a_leased_turn_off_its_runs_pinned_replica_is_placed_and_counted() -> None:
    state = make_state([("a", ["m"], 2), ("b", ["m"], 2)])
    feed(state, [Resynced("dp2", 0.0, (RunRecord("r1", "a", "tool_paused", "interactive", ""),), ())])
    feed(state, [lessee(at=0.5)])
    # dp does not know r1 is paused on a (it came through dp2) and places it on b
    epoch = state.lessees["dp"]["b"].epoch
    feed(state, [leased("t1", "r1", "b", epoch)])
    assert (state.runs["r1"].phase, state.runs["r1"].last_replica) == ("generating", "b")
    assert state.replicas["a"].reserved_for == set()  # its kept slot on a is released
    assert snapshot(state, 1.0)["counters"]["leased_off_affinity"] == 1
