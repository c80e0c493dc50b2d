"""Health: an unusable replica gets no turns, and runs pinned to it may move.

A replica is unusable while its last probe found it unhealthy (``ReplicaProbed``: its health path
failed or timed out), while its circuit breaker is open (:mod:`.breaker`: turns failed there;
a half-open breaker leaves it usable, for its trial turns only: :mod:`.capacity`) and while it is
being removed (:mod:`.draining`).

A replica never probed counts as healthy, so a scheduler without probes (tests, a first start)
places turns as before. A known model whose replicas are all unusable is not refused: its turns
are held until one comes back.

Reads: the replica's ``healthy`` and ``removing`` flags and its breaker state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica


def usable(replica: Replica) -> bool:
    """True when ``replica`` may be given turns: its last probe found it healthy (or none ran yet),
    its breaker is not open and it is not being removed."""
    return replica.healthy and not replica.tripped and not replica.removing
