"""Capacity leases: which replicas may be leased to dataplanes, how many slots, and how they are shared.

A lease lets a dataplane place a turn at once and report it after (rule 14 of
:mod:`luftpause.scheduler.core.decide`). It only makes sense where a decision could not change the
outcome: a replica that is healthy, whose engine reports no queue, and that no held turn may take
(checked in ``decide``, which knows the held queues). Its slots are those a batch turn could take
now: effective capacity less the headroom kept for tool-paused interactive runs less the turns
placed there less the slots already leased; so a leased batch turn never takes a kept slot.

Reads: the replica's kind, health, ``draining`` flag, engine ``waiting`` count, effective capacity
(:mod:`.engine_load`), headroom (:mod:`.headroom`), ``inflight`` and ``leased``; the number of
lessees and what each holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from luftpause.scheduler.core.policies import capacity, health

if TYPE_CHECKING:
    from luftpause.scheduler.core.state import Replica


def grantable(replica: Replica) -> bool:
    """True when ``replica`` may be leased at all: generative, usable, not draining (a lease may
    place a new run: :mod:`.draining`), its breaker closed (a half-open one takes trial turns
    only), its engine not queueing."""
    waiting = replica.engine_waiting
    return (
        replica.kind == "generative"
        and health.usable(replica)
        and replica.breaker == "closed"
        and not replica.draining
        and (waiting is None or waiting <= 0)
    )


def room(replica: Replica) -> int:
    """Slots of ``replica`` a batch turn could take now and nobody holds: may be negative."""
    return capacity.limit(replica, "batch") - replica.inflight - replica.leased


def shares(total: int, holdings: Sequence[int]) -> list[int]:
    """What each of ``len(holdings)`` lessees should hold of ``total`` slots: an even split, the
    remainder one each to the first lessees (their order is the order they resynced in)."""
    base, extra = divmod(total, len(holdings))
    return [base + (1 if index < extra else 0) for index in range(len(holdings))]
