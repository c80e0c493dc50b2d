"""Every error ``/mcp`` answers is a JSON-RPC 2.0 error object (docs/failover.md "Errors").

The MCP SDK answers some refusals of its own in plain text (``Invalid Content-Type header`` 400,
``Invalid Host header`` 421, a body over its limit 413), and a request body that ends before it is
whole (granian reports a malformed chunked body as ``http.disconnect``, the connection still open)
as a 500 ``Error handling POST request``. :class:`McpErrorBodies` sits in front of the SDK's app:

* a ``Content-Length`` over the SDK's limit is refused 413 at once, before the body is read, on
  every path (the monitor's own limit is lower);
* it reads a ``POST`` body first (up to :data:`PREREAD_BYTES`, the rest passed through as it
  comes) and answers a body cut short 400 itself, JSON-RPC code -32700 (parse error); on the
  runtime's other paths (the monitor's ``send`` and ``stop``) the same 400 with the JSON error
  body, where Starlette would have answered 500 (``ClientDisconnect``);
* a response of status 400 or more whose ``content-type`` is not JSON gets, with the same status
  and other headers, the body ``{"jsonrpc": "2.0", "id": null, "error": {"code": -32600,
  "message": <the SDK's text>}}``, which is also luftpause's error body (``error.message``,
  :func:`.auth.error_body`).
"""

from __future__ import annotations

from typing import Any

from mcp.server.transport_security import DEFAULT_MAX_REQUEST_BODY_SIZE, TransportSecuritySettings
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from luftpause.runtime.web.auth import error_body

JSONRPC_PARSE_ERROR = -32700
JSONRPC_INVALID_REQUEST = -32600
"""JSON-RPC 2.0 section 5.1 error codes."""
PREREAD_BYTES = DEFAULT_MAX_REQUEST_BODY_SIZE
"""Body bytes read before the SDK is called: its own limit (413 past it)."""
BODY_CUT_SHORT = (
    "the request body ended before it was whole: its chunked encoding is malformed, or the client "
    "stopped sending it"
)


LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")


def loopback_security(host: str) -> TransportSecuritySettings | None:
    """The SDK's DNS-rebinding protection for a runtime listening on loopback ``host``: its own
    defaults (``127.0.0.1:*`` and the like) plus the same names without a port, which HTTP/1.1
    allows (RFC 9110 section 7.2: the port may be left out) and ``GET /status`` accepts; ``None``
    (the SDK's choice) elsewhere."""
    if host not in ("127.0.0.1", "localhost", "::1"):
        return None
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=[h for name in LOOPBACK_HOSTS for h in (name, f"{name}:*")],
        allowed_origins=[o for name in LOOPBACK_HOSTS for o in (f"http://{name}", f"http://{name}:*")],
    )


class McpErrorBodies:
    """ASGI middleware: JSON-RPC error bodies on ``path`` (see the module's docstring)."""

    def __init__(self, app: ASGIApp, path: str = "/mcp") -> None:
        self.app = app
        self.path = path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        mcp = scope["path"] == self.path
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), b"")
        if declared.isdigit() and int(declared) > PREREAD_BYTES:
            # refused before a byte of it is read: the SDK would read it all first, and the pre-read
            # below would wait for bytes a client that is refused never sends (then 408)
            too_large = f"request body is {int(declared)} bytes; the limit is {PREREAD_BYTES}"
            await _answer(send, 413, too_large, JSONRPC_INVALID_REQUEST if mcp else None)
            return
        if scope["method"] == "POST":
            read: list[Message] = []
            size = 0
            while size <= PREREAD_BYTES:
                message = await receive()
                if message["type"] != "http.request":
                    await _answer(send, 400, BODY_CUT_SHORT, JSONRPC_PARSE_ERROR if mcp else None)
                    return
                read.append(message)
                size += len(message.get("body", b""))
                if not message.get("more_body"):
                    break
            receive = _replaying(read, receive)
        await self.app(scope, receive, _json_errors(send) if mcp else send)


def _replaying(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` that gives ``messages`` first, then what ``receive`` gives."""
    pending = list(messages)

    async def replay() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replay


def _json_errors(send: Send) -> Send:
    """``send`` with the body of a non-JSON error response replaced by a JSON-RPC error object."""
    held: dict[str, Any] = {}
    parts: list[bytes] = []

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            status = message["status"]
            headers = message.get("headers", [])
            content_type = next((v for k, v in headers if k.lower() == b"content-type"), b"")
            if status >= 400 and not content_type.lower().startswith(b"application/json"):
                held["start"] = message
                return
            await send(message)
            return
        if message["type"] == "http.response.body" and "start" in held:
            parts.append(message.get("body", b""))
            if message.get("more_body"):
                return
            start = held.pop("start")
            text = b"".join(parts).decode("utf-8", "replace").strip() or "refused"
            body = error_body(text, JSONRPC_INVALID_REQUEST)
            headers = [
                (k, v)
                for k, v in start.get("headers", [])
                if k.lower() not in (b"content-type", b"content-length")
            ]
            headers += [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
            await send({**start, "headers": headers})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        await send(message)

    return wrapped


async def _answer(send: Send, status: int, message: str, code: int | None) -> None:
    body = error_body(message, code)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
