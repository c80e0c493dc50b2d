"""Capacity: whether a replica has a slot for one more turn of a given service class.

A replica has room for a turn when it is usable (:mod:`.health`) and its in-flight turns are below
its effective capacity (:mod:`.engine_load`) less the slots kept from that class (:mod:`.headroom`),
and, while its breaker is half-open, below its trial turns (:mod:`.breaker`).
Reads: the replica's ``inflight`` (turns placed and not yet finished, failed, abandoned or expired)
and ``leased`` (slots leased to dataplanes, unused), health, engine load, ``max_inflight`` and
headroom; the turn's service class.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from luftpause.scheduler.core.policies import breaker, engine_load, headroom, health

if TYPE_CHECKING:
    from luftpause.scheduler.core.events import ServiceClass
    from luftpause.scheduler.core.state import Replica


def limit(replica: Replica, service_class: ServiceClass = "interactive") -> int:
    """The most in-flight turns ``replica`` may have after placing a turn of ``service_class``."""
    return engine_load.capacity(replica) - headroom.kept_from(replica, service_class)


def has_room(
    replica: Replica, service_class: ServiceClass = "interactive", leased_taken: bool = True
) -> bool:
    """True when one more turn of ``service_class`` may be placed on ``replica``.

    Slots leased to dataplanes (:mod:`.leases`) are taken, as placed turns are, unless
    ``leased_taken`` is False (a lease may be withdrawn to make room).
    """
    used = replica.inflight + replica.leased if leased_taken else replica.inflight
    trials = breaker.room(replica)  # a half-open breaker takes its trial turns only
    return (
        health.usable(replica) and used < limit(replica, service_class) and (trials is None or used < trials)
    )


def with_room(
    replicas: Iterable[Replica], service_class: ServiceClass = "interactive", leased_taken: bool = True
) -> list[Replica]:
    """Those of ``replicas`` with room for a turn of ``service_class``, in the given order."""
    return [replica for replica in replicas if has_room(replica, service_class, leased_taken)]
