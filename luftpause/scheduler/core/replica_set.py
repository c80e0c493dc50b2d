"""Replicas changed at run time (rule 16 of :mod:`.decide`): added, drained, put back, removed and
retired once nothing is placed on them (:mod:`.policies.draining`)."""

from __future__ import annotations

from luftpause.scheduler.core.actions import Action, RetireReplica
from luftpause.scheduler.core.events import ReplicaAdded, ReplicaDrained, ReplicaRemoved, ReplicaRestored
from luftpause.scheduler.core.held import pinned_to
from luftpause.scheduler.core.placement import fill, refile, usability_changed
from luftpause.scheduler.core.policies import draining, health
from luftpause.scheduler.core.state import Replica, State, index_models


def added(state: State, event: ReplicaAdded, out: list[Action]) -> None:
    if event.name in state.replicas:
        return  # the shell refuses a name already in the set; a replay of the same event is a no-op
    replica = Replica(
        event.name, tuple(event.models), event.kind, event.max_inflight, state.next_replica_index
    )
    state.next_replica_index += 1
    state.replicas[replica.name] = replica
    index_models(state)
    state.counters.replicas_added += 1
    fill(state, replica, event.at, out)  # the held turns of its models may go there now


def drained(state: State, event: ReplicaDrained, out: list[Action]) -> None:
    replica = state.replicas.get(event.name)
    if replica is None or replica.draining or replica.removing:
        return
    replica.draining = True  # its leases are withdrawn after the event (not grantable any more)
    # the turns waiting for it as their soft replica wait no more: they go as new runs' do
    waiting = [turn.turn_id for turn in state.held if turn.soft == replica.name and not turn.soft_over]
    if waiting:
        refile(state, waiting, event.at, out)


def restored(state: State, event: ReplicaRestored, out: list[Action]) -> None:
    replica = state.replicas.get(event.name)
    if replica is None or not (replica.draining or replica.removing):
        return
    was_usable = health.usable(replica)
    replica.draining = replica.removing = False
    state.removing.discard(replica.name)
    if was_usable != health.usable(replica):
        usability_changed(state, [replica], event.at, out)
    fill(state, replica, event.at, out)


def removed(state: State, event: ReplicaRemoved, out: list[Action]) -> None:
    replica = state.replicas.get(event.name)
    if replica is None or replica.removing:
        return
    was_usable = health.usable(replica)
    replica.removing = True
    replica.draining = False
    state.removing.add(replica.name)
    if was_usable:
        usability_changed(state, [replica], event.at, out)  # runs pinned there move now
    # The slots it keeps for runs paused there stay kept until it leaves (it takes no turn, so they
    # keep nothing from anyone); a paused run's next turn goes elsewhere and gives its slot up then.


def retire_due(state: State, at: float, out: list[Action]) -> None:
    """Retire every replica being removed that has nothing placed or leased any more."""
    due = [replica for replica in state.replicas.values() if draining.retirable(replica)]
    for replica in due:
        _retire(state, replica, at, out)


def _retire(state: State, replica: Replica, at: float, out: list[Action]) -> None:
    del state.replicas[replica.name]
    state.removing.discard(replica.name)
    index_models(state)
    for holdings in state.lessees.values():
        holdings.pop(replica.name, None)  # every slot was revoked (leased == 0): only the epoch is left
    # no run keeps it as its last replica: a replica added later under its name holds no prefix of theirs
    for run in state.runs.values():
        if run.last_replica == replica.name:
            run.last_replica = None
        if run.reserved_on == replica.name:
            run.reserved_on = None
    pinned = pinned_to(replica.name)
    stranded = [turn.turn_id for turn in state.held if turn.queue == pinned]
    state.counters.replicas_retired += 1
    out.append(RetireReplica(replica.name))
    if stranded:
        refile(state, stranded, at, out)
