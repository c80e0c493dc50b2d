"""The runtime's HTTP edge besides ``/mcp`` and the monitor: ``GET /status``'s JSON and its CORS,
the JSON error answers of every route, and the SDK's ``/mcp`` routes taken into our router.

* ``GET /status``: JSON ``{"runs": [run], "upstream": [server]}`` (:meth:`Runtime.status`),
  readable from the scheduler's live page (another origin: :class:`StatusCors`);
* every HTTP error the runtime itself answers (401, 404 for an unknown path, 405 with ``Allow``,
  421, 500) has the JSON error body ``{"error": {"message": "..."}}``; ``/mcp``'s own protocol
  errors are the SDK's JSON-RPC error objects, which have the same ``error.message``.
"""

from __future__ import annotations

from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from luftpause.config import split_host_port
from luftpause.runtime.runs.journal import encode
from luftpause.runtime.web.auth import error_body
from luftpause.runtime.web.mcp_errors import JSONRPC_INVALID_REQUEST
from luftpause.runtime.web.monitor import host_allowed


def json_bytes(data: Any) -> bytes:
    """``data`` as JSON bytes, whatever values it holds: the journal's :func:`encode` without its
    newline (orjson, or the standard library escaped to ASCII for what orjson refuses: integers
    past 64 bits, lone surrogates), since ``GET /status`` must never fail on a value a client
    sent."""
    return encode(data)[:-1]


def json_response(data: Any, status: int = 200) -> Response:
    return Response(json_bytes(data), status_code=status, media_type="application/json")


def _error(status: int, message: str, headers: dict[str, str] | None = None) -> Response:
    return Response(error_body(message), status_code=status, headers=headers, media_type="application/json")


async def http_error(request: Request, exc: Exception) -> Response:
    """404, 405 (with ``Allow``) and any other ``HTTPException`` the router raises, as JSON."""
    assert isinstance(exc, HTTPException)
    method, path = request.method, request.url.path
    headers = dict(exc.headers or {})
    if exc.status_code == 404:
        message = f"no route {method} {path}"
    elif exc.status_code == 405 and headers.get("Allow"):
        # Starlette joins a set, so its order changes between processes; sorted, it reads the same.
        headers["Allow"] = ", ".join(sorted(m.strip() for m in headers["Allow"].split(",")))
        message = f"{path} takes {headers['Allow']}, not {method}"
    else:
        message = str(exc.detail)
    return _error(exc.status_code, message, headers)


async def internal_error(request: Request, exc: Exception) -> Response:
    # Starlette's ServerErrorMiddleware sends this, then re-raises so the server logs the traceback;
    # the client learns only that it was our fault, never our internals.
    return _error(500, f"internal error of the luftpause runtime ({type(exc).__name__}); see its log")


LOOPBACK_NAMES = ("127.0.0.1", "localhost", "[::1]")
WILDCARD_HOSTS = ("0.0.0.0", "::", "[::]", "")


def status_origins(scheduler_http: str) -> tuple[frozenset[str], str | None]:
    """The browser origins that may read ``/status``: the scheduler's live page, which fetches it
    (``GET /?runtime=...`` on ``[scheduler] http``). Returns ``(exact origins, any-host port)``:

    * the scheduler on a loopback address: ``http://127.0.0.1:P``, ``http://localhost:P`` and
      ``http://[::1]:P`` (the same page under each loopback name);
    * on a named host or address: ``http://<host>:P`` and ``https://<host>:P``;
    * on a wildcard address (``0.0.0.0``, ``::``): the page may be reached under any name of the
      machine, which the runtime cannot know, so any ``http``/``https`` origin on port ``P`` (the
      second item), and the loopback ones.

    No other web page may read it: before, any page could (``*``)."""
    host, port = split_host_port(scheduler_http)
    bracketed = f"[{host}]" if ":" in host and not host.startswith("[") else host
    if host in WILDCARD_HOSTS or bracketed in WILDCARD_HOSTS:
        return frozenset(f"http://{name}:{port}" for name in LOOPBACK_NAMES), str(port)
    if bracketed in LOOPBACK_NAMES or host == "::1":
        return frozenset(f"http://{name}:{port}" for name in LOOPBACK_NAMES), None
    return frozenset({f"http://{bracketed}:{port}", f"https://{bracketed}:{port}"}), None


