"""Builders for the engine model's tests: prompt paths from synthetic keys, and running an
engine until it is idle."""

from __future__ import annotations

import hashlib
from typing import TypeVar

from luftpause.testkit.engine.model import (
    PROFILES,
    EngineEvent,
    EngineModel,
    EngineProfile,
    PrefixPath,
    StepCosts,
)

_E = TypeVar("_E", bound=EngineEvent)


def path(name: str, *tokens: int) -> PrefixPath:
    """A prompt of one node per entry of ``tokens``, keyed by a chain over ``name``: two paths of
    the same name share their leading nodes."""
    key = hashlib.blake2b(name.encode(), digest_size=16).digest()
    nodes = []
    for index, count in enumerate(tokens):
        seed = key + index.to_bytes(4, "big") + count.to_bytes(8, "big")
        key = hashlib.blake2b(seed, digest_size=16).digest()
        nodes.append((key, count))
    return PrefixPath(tuple(nodes))


def then(prompt: PrefixPath, name: str, tokens: int) -> PrefixPath:
    """``prompt`` with one more node (a reply or tool result named ``name``)."""
    return PrefixPath((*prompt.nodes, node_after(prompt, name, tokens)))


def node_after(prompt: PrefixPath, name: str, tokens: int) -> tuple[bytes, int]:
    """The node ``name`` of ``tokens`` tokens that follows ``prompt``."""
    parent = prompt.nodes[-1][0] if prompt.nodes else b""
    return hashlib.blake2b(parent + name.encode(), digest_size=16).digest(), tokens


def run_until_idle(engine: EngineModel, limit: int = 1_000_000) -> list[EngineEvent]:
    """Advance ``engine`` step by step until it is idle; every event, in order."""
    events: list[EngineEvent] = []
    for _ in range(limit):
        moment = engine.next_event_time()
        if moment is None:
            return events
        events.extend(engine.advance(moment))
    raise AssertionError("the engine never went idle")


def small(style: str, pool: int, **changes: object) -> EngineProfile:
    """A profile of ``style`` with a pool of ``pool`` tokens, 4,096 tokens a step and steps of
    10 ms plus 1 ms per 1,000 tokens computed (no context cost), unless ``changes`` say otherwise:
    durations easy to reason about."""
    base = {"sglang": PROFILES["sglang-llama-3.2-1b-fp8-8gb"], "vllm": PROFILES["vllm-llama-3.2-1b-fp8-8gb"]}
    fields: dict[str, object] = {"step_tokens": 4096, "costs": StepCosts(0.010, 0.000001, 0.0)}
    return base[style].with_changes(pool_tokens=pool, **{**fields, **changes})


def of_kind(events: list[EngineEvent], kind: type[_E]) -> list[_E]:
    """The events of one kind, in order."""
    return [event for event in events if isinstance(event, kind)]


def by_id(events: list[EngineEvent], kind: type[_E]) -> dict[str, _E]:
    """The (last) event of one kind per request id."""
    return {event.request_id: event for event in of_kind(events, kind)}
