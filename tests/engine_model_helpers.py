"""Builders for the engine model's tests: prompt paths from synthetic keys, and running an
engine until it is idle."""

from __future__ import annotations

import hashlib

from luftpause.testkit.engine.model import EngineEvent, EngineModel, PrefixPath


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
