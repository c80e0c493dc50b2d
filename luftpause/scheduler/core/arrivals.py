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
)
from luftpause.scheduler.core.leasing import _revoke
from luftpause.scheduler.core.limiting import refusal
from luftpause.scheduler.core.placement import _place, _run_of_arrival, _where
from luftpause.scheduler.core.policies import (
    abandoned,
    capacity,
    least_loaded,
    routing,
    run_order,
)
from luftpause.scheduler.core.state import State


def _arrived(state: State, event: TurnArrived, out: list[Action]) -> None:
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
    if state.protection.on:
        refused = refusal(state, event, turn, serving)  # rule 18, before anything is recorded
        if refused is not None:
            out.append(refused)
            return
    state.counters.arrived += 1
    run = None if event.single_pass else _run_of_arrival(state, event, out)  # rule 13: no run state
    turn.rank = run_order.rank(state.run_order, run, turn.seq)
    state.next_seq += 1
    turn.queue, usable = _where(state, run, turn, serving)
    # where it would go with no lease out (rule 14: a lease gives way to a turn that asks)
    leased_taken = not state.lessees
    target = None
    if not state.holding:
        target = least_loaded.pick(capacity.with_room(usable, turn.service_class, leased_taken))
    if target is None:
        state.held.add(turn)
    else:
        if target.leased and not capacity.has_room(target, turn.service_class):
            _revoke(state, target, out)
        _place(state, turn, target, event.at, out)
