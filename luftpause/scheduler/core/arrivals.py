"""Turn arrivals (rules 1, 4, 11, 13, 18 of :mod:`.decide`): refused, answered again, placed or held."""

from __future__ import annotations

from luftpause.scheduler.core.actions import (
    Action,
    Place,
    Reject,
)
from luftpause.scheduler.core.events import (
    TurnArrived,
)
from luftpause.scheduler.core.held import (
    HeldTurn,
    any_replica_for,
    pinned_to,
)
from luftpause.scheduler.core.leasing import revoke
from luftpause.scheduler.core.limiting import refusal
from luftpause.scheduler.core.placement import begin_soft_wait, destination, place, run_of_arrival, where
from luftpause.scheduler.core.policies import (
    abandoned,
    capacity,
    health,
    idle_affinity,
    routing,
    run_order,
)
from luftpause.scheduler.core.state import State

FAILOVER_REFUSED_STATUS = 502
"""A turn admitted again after its replica was unreachable, with no other usable replica: what
the client would have had without the failover (docs/failover.md)."""


def arrived(state: State, event: TurnArrived, out: list[Action]) -> None:
    placed = state.placed.get(event.turn_id)
    if placed is not None:
        out.append(Place(event.turn_id, placed.replica))
        return
    if event.turn_id in state.held:
        return
    if event.turn_id in state.tombstones:
        state.counters.rejected += 1
        out.append(Reject(event.turn_id, abandoned.ABANDONED_REASON, abandoned.ABANDONED_STATUS))
        return
    serving = routing.replicas_for(state, event.model, event.single_pass)
    if not serving:
        state.counters.rejected += 1
        reason = routing.unknown_model_reason(event.model, event.single_pass)
        out.append(Reject(event.turn_id, reason, routing.UNKNOWN_MODEL_STATUS))
        return
    if event.failover_from:
        # its replica failed it before answering: another one, now, or the client hears so at
        # once rather than waiting for a replica to come back
        serving = tuple(replica for replica in serving if replica.name != event.failover_from)
    if event.failover_from and not any(health.usable(replica) for replica in serving):
        state.counters.rejected += 1
        reason = (
            f"replica {event.failover_from} failed the turn before answering, and no other healthy "
            f"replica serves model {event.model!r}"
        )
        out.append(Reject(event.turn_id, reason, FAILOVER_REFUSED_STATUS))
        return
    turn = HeldTurn(
        event.turn_id,
        event.run_id,
        event.model,
        event.service_class,
        event.caller,
        event.dataplane_id,
        event.at,
        state.next_seq,
        any_replica_for(event.model),
        event.single_pass,
        event.trace_id,
    )
    if not event.single_pass and state.strict_affinity:
        soft = idle_affinity.soft_replica(
            state.idle_affinity, state.runs.get(event.run_id), serving, event.at
        )
        turn.soft = None if soft is None else soft.name
    if state.protection.on:
        refused = refusal(state, event, turn, serving)  # rule 18, before anything is recorded
        if refused is not None:
            out.append(refused)
            return
    state.counters.arrived += 1
    run = None if event.single_pass else run_of_arrival(state, event, out)  # rule 13: no run state
    turn.rank = run_order.rank(state.run_order, run, turn.seq)
    state.next_seq += 1
    turn.queue, usable, soft = where(state, run, turn, serving)
    # where it would go with no lease out (rule 14: a lease gives way to a turn that asks)
    target = None if state.holding else destination(usable, soft, turn.service_class, not state.lessees)
    if target is None:
        state.held.add(turn)
        if soft is not None and run is not None and turn.queue == pinned_to(soft.name):
            begin_soft_wait(state, run, turn, soft, event.at)
    else:
        if target.leased and not capacity.has_room(target, turn.service_class):
            revoke(state, target, out)
        place(state, turn, target, event.at, out)
