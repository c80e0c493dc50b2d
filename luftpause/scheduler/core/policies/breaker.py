"""Circuit breaker: a replica whose turns fail several times in a row leaves rotation at once,
before its next probe, and comes back with its next healthy probe.

A health endpoint may answer 200 while every turn fails (an engine out of memory, a model that
failed to load behind a router): without the breaker each such turn costs its client an error until
the probe, every 2 s, notices nothing. With ``[scheduler.protection] breaker_failures = N`` (0, the
default: off), the N-th turn in a row that fails on a replica with an engine fault *trips* it: it
counts as unhealthy (:mod:`.health`) until a probe finds it healthy, which resets the count. A
finished turn resets the count too. Failures that are not the engine's (the client left
mid-stream: ``TurnFailed.engine_fault`` false) leave the count alone.

Reads: the replica's failures in a row and whether it is tripped; the failed turn's
``engine_fault``; the configured threshold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica


def failed(replica: Replica, engine_fault: bool, threshold: int) -> bool:
    """Count one failed turn of ``replica``; True when it trips the breaker now."""
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


def probed(replica: Replica, healthy: bool) -> None:
    """A probe of ``replica``: a healthy one closes the breaker (the count starts again)."""
    if healthy and replica.tripped:
        replica.tripped = False
        replica.failures = 0
