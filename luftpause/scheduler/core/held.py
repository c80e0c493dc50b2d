"""Held turns: the turns waiting for a slot, filed in one queue per place they may go.

A held turn is filed either under ``("replica", name)`` (its run is pinned to that replica by
affinity) or under ``("model", model)`` (any replica serving its model will do). When a slot frees
on a replica, only the heads of that replica's queue and of the queues of its models are looked at,
so placing a turn costs O(models of the replica · log held), not a scan of every held turn, and a
turn pinned to a full replica never blocks turns that may go elsewhere.

Each queue is a heap of ``(order key, arrival number, turn id)`` with lazy deletion: an abandoned
or re-filed turn leaves a stale entry that is dropped when it reaches the top (or when stale
entries outnumber live ones four to one). The heap order is the ordering policy's key
(:func:`luftpause.scheduler.core.policies.ordering.order_key`).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

from luftpause.scheduler.core.events import ServiceClass
from luftpause.scheduler.core.policies.ordering import order_key

QueueKey = tuple[str, str]
"""``("replica", name)`` for a pinned turn, ``("model", model)`` for one that may go anywhere."""


def pinned_to(replica: str) -> QueueKey:
    """The queue of turns that may only go to ``replica``."""
    return ("replica", replica)


def any_replica_for(model: str) -> QueueKey:
    """The queue of turns that may go to any replica serving ``model``."""
    return ("model", model)


@dataclass(slots=True)
class HeldTurn:
    """A turn waiting for a slot. ``seq`` is its arrival number; ``queue`` where it is filed."""

    turn_id: str
    run_id: str
    model: str
    service_class: ServiceClass
    caller: str
    dataplane_id: str
    arrived_at: float
    seq: int
    queue: QueueKey


_COMPACT_MIN = 64


class HeldTurns:
    """Every held turn by id (arrival order) and per queue (heap order)."""

    __slots__ = ("_by_id", "_heaps", "_live")

    def __init__(self) -> None:
        self._by_id: OrderedDict[str, HeldTurn] = OrderedDict()
        self._heaps: dict[QueueKey, list[tuple[tuple[int, ...], int, str]]] = {}
        self._live: dict[QueueKey, int] = {}

    def __len__(self) -> int:
        return len(self._by_id)

    def __contains__(self, turn_id: object) -> bool:
        return turn_id in self._by_id

    def __iter__(self) -> Iterator[HeldTurn]:
        """Held turns in arrival order."""
        return iter(self._by_id.values())

    def get(self, turn_id: str) -> HeldTurn | None:
        return self._by_id.get(turn_id)

    def oldest(self) -> HeldTurn | None:
        """The held turn that arrived first, or ``None``."""
        for turn in self._by_id.values():
            return turn
        return None

    def add(self, turn: HeldTurn) -> None:
        """Hold ``turn`` in the queue ``turn.queue``."""
        self._by_id[turn.turn_id] = turn
        self._push(turn)

    def remove(self, turn_id: str) -> HeldTurn | None:
        """Take ``turn_id`` out of its queue; ``None`` if it is not held."""
        turn = self._by_id.pop(turn_id, None)
        if turn is not None:
            self._unfile(turn.queue)
        return turn

    def refile(self, turn: HeldTurn, queue: QueueKey) -> None:
        """Move a held turn to another queue, keeping its place in arrival order."""
        if queue == turn.queue:
            return
        self._unfile(turn.queue)
        turn.queue = queue
        self._push(turn)

    def head(self, queue: QueueKey) -> HeldTurn | None:
        """The first turn of ``queue`` in order, or ``None`` if it is empty."""
        heap = self._heaps.get(queue)
        while heap:
            _, seq, turn_id = heap[0]
            turn = self._by_id.get(turn_id)
            if turn is not None and turn.queue == queue and turn.seq == seq:
                return turn
            heapq.heappop(heap)
        return None

    def _push(self, turn: HeldTurn) -> None:
        entry = (order_key(turn), turn.seq, turn.turn_id)
        heapq.heappush(self._heaps.setdefault(turn.queue, []), entry)
        self._live[turn.queue] = self._live.get(turn.queue, 0) + 1

    def _unfile(self, queue: QueueKey) -> None:
        live = self._live[queue] - 1
        heap = self._heaps[queue]
        if live == 0:
            # nothing valid is left: drop the heap with its stale entries
            del self._live[queue]
            del self._heaps[queue]
            return
        self._live[queue] = live
        if len(heap) > _COMPACT_MIN and len(heap) > 4 * live:
            kept = {
                entry
                for entry in heap
                if (t := self._by_id.get(entry[2])) is not None and t.queue == queue and t.seq == entry[1]
            }
            heap[:] = list(kept)
            heapq.heapify(heap)
