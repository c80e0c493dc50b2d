"""Strict affinity: a run that is generating or paused on a tool goes only to its last replica.

That replica holds the run's prefix cache, so the run waits for it even when another replica has
room. An ``idle`` run (finished its answer, failed its last turn, expired) or a new run may go
anywhere, and so may a run whose last replica is unhealthy (its prefix is no use there), or a run
parked by KV admission (:mod:`.kv_admission`: its tool outlived its caller's usual pause while its
replica's pool was wanted).
Reads: the run's ``phase``, ``last_replica`` and ``kv_parked``; the replicas serving the turn's
model and their health. A last replica that does not serve the turn's model (or is no longer configured) pins
nothing, since it cannot hold a prefix for that model.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from luftpause.scheduler.core.policies import health

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica, Run


def pinned_replica(run: Run | None, serving: tuple[Replica, ...]) -> Replica | None:
    """The only replica ``run``'s next turn may use, or ``None`` when any of ``serving`` will do."""
    if run is None or run.phase == "idle" or run.last_replica is None or run.kv_parked:
        return None
    for replica in serving:
        if replica.name == run.last_replica:
            return replica if health.usable(replica) else None
    return None
