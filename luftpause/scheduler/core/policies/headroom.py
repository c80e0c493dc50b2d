"""Headroom for returning runs: a batch turn may not take the slots interactive runs will need.

An interactive run paused on a tool at a replica comes back soon and, by strict affinity, only to
that replica; so one slot per such run is kept from batch turns there. Interactive turns may use
those slots (a person waits either way). How long a pause keeps its slot is
:mod:`.pause_hold`'s. Reads: the service class of the turn and the interactive runs tool-paused at
the replica within their hold (``Replica.reserved_for``, kept by
:mod:`luftpause.scheduler.core.decide`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.events import RunPhase, ServiceClass
    from luftpause.scheduler.core.state import Replica


def reserved(replica: Replica) -> int:
    """Slots of ``replica`` kept for its tool-paused interactive runs."""
    return len(replica.reserved_for)


def kept_from(replica: Replica, service_class: ServiceClass) -> int:
    """How many of ``replica``'s free slots a turn of ``service_class`` may not take."""
    return len(replica.reserved_for) if service_class == "batch" else 0


def reserves(service_class: ServiceClass, phase: RunPhase, last_replica: str | None) -> str | None:
    """The replica a run in this class and phase keeps a slot on, or ``None``."""
    if service_class == "interactive" and phase == "tool_paused":
        return last_replica
    return None
