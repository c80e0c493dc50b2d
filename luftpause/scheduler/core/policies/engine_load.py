"""Engine-load admission: how many turns a replica may have in flight, from what its engine reports.

While the engine's last ``/metrics`` show no waiting queue, the replica accepts turns up to its
configured ``max_inflight``. Once a queue forms (``waiting > 0``) the engine is saturated: more
turns would only wait inside it, where luftpause can no longer order them, so in-flight turns are
capped at the engine's reported running count and the scheduler holds the rest. A replica that
reports no load (no metrics, or none under a known name) is capped only by ``max_inflight``.

Reads: the replica's ``engine_running`` and ``engine_waiting`` (request counts from its last probe,
``None`` when not reported) and ``max_inflight``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica


def capacity(replica: Replica) -> int:
    """The most turns ``replica`` may have in flight now (its effective capacity, >= 0)."""
    waiting, running = replica.engine_waiting, replica.engine_running
    if waiting is None or running is None or waiting <= 0:
        return replica.max_inflight
    return min(replica.max_inflight, max(0, running))