class StatusCors:
    """ASGI middleware for ``GET /status``, which the scheduler's live page (another origin)
    fetches from the browser.

    * CORS: a request whose ``Origin`` is one of :func:`status_origins` gets
      ``Access-Control-Allow-Origin: <that origin>`` (and ``Vary: Origin``) on every answer, a 401
      too (so the page can say the token was refused); one without ``Origin`` (curl, a test: not
      a browser's cross-origin read) gets ``*``; the preflight an ``Authorization`` header
      causes (``OPTIONS /status``) is answered 204 here, before the token gate, which would refuse
      it. Any other origin gets no CORS header (the browser withholds the answer) and its
      preflight a 403. No other path is opened to other origins (``/mcp`` must not be).
    * Host: when the runtime listens on a loopback address, a ``Host`` that is not a loopback name
      is refused 421 (DNS rebinding), on ``/mcp`` too, before the SDK's transport security
      would refuse it with a plain-text body: the refusal has the JSON error body.
    """

    def __init__(self, app: ASGIApp, scheduler_http: str, listen_host: str) -> None:
        self.app = app
        self.origins, self.any_host_port = status_origins(scheduler_http)
        self.listen_host = listen_host

    def origin_allowed(self, origin: str) -> bool:
        if origin in self.origins:
            return True
        if self.any_host_port is None:
            return False
        scheme, _, rest = origin.partition("://")
        return (
            scheme in ("http", "https") and "/" not in rest and rest.rsplit(":", 1)[-1] == self.any_host_port
        )

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in ("/status", "/mcp"):
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if not host_allowed(headers.get("host"), self.listen_host):
            # on /mcp a JSON-RPC error object too (JSON-RPC 2.0 section 5.1: invalid request)
            code = JSONRPC_INVALID_REQUEST if scope["path"] == "/mcp" else None
            body = error_body(f"Host {headers.get('host')!r} is not served here", code)
            await send({"type": "http.response.start", "status": 421, "headers": _json_headers(body)})
            await send({"type": "http.response.body", "body": body})
            return
        if scope["path"] == "/mcp":  # the same Host check as the SDK's, answered in the JSON shape
            await self.app(scope, receive, send)
            return
        origin = headers.get("origin")
        allowed = origin is not None and self.origin_allowed(origin)
        if origin is None:
            # Not a cross-origin read by a browser (which always sends Origin on one): ``*`` gives
            # a web page nothing, and ``Vary: Origin`` keeps a cache from serving it to one.
            cors = [(b"access-control-allow-origin", b"*"), (b"vary", b"origin")]
        elif allowed:
            cors = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"origin")]
        else:
            cors = [(b"vary", b"origin")]
        if scope["method"] == "OPTIONS":
            if not allowed or origin is None:
                body = error_body(f"origin {origin!r} may not read /status")
                await send({"type": "http.response.start", "status": 403, "headers": _json_headers(body)})
                await send({"type": "http.response.body", "body": body})
                return
            preflight = [
                *cors,
                (b"access-control-allow-methods", b"GET"),
                (b"access-control-allow-headers", b"authorization"),
                (b"access-control-max-age", b"600"),
            ]
            await send({"type": "http.response.start", "status": 204, "headers": preflight})
            await send({"type": "http.response.body", "body": b""})
            return

        async def send_with_origin(message: Message) -> None:
            if message["type"] == "http.response.start" and cors:
                message = {**message, "headers": [*message.get("headers", []), *cors]}
            await send(message)

        await self.app(scope, receive, send_with_origin)


def _json_headers(body: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]


def mcp_routes(mcp_app: Starlette) -> list[BaseRoute]:
    """The SDK app's routes (``/mcp``), to be served by our router rather than a catch-all mount, so
    that unknown paths reach our JSON 404. Without SDK auth its app has no middleware of its own;
    should a later SDK add some, taking only its routes would silently drop it, so refuse."""
    if mcp_app.user_middleware:
        raise RuntimeError("the SDK's MCP app carries middleware; serve it whole instead of its routes")
    return list(mcp_app.routes)
