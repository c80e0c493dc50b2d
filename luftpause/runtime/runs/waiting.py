"""Waiting for runs (``await``, ``run``): until all or any of them are done, a timeout, or
something the waiter must act on, with progress notifications while it waits."""

from __future__ import annotations

import asyncio
import math
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from luftpause.runtime.runs.changes import NetworkChanges
    from luftpause.runtime.runs.record import Run

WaitMode = Literal["all", "any"]

PROGRESS_INTERVAL_ENV = "LUFTPAUSE_PROGRESS_INTERVAL_SECONDS"
"""Environment variable that sets the progress interval (seconds, > 0; tests shorten it so a
notification is certain within a run of a few seconds)."""


def progress_interval_seconds(default: float = 5.0) -> float:
    """How often a long ``await`` tells its caller it is still waiting (seconds): Claude Code
    resets its idle timeout on progress, and a few seconds keeps every reasonable client waiting.
    :data:`PROGRESS_INTERVAL_ENV` overrides ``default`` when it holds a finite number above 0."""
    raw = os.environ.get(PROGRESS_INTERVAL_ENV, "")
    try:
        value = float(raw)
    except ValueError:
        return default
    return value if math.isfinite(value) and value > 0 else default


PROGRESS_INTERVAL_SECONDS = progress_interval_seconds()


async def wait_for_runs(
    changes: NetworkChanges,
    runs: list[Run],
    mode: WaitMode,
    seconds: float,
    on_progress: Callable[[float, int], Awaitable[None]] | None = None,
    progress_interval: float = PROGRESS_INTERVAL_SECONDS,
    interrupt: Callable[[], bool] | None = None,
) -> bool:
    """Wait until all (``mode="all"``) or any (``"any"``) of ``runs`` are done.

    Waits at most ``seconds``. While waiting, ``on_progress(elapsed_seconds, finished_count)``
    is awaited every ``progress_interval`` seconds. Returns ``True`` when the timeout passed
    first (the caller reports ``timedOut``), ``False`` when the condition holds. Raises
    ``ValueError`` for a non-finite ``seconds`` (NaN would otherwise end the wait at once).
    ``interrupt()``, checked whenever something changed (``changes.notify()``), ends the
    wait early (returning ``False``) when it returns true: the caller has something to do.
    """
    if not math.isfinite(seconds):
        raise ValueError(f"a wait needs a finite number of seconds, got {seconds!r}")
    loop = asyncio.get_running_loop()
    start = loop.time()
    deadline = start + max(0.0, seconds)
    next_progress = start + progress_interval
    while True:
        changed = changes.event
        finished = sum(1 for run in runs if run.done)
        if (finished == len(runs)) if mode == "all" else (finished > 0 or not runs):
            return False
        if interrupt is not None and interrupt():
            return False
        now = loop.time()
        if now >= deadline:
            return True
        if on_progress is not None and now >= next_progress:
            await on_progress(now - start, finished)
            next_progress = now + progress_interval
            continue
        wake_at = min(deadline, next_progress) if on_progress is not None else deadline
        try:
            await asyncio.wait_for(changed.wait(), wake_at - now)
        except TimeoutError:
            pass
