"""Probe rounds (rules 2 and 3 of :mod:`.decide`): health, engine load and the learned batch
capacity of every replica of a round, applied whole before the replicas it opened are filled."""

from __future__ import annotations

from collections.abc import Iterable

from luftpause.scheduler.core.actions import (
    Action,
    BreakerChanged,
)
from luftpause.scheduler.core.events import (
    ReplicaProbed,
)
from luftpause.scheduler.core.placement import any_held_for, fill_least_loaded, usability_changed
from luftpause.scheduler.core.policies import (
    breaker,
    engine_load,
    health,
)
from luftpause.scheduler.core.state import Replica, State


def apply_probes(state: State, probes: Iterable[ReplicaProbed], at: float, out: list[Action]) -> None:
    """Apply a probe round (health, load, learned batch capacity), then fill what it opened."""
    probed: list[Replica] = []
    flipped: list[Replica] = []
    for event in probes:
        replica = state.replicas.get(event.replica)
        if replica is None:
            continue  # not configured here (a probe from an older configuration)
        turns_wait = bool(state.held) and any_held_for(state, replica)
        was_usable = health.usable(replica)
        replica.healthy = event.healthy
        change = breaker.probed(replica, event.healthy, event.at, state.protection.breaker)
        if change is not None:  # open -> half-open after open_s, or half-open -> open
            breaker_changed(state, replica, change, out)
        replica.probed_at = event.at
        replica.engine_running = event.running
        replica.engine_waiting = event.waiting
        replica.kv_usage = event.kv_usage
        replica.cache_hit_rate = event.cache_hit_rate
        learned = engine_load.learn(
            replica.batch_capacity,
            event.healthy,
            event.running,
            event.waiting,
            turns_wait,
            event.kv_usage,
            replica.queued,
        )
        replica.batch_capacity, replica.queued = learned.capacity, learned.queued
        probed.append(replica)
        if was_usable != health.usable(replica):
            flipped.append(replica)
    usability_changed(state, flipped, at, out)
    if probed:
        fill_least_loaded(state, probed, at, out)


def breaker_changed(state: State, replica: Replica, change: breaker.Transition, out: list[Action]) -> None:
    """Count ``replica``'s breaker transition ``change`` and tell the shell (rule 17)."""
    key = (replica.name, change.before, change.after)
    state.breaker_transitions[key] = state.breaker_transitions.get(key, 0) + 1
    if change.after == "open":
        state.counters.breaker_trips += 1
    elif change.after == "closed":
        state.counters.breaker_closes += 1
    out.append(BreakerChanged(replica.name, change.before, change.after, change.reason))
