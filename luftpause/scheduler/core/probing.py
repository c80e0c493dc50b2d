"""Probe rounds (rules 2 and 3 of :mod:`.decide`): health, engine load and the learned batch
capacity of every replica of a round, applied whole before the replicas it opened are filled."""

from __future__ import annotations

from collections.abc import Iterable

from luftpause.scheduler.core.actions import (
    Action,
)
from luftpause.scheduler.core.events import (
    ReplicaProbed,
)
from luftpause.scheduler.core.held import (
    pinned_to,
)
from luftpause.scheduler.core.placement import _fill_least_loaded, _refile, _takes_held
from luftpause.scheduler.core.policies import (
    engine_load,
)
from luftpause.scheduler.core.state import Replica, State


def _probed(state: State, probes: Iterable[ReplicaProbed], at: float, out: list[Action]) -> None:
    """Apply a probe round (health, load, learned batch capacity), then fill what it opened."""
    probed: list[Replica] = []
    flipped: list[Replica] = []
    for event in probes:
        replica = state.replicas.get(event.replica)
        if replica is None:
            continue  # not configured here (a probe from an older configuration)
        turns_wait = bool(state.held) and _takes_held(state, replica)
        was_healthy = replica.healthy
        replica.healthy = event.healthy
        replica.probed_at = event.at
        replica.engine_running = event.running
        replica.engine_waiting = event.waiting
        replica.kv_usage = event.kv_usage
        replica.cache_hit_rate = event.cache_hit_rate
        replica.batch_capacity = engine_load.learn(
            replica.batch_capacity, event.healthy, event.running, event.waiting, turns_wait
        )
        probed.append(replica)
        if was_healthy != replica.healthy and replica.kind == "generative":
            flipped.append(replica)
    if flipped and state.held:
        # affinity to these replicas yields (or holds again): re-file the held turns they concern.
        # A scan of the held turns, but only when a replica's health flips.
        pinned = {pinned_to(replica.name) for replica in flipped}
        models = {model for replica in flipped for model in replica.models}
        concerned = [
            turn.turn_id
            for turn in state.held
            if turn.queue in pinned or (turn.queue[0] == "model" and turn.model in models)
        ]
        _refile(state, concerned, at, out)
    if probed:
        _fill_least_loaded(state, probed, at, out)
