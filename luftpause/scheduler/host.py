"""The imperative shell around the pure core: feeds events, carries out actions, answers Admits.

One :class:`SchedulerHost` lives in the scheduler's event loop. It owns the core's state, stamps
events with its monotonic clock, and keeps, per turn id, the futures of the Admit calls waiting for
that turn's ``Place`` or ``Reject``. Everything runs on one loop thread, so ``decide`` needs no lock.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from luftpause.config import Config
from luftpause.scheduler.core import (
    Action,
    Event,
    Forget,
    Place,
    Reject,
    State,
    Tick,
    TurnAbandoned,
    TurnArrived,
    decide,
    new_state,
    snapshot,
)

log = logging.getLogger("luftpause.scheduler")

TICK_INTERVAL_S = 1.0

Outcome = Place | Reject
"""How an Admit ends: placed on a replica, or refused."""


class SchedulerHost:
    """The scheduler's state plus the Admit calls waiting on it.

    ``clock`` returns seconds on a monotonic scale (``time.monotonic`` by default).
    """

    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.state: State = new_state(config)
        self.clock = clock
        self._waiters: dict[str, list[asyncio.Future[Outcome]]] = {}
        self._tick_handle: asyncio.TimerHandle | None = None

    def now(self) -> float:
        """The shell's clock in seconds (monotonic), the ``at`` of every event."""
        return self.clock()

    def feed(self, event: Event) -> list[Action]:
        """Apply ``event`` to the core and carry out its actions; returns them."""
        self.state, actions = decide(self.state, event)
        for action in actions:
            if isinstance(action, Place | Reject):
                for waiter in self._waiters.pop(action.turn_id, ()):
                    if not waiter.done():
                        waiter.set_result(action)
            elif isinstance(action, Forget):
                log.debug("forgot run %s", action.run_id)
        return actions

    async def admit(self, arrived: TurnArrived) -> Outcome:
        """Feed ``arrived`` and wait until that turn is placed or refused.

        If the caller is cancelled first (the dataplane's client left, or its connection broke),
        the turn is abandoned: it leaves the queue, or frees the slot it was just given, unless
        another Admit for the same turn id is still waiting.
        """
        waiter: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(arrived.turn_id, []).append(waiter)
        try:
            self.feed(arrived)
            return await waiter
        except asyncio.CancelledError:
            if not self._drop_waiter(arrived.turn_id, waiter):
                self.feed(TurnAbandoned(arrived.turn_id, self.now()))
            raise
        finally:
            self._drop_waiter(arrived.turn_id, waiter)

    def _drop_waiter(self, turn_id: str, waiter: asyncio.Future[Outcome]) -> bool:
        """Forget ``waiter``; True when other Admits for ``turn_id`` still wait."""
        waiters = self._waiters.get(turn_id)
        if waiters is None:
            return False
        if waiter in waiters:
            waiters.remove(waiter)
        if not waiters:
            del self._waiters[turn_id]
            return False
        return True

    def status(self) -> dict[str, object]:
        """``GET /status``: :func:`luftpause.scheduler.core.snapshot` at the current time."""
        return snapshot(self.state, self.now())

    def start_clock(self) -> None:
        """Feed a ``Tick`` every second on the running loop, until :meth:`stop_clock`."""
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.feed(Tick(self.now()))
            self._tick_handle = loop.call_later(TICK_INTERVAL_S, tick)

        self._tick_handle = loop.call_later(TICK_INTERVAL_S, tick)

    def stop_clock(self) -> None:
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None
