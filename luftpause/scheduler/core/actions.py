"""What the shell must do: the outputs of :func:`luftpause.scheduler.core.decide.decide`.

Actions are imperatives, frozen and slotted. ``Place`` and ``Reject`` answer the Admit waiting for
that turn id; ``Forget`` and ``AckResync`` tell the shell what became of runs and of a resync;
``GrantLease`` and ``RevokeLease`` go to one dataplane's stream (rule 14, capacity leases);
``RetireReplica`` says a removed replica has left the set (rule 16); ``BreakerChanged`` that a
replica's circuit breaker changed state (rule 17), for the shell to log.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Place:
    """Send turn ``turn_id`` to replica ``replica`` (a replica name from the configuration)."""

    turn_id: str
    replica: str


@dataclass(frozen=True, slots=True)
class Reject:
    """Refuse turn ``turn_id``: the dataplane answers ``http_status`` with ``reason`` as the message.

    ``retry_after_s``: seconds the client should wait before trying again (a protection limit's
    429 carries it as ``Retry-After``); 0: none said.
    """

    turn_id: str
    reason: str
    http_status: int
    retry_after_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Forget:
    """Run ``run_id`` is no longer tracked; its next turn starts with no affinity."""

    run_id: str


@dataclass(frozen=True, slots=True)
class AckResync:
    """Answer dataplane ``dataplane_id``'s resync: ``runs`` runs and ``turns`` in-flight turns adopted."""

    dataplane_id: str
    runs: int
    turns: int


@dataclass(frozen=True, slots=True)
class GrantLease:
    """Tell dataplane ``dataplane_id`` it may place ``count`` more turns on ``replica`` at once.

    Under ``epoch``: the dataplane reports each turn it places with it (``LeasedTurnPlaced``).
    ``models``: the replica's, the turns it may take (rule 14).
    """

    dataplane_id: str
    replica: str
    count: int
    epoch: int
    models: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RevokeLease:
    """Tell dataplane ``dataplane_id`` that every unused slot it holds of ``replica`` is withdrawn.

    ``epoch`` is the holding's new epoch: turns reported with an older one crossed this revocation.
    """

    dataplane_id: str
    replica: str
    epoch: int


@dataclass(frozen=True, slots=True)
class RetireReplica:
    """Replica ``replica``, being removed, has nothing placed or leased any more and has left the
    set: stop probing it and tell the dataplanes."""

    replica: str


@dataclass(frozen=True, slots=True)
class BreakerChanged:
    """Replica ``replica``'s circuit breaker went ``before`` -> ``after`` (``"closed"``, ``"open"``
    or ``"half_open"``: :mod:`.policies.breaker`); ``reason`` says why, in words."""

    replica: str
    before: str
    after: str
    reason: str = ""

    @property
    def opened(self) -> bool:
        """It opened: the replica takes no turn."""
        return self.after == "open"


Action = Place | Reject | Forget | AckResync | GrantLease | RevokeLease | RetireReplica | BreakerChanged
