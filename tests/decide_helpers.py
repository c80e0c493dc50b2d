"""Builders for the scheduler core's table-driven tests (``tests/scheduler/core/``): events with the
defaults the tables share, a state made from a case's replicas, and the views a case compares
(placements, held turns, runs) after feeding events through ``decide``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from luftpause.config import parse_config
from luftpause.scheduler.core import (
    AbandonReported,
    Action,
    Event,
    InFlightRecord,
    Reject,
    ReplicaProbed,
    RunPhase,
    RunRecord,
    State,
    TurnAbandoned,
    TurnArrived,
    TurnFailed,
    TurnFinished,
    decide,
    new_state,
)


def arrive(
    turn: str,
    run: str,
    model: str = "m",
    at: float = 0.0,
    cls: str = "interactive",
    caller: str = "",
    failover_from: str = "",
) -> TurnArrived:
    return TurnArrived(turn, run, model, cls, caller, "dp", at, failover_from=failover_from)  # type: ignore[arg-type]


def single(
    turn: str,
    run: str = "",
    model: str = "m",
    at: float = 0.0,
    cls: str = "interactive",
    caller: str = "",
    dataplane: str = "dp",
) -> TurnArrived:
    """A single-pass turn (``/v1/decide``) arriving."""
    return TurnArrived(turn, run, model, cls, caller, dataplane, at, single_pass=True)  # type: ignore[arg-type]


def finish(turn: str, at: float = 1.0, tools: bool = False) -> TurnFinished:
    return TurnFinished(turn, at, "tool_calls" if tools else "stop", tools, 10, 5)


def fail(turn: str, at: float = 1.0) -> TurnFailed:
    return TurnFailed(turn, at, "engine a: connection refused")


def abandon(turn: str, at: float = 1.0) -> TurnAbandoned:
    return TurnAbandoned(turn, at)


def reported(turn: str, at: float = 1.0) -> AbandonReported:
    return AbandonReported(turn, at)


def refused(turn: str) -> Reject:
    return Reject(turn, "turn was abandoned by its dataplane", 499)


def probe(
    replica: str,
    at: float = 0.5,
    healthy: bool = True,
    running: int | None = None,
    waiting: int | None = None,
    kv_usage: float | None = None,
) -> ReplicaProbed:
    """A probe; ``kv_usage`` not reported unless given (a queue is then the engine's bound)."""
    return ReplicaProbed(replica, at, healthy, running, waiting, kv_usage, None)


def inflight(turn: str, run: str, replica: str, model: str = "m") -> InFlightRecord:
    return InFlightRecord(turn, run, replica, model, "interactive", "")


def run_record(run: str, replica: str, phase: RunPhase) -> RunRecord:
    return RunRecord(run, replica, phase, "interactive", "")


ReplicaRow = tuple[str, list[str], int] | tuple[str, list[str], int, str]
"""(name, models, max_inflight[, kind]): one replica of a case."""


def make_state(replicas: Sequence[ReplicaRow], resync_hold_s: float = 0.0) -> State:
    """A state for these replicas; no startup hold unless asked (rule 15 has its own cases), so
    that a case of another rule may resync at once."""
    blocks = [f"[scheduler]\nresync_hold_s = {resync_hold_s}\n"]
    for spec in replicas:
        name, models, cap = spec[0], spec[1], spec[2]
        kind = spec[3] if len(spec) > 3 else "generative"
        blocks.append(
            f'[[replicas]]\nname = "{name}"\nurl = "http://127.0.0.1:1"\nmodels = {models!r}\n'
            f'max_inflight = {cap}\nkind = "{kind}"\n'.replace("'", '"')
        )
    return new_state(parse_config("\n".join(blocks), "test.toml"))


def feed(state: State, events: list[Event]) -> list[Action]:
    actions: list[Action] = []
    for event in events:
        state, out = decide(state, event)
        actions.extend(out)
    return actions


def placements(state: State) -> dict[str, str]:
    return {turn_id: placed.replica for turn_id, placed in state.placed.items()}


def held_turns(state: State) -> list[str]:
    return [turn.turn_id for turn in state.held]


def runs(state: State) -> dict[str, tuple[str, str | None]]:
    return {run_id: (run.phase, run.last_replica) for run_id, run in state.runs.items()}


@dataclass
class Case:
    name: str
    replicas: Sequence[tuple[str, list[str], int] | tuple[str, list[str], int, str]]
    before: list[Event]
    event: Event
    actions: list[Action]
    placed: dict[str, str]
    held: list[str]
    runs: dict[str, tuple[str, str | None]] = field(default_factory=dict)
