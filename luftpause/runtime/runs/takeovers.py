"""Following the custody of runs while the registry serves, on a store several runtimes share
(PostgreSQL: :mod:`luftpause.runtime.runs.custody`).

Every :attr:`~luftpause.runtime.runs.store.RecordStore.custody_period` (the lease renewal period),
:func:`follow_custody` runs one custody round
(:meth:`~luftpause.runtime.runs.store.RecordStore.custody_round`: renew this runtime's leases, take
over the expired leases of dead runtimes, read the records of the runs taken) and hands what
changed to the registry (stop driving the runs lost, resume the runs taken). It must never stop
while the registry serves: a runtime that stops renewing has its runs taken over by another while
it still drives them (fencing then refuses its writes).

So a round (or the handing over) that fails is tried again, with capped exponential backoff and
jitter (tenacity): the first retry after an eighth of the period, never later than one period
after the last try, so a passing fault costs no lease. Each failure is logged with its cause, once
per kind (the exception's type) while it lasts: the first of each kind at ERROR (with the
traceback, but for a store that cannot be reached), the same kind again at DEBUG; the first round
that gets through after failures says how many there were, at WARNING, and the next failure of
any kind is logged again. The follower ends only when it is cancelled (the registry is left).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential_jitter

from luftpause.runtime.runs.store import RecordStore, Takeover

log = logging.getLogger("luftpause.runtime.runs.takeovers")

FIRST_RETRY_SHARE = 1 / 8
"""The first retry of a failed round comes after this share of the custody period; each later
one after twice as long as the one before, up to the period."""


def _cause(exc: BaseException) -> str:
    """``Type: message``, and the same of what it was raised from, if anything."""
    text = f"{type(exc).__name__}: {exc}"
    cause = exc.__cause__ or (None if exc.__suppress_context__ else exc.__context__)
    if cause is not None:
        text += f" (from {type(cause).__name__}: {cause})"
    return text


class FailureLog:
    """The log of a task that retries: each failure with its cause, once per kind until it gets
    through (module docstring). ``what`` names the task in each line."""

    def __init__(self, what: str, logger: logging.Logger = log) -> None:
        self.what = what
        self.logger = logger
        self.failures = 0
        """Failures since the task last got through."""
        self.seen: set[type[BaseException]] = set()
        """The kinds of failure logged since the task last got through."""

    def failed(self, exc: BaseException, retry_in: float) -> None:
        """``exc`` made the task fail; it is tried again in ``retry_in`` seconds."""
        self.failures += 1
        kind = type(exc)
        if kind in self.seen:
            self.logger.debug("%s failed again: %s; trying again in %.2f s", self.what, _cause(exc), retry_in)
            return
        self.seen.add(kind)
        self.logger.error(
            "%s failed: %s; trying again in %.2f s, and until it gets through "
            "(a failure of the same kind is not logged again meanwhile)",
            self.what,
            _cause(exc),
            retry_in,
            exc_info=None if isinstance(exc, OSError) else exc,
        )

    def got_through(self) -> None:
        """The task got through: after failures, say so, and log any failure again."""
        if self.failures:
            self.logger.warning("%s got through again, after %d failed attempts", self.what, self.failures)
        self.failures = 0
        self.seen.clear()

    def before_sleep(self, state: RetryCallState) -> None:
        """tenacity's ``before_sleep``: :meth:`failed` with the attempt's exception."""
        exc = state.outcome.exception() if state.outcome is not None else None
        if exc is not None:
            self.failed(exc, state.upcoming_sleep)


async def follow_custody(store: RecordStore, take: Callable[[Takeover], None]) -> None:
    """While it is not cancelled: every custody period of ``store``, one custody round, whose
    change (runs lost or taken) goes to ``take``; a failure is logged and tried again (module
    docstring). Returns at once for a store no other runtime shares."""
    period = store.custody_period
    if period is None:
        return
    failures = FailureLog(f"following the leases on {store.label}")
    retrying = AsyncRetrying(
        wait=wait_exponential_jitter(
            multiplier=period * FIRST_RETRY_SHARE, max=period, jitter=period * FIRST_RETRY_SHARE / 2
        ),
        retry=retry_if_exception_type(Exception),  # never a cancellation: the registry is left
        before_sleep=failures.before_sleep,
        reraise=True,
    )
    while True:
        await asyncio.sleep(period)
        async for attempt in retrying:
            with attempt:
                change = await store.custody_round()
                if change.lost or change.took is not None:
                    take(change)
        failures.got_through()
