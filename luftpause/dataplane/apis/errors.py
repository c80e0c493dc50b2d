"""Errors of the two front-door APIs, in each API's own shape and status.

The chat route answers ``{"error": {"message": ...}}`` (``luftpause.dataplane.errors``). The
Messages and Responses routes answer the same cases (docs/architecture.md "Failure contract") with the same
statuses, in the shape their clients parse:

* Anthropic Messages (API reference "Errors"): ``{"type": "error", "error": {"type": <type>,
  "message": ...}}``, the type named by the status (:data:`ANTHROPIC_ERROR_TYPES`: 400
  ``invalid_request_error``, 401 ``authentication_error``, 403 ``permission_error``, 404
  ``not_found_error``, 413 ``request_too_large``, 429 ``rate_limit_error``, 503 and 529
  ``overloaded_error``, any other 5xx ``api_error``). Mid-stream, the same object is an SSE event
  named ``error``, which the ``anthropic`` SDK raises as an ``APIStatusError``.
* OpenAI Responses (API reference "Error codes"): ``{"error": {"message", "type", "param",
  "code"}}``, ``type`` ``invalid_request_error`` for 4xx and ``server_error`` for 5xx. Mid-stream,
  the failure is the ``response.failed`` event (``responses_stream``).

The exception tree (every error is a :class:`~luftpause.dataplane.errors.DataplaneError`, so the
routes answer it with its status like any other)::

    BadRequest (400)
    └── TranslationError (400)    a request luftpause cannot translate faithfully: an unknown or
                                  unsupported field, a malformed block or item; ``param`` names
                                  the offending field as a path (``messages[2].content[0].type``)

How the dataplane's failures map (the route renders with :func:`error_body`, ``api`` being
``"messages"`` or ``"responses"``):

====================================  =====================================================
case                                  what the client of either API sees
====================================  =====================================================
bad request, untranslatable field     400 in the API's shape, ``param`` set where known
missing or wrong bearer token         401 (``authentication_error`` / ``invalid_request_error``)
unknown model                         404 (``not_found_error`` / ``code: "model_not_found"``)
engine unreachable                    502 (``api_error`` / ``server_error``)
engine refuses (429, 5xx)             its status and ``Retry-After`` unchanged; a translated turn's
                                      body re-shaped by :func:`engine_refusal_body` (the
                                      engine's message kept), a natively served one unchanged
engine error event mid-stream         Messages: an ``error`` event; Responses: ``response.failed``
engine fails mid-stream               200, the events so far, then the connection aborted: no
                                      ``message_stop`` / ``response.completed``
scheduler unreachable                 nothing yet: the turn is held, as on the chat route
====================================  =====================================================
"""

from __future__ import annotations

from typing import Any, Literal

import orjson

from luftpause.dataplane.errors import BadRequest

__all__ = [
    "ANTHROPIC_ERROR_TYPES",
    "Api",
    "TranslationError",
    "anthropic_error",
    "engine_refusal_body",
    "error_body",
    "openai_error",
]

Api = Literal["messages", "responses"]

ANTHROPIC_ERROR_TYPES: dict[int, str] = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    415: "invalid_request_error",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "api_error",
    529: "overloaded_error",
}
"""Anthropic's error ``type`` per HTTP status (its API reference, "Errors")."""


class TranslationError(BadRequest):
    """A request the translator refuses: 400, with ``param`` the path of the field at fault."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


def anthropic_error(status: int, message: str) -> dict[str, Any]:
    """The Anthropic error object for ``status`` (see :data:`ANTHROPIC_ERROR_TYPES`)."""
    kind = ANTHROPIC_ERROR_TYPES.get(status)
    if kind is None:
        kind = "api_error" if status >= 500 else "invalid_request_error"
    return {"type": "error", "error": {"type": kind, "message": message}}


def openai_error(
    status: int, message: str, param: str | None = None, code: str | None = None
) -> dict[str, Any]:
    """The OpenAI error object: ``{"error": {"message", "type", "param", "code"}}``."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    if code is None:
        code = {
            401: "invalid_api_key",
            404: "not_found",
            413: "request_too_large",
            429: "rate_limit_exceeded",
        }.get(status)
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def error_body(api: Api, status: int, message: str, param: str | None = None) -> bytes:
    """The body answering an error of ``status`` on ``api``'s route, as JSON bytes.

    A 404 whose message says no replica serves the model gets ``code: "model_not_found"`` on the
    Responses route (what OpenAI answers for an unknown model).
    """
    if api == "messages":
        return orjson.dumps(anthropic_error(status, message))
    code = "model_not_found" if status == 404 and "serves model" in message else None
    return orjson.dumps(openai_error(status, message, param, code))


def engine_refusal_body(api: Api, status: int, body: bytes) -> bytes:
    """Re-shape an engine's refusal of a translated turn (a Chat Completions error body) for ``api``.

    The engine's message is kept: ``error.message`` when the body is ``{"error": {"message": ...}}``
    (vLLM, SGLang, OpenAI) or ``{"error": "..."}``, the top-level ``message`` of vLLM's older
    ``{"object": "error", "message": ...}``, else the body's text (cut to 2,000 characters), else
    ``engine answered <status>``. The status and ``Retry-After`` stay the route's to send unchanged.
    """
    message = _refusal_message(body) or f"engine answered {status}"
    return error_body(api, status, message)


def _refusal_message(body: bytes) -> str | None:
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        text = body.decode("utf-8", "replace").strip()
        return text[:2000] or None
    if not isinstance(doc, dict):
        return None
    error = doc.get("error")
    if isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]:
        return str(error["message"])
    if isinstance(error, str) and error:
        return error
    message = doc.get("message")
    if isinstance(message, str) and message:
        return message
    return None
