"""The virtual clock of a flood simulation: callbacks at instants of simulated time, in order.

A discrete-event loop with no real time in it: :meth:`VirtualClock.run_until` pops the earliest
callback, sets :attr:`VirtualClock.now` to its instant and calls it; a callback may schedule more.
Callbacks at the same instant run in the order they were scheduled (a sequence number breaks the
tie), so a run is the same every time for the same inputs. Times are seconds from the start of
the simulation (``0.0``).

A :class:`Timer` is a callback that can be moved or cancelled (an engine model's next step, which
moves whenever a request is submitted or cancelled): moving it leaves the old entry in the heap,
marked stale by a generation number, and skipped when it comes up.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

Callback = Callable[[], None]


class VirtualClock:
    """Simulated time and the callbacks waiting for it."""

    __slots__ = ("_heap", "_seq", "now")

    def __init__(self) -> None:
        self.now = 0.0
        self._heap: list[tuple[float, int, Callback]] = []
        self._seq = itertools.count()

    def call_at(self, at: float, callback: Callback) -> None:
        """Run ``callback`` at ``at`` seconds (at :attr:`now` if ``at`` is in the past)."""
        heapq.heappush(self._heap, (max(at, self.now), next(self._seq), callback))

    def call_later(self, delay: float, callback: Callback) -> None:
        """Run ``callback`` ``delay`` seconds from now (``delay`` < 0 counts as 0)."""
        self.call_at(self.now + max(delay, 0.0), callback)

    def every(self, interval: float, callback: Callback, first: float | None = None) -> None:
        """Run ``callback`` every ``interval`` seconds (> 0), first at ``first`` (default now +
        ``interval``), for as long as the clock runs."""
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")

        def fire() -> None:
            callback()
            self.call_later(interval, fire)

        self.call_at(self.now + interval if first is None else first, fire)

    def run_until(self, end: float) -> None:
        """Run every callback due before ``end`` seconds, in order; then :attr:`now` is ``end``."""
        heap = self._heap
        while heap and heap[0][0] < end:
            at, _, callback = heapq.heappop(heap)
            self.now = at
            callback()
        self.now = max(self.now, end)

    def pending(self) -> int:
        """Callbacks scheduled and not yet run (stale timer entries included)."""
        return len(self._heap)


class Timer:
    """One movable callback on ``clock``: :meth:`set` (re)arms it, :meth:`cancel` disarms it."""

    __slots__ = ("_callback", "_clock", "_generation", "at")

    def __init__(self, clock: VirtualClock, callback: Callback) -> None:
        self._clock = clock
        self._callback = callback
        self._generation = 0
        self.at: float | None = None
        """When it fires next, or ``None`` while disarmed."""

    def set(self, at: float | None) -> None:
        """Fire at ``at`` seconds (instead of any earlier setting); ``None`` disarms."""
        if at == self.at:
            return
        self._generation += 1
        self.at = at
        if at is None:
            return
        generation = self._generation

        def fire() -> None:
            if generation == self._generation:
                self.at = None
                self._callback()

        self._clock.call_at(at, fire)

    def cancel(self) -> None:
        self.set(None)
