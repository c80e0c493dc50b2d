"""KV-token admission (``policies/kv_admission.py``): a new or idle run starts on a replica whose
KV pool is known only while the runs in progress there, counted by their tokens, fit it; turns of
runs counted there are never held by it; a replica with nothing in flight takes a run anyway; a
run whose tool outlives its caller's usual pause under pressure is parked (issue 23 item 4)."""

from __future__ import annotations

import pytest
from decide_helpers import arrive, feed, make_state, placements

from luftpause.config import parse_config
from luftpause.scheduler.core import ReplicaAdded, ReplicaRemoved, RunEnded, Tick, TurnFinished, decide
from luftpause.scheduler.core.held import any_replica_for
from luftpause.scheduler.core.policies import kv_admission
from luftpause.scheduler.core.policies.kv_admission import KvAdmission
from luftpause.scheduler.core.state import State, new_state

POOL = 10_000  # tokens; 0.9 of it (9,000) may be claimed


def _ends(turn: str, at: float, prompt: int, tools: bool = True) -> TurnFinished:
    return TurnFinished(turn, at, "tool_calls" if tools else "stop", tools, prompt, 100)


def _pressed(pool: int | None = POOL, settings: KvAdmission | None = None) -> State:
    """Four slots. Runs A and B start (each counted at the pool over 8 plus 512); A's first turn
    ends on a tool with a 4,000-token prompt (A now counts 4,612, and a first turn is known to
    leave 4,100); B still generates. Then C's first turn arrives: 4,612 + 1,762 + 4,612 > 9,000."""
    state = make_state([("a", ["m"], 4)])
    state.replicas["a"].kv_tokens = pool
    if settings is not None:
        state.kv_admission = settings
    feed(
        state,
        [
            arrive("a1", "A", at=0.0, cls="batch"),
            arrive("b1", "B", at=0.0, cls="batch"),
            _ends("a1", at=1.0, prompt=4_000),
            arrive("c1", "C", at=1.1, cls="batch"),
        ],
    )
    return state


