"""Engine-load admission with a learned batch capacity, and probe rounds filled least loaded first.

Each case carries the input that broke the scheduler before (issue 3, review items 1 and 2): with
the default ``max_inflight = 32`` and engines of 4 slots, a probe that saw the queue drained
reopened the replica to 32 and every held turn went into the engine's FIFO queue; and a probe round
gave every held turn to the first replica probed.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from decide_helpers import arrive, finish, make_state, probe

from luftpause.scheduler.core import (
    Event,
    Place,
    ReplicaProbed,
    ReplicasProbed,
    State,
    decide,
    snapshot,
)
from luftpause.scheduler.core.policies import engine_load


def feed(state: State, events: list[Event]) -> list[object]:
    out: list[object] = []
    for event in events:
        state, actions = decide(state, event)
        out.extend(actions)
    return out


def flood(state: State, count: int, at: float = 0.0, first: int = 0) -> list[object]:
    """``count`` new runs' turns, ``t<first>`` on."""
    return feed(state, [arrive(f"t{i}", f"r{i}", at=at) for i in range(first, first + count)])


def placed_on(state: State, replica: str) -> int:
    return state.replicas[replica].inflight


# -- the learning rule, as a table ------------------------------------------------------------------


@dataclass
class Learn:
    name: str
    known: int | None
    healthy: bool
    running: int | None
    waiting: int | None
    turns_wait: bool
    learned: int | None


LEARN = [
    Learn("a queue sets it to the running count", None, True, 4, 20, True, 4),
    Learn("a queue lowers it to the running count", 8, True, 3, 1, True, 3),
    Learn("a queue with nothing running caps at 0", 4, True, 0, 2, True, 0),
    Learn("no queue ever seen: unknown", None, True, 4, 0, True, None),
    Learn("the queue drained: it is kept (the flip-flop)", 4, True, 4, 0, False, 4),
    Learn("drained, fewer running: kept", 4, True, 1, 0, True, 4),
    Learn("drained, fewer running, nothing held for it: forgotten", 4, True, 1, 0, False, None),
    Learn("running at it, no queue, turns waiting: grows by one", 4, True, 4, 0, True, 5),
    Learn("running at it, no queue, nothing waiting: no growth", 4, True, 4, 0, False, 4),
    Learn("running above it with no queue: raised to what runs", 4, True, 9, 0, False, 9),
    Learn("unhealthy (the engine may be restarting): forgotten", 4, False, 4, 20, True, None),
    Learn("no load reported: forgotten, the replica is not capped", 4, True, None, None, True, None),
    Learn("waiting reported without running: forgotten", 4, True, None, 3, True, None),
]


@pytest.mark.parametrize("case", LEARN, ids=[case.name for case in LEARN])
def test_the_batch_capacity_is_learned_from_probes(case: Learn) -> None:
    learned = engine_load.learn(case.known, case.healthy, case.running, case.waiting, case.turns_wait)
    assert learned.capacity == case.learned
    assert learned.queued == (case.healthy and bool(case.waiting) and case.running is not None)


# -- a lone queue with KV to spare (issue 23: the light load was not neutral) ------------------------


@dataclass
class LoneQueue:
    name: str
    known: int | None
    running: int
    waiting: int
    kv_usage: float | None
    queued_before: bool
    learned: int | None


LONE = [
    LoneQueue("a lone queue with KV to spare: the engine may be admitting", None, 4, 2, 0.19, False, None),
    LoneQueue("the same queue on the next probe too: the bound", None, 4, 2, 0.19, True, 4),
    LoneQueue("a lone queue with the KV cache full: the bound", None, 19, 7, 0.91, False, 19),
    LoneQueue("a lone queue, no KV usage reported: taken as the bound", None, 4, 2, None, False, 4),
    LoneQueue("once known, a queue with KV to spare lowers it no more", 8, 5, 1, 0.2, False, 8),
    LoneQueue("once known, a queue with the KV cache full lowers it", 8, 5, 1, 0.95, False, 5),
    LoneQueue("once known, a queue with no KV usage reported lowers it", 8, 5, 1, None, False, 5),
    LoneQueue("once known, a queue above it raises it", 8, 9, 1, 0.2, True, 9),
]


@pytest.mark.parametrize("case", LONE, ids=[case.name for case in LONE])
def test_a_lone_queue_with_kv_to_spare_teaches_no_bound(case: LoneQueue) -> None:
    learned = engine_load.learn(
        case.known, True, case.running, case.waiting, True, case.kv_usage, case.queued_before
    )
    assert (learned.capacity, learned.queued) == (case.learned, True)


def test_a_light_load_whose_engine_is_still_admitting_is_not_capped() -> None:
    """The light-load input (SIMULATED, 6 agents per replica, slots unbounded): a probe caught the
    engine with 4 running and 2 still waiting to be admitted, 19 % of its KV in use; that capped the
    replica at 4 and held the next turns for seconds. Now only a queue the next probe still shows
    caps it."""
    state = make_state([("a", ["m"], 32)])
    flood(state, 6)
    feed(state, [ReplicaProbed("a", 2.0, True, 4, 2, 0.19)])
    flood(state, 3, at=2.5, first=10)
    assert placed_on(state, "a") == 9 and not state.held
    feed(state, [ReplicaProbed("a", 4.0, True, 8, 1, 0.4)])  # still queued: that is its bound
    assert engine_load.capacity(state.replicas["a"]) == 8


# -- the flip-flop of the review: 4-slot engines under the default max_inflight = 32 ----------------


