"""Held turns: the turns waiting for a slot, filed in one queue per place they may go.

A held generative turn is filed either under ``("replica", name)`` (its run is pinned to that
replica by affinity) or under ``("model", model)`` (any generative replica serving its model will
do); a held single-pass turn under ``("single_pass", model)`` (any single-pass replica serving its
model: single-pass turns have no affinity). When a slot frees on a replica, only the heads of the
queues that replica serves are looked at (:func:`queues_served_by`), so a turn pinned to a full
replica never blocks turns that may go elsewhere, and the two kinds of turn never meet.

The head of a queue is the first turn in the ordering policy's order
(:mod:`luftpause.scheduler.core.policies.ordering`): interactive first, then the root caller with
the fewest in-flight turns (its own and its sub-callers',
:mod:`luftpause.scheduler.core.policies.caller_tree`), then, within that root, the caller with the
fewest of its own, then the turn's rank (:mod:`luftpause.scheduler.core.policies.run_order`: its
run's start, by default), then arrival. Callers' and roots' in-flight turns are counted in the
pool their turn waits for: generative turns on generative replicas for generative queues,
single-pass turns on single-pass replicas for single-pass queues (dicts bound by
:meth:`HeldTurns.bind_loads`), so a caller busy on one pool is not pushed back on the other.

Both caller terms change while turns wait, so a queue is split into one *lane* per service class,
and a lane into one heap of ``(rank, arrival number, turn id)`` per caller; over them, one heap per
root of ``(caller's in-flight turns, its first turn's rank and arrival number, caller)`` (kept only
while the root has two callers or more in the lane: a root of one caller, the common case, is read
through that caller); over the roots, one heap of ``(root's in-flight turns, that root's first
entry, root)``. The heaps are kept lazily: an entry whose key is out of date is corrected when it
reaches the top, and when a caller's count falls (:meth:`HeldTurns.load_changed`) it gets a fresh
entry in its root's heap and its root a fresh one in every lane the root has turns in, so the
siblings' turns, whose root count fell with it, are re-ranked by one entry per lane and not one
per sibling; a count that rises needs none (every stale entry is then too small, and sinks when it
reaches the top). The top, once correct, is the true first: finding a head costs O(log)
amortised, never a scan of every held turn, caller or root.

Removed and re-filed turns leave stale entries, dropped when they reach the top or when stale
entries outnumber live ones four to one.

:meth:`HeldTurns.count` counts held turns per caller *and everything under it*, for the protection
limits (:mod:`luftpause.scheduler.core.policies.limits`), whose configured names may be any
caller of the tree.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field

from luftpause.scheduler.core.events import ServiceClass
from luftpause.scheduler.core.policies.caller_tree import lineage, root
from luftpause.scheduler.core.policies.ordering import CLASS_RANK

_SINGLE_PASS = "single_pass"

QueueKey = tuple[str, str]
"""``("replica", name)`` for a pinned turn, ``("model", model)`` for one that may go anywhere,
``("single_pass", model)`` for a single-pass turn."""

LaneKey = tuple[QueueKey, int]
"""A queue and a service class rank."""


def pinned_to(replica: str) -> QueueKey:
    """The queue of turns that may only go to ``replica``."""
    return ("replica", replica)


def any_replica_for(model: str) -> QueueKey:
    """The queue of generative turns that may go to any generative replica serving ``model``."""
    return ("model", model)


def single_pass_for(model: str) -> QueueKey:
    """The queue of single-pass turns that may go to any single-pass replica serving ``model``."""
    return (_SINGLE_PASS, model)


def is_single_pass(queue: QueueKey) -> bool:
    """True for a queue of single-pass turns."""
    return queue[0] == _SINGLE_PASS


def queues_served_by(name: str, kind: str, models: tuple[str, ...]) -> list[QueueKey]:
    """The queues whose turns replica ``name`` (of ``kind``, declaring ``models``) may take.

    A generative replica: the turns pinned to it and the free turns of its models. A single-pass
    replica: the single-pass turns of its models, and nothing else.
    """
    if kind == _SINGLE_PASS:
        return [single_pass_for(model) for model in models]
    return [pinned_to(name), *(any_replica_for(model) for model in models)]


@dataclass(slots=True)
class HeldTurn:
    """A turn waiting for a slot. ``seq`` is its arrival number; ``queue`` where it is filed.

    ``single_pass``: a single-pass turn (``/v1/decide``), for single-pass replicas only; it has no
    run state (``run_id`` is only carried along).
    """

    turn_id: str
    run_id: str
    model: str
    service_class: ServiceClass
    caller: str
    dataplane_id: str
    arrived_at: float
    seq: int
    queue: QueueKey
    single_pass: bool = False
    trace_id: str = ""
    """The turn's W3C trace id (32 hex digits), ``""`` when it came without a trace context."""
    rank: float = 0.0
    """Its place among its caller's held turns of its class, before arrival (smaller first;
    :mod:`luftpause.scheduler.core.policies.run_order`); fixed when it is filed."""
    soft: str | None = None
    """Its soft replica (:mod:`luftpause.scheduler.core.policies.idle_affinity`), fixed when it
    arrived: its idle run's last replica, which holds the run's prefix; ``None``: none."""
    soft_since: float | None = None
    """When it was held for its soft replica (its arrival); ``None``: it was not."""
    soft_until: float | None = None
    """When that wait ends (``None``: none began)."""
    soft_over: bool = False
    """Its wait for the soft replica is over (its end passed, the replica stopped taking it, or its
    run's last replica changed): it may go to any replica from now on."""


