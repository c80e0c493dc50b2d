"""``GET /livez`` and ``GET /readyz``: one answer shape for the three processes.

Both answer ``application/json``::

    {"status": "ok" | "degraded" | "unready",
     "checks": {name: {"ok": bool, "detail": str, "degraded"?: true}, ...}}

with 200 when every check is ok and 503 otherwise (``degraded``: every check is ok, so the
process serves and answers 200, but one found something a person must look at, which its detail
says) (the status a Kubernetes probe, a compose
healthcheck or ``luftpause up`` reads; the body says which check failed and why). ``/livez`` has
no checks: a process that answers it is alive, and restarting it would not help with anything
``/readyz`` waits for. ``/readyz`` has each process's own (docs/architecture.md "Health"):

* scheduler: ``probed``, its first probe round of every replica is done (before it, every replica
  counts as healthy, unseen);
* dataplane: ``scheduler``, its link to the scheduler is resynced; ``replicas``, the scheduler
  counts at least one replica healthy;
* runtime: ``journal``, its journal has been replayed (runs restored and resumed); ``degraded``
  when the replay met damage (records skipped, a truncated or emptied journal).

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
    degraded: bool = False
    """Passing, but with something wrong a person must see (the whole answer is ``degraded``)."""


def report(checks: Mapping[str, Check]) -> tuple[int, bytes]:
    """The HTTP status (200 or 503) and JSON body of a probe answer with ``checks``."""
    ready = all(check.ok for check in checks.values())
    degraded = any(check.degraded for check in checks.values())
    body = {
        "status": ("degraded" if degraded else "ok") if ready else "unready",
        "checks": {name: _check_json(check) for name, check in checks.items()},
    }
    return (200 if ready else 503), orjson.dumps(body)


def _check_json(check: Check) -> dict[str, object]:
    out: dict[str, object] = {"ok": check.ok, "detail": check.detail}
    if check.degraded:
        out["degraded"] = True
    return out


LIVE = report({})
"""``/livez``'s answer: 200 and ``{"status": "ok", "checks": {}}``."""
