"""The runtime's HTTP edge: the shared bearer token and the JSON error body.

Auth (docs/architecture.md "Auth"): when ``LUFTPAUSE_TOKEN`` is set, every HTTP request to the runtime except
:data:`OPEN_PATHS` (so ``/mcp``, ``GET /status`` and any other path) must carry
``Authorization: Bearer <token>``; the token is compared in constant time. Anything else is answered
401 with ``WWW-Authenticate: Bearer`` and the JSON error body. Unset, every request is accepted
(the server logs a warning at start).

Error body, the one contract of every luftpause HTTP error (docs/architecture.md "Failure contract")::

    {"error": {"message": "<what was wrong>"}}    content-type: application/json

On ``/mcp`` the 401 is also a JSON-RPC 2.0 error object (``"jsonrpc": "2.0", "id": null``, ``code``
-32001 from the implementation-defined server-error range), the same superset the SDK's own ``/mcp``
refusals use: MCP clients then show our message instead of a generic "error response".
"""

from __future__ import annotations

import hmac
import os
from collections.abc import Mapping

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from luftpause.auth.callers import CallerKeys
from luftpause.runtime.runs.tenants import SCOPE_KEY, Tenant

TOKEN_ENV = "LUFTPAUSE_TOKEN"

OPEN_PATHS = frozenset({"/health", "/livez", "/readyz", "/metrics", "/monitor"})  # the page holds no data
"""Paths served without the token: probes (``ChildProcess``, compose, Kubernetes) and Prometheus
scrapes carry none (the dataplane's ``/metrics`` is open too)."""

JSONRPC_UNAUTHORIZED = -32001
"""JSON-RPC error code of a refused token (JSON-RPC 2.0 section 5.1, server-error range)."""


def token_from_env() -> str | None:
    """The shared token from ``LUFTPAUSE_TOKEN``; ``None`` when unset or empty."""
    return os.environ.get(TOKEN_ENV) or None


def error_body(message: str, jsonrpc_code: int | None = None) -> bytes:
    """``{"error": {"message": message}}`` as JSON bytes; with ``jsonrpc_code``, also a JSON-RPC
    error object: ``{"jsonrpc": "2.0", "id": null, "error": {"code", "message"}}``."""
    if jsonrpc_code is None:
        return orjson.dumps({"error": {"message": message}})
    return orjson.dumps({"jsonrpc": "2.0", "id": None, "error": {"code": jsonrpc_code, "message": message}})


async def send_error(
    send: Send,
    status: int,
    message: str,
    headers: Mapping[str, str] | None = None,
    jsonrpc_code: int | None = None,
) -> None:
    """Answer an ASGI HTTP request with ``status`` and the JSON error body carrying ``message``
    (a JSON-RPC error object too when ``jsonrpc_code`` is given)."""
    body = error_body(message, jsonrpc_code)
    raw_headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    for name, value in (headers or {}).items():
        raw_headers.append((name.lower().encode("latin-1"), value.encode("latin-1")))
    await send({"type": "http.response.start", "status": status, "headers": raw_headers})
    await send({"type": "http.response.body", "body": body})


def bearer_matches(authorization: bytes | None, token: bytes) -> bool:
    """Whether an ``Authorization`` header value is ``Bearer <token>`` (scheme case-insensitive,
    RFC 9110 section 11.1), the token compared in constant time."""
    if authorization is None:
        return False
    scheme, _, given = authorization.strip().partition(b" ")
    return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), token)


class BearerTokenGate:
    """ASGI middleware: with a token, refuse every HTTP request but :data:`OPEN_PATHS` that does not
    carry it (401, JSON error body; a JSON-RPC error object on ``jsonrpc_paths``); with
    ``token=None``, pass everything through.

    With caller ``keys`` (:mod:`luftpause.auth.callers`) the keys are taken instead of the token
    (``Authorization: Bearer <key>``, or ``x-api-key``): a request with no known key is refused
    401, and one with a key carries its :class:`~luftpause.runtime.runs.tenants.Tenant` (the key's
    root caller; ``admin`` for an admin key) in its scope for the routes and tools to read
    (docs/security-tenants.md)."""

    def __init__(
        self,
        app: ASGIApp,
        token: str | None,
        jsonrpc_paths: frozenset[str] = frozenset(),
        keys: CallerKeys | None = None,
    ) -> None:
        self.app = app
        self.token = token.encode("utf-8") if token else None
        self.jsonrpc_paths = jsonrpc_paths
        self.keys = keys

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.keys is not None and scope["type"] == "http":
            scope.pop(SCOPE_KEY, None)  # only this gate says who a request is
            if scope["path"] in OPEN_PATHS:
                await self.app(scope, receive, send)
                return
            headers = dict(scope["headers"])
            api_key = headers.get(b"x-api-key")
            authorization = headers.get(b"authorization") or (b"Bearer " + api_key if api_key else None)
            identity = self.keys.identify(authorization)
            if identity is None:
                await send_error(
                    send,
                    401,
                    "missing or unknown caller key (Authorization: Bearer <your key>, or x-api-key)",
                    {"WWW-Authenticate": 'Bearer realm="luftpause"'},
                    JSONRPC_UNAUTHORIZED if scope["path"] in self.jsonrpc_paths else None,
                )
                return
            tenant = Tenant(identity.tenant, identity.admin, identity.caller)
            await self.app({**scope, SCOPE_KEY: tenant}, receive, send)
            return
        if self.token is not None and scope["type"] == "http" and scope["path"] not in OPEN_PATHS:
            authorization = next((v for k, v in scope["headers"] if k == b"authorization"), None)
            if not bearer_matches(authorization, self.token):
                await send_error(
                    send,
                    401,
                    f"missing or wrong bearer token (Authorization: Bearer <{TOKEN_ENV}>)",
                    {"WWW-Authenticate": 'Bearer realm="luftpause"'},
                    JSONRPC_UNAUTHORIZED if scope["path"] in self.jsonrpc_paths else None,
                )
                return
        await self.app(scope, receive, send)