def test_a_drained_queue_does_not_reopen_a_replica_to_max_inflight() -> None:
    state = make_state([("a", ["m"], 32)])
    flood(state, 24)  # no load reported yet: 24 placed, as many as the configuration allows
    feed(state, [probe("a", at=2.0, running=4, waiting=20)])
    assert engine_load.capacity(state.replicas["a"]) == 4
    feed(state, [finish(f"t{i}", at=3.0) for i in range(20)])  # 4 left in flight, engine drained
    assert placed_on(state, "a") == 4
    flood(state, 20, at=3.5, first=100)
    assert len(state.held) == 20, "at capacity 4, the new turns are held by luftpause"
    feed(state, [probe("a", at=4.0, running=4, waiting=0)])  # the probe that flipped to 32
    # one more, to find out whether the engine takes it, never all 20
    assert placed_on(state, "a") == 5
    assert len(state.held) == 19
    feed(state, [probe("a", at=6.0, running=4, waiting=1)])  # it did not: back to 4
    assert engine_load.capacity(state.replicas["a"]) == 4
    assert snapshot(state, 6.0)["replicas"][0]["batch_capacity"] == 4


def test_a_larger_engine_is_found_one_slot_per_probe() -> None:
    state = make_state([("a", ["m"], 32)])
    flood(state, 4)
    feed(state, [probe("a", at=1.0, running=2, waiting=2)])  # the engine was still admitting
    assert engine_load.capacity(state.replicas["a"]) == 2
    flood(state, 10, at=1.5, first=10)
    seen = []
    for step in range(10):
        running = placed_on(state, "a")  # an 8-slot engine runs all it gets, up to 8, queues the rest
        feed(state, [probe("a", at=2.0 + 2 * step, running=min(8, running), waiting=max(0, running - 8))])
        seen.append(engine_load.capacity(state.replicas["a"]))
    # the first probe shows 4 running with no queue (the engine had been admitting): raised to 4;
    # then one slot per probe that shows the engine full with no queue
    assert seen[:5] == [4, 5, 6, 7, 8]
    # then it tries one past the engine and comes back: at most one turn in the engine's queue
    assert set(seen[5:]) == {8, 9}


def test_an_unhealthy_probe_forgets_the_batch_capacity() -> None:
    state = make_state([("a", ["m"], 32)])
    flood(state, 8)
    feed(state, [probe("a", at=1.0, running=4, waiting=4)])
    feed(state, [probe("a", at=3.0, healthy=False)])
    assert state.replicas["a"].batch_capacity is None
    feed(state, [probe("a", at=5.0, running=0, waiting=0)])  # restarted, maybe with more slots
    assert engine_load.capacity(state.replicas["a"]) == 32


# -- probe rounds -----------------------------------------------------------------------------------


def capped_pair() -> State:
    """Replicas a and b (max_inflight 32), each capped at 4 by a queue, 4 placed on each, 18 held."""
    state = make_state([("a", ["m"], 32), ("b", ["m"], 32)])
    flood(state, 8)  # 4 on each, least loaded first
    feed(state, [ReplicasProbed(1.0, (probe("a", 1.0, True, 4, 2), probe("b", 1.0, True, 4, 2)))])
    flood(state, 18, at=1.5, first=100)
    assert (placed_on(state, "a"), placed_on(state, "b"), len(state.held)) == (4, 4, 18)
    return state


def test_a_probe_round_that_lifts_two_caps_shares_the_held_turns() -> None:
    # the review's input: both capped at 4, 18 held, a round with waiting = 0 and no batch capacity
    # known (forgotten by ill health, as after an engine restart) used to give a: 22, b: 4
    state = capped_pair()
    for replica in state.replicas.values():
        replica.batch_capacity = None
    round_ = ReplicasProbed(2.0, (probe("a", 2.0, True, 4, 0), probe("b", 2.0, True, 4, 0)))
    actions = feed(state, [round_])
    assert (placed_on(state, "a"), placed_on(state, "b")) == (13, 13)
    targets = [action.replica for action in actions if isinstance(action, Place)]
    assert targets[:4] == ["a", "b", "a", "b"], "least loaded first, ties in configuration order"


def test_a_drained_round_lets_each_capped_replica_try_one_more() -> None:
    state = capped_pair()
    round_ = ReplicasProbed(2.0, (probe("a", 2.0, True, 4, 0), probe("b", 2.0, True, 4, 0)))
    feed(state, [round_])
    # both learned 4 and grow by one each, since turns wait for them
    assert (placed_on(state, "a"), placed_on(state, "b")) == (5, 5)


def test_a_round_fills_the_less_loaded_replica_first_whatever_the_probe_order() -> None:
    state = make_state([("a", ["m"], 12), ("b", ["m"], 12)])
    flood(state, 16)  # 8 on each
    feed(state, [ReplicasProbed(1.0, (probe("b", 1.0, True, 2, 6), probe("a", 1.0, True, 6, 2)))])
    feed(state, [finish(f"t{i}", at=1.2) for i in (1, 3, 5, 7, 9, 11)])  # frees b's turns: b has 2
    flood(state, 3, at=1.5, first=100)
    assert len(state.held) == 3
    # b learned 2, a learned 6: a round lifting both (no load: caps forgotten) gives b the turns
    feed(state, [ReplicasProbed(2.0, (probe("a", 2.0, True, None, None), probe("b", 2.0, True, None, None)))])
    assert [state.placed[f"t{i}"].replica for i in (100, 101, 102)] == ["b", "b", "b"]


def test_a_lone_replica_probed_is_a_round_of_one() -> None:
    state = make_state([("a", ["m"], 4)])
    flood(state, 6)
    assert feed(state, [ReplicaProbed("a", 1.0, True, 2, 2)]) == []
    assert engine_load.capacity(state.replicas["a"]) == 2
