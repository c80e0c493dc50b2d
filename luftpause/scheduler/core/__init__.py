"""The scheduler's pure core: ``decide(state, event) -> (state, actions)`` and ``snapshot``.

No IO, no clock, no randomness: time arrives inside events. The shell
(:mod:`luftpause.scheduler.server`) turns gRPC calls and its 1 s timer into events and carries out
the actions. Rules: :mod:`luftpause.scheduler.core.decide`; policies: :mod:`.policies`.
"""

from __future__ import annotations

from luftpause.scheduler.core.actions import (
    AckResync,
    Action,
    BreakerChanged,
    Forget,
    GrantLease,
    Place,
    Reject,
    RetireReplica,
    RevokeLease,
)
from luftpause.scheduler.core.decide import decide
from luftpause.scheduler.core.events import (
    AbandonReported,
    DataplaneLost,
    Event,
    FirstToken,
    InFlightRecord,
    LeasedTurnPlaced,
    ReplicaAdded,
    ReplicaDrained,
    ReplicaProbed,
    ReplicaRemoved,
    ReplicaRestored,
    ReplicasProbed,
    Resynced,
    RunEnded,
    RunPhase,
    RunRecord,
    ServiceClass,
    Tick,
    TurnAbandoned,
    TurnArrived,
    TurnFailed,
    TurnFinished,
    TurnStarted,
)
from luftpause.scheduler.core.held import HeldTurn
from luftpause.scheduler.core.resync import resync_gone_turns
from luftpause.scheduler.core.snapshot import snapshot
from luftpause.scheduler.core.state import PlacedTurn, State, new_state, state_from_replicas
from luftpause.scheduler.core.turn_ends import dataplanes_gone_for_good, expiring_turns, turns_on

__all__ = [
    "AbandonReported",
    "AckResync",
    "Action",
    "BreakerChanged",
    "DataplaneLost",
    "Event",
    "FirstToken",
    "Forget",
    "GrantLease",
    "HeldTurn",
    "InFlightRecord",
    "LeasedTurnPlaced",
    "Place",
    "PlacedTurn",
    "Reject",
    "ReplicaAdded",
    "ReplicaDrained",
    "ReplicaProbed",
    "ReplicaRemoved",
    "ReplicaRestored",
    "ReplicasProbed",
    "Resynced",
    "RetireReplica",
    "RevokeLease",
    "RunEnded",
    "RunPhase",
    "RunRecord",
    "ServiceClass",
    "State",
    "Tick",
    "TurnAbandoned",
    "TurnArrived",
    "TurnFailed",
    "TurnFinished",
    "TurnStarted",
    "dataplanes_gone_for_good",
    "decide",
    "expiring_turns",
    "new_state",
    "resync_gone_turns",
    "snapshot",
    "state_from_replicas",
    "turns_on",
]
