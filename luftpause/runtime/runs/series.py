"""The runtime's last minutes for its monitor: runs by state, one sample every 2 s for 10 min
(:mod:`luftpause.observe.series`), served as ``GET /monitor/series`` (:mod:`luftpause.runtime.web.monitor`).

A sample as served (beside ``seq`` and ``t``)::

    {"runs": {"running": int, "AwaitingApproval": int, "completed": int, "failed": int,
              "cancelled": int}}

counted over the runs the registry holds at that moment, by each run's ``state`` as ``GET
/status`` and ``await`` report it (``AwaitingApproval`` is a running run waiting for a person; it
is not counted in ``running`` too). With caller keys, a request sees only its tenant's runs
counted (:func:`for_tenant`; an admin key, every run), as the monitor's other routes show only
them (:mod:`luftpause.runtime.runs.tenants`): the ring keeps each sample's counts per tenant
beside the totals (``"tenants": {name: counts}``, tenants with a run held only), and no request
is served another tenant's. Finished runs count while the runtime keeps them (``[runtime]
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
from luftpause.runtime.runs.tenants import Tenant

STATES = ("running", "AwaitingApproval", "completed", "failed", "cancelled")
"""The keys of a sample's ``runs``, in the order the monitor draws them."""


class RunSeries:
    """The ring of the runtime's samples over ``registry``."""

    def __init__(self, registry: RunRegistry, ring: SeriesRing | None = None) -> None:
        self.registry = registry
        self.ring = ring if ring is not None else SeriesRing()

    def sample(self) -> dict[str, Any]:
        """One sample's values as the ring keeps them: ``{"runs": counts, "tenants": {name:
        counts}}`` (module docstring)."""
        runs = dict.fromkeys(STATES, 0)
        tenants: dict[str, dict[str, int]] = {}
        for run in self.registry.all():
            state = run.display_state
            runs[state] = runs.get(state, 0) + 1
            if run.spec.tenant is not None:
                own = tenants.setdefault(run.spec.tenant, dict.fromkeys(STATES, 0))
                own[state] = own.get(state, 0) + 1
        return {"runs": runs, "tenants": tenants}

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


def for_tenant(answer: dict[str, Any], tenant: Tenant | None) -> dict[str, Any]:
    """``answer`` (:meth:`luftpause.observe.series.SeriesRing.since` of a :class:`RunSeries` ring) as a
    request of ``tenant`` may see it: each sample's ``runs`` counts only that tenant's runs (every
    run for ``None``, no keys configured, and for an admin key), and no sample carries the
    per-tenant counts."""
    samples = []
    for sample in answer["samples"]:
        runs = sample.get("runs", {})
        if tenant is not None and not tenant.admin:
            runs = sample.get("tenants", {}).get(tenant.name) or dict.fromkeys(STATES, 0)
        samples.append({**{k: v for k, v in sample.items() if k != "tenants"}, "runs": runs})
    return {**answer, "samples": samples}
