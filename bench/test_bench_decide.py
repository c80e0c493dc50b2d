"""Micro-benchmark of the scheduler core: ``decide()`` events per second.

Run: ``.venv/bin/pytest bench/test_bench_decide.py --benchmark-only``. Events per second are
events per round divided by the median round time (DESIGN.md's budget: at least 20,000 events/s
on one core).

* ``mix`` -- a realistic mix replayed on a fresh state each round: 2 replicas of 32 slots, 400
  runs of 16 callers (1 in 4 interactive) over 20,000 events: arrivals, finishes with and without
  tool calls (so runs pause and come back), failures, a probe per replica every 2 s of event time
  (engines sometimes queued), 1 s ticks. The pool is saturated part of the time, so turns are held.
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
    def __init__(self, name: str, max_inflight: int) -> None:
        self.name = name
        self.models = ("m",)
        self.kind = "generative"
        self.max_inflight = max_inflight


def _state(replicas: int, slots: int) -> State:
    return state_from_replicas([_Spec(f"r{i}", slots) for i in range(replicas)])  # type: ignore[list-item]


def _mix(count: int = 20_000, seed: int = 7) -> list[Event]:
    """A realistic event sequence, generated against a live state so every report is for a real turn."""
    rng = random.Random(seed)
    state = _state(2, 32)
    events: list[Event] = []
    now = 0.0
    next_probe = 0.0
    next_tick = 1.0
    turn = 0
    paused: list[str] = []
    while len(events) < count:
        now += 0.004
        if now >= next_probe:
            for name in state.replicas:
                queued = rng.random() < 0.3
                events.append(
                    ReplicaProbed(name, now, True, 24 if queued else 10, 3 if queued else 0, 0.6, 0.4)
                )
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
                tools = roll < 0.6
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
            event = TurnArrived(f"t{turn}", run_id, "m", cls, f"caller{number % 16}", "dp", now)  # type: ignore[arg-type]
            turn += 1
        events.append(event)
        state, _ = decide(state, event)
    return events[:count]


def test_decide_realistic_mix(benchmark: Any) -> None:
    events = _mix()

    def replay(state: State) -> None:
        for event in events:
            decide(state, event)

    benchmark.pedantic(replay, setup=lambda: ((_state(2, 32),), {}), rounds=5, iterations=1)


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
