"""Errors the dataplane answers with, each knowing its HTTP status.

The body is ``{"error": {"message": "..."}}`` (docs/architecture.md "Failure contract"), except on
the Messages and Responses routes, which answer the same errors, with the same statuses, in their
API's own shape (``luftpause.dataplane.intake.front_doors.error_body``; ``apis.errors`` adds
``TranslationError``, a ``BadRequest``)::

    DataplaneError (500)          a fault of ours ("internal error: <type>"); with the status of a
    │                             scheduler's refusal (404 no replica serves the model, 499 the turn
    │                             was abandoned) and its reason as the message, or 503 when the
    │                             scheduler failed the stream ("scheduler failed: <code>: ...") or
    │                             refused a turn without a status of its own
    ├── BadRequest (400)          malformed JSON, missing model/messages, bad or empty
    │                             x-luftpause-class, a run id over 256 bytes (header or DELETE)
    ├── Unauthorized (401)        LUFTPAUSE_TOKEN set and the bearer token missing or wrong; with
    │                             caller keys, no configured key
    ├── Forbidden (403)           a service class the caller key may not use
    ├── NotFound (404)            unknown route, or no replica serves the model
    ├── MethodNotAllowed (405)
    ├── PayloadTooLarge (413)     request body over MAX_BODY_BYTES
    ├── UnsupportedMediaType (415) a request body with a Content-Encoding other than identity
    ├── TooManyRequests (429)     a protection limit of the scheduler (with Retry-After)
    └── EngineUnreachable (502)   the engine could not be connected to, broke off or stayed silent
                                  for the read timeout before answering: "engine <replica>: <error>"

After an answer began (200 and some chunks), a failure is no status at all: the connection is
aborted without its last chunk (``asgi.StreamBroken``).

Apart from that tree, ``EngineError`` is an engine request that failed (the engine connections'
errors, ``luftpause.dataplane.relay.upstream``, derive from it): answered as ``EngineUnreachable``
before the answer began.
"""

from __future__ import annotations

import orjson


class DataplaneError(Exception):
    """Base: ``status`` is the HTTP status, ``str(err)`` the message returned to the client."""

    status = 500
    run_id: str | None = None
    """Set once the turn has a run: the answer then carries ``x-luftpause-run-id``."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        if status is not None:
            self.status = status

    def body(self) -> bytes:
        return error_body(str(self))


class BadRequest(DataplaneError):
    status = 400


class Unauthorized(DataplaneError):
    """401, sent with ``WWW-Authenticate: <challenge>`` (RFC 6750 section 3; the runtime's value)."""

    status = 401
    challenge = 'Bearer realm="luftpause"'


class Forbidden(DataplaneError):
    status = 403


class NotFound(DataplaneError):
    status = 404


class MethodNotAllowed(DataplaneError):
    """405; ``allow`` is the value of the ``Allow`` header sent with it."""

    status = 405

    def __init__(self, message: str, allow: str) -> None:
        super().__init__(message)
        self.allow = allow


class TooManyRequests(DataplaneError):
    """429 from a protection limit of the scheduler, sent with ``Retry-After: <retry_after_s>``."""

    status = 429

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = max(1, retry_after_s)


class PayloadTooLarge(DataplaneError):
    status = 413


class UnsupportedMediaType(DataplaneError):
    status = 415


class EngineUnreachable(DataplaneError):
    status = 502


class EngineError(Exception):
    """The engine request failed; ``str(err)`` says how (it goes into the client's 502,
    :class:`EngineUnreachable`, or ends the answer's stream when it came after the first byte).
    The engine connections raise it and its kinds (``luftpause.dataplane.relay.upstream``); a
    front door's translation of a whole answer raises it for an answer it cannot read.

    ``undelivered``: no byte of an answer came before the failure, and no connection was made or
    it ended (closed, reset, timed out) before its head: the turn may go to another replica
    (docs/failover.md). Set by ``EnginePool.send``."""

    undelivered = False


def error_body(message: str) -> bytes:
    """The JSON error contract: ``{"error": {"message": message}}`` as bytes."""
    return orjson.dumps({"error": {"message": message}})
