"""The runtime's last minutes for its monitor: runs by state, one sample every 2 s for 10 min
(:mod:`luftpause.observe.series`), served as ``GET /monitor/series`` (:mod:`luftpause.runtime.web.monitor`).

A sample (beside ``seq`` and ``t``)::

    {"runs": {"running": int, "AwaitingApproval": int, "completed": int, "failed": int,
              "cancelled": int}}

counted over the runs the registry holds at that moment, by each run's ``state`` as ``GET
/status`` and ``await`` report it (``AwaitingApproval`` is a running run waiting for a person; it
is not counted in ``running`` too). Finished runs count while the runtime keeps them (``[runtime]
retained_bytes``, at most 1 h), so the finished states fall when old runs are forgotten, not only
when runs re-open. One sample walks every held run once (up to 10,000 finished ones: about a
millisecond every 2 s).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

from luftpause.observe.series import SeriesRing, sample_every
from luftpause.runtime.runs.registry import RunRegistry

STATES = ("running", "AwaitingApproval", "completed", "failed", "cancelled")
"""The keys of a sample's ``runs``, in the order the monitor draws them."""


class RunSeries:
    """The ring of the runtime's samples over ``registry``."""

    def __init__(self, registry: RunRegistry, ring: SeriesRing | None = None) -> None:
        self.registry = registry
        self.ring = ring if ring is not None else SeriesRing()

    def sample(self) -> dict[str, Any]:
        """One sample's values (module docstring)."""
        runs = dict.fromkeys(STATES, 0)
        for run in self.registry.all():
            state = run.display_state
            runs[state] = runs.get(state, 0) + 1
        return {"runs": runs}

    @contextlib.asynccontextmanager
    async def sampling(self) -> AsyncIterator[RunSeries]:
        """Sample every ``ring.interval_s`` while inside (a task of the running loop)."""
        task = asyncio.create_task(sample_every(self.ring, self.sample), name="luftpause-run-series")
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
