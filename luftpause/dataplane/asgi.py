"""One HTTP exchange of the dataplane's ASGI application (ASGI 3.0, HTTP spec 2.3), as granian
serves it.

Why ASGI and not granian's RSGI: under ASGI granian (2.8.9) aborts the connection when the
application raises after the response began (the client sees a chunked body without its final
``0\\r\\n\\r\\n`` chunk, so a broken stream looks broken), and ``await send(...)`` waits while the
client is not reading, so a slow reader bounds what the dataplane holds. Under RSGI neither held:
a failed stream ended cleanly and ``send_bytes`` buffered without limit.

What granian's ASGI does that the code relies on: ``receive()`` after the whole body was read waits
until the client leaves and then returns ``{"type": "http.disconnect"}`` (how a held turn notices
its client leaving); ``send`` on a connection the client has closed does not raise (granian logs
it), so the client leaving mid-stream is noticed by that same disconnect, never by ``send``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from luftpause.dataplane.errors import BadRequest

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Scope = MutableMapping[str, Any]


class StreamBroken(Exception):
    """Raised out of the application after a response began, so that granian aborts the
    connection: the client then sees its stream broken (no final chunk), never a clean end."""


class Exchange:
    """One request and its response: ``method``, ``path``, the request headers by lower-case name
    (raw bytes; the first of repeated ones), ``receive`` and ``send`` as granian gave them, and
    ``started``, True once the response's head was sent (after it only the body may follow)."""

    __slots__ = ("headers", "method", "path", "receive", "send", "started")

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        headers: dict[str, bytes] = {}
        for name, value in scope["headers"]:
            key = name.decode("latin-1")
            if key not in headers:
                headers[key] = value
        self.headers = headers
        self.receive = receive
        self.send = send
        self.started = False

    def header(self, name: str) -> str | None:
        """Request header ``name`` (lower-case) as text, None when absent.

        Raises :class:`BadRequest` when the value has a byte outside ASCII: a caller or run id in
        another script must come percent-encoded (RFC 3986); luftpause treats the encoded text as an
        opaque id and never decodes it.
        """
        value = self.headers.get(name)
        if value is None:
            return None
        try:
            return value.decode("ascii")
        except UnicodeDecodeError:
            raise BadRequest(
                f"header {name} must be ASCII: percent-encode other characters (RFC 3986)"
            ) from None

    async def start(self, status: int, headers: list[tuple[str, str]]) -> None:
        """Send the response head; header names and values are latin-1 text (RFC 9110 §5.5)."""
        self.started = True
        await self.send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers],
            }
        )

    async def respond(self, status: int, headers: list[tuple[str, str]], body: bytes = b"") -> None:
        """A whole response: head and ``body`` in one piece."""
        await self.start(status, headers)
        await self.send({"type": "http.response.body", "body": body, "more_body": False})
