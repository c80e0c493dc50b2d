"""Health: an unhealthy replica gets no turns, and runs pinned to it may move.

Reads: the replica's ``healthy`` flag from its last probe (``ReplicaProbed``: its health path
failed or timed out). A replica never probed counts as healthy, so a scheduler without probes
(tests, a first start) places turns as before. A known model whose replicas are all unhealthy is
not refused: its turns are held until one comes back.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica


def usable(replica: Replica) -> bool:
    """True when ``replica`` may be given turns (its last probe found it healthy, or none ran yet)."""
    return replica.healthy
