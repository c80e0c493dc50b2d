"""Errors the scheduler process answers with, each knowing its HTTP status or gRPC status code.

Its HTTP side (``GET /status``, ``/metrics``, ``/livez``, ``/readyz``, ``/health``, ``GET /``:
:mod:`luftpause.scheduler.status_http`)
answers errors with the JSON error body ``{"error": {"message": "..."}}`` (docs/architecture.md
"Failure contract"); its gRPC side (:mod:`luftpause.scheduler.grpc_service`) ends a ``Connect``
stream with a status code and the message as its details::

    SchedulerError (HTTP 500, gRPC INTERNAL)     a fault of ours: "internal error: <type>"
    ├── RouteNotFound (HTTP 404)                 "no route <METHOD> <path>"
    ├── MethodNotAllowed (HTTP 405 + Allow)      "<path> takes GET, HEAD, not <METHOD>"
    └── StreamOutOfOrder (gRPC FAILED_PRECONDITION)
                                                 a Connect stream that does not open with its
                                                 resync, or a resync whose next part is missing
    CannotListen (OSError; exit status 1)        a port taken, or an address this host has not

Not exceptions: a turn the scheduler refuses is the core's ``Reject`` action
(:mod:`luftpause.scheduler.core.actions`), answered over the stream as ``refused{reason,
http_status}``, which the dataplane answers its client with: 404 when no replica serves the model,
499 when its dataplane abandoned it, 503 when the core failed on the admission. A bad
configuration is :class:`luftpause.config.ConfigError` (exit status 2). The pure core
(:mod:`luftpause.scheduler.core`) raises none of these.
"""

from __future__ import annotations

import grpc


class SchedulerError(Exception):
    """Base: ``http_status`` for the HTTP side, ``grpc_code`` for the gRPC side; ``str(err)`` is the
    message the client is given."""

    http_status = 500
    grpc_code = grpc.StatusCode.INTERNAL


class RouteNotFound(SchedulerError):
    """No route serves the request's method and path."""

    http_status = 404

    def __init__(self, method: str, path: str) -> None:
        super().__init__(f"no route {method} {path}")


class MethodNotAllowed(SchedulerError):
    """A known path asked with another method; ``allow`` is the ``Allow`` header's value."""

    http_status = 405

    def __init__(self, method: str, path: str, allowed: list[str]) -> None:
        self.allow = ", ".join(sorted(allowed))
        super().__init__(f"{path} takes {self.allow}, not {method}")


class StreamOutOfOrder(SchedulerError):
    """A ``Connect`` stream whose messages break the protocol's order (the message says which)."""

    grpc_code = grpc.StatusCode.FAILED_PRECONDITION


class CannotListen(OSError):
    """The scheduler cannot listen on an address of its configuration; the message names it."""