def test_a_new_run_waits_while_the_runs_in_progress_fill_the_pool() -> None:
    state = _pressed()
    replica = state.replicas["a"]
    assert placements(state) == {"b1": "a"}  # two slots free, yet C is held
    assert "c1" in state.held
    assert replica.kv_runs == {"A": 4_612, "B": POOL // 8 + 512}
    assert replica.kv_used == sum(replica.kv_runs.values())


def test_a_run_in_progress_is_never_held_for_the_pool() -> None:
    state = _pressed()
    feed(state, [arrive("a2", "A", at=1.6, cls="batch")])  # A is back from its tool
    assert placements(state) == {"b1": "a", "a2": "a"}
    assert "c1" in state.held


@pytest.mark.parametrize("ending", ["idle", "ended"])
def test_a_run_leaving_the_pool_lets_the_held_run_start(ending: str) -> None:
    state = _pressed()
    if ending == "idle":
        feed(state, [arrive("a2", "A", at=1.6, cls="batch"), _ends("a2", at=2.0, prompt=4_300, tools=False)])
    else:
        feed(state, [RunEnded("A", at=2.0)])
    assert placements(state)["c1"] == "a"
    assert "A" not in state.replicas["a"].kv_runs


def test_a_replica_with_nothing_in_flight_takes_a_run_its_whole_pool_holds() -> None:
    # B pauses on a tool too, with a 400-token prompt: nothing in flight. B counts 1,012, a first
    # turn is now taken to leave 3,380 (C: 3,892): 4,612 + 1,012 + 3,892 is past 0.9 of the pool,
    # within the whole of it
    state = _pressed()
    feed(state, [_ends("b1", at=1.5, prompt=400)])
    assert placements(state) == {"c1": "a"}


def test_a_replica_with_nothing_in_flight_keeps_a_run_its_pool_cannot_hold() -> None:
    # B's prompt is 4,000 tokens too: 4,612 + 4,612 + 4,612 is past the whole pool
    state = _pressed()
    feed(state, [_ends("b1", at=1.5, prompt=4_000)])
    assert placements(state) == {} and "c1" in state.held


def test_a_replica_that_counts_no_run_takes_one_past_its_pool() -> None:
    state = make_state([("a", ["m"], 4)])
    state.replicas["a"].kv_tokens = 1_000  # every run counts more than this
    feed(state, [arrive("a1", "A", at=0.0, cls="batch")])
    assert placements(state) == {"a1": "a"}


@pytest.mark.parametrize(
    "settings", [None, KvAdmission(on=False)], ids=["no pool configured", "admission off"]
)
def test_without_a_pool_or_with_the_admission_off_slots_alone_admit(settings: KvAdmission | None) -> None:
    state = _pressed(pool=None if settings is None else POOL, settings=settings)
    assert placements(state) == {"b1": "a", "c1": "a"}


def test_a_tool_outliving_its_callers_pauses_parks_its_run_and_frees_the_pool() -> None:
    state = _pressed()
    feed(state, [Tick(at=5.0)])  # 4 s into A's tool: under the 10 s before any pause was seen
    assert "c1" in state.held and not state.runs["A"].kv_parked
    feed(state, [Tick(at=11.5)])
    assert state.runs["A"].kv_parked
    assert placements(state)["c1"] == "a"
    assert "A" not in state.replicas["a"].kv_runs
    # its next turn is pinned nowhere: it starts again like a new run's, counted once placed
    # (B 1,762 + C 4,612 + A 4,612 > 9,000: held, in the queue any replica takes from)
    state, _ = decide(state, arrive("a2", "A", at=12.0, cls="batch"))
    held = state.held.get("a2")
    assert held is not None and held.queue == any_replica_for("m")


def test_park_after_is_twice_the_third_quartile_of_the_callers_pauses() -> None:
    assert kv_admission.park_after([0.5] * 3) == kv_admission.PARK_DEFAULT_S  # too few seen
    assert kv_admission.park_after([0.5] * 16) == kv_admission.PARK_MIN_S  # 2 x 0.5 s = the floor
    assert kv_admission.park_after([float(s) for s in range(1, 17)]) == 26.0  # 2 x 13 s


def test_a_run_is_counted_by_its_last_turn_plus_its_growth_or_by_first_turns() -> None:
    assert kv_admission.run_tokens(3_000, 2, 2_500.0, 300.0, POOL) == 3_300
    assert kv_admission.run_tokens(0, 0, 2_500.0, None, POOL) == 2_500 + kv_admission.DEFAULT_GROWTH
    assert kv_admission.run_tokens(0, 0, None, None, 80_000) == 10_000 + kv_admission.DEFAULT_GROWTH
    assert kv_admission.run_tokens(0, 0, None, None, None) == kv_admission.DEFAULT_GROWTH


def test_the_configuration_sets_the_pool_and_the_fill() -> None:
    config = parse_config(
        '[scheduler]\nkv_fill = 0.8\n[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:1"\n'
        'models = ["m"]\nkv_tokens = 59125\n',
        "test.toml",
    )
    state = new_state(config)
    assert state.replicas["a"].kv_tokens == 59_125
    assert state.kv_admission == KvAdmission(True, 0.8)


def test_a_retired_replica_counts_no_run_and_one_added_under_its_name_starts_empty() -> None:
    # found by the state machine: a run paused on a removed replica stayed counted on its name
    state = make_state([("a", ["m"], 4), ("b", ["m"], 4)])
    state.replicas["a"].kv_tokens = POOL
    feed(state, [arrive("a1", "A", at=0.0, cls="batch"), _ends("a1", at=1.0, prompt=4_000)])
    assert state.runs["A"].kv_on == "a"
    feed(state, [ReplicaRemoved("a", at=2.0)])  # nothing placed there: it leaves at once
    assert "a" not in state.replicas and state.runs["A"].kv_on is None
    feed(state, [ReplicaAdded("a", 3.0, ("m",), "generative", 4)])
    assert state.replicas["a"].kv_runs == {} and state.runs["A"].kv_on is None
