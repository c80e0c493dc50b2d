"""Micro-benchmark of the scheduler core: ``decide()`` events per second.

Run: ``.venv/bin/pytest bench/test_bench_decide.py --benchmark-only``. Events per second are
events per round divided by the median round time (docs/architecture.md "Performance budgets": at
least 20,000 events/s on one core).

* ``mix, replicas=R`` -- a realistic mix replayed on a fresh state each round: 64 generative slots
  split over R replicas (2 of 32, or 16 of 4) and one single-pass replica of 8 slots, 400 runs of
  16 callers (1 in 4 interactive) over 20,000 events: arrivals (1 in 10 a single-pass turn, as
  ``/v1/decide`` classifiers are), finishes with and without tool calls (so runs pause and come
  back), failures, a probe per replica every 2 s of event time (3 in 10 find its engine queued,
  capping it at 3/4 of its slots), 1 s ticks. The pools are saturated much of the time, so turns
  are held (at most about 1,700 at once on 2 replicas, 6,200 on 16, where headroom and affinity
  weigh more on 4-slot replicas).
* ``held=N, replicas=R`` -- a saturated pool of R replicas (8 slots each) with N turns held, from
  32 callers in both classes; one round is one turn finishing (its slot goes to the first held
  turn) and one new turn arriving (held): the held count stays N. Placement looks only at queue
  heads, so the time per event should barely grow with N.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest

from luftpause.scheduler.core import (
    Event,
    Place,
    ReplicaProbed,
    State,
    Tick,
    TurnArrived,
    TurnFailed,
    TurnFinished,
    decide,
    state_from_replicas,
)


class _Spec:
    def __init__(self, name: str, max_inflight: int, kind: str = "generative") -> None:
        self.name = name
        self.models = ("m",)
        self.kind = kind
        self.max_inflight = max_inflight


def _state(replicas: int, slots: int, single_pass_slots: int = 0) -> State:
    specs = [_Spec(f"r{i}", slots) for i in range(replicas)]
    if single_pass_slots:
        specs.append(_Spec("sp", single_pass_slots, "single_pass"))
    return state_from_replicas(specs)  # type: ignore[arg-type]


GENERATIVE_SLOTS = 64
SINGLE_PASS_SLOTS = 8


def _mix_state(replicas: int) -> State:
    return _state(replicas, GENERATIVE_SLOTS // replicas, SINGLE_PASS_SLOTS)


def _mix(replicas: int, count: int = 20_000, seed: int = 7) -> list[Event]:
    """A realistic event sequence, generated against a live state so every report is for a real turn."""
    rng = random.Random(seed)
    state = _mix_state(replicas)
    events: list[Event] = []
    now = 0.0
    next_probe = 0.0
    next_tick = 1.0
    turn = 0
    paused: list[str] = []
    while len(events) < count:
        now += 0.004
        if now >= next_probe:
            for name, replica in state.replicas.items():
                queued = rng.random() < 0.3  # a queued engine runs 3/4 of its slots' worth
                running = replica.max_inflight * 3 // 4 if queued else replica.max_inflight // 3
                events.append(ReplicaProbed(name, now, True, running, 3 if queued else 0, 0.6, 0.4))
            next_probe += 2.0
        if now >= next_tick:
            events.append(Tick(now))
            next_tick += 1.0
        placed = list(state.placed)
        if placed and rng.random() < 0.5:
            turn_id = placed[rng.randrange(min(len(placed), 8))]  # oldest first, roughly
            roll = rng.random()
            if roll < 0.05:
                event: Event = TurnFailed(turn_id, now, "engine gone")
            else:
                tools = roll < 0.6 and not state.placed[turn_id].single_pass
                event = TurnFinished(turn_id, now, "tool_calls" if tools else "stop", tools, 900, 120)
                if tools:
                    paused.append(state.placed[turn_id].run_id)
        else:
            if paused and rng.random() < 0.6:
                run_id = paused.pop(rng.randrange(len(paused)))  # a tool round came back
            else:
                run_id = f"run{rng.randrange(400)}"
            number = int(run_id[3:]) if run_id[3:].isdigit() else 0
            cls = "interactive" if number % 4 == 0 else "batch"
            single_pass = rng.random() < 0.1
            caller = f"caller{number % 16}"
            event = TurnArrived(f"t{turn}", run_id, "m", cls, caller, "dp", now, single_pass)  # type: ignore[arg-type]
            turn += 1
        events.append(event)
        state, _ = decide(state, event)
    return events[:count]


@pytest.mark.parametrize("replicas", [2, 16])
def test_decide_realistic_mix(benchmark: Any, replicas: int) -> None:
    events = _mix(replicas)
    assert sum(1 for e in events if isinstance(e, TurnArrived) and e.single_pass) > 500

    def replay(state: State) -> None:
        for event in events:
            decide(state, event)

    benchmark.pedantic(replay, setup=lambda: ((_mix_state(replicas),), {}), rounds=5, iterations=1)


def _saturated(held: int, replicas: int) -> tuple[State, Callable[[], None]]:
    state = _state(replicas, 8)
    clock = [0.0]
    counter = [0]

    def arrive() -> list[Any]:
        n = counter[0]
        counter[0] += 1
        clock[0] += 0.001
        cls = "interactive" if n % 5 == 0 else "batch"
        event = TurnArrived(f"t{n}", f"run{n}", "m", cls, f"caller{n % 32}", "dp", clock[0])  # type: ignore[arg-type]
        return decide(state, event)[1]

    for _ in range(replicas * 8 + held):
        arrive()
    assert len(state.held) == held

    def one_round() -> None:
        oldest = next(iter(state.placed))
        clock[0] += 0.001
        _, actions = decide(state, TurnFinished(oldest, clock[0], "stop", False, 900, 120))
        assert len(actions) == 1 and isinstance(actions[0], Place)
        arrive()

    return state, one_round


@pytest.mark.parametrize("replicas", [2, 16])
@pytest.mark.parametrize("held", [1, 100, 10_000])
def test_decide_with_held_turns(benchmark: Any, held: int, replicas: int) -> None:
    state, one_round = _saturated(held, replicas)
    benchmark(one_round)
    assert len(state.held) == held
