"""Capacity: at most ``max_inflight`` placed turns per replica; the scheduler holds the rest.

Reads: the replica's ``inflight`` (turns placed and not yet finished, failed, abandoned or expired)
and its configured ``max_inflight``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica


def has_room(replica: Replica) -> bool:
    """True when one more turn may be placed on ``replica``."""
    return replica.inflight < replica.max_inflight


def with_room(replicas: Iterable[Replica]) -> list[Replica]:
    """Those of ``replicas`` with room, in the given order."""
    return [replica for replica in replicas if replica.inflight < replica.max_inflight]
