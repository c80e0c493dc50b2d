"""Running slots and a waiting queue, as an SGLang or vLLM scheduler has them.

An engine decodes at most ``slots`` requests at once (continuous batching: a finished request's
slot goes to the head of the queue at once, not at the end of a batch); every other admitted
request waits in arrival order, or by a rank (the request's priority) and then arrival. A
request that leaves while waiting (its client disconnected) leaves the queue at once; one that
leaves while running frees its slot at once for the head of the queue.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field


@dataclass(slots=True)
class EngineStats:
    """Counters of one engine since it started (request counts, tokens).

    ``requests`` counts chat completion requests that passed validation; ``completed`` those that
    sent their whole answer; ``disconnected`` those whose client left first (while waiting or
    running). ``running`` and ``waiting`` are the current counts; ``max_running_seen`` and
    ``max_waiting_seen`` the highest ever seen. ``faults`` counts the requests given each fault,
    by kind (``"status"``, ``"die_mid_stream"``, ``"error_mid_stream"``, ``"stall"``, ``"slow"``,
    ``"close"``; see
    :mod:`.faults`), whether from the request's own field or the engine's configured fault; a
    faulted request never counts as ``completed`` unless its answer was sent whole (``stall``,
    ``slow``). ``idle_closed`` counts the ``POST`` requests dropped unanswered because their
    kept-alive connection had been idle for ``EngineSettings.idle_close_ms`` (:mod:`.idle_close`).
    """

    requests: int = 0
    completed: int = 0
    disconnected: int = 0
    running: int = 0
    waiting: int = 0
    max_running_seen: int = 0
    max_waiting_seen: int = 0
    # prompt_tokens and cached_tokens (those the prefix cache held) of completed requests.
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    idle_closed: int = 0


class SlotPool:
    """``slots`` running places and a queue in front of them; counts go to ``stats``.

    Use ``async with pool.slot(rank): ...``: waiters get a slot lowest ``rank`` first, equal ranks
    in arrival order (all ranks 0: FIFO). Cancelling a task that waits removes it from the queue;
    leaving the block (normally or by cancellation) hands the slot to the first waiter.
    """

    def __init__(self, slots: int, stats: EngineStats) -> None:
        if slots < 1:
            raise ValueError(f"slots must be at least 1, got {slots}")
        self._slots = slots
        self._stats = stats
        # Sorted by (rank, arrival number); the future is never compared (arrival numbers differ).
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    @property
    def slots(self) -> int:
        return self._slots

    @asynccontextmanager
    async def slot(self, rank: int = 0) -> AsyncIterator[None]:
        await self._acquire(rank)
        try:
            yield
        finally:
            self._release()

    async def _acquire(self, rank: int) -> None:
        stats = self._stats
        if stats.running < self._slots and not self._waiters:
            self._start_running()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (rank, next(self._arrivals), waiter)
        bisect.insort(self._waiters, entry)
        stats.waiting += 1
        stats.max_waiting_seen = max(stats.max_waiting_seen, stats.waiting)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # The slot was handed over just as the caller left: pass it on.
                self._release()
            elif entry in self._waiters:
                # Still queued (a cancelled waiter already popped by _release was counted there).
                self._waiters.remove(entry)
                stats.waiting -= 1
            raise

    def _start_running(self) -> None:
        stats = self._stats
        stats.running += 1
        stats.max_running_seen = max(stats.max_running_seen, stats.running)

    def _release(self) -> None:
        stats = self._stats
        stats.running -= 1
        while self._waiters:
            _, _, waiter = self._waiters.pop(0)
            stats.waiting -= 1
            if not waiter.done():
                # The slot moves to the waiter now, so that no newcomer can overtake it.
                self._start_running()
                waiter.set_result(None)
                return
