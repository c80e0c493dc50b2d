"""Draining and removing replicas (the admin API, ``SIGHUP``): which turns a replica still takes.

* A *draining* replica takes no new run: only turns of runs pinned to it by affinity (generating
  or tool-paused there, :mod:`.affinity`: a run coming back from its tool still goes there) until
  they end or move; its in-flight turns finish; it is never leased (:mod:`.leases`). A single-pass
  replica, which pins no run, takes nothing while draining.
* A *removing* replica takes no turn at all (it counts as unusable, :mod:`.health`, so affinity
  yields and the runs pinned there move); it leaves the replica set when its last placed turn ends,
  at once when it has none. Holding back a run coming back from its tool would make a removal last
  as long as the longest run on it; a removal is bounded by the turn expiry (600 s) instead.

Reads: the replica's ``draining`` and ``removing`` flags.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica


def takes_new_runs(replica: Replica) -> bool:
    """True when a turn that no affinity pins to ``replica`` may go there."""
    return not replica.draining and not replica.removing


def retirable(replica: Replica) -> bool:
    """True when a replica being removed may leave the set now: nothing placed or leased there."""
    return replica.removing and replica.inflight == 0 and replica.leased == 0
