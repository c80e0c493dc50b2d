"""Circuit breaker: a replica whose turns fail several times in a row leaves rotation at once,
before its next probe, and comes back with its next healthy probe.

A health endpoint may answer 200 while every turn fails (an engine out of memory, a model that
failed to load behind a router): without the breaker each such turn costs its client an error until
the probe, every 2 s, notices nothing. With ``[scheduler.protection] breaker_failures = N`` (0, the
default: off), the N-th turn in a row that fails on a replica with an engine fault *trips* it: it
counts as unhealthy (:mod:`.health`) until a probe finds it healthy, which resets the count. A
finished turn resets the count too. Failures that are not the engine's (the client left
mid-stream: ``TurnFailed.engine_fault`` false) leave the count alone.

A turn whose engine was never reached (``TurnFailed.unreachable``: the connection refused, or
reset or timed out before any byte of the answer) trips it at once, whatever the threshold and
even with the breaker off: the replica is down, and the next probe may be 2 s away while the
dataplane sends its turn to another replica (docs/failover.md).

Reads: the replica's failures in a row and whether it is tripped; the failed turn's
``engine_fault`` and ``unreachable``; the configured threshold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica


def failed(replica: Replica, engine_fault: bool, threshold: int, unreachable: bool = False) -> bool:
    """Count one failed turn of ``replica``; True when it trips the breaker now."""
    if unreachable:
        replica.failures += 1
        if not replica.tripped:
            replica.tripped = True
            return True
        return False
    if not engine_fault or threshold <= 0:
        return False
    replica.failures += 1
    if replica.failures >= threshold and not replica.tripped:
        replica.tripped = True
        return True
    return False


def finished(replica: Replica) -> None:
    """A turn of ``replica`` finished: its failures in a row start again from 0."""
    replica.failures = 0


def probed(replica: Replica, healthy: bool) -> bool:
    """A probe of ``replica``: a healthy one closes the breaker (the count starts again); True when
    it closed it now."""
    if healthy and replica.tripped:
        replica.tripped = False
        replica.failures = 0
        return True
    return False