@dataclass(slots=True)
class _Lane:
    """The held turns of one queue and one service class, by root and caller."""

    turns: dict[str, list[tuple[float, int, str]]] = field(default_factory=dict)
    """Caller -> heap of (rank, arrival number, turn id), with stale entries."""
    live: dict[str, int] = field(default_factory=dict)
    """Caller -> its turns really filed here."""
    members: dict[str, set[str]] = field(default_factory=dict)
    """Root -> its callers with turns really filed here."""
    groups: dict[str, list[tuple[int, float, int, str]]] = field(default_factory=dict)
    """Root -> heap of (caller's in-flight turns, its first turn's rank and arrival number here,
    caller) over its members, lazily corrected."""
    roots: list[tuple[int, int, float, int, str]] = field(default_factory=list)
    """Heap of (root's in-flight turns, then its group's first entry: caller's in-flight turns,
    rank, arrival number; root), lazily corrected."""
    loads: dict[str, int] = field(default_factory=dict)
    """Caller -> its in-flight turns in the pool this lane's turns wait for (shared, read only)."""
    root_loads: dict[str, int] = field(default_factory=dict)
    """Root -> the in-flight turns of it and its sub-callers in that pool (shared, read only)."""


_COMPACT_MIN = 64
_RANKS = sorted(set(CLASS_RANK.values()))


