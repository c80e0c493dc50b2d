"""Capacity leases (rule 14 of :mod:`.decide`): granting, withdrawing and using them."""

from __future__ import annotations

from luftpause.scheduler.core.actions import (
    Action,
    GrantLease,
    RevokeLease,
)
from luftpause.scheduler.core.events import (
    LeasedTurnPlaced,
    TurnArrived,
)
from luftpause.scheduler.core.held import (
    HeldTurn,
    any_replica_for,
)
from luftpause.scheduler.core.placement import any_held_for, fill_least_loaded, place, run_of_arrival
from luftpause.scheduler.core.policies import (
    affinity,
    leases,
    routing,
)
from luftpause.scheduler.core.state import Lease, Replica, Run, State


def leased(state: State, event: LeasedTurnPlaced, out: list[Action]) -> None:
    """A dataplane placed a turn under a lease: it is placed there, whatever the lease says now."""
    replica = state.replicas.get(event.replica)
    if replica is None or replica.kind != "generative" or event.turn_id in state.placed:
        return  # not a replica of ours (a different configuration), or reported already
    holding = state.lessees.get(event.dataplane_id, {}).get(event.replica)
    if holding is not None and holding.epoch == event.epoch and holding.count > 0:
        holding.count -= 1
        replica.leased -= 1
    else:
        state.counters.lease_crossings += 1  # it crossed the revocation on the wire: it stands
    waiting = state.held.remove(event.turn_id)  # its Admit is out too (a dataplane of another make)
    run: Run | None
    if waiting is None:
        state.counters.arrived += 1
        arrival = TurnArrived(
            event.turn_id,
            event.run_id,
            event.model,
            event.service_class,
            event.caller,
            event.dataplane_id,
            event.at,
        )
        run = run_of_arrival(state, arrival, out)
    else:
        run = state.runs.get(event.run_id)
    if state.strict_affinity:
        pinned = affinity.pinned_replica(run, routing.replicas_for(state, event.model))
        if pinned is not None and pinned is not replica:
            state.counters.leased_off_affinity += 1
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
        trace_id=event.trace_id,
    )
    state.next_seq += 1
    place(state, turn, replica, event.at, out, leased=True, answer=waiting is not None)
    state.placed[event.turn_id].started_at = event.at  # it went to its engine as it was placed


def drop_leases(state: State, dataplane_id: str, takes_leases: bool) -> None:
    """Return every slot leased to ``dataplane_id``; it stays a lessee only if ``takes_leases``."""
    holdings = state.lessees.pop(dataplane_id, None)
    if holdings is not None:
        for name, holding in holdings.items():
            state.replicas[name].leased -= holding.count
    if takes_leases and dataplane_id:
        state.lessees[dataplane_id] = {}


def lease(state: State, at: float, out: list[Action]) -> None:
    """After an event: withdraw the leases that no longer hold, give what that frees to the held
    turns (least loaded replica first, as an arrival would have been placed), then share out what
    may be leased. Afterwards no replica with a lease may take a held turn."""
    opened: list[Replica] = []
    for replica in state.replicas.values():
        if not replica.leased:
            continue
        takes_held = bool(state.held) and any_held_for(state, replica)
        if state.holding or takes_held or not leases.grantable(replica) or leases.room(replica) < 0:
            revoke(state, replica, out)
            if takes_held:
                opened.append(replica)
    if opened:
        fill_least_loaded(state, opened, at, out)
    if state.holding:
        return
    for replica in state.replicas.values():
        if not leases.grantable(replica) or (state.held and any_held_for(state, replica)):
            continue
        room = leases.room(replica)
        if room > 0:
            _grant(state, replica, room, out)


def revoke(state: State, replica: Replica, out: list[Action]) -> None:
    for dataplane_id, holdings in state.lessees.items():
        holding = holdings.get(replica.name)
        if holding is None or holding.count == 0:
            continue  # every slot granted was reported used: nothing to withdraw
        replica.leased -= holding.count
        holding.count = 0
        holding.epoch = state.next_lease_epoch
        state.next_lease_epoch += 1
        state.counters.lease_revocations += 1
        out.append(RevokeLease(dataplane_id, replica.name, holding.epoch))


def _grant(state: State, replica: Replica, room: int, out: list[Action]) -> None:
    lessees = list(state.lessees.items())
    held = [holdings.get(replica.name) for _, holdings in lessees]
    wanted = leases.shares(room + replica.leased, [0 if h is None else h.count for h in held])
    for (dataplane_id, holdings), holding, want in zip(lessees, held, wanted, strict=True):
        give = min(want - (0 if holding is None else holding.count), room)
        if give <= 0:
            continue
        if holding is None:
            holding = holdings[replica.name] = Lease(0, state.next_lease_epoch)
            state.next_lease_epoch += 1
        holding.count += give
        replica.leased += give
        room -= give
        out.append(GrantLease(dataplane_id, replica.name, give, holding.epoch, replica.models))
