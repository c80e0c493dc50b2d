"""``GET /livez`` and ``GET /readyz``: one answer shape for the three processes.

Both answer ``application/json``::

    {"status": "ok" | "unready", "checks": {name: {"ok": bool, "detail": str}, ...}}

with 200 when every check is ok and 503 otherwise (the status a Kubernetes probe, a compose
healthcheck or ``luftpause up`` reads; the body says which check failed and why). ``/livez`` has
no checks: a process that answers it is alive, and restarting it would not help with anything
``/readyz`` waits for. ``/readyz`` has each process's own (docs/architecture.md "Health"):

* scheduler: ``probed``, its first probe round of every replica is done (before it, every replica
  counts as healthy, unseen);
* dataplane: ``scheduler``, its link to the scheduler is resynced; ``replicas``, the scheduler
  counts at least one replica healthy;
* runtime: ``journal``, its journal has been replayed (runs restored and resumed).

``GET /health`` stays each process's older answer, unchanged, for those who read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import orjson

__all__ = ["CONTENT_TYPE", "LIVE", "Check", "report"]

CONTENT_TYPE = "application/json"


@dataclass(frozen=True, slots=True)
class Check:
    """One readiness check: whether it passes and, either way, what it saw (for a person)."""

    ok: bool
    detail: str


def report(checks: Mapping[str, Check]) -> tuple[int, bytes]:
    """The HTTP status (200 or 503) and JSON body of a probe answer with ``checks``."""
    ready = all(check.ok for check in checks.values())
    body = {
        "status": "ok" if ready else "unready",
        "checks": {name: {"ok": check.ok, "detail": check.detail} for name, check in checks.items()},
    }
    return (200 if ready else 503), orjson.dumps(body)


LIVE = report({})
"""``/livez``'s answer: 200 and ``{"status": "ok", "checks": {}}``."""