class HeldTurns:
    """Every held turn by id (arrival order) and per queue (in the ordering policy's order)."""

    __slots__ = (
        "_by_id",
        "_counts",
        "_lanes",
        "_loads",
        "_root_lanes",
        "_root_loads",
        "_single_pass_loads",
        "_single_pass_root_loads",
    )

    def __init__(self) -> None:
        self._by_id: OrderedDict[str, HeldTurn] = OrderedDict()
        self._counts: dict[tuple[str, str], int] = {}
        self._lanes: dict[LaneKey, _Lane] = {}
        self._root_lanes: dict[str, set[LaneKey]] = {}
        self._loads: dict[str, int] = {}
        self._root_loads: dict[str, int] = {}
        self._single_pass_loads: dict[str, int] = {}
        self._single_pass_root_loads: dict[str, int] = {}

    def bind_loads(
        self,
        caller_inflight: dict[str, int],
        single_pass_inflight: dict[str, int] | None = None,
        root_inflight: dict[str, int] | None = None,
        single_pass_root_inflight: dict[str, int] | None = None,
    ) -> None:
        """Read in-flight turns from the state's dicts (changed in place, never replaced).

        ``caller_inflight`` (by caller) and ``root_inflight`` (by root: the sum over the callers
        under it) rank the generative queues, ``single_pass_inflight`` and
        ``single_pass_root_inflight`` the single-pass ones (``None``: a dict of its own, never
        changed, for a user that ranks by fewer terms). Call it before any turn is filed: each lane
        keeps the dicts it was created with.
        """
        self._loads = caller_inflight
        self._root_loads = {} if root_inflight is None else root_inflight
        self._single_pass_loads = {} if single_pass_inflight is None else single_pass_inflight
        self._single_pass_root_loads = {} if single_pass_root_inflight is None else single_pass_root_inflight

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

    def count(self, caller: str, service_class: str) -> int:
        """How many turns of ``service_class`` are held (both kinds) for ``caller`` and every
        caller under it (``count("a", ...)`` counts ``a``'s, ``a/b``'s and ``a/b/c``'s)."""
        return self._counts.get((caller, service_class), 0)

    def add(self, turn: HeldTurn) -> None:
        """Hold ``turn`` in the queue ``turn.queue``."""
        self._by_id[turn.turn_id] = turn
        counts = self._counts
        for name in lineage(turn.caller):
            key = (name, turn.service_class)
            counts[key] = counts.get(key, 0) + 1
        self._push(turn)

    def remove(self, turn_id: str) -> HeldTurn | None:
        """Take ``turn_id`` out of its queue; ``None`` if it is not held."""
        turn = self._by_id.pop(turn_id, None)
        if turn is not None:
            counts = self._counts
            for name in lineage(turn.caller):
                key = (name, turn.service_class)
                left = counts[key] - 1
                if left:
                    counts[key] = left
                else:
                    del counts[key]
            self._unfile(turn, turn.queue)
        return turn

    def refile(self, turn: HeldTurn, queue: QueueKey) -> None:
        """Move a held turn to another queue, keeping its place in arrival order."""
        if queue == turn.queue:
            return
        old = turn.queue
        turn.queue = queue
        self._unfile(turn, old)
        self._push(turn)

    def head(self, queue: QueueKey) -> HeldTurn | None:
        """The first turn of ``queue`` in order, or ``None`` if it is empty."""
        for rank in _RANKS:
            lane = self._lanes.get((queue, rank))
            if lane is not None:
                turn = self._lane_head(queue, lane)
                if turn is not None:
                    return turn
        return None

    def load_changed(self, caller: str, single_pass: bool = False, fell: bool = True) -> None:
        """``caller``'s in-flight turns in one pool changed, and with them its root's: re-rank it
        among its root's callers, and its root among the roots, in that pool's lanes (every lane
        its root has turns in: its siblings' turns move with the root's count).

        ``fell=False`` says the counts rose: then nothing is pushed, since every entry out of date
        is too small and is corrected when it reaches the top (a fall needs fresh entries, or the
        stale larger ones would keep the caller and its root back)."""
        if not fell:
            return
        top = root(caller)
        lane_keys = self._root_lanes.get(top)
        if not lane_keys:
            return
        for queue, rank in lane_keys:
            if is_single_pass(queue) != single_pass:
                continue
            lane = self._lanes[(queue, rank)]
            if caller in lane.live and len(lane.members[top]) > 1:
                turn = self._caller_head(queue, lane, caller)
                if turn is not None:
                    group = lane.groups[top]
                    heapq.heappush(group, (lane.loads.get(caller, 0), turn.rank, turn.seq, caller))
                    self._compact_group(queue, lane, top)
            first = self._group_head(queue, lane, top)
            if first is not None:
                entry = (
                    lane.root_loads.get(top, 0),
                    lane.loads.get(first.caller, 0),
                    first.rank,
                    first.seq,
                    top,
                )
                heapq.heappush(lane.roots, entry)
                self._compact_roots(queue, lane)

    # -- inside ---------------------------------------------------------------------------------------

    def _lane_head(self, queue: QueueKey, lane: _Lane) -> HeldTurn | None:
        heap = lane.roots
        while heap:
            root_load, load, rank, seq, top = heap[0]
            turn = self._group_head(queue, lane, top)
            if turn is None:
                heapq.heappop(heap)
                continue
            current = (lane.root_loads.get(top, 0), lane.loads.get(turn.caller, 0), turn.rank, turn.seq)
            if (root_load, load, rank, seq) == current:
                return turn
            heapq.heapreplace(heap, (*current, top))  # out of date: sink it to its place
        return None

    def _group_head(self, queue: QueueKey, lane: _Lane, top: str) -> HeldTurn | None:
        members = lane.members.get(top)
        if members is not None and len(members) == 1:
            for only in members:  # a root of one caller here (the most common): no heap to keep
                return self._caller_head(queue, lane, only)
        heap = lane.groups.get(top)
        while heap:
            load, rank, seq, caller = heap[0]
            turn = self._caller_head(queue, lane, caller)
            if turn is None:
                heapq.heappop(heap)
                continue
            current = (lane.loads.get(caller, 0), turn.rank, turn.seq)
            if (load, rank, seq) == current:
                return turn
            heapq.heapreplace(heap, (*current, caller))  # out of date: sink it to its place
        return None

    def _caller_head(self, queue: QueueKey, lane: _Lane, caller: str) -> HeldTurn | None:
        heap = lane.turns.get(caller)
        while heap:
            _, seq, turn_id = heap[0]
            turn = self._by_id.get(turn_id)
            if turn is not None and turn.queue == queue and turn.seq == seq:
                return turn
            heapq.heappop(heap)
        return None

    def _push(self, turn: HeldTurn) -> None:
        key = (turn.queue, CLASS_RANK[turn.service_class])
        lane = self._lanes.get(key)
        if lane is None:
            if is_single_pass(turn.queue):
                lane = _Lane(loads=self._single_pass_loads, root_loads=self._single_pass_root_loads)
            else:
                lane = _Lane(loads=self._loads, root_loads=self._root_loads)
            self._lanes[key] = lane
        caller = turn.caller
        top = root(caller)
        heap = lane.turns.get(caller)
        if heap is None:
            heap = lane.turns[caller] = []
            lane.live[caller] = 1
            members = lane.members.get(top)
            if members is None:
                members = lane.members[top] = set()
                lane.groups[top] = []
                self._root_lanes.setdefault(top, set()).add(key)
            members.add(caller)
            joined = len(members) == 2
        else:
            lane.live[caller] += 1
            joined = False
        entry = (turn.rank, turn.seq, turn.turn_id)
        heapq.heappush(heap, entry)
        if heap[0] == entry:  # the caller's new first turn here: rank it, and its root, by that
            load = lane.loads.get(caller, 0)
            if joined:  # a second caller: the root's heap of callers is kept from now on
                self._compact_group(turn.queue, lane, top, fresh=True)
            elif len(lane.members[top]) > 1:
                heapq.heappush(lane.groups[top], (load, turn.rank, turn.seq, caller))
                self._compact_group(turn.queue, lane, top)
            heapq.heappush(lane.roots, (lane.root_loads.get(top, 0), load, turn.rank, turn.seq, top))
            self._compact_roots(turn.queue, lane)

    def _unfile(self, turn: HeldTurn, queue: QueueKey) -> None:
        key = (queue, CLASS_RANK[turn.service_class])
        lane = self._lanes[key]
        caller = turn.caller
        live = lane.live[caller] - 1
        if live == 0:
            # nothing valid is left for this caller here: drop its heap with its stale entries
            del lane.live[caller]
            del lane.turns[caller]
            top = root(caller)
            members = lane.members[top]
            members.discard(caller)
            if members:
                self._compact_group(queue, lane, top)
                return
            # nor for its root: drop the root's heap too
            del lane.members[top]
            del lane.groups[top]
            lanes = self._root_lanes[top]
            lanes.discard(key)
            if not lanes:
                del self._root_lanes[top]
            if not lane.live:
                del self._lanes[key]
                return
            self._compact_roots(queue, lane)
            return
        lane.live[caller] = live
        heap = lane.turns[caller]
        if len(heap) > _COMPACT_MIN and len(heap) > 4 * live:
            kept = {
                entry
                for entry in heap
                if (t := self._by_id.get(entry[2])) is not None and t.queue == queue and t.seq == entry[1]
            }
            heap[:] = list(kept)
            heapq.heapify(heap)

    def _compact_group(self, queue: QueueKey, lane: _Lane, top: str, fresh: bool = False) -> None:
        """Rebuild ``top``'s heap of callers from its members when stale entries outnumber them (or
        when ``fresh``); a root of one caller keeps none (:meth:`_group_head` reads its caller)."""
        heap = lane.groups[top]
        members = lane.members[top]
        if len(members) <= 1:
            heap.clear()
            return
        if not fresh and (len(heap) <= _COMPACT_MIN or len(heap) <= 4 * len(members)):
            return
        entries = []
        for caller in members:
            turn = self._caller_head(queue, lane, caller)
            if turn is not None:
                entries.append((lane.loads.get(caller, 0), turn.rank, turn.seq, caller))
        heapq.heapify(entries)
        heap[:] = entries

    def _compact_roots(self, queue: QueueKey, lane: _Lane) -> None:
        if len(lane.roots) <= _COMPACT_MIN or len(lane.roots) <= 4 * len(lane.members):
            return
        fresh = []
        for top in lane.members:
            turn = self._group_head(queue, lane, top)
            if turn is not None:
                fresh.append(
                    (lane.root_loads.get(top, 0), lane.loads.get(turn.caller, 0), turn.rank, turn.seq, top)
                )
        heapq.heapify(fresh)
        lane.roots[:] = fresh
