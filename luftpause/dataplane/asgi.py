"""One HTTP exchange of the dataplane's ASGI application (ASGI 3.0, HTTP spec 2.3), as granian
serves it.

Why ASGI and not granian's RSGI: under ASGI granian (2.8.9) aborts the connection when the
application raises after the response began (the client sees a chunked body without its final
``0\\r\\n\\r\\n`` chunk, so a broken stream looks broken), and ``await send(...)`` waits while the
client is not reading (a channel of 4 pieces, granian PR #898), so a slow reader bounds what the
dataplane holds. Under RSGI neither holds in any released granian: a failed stream ends cleanly
and ``send_bytes`` buffers without limit (its next interface, on granian's ``rsgi-2`` branch, is
unreleased and its writer unbounded too).

What granian's ASGI does that the code relies on: ``receive()`` after the whole body was read waits
until the client leaves, or the response has ended, and then returns ``{"type":
"http.disconnect"}`` (how a turn notices its client leaving); the connection's end is kept for a
``receive()`` that comes later (a ``tokio::sync::Notify`` permit), so a watch begun late still sees
it; ``send`` on a connection the client has closed does not raise (granian logs it), so the client
leaving mid-stream is noticed by that same disconnect, never by ``send``.

What it costs: every ``receive()`` is a future that granian's runtime thread completes under the
GIL, about 0.04 ms of CPU per call at one stream (bench/README.md, "End to end"); ``send()`` of a
body costs far less while granian's channel has room. So an exchange reads a body announced by
``Content-Length`` with one ``receive()`` when it all came in one piece (the empty closing message
is then left unread), and a turn watches for its client leaving only once it has lasted
``WATCH_AFTER_S`` or must wait for the scheduler (:meth:`Exchange.watch`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from luftpause.dataplane.errors import BadRequest

Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
Scope = MutableMapping[str, Any]
Headers = list[tuple[bytes, bytes]]
"""Header ``(name, value)`` pairs as ASGI carries them: lower-case names, latin-1 bytes."""

WATCH_AFTER_S = 0.25
"""Seconds into a turn after which the dataplane starts watching for its client leaving (at once
when the turn must wait for the scheduler). A client that leaves a stream earlier is noticed then:
the engine works for up to this long on an answer nobody reads, which a turn that ends sooner never
costs the watch's two crossings into granian. At 50 ms, every turn of the end-to-end bench at 64
streams outlived it on the loaded machine (queued in the client and the dataplane), and the
watches' cost queued them further."""


class ClientGone(Exception):
    """The client went away before its answer began; there is nobody to answer."""


class BodyCutShort(BadRequest):
    """400: the request body ended before it was whole. granian reports a malformed chunked body
    (a chunk size that is not hex, a chunk without its CRLF) as ``http.disconnect`` with the
    connection still open, exactly as it reports a client that left mid-body; either way the
    answer is this 400 (sent to nobody in the second case), never granian's own plain-text 500
    for an application that answered nothing."""

    def __init__(self) -> None:
        super().__init__(
            "the request body ended before it was whole: its chunked encoding is malformed, or "
            "the client stopped sending it"
        )


class StreamBroken(Exception):
    """Raised out of the application after a response began, so that granian aborts the
    connection: the client then sees its stream broken (no final chunk), never a clean end."""


class Exchange:
    """One request and its response: ``method``, ``path``, the request headers by lower-case name
    (raw bytes; the first of repeated ones), ``receive`` and ``send`` as granian gave them, and
    ``started``, True once the response's head was sent (after it only the body may follow), and
    ``status``, the HTTP status of that head (0 before it)."""

    __slots__ = ("_on_gone", "_watch", "headers", "method", "path", "receive", "send", "started", "status")

    def __init__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.method: str = scope["method"]
        self.path: str = scope["path"]
        raw: Headers = scope["headers"]
        headers: dict[bytes, bytes] = dict(raw)
        if len(headers) != len(raw):  # a repeated header: keep its first value, as before
            headers = {}
            for name, value in raw:
                headers.setdefault(name, value)
        self.headers = headers
        self.receive = receive
        self.send = send
        self.started = False
        self.status = 0
        self._watch: asyncio.Future[Message] | None = None
        self._on_gone: Callable[[], None] | None = None

    def header(self, name: bytes) -> str | None:
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
                f"header {name.decode()} must be ASCII: percent-encode other characters (RFC 3986)"
            ) from None

    async def read_body(self, limit: int, too_large: Callable[[], Exception]) -> bytes:
        """The request body; ``too_large()`` is raised as soon as it passes ``limit`` bytes, and
        :class:`BodyCutShort` (400) when it ends before it is whole (malformed chunked encoding, or
        the client leaving before it has sent all of it).

        With ``Content-Length`` the body ends at that length: the closing empty message granian
        sends after it is not waited for (a watch reads it, :meth:`watch`).
        """
        declared_raw = self.headers.get(b"content-length")
        declared = int(declared_raw) if declared_raw is not None and declared_raw.isdigit() else None
        receive = self.receive
        message = await receive()
        if message["type"] != "http.request":
            raise BodyCutShort
        body: bytes = message.get("body", b"")
        if not message.get("more_body") or len(body) == declared:
            if len(body) > limit:
                raise too_large()
            return body
        parts = [body]
        size = len(body)
        while True:
            message = await receive()
            if message["type"] != "http.request":
                raise BodyCutShort
            part = message.get("body", b"")
            size += len(part)
            if size > limit:
                raise too_large()
            parts.append(part)
            if not message.get("more_body") or size == declared:
                return b"".join(parts)

    def watch(self, on_gone: Callable[[], None]) -> None:
        """Call ``on_gone`` (once, from the loop) when the client leaves, from now until
        :meth:`unwatch`; a second call while watching does nothing. Call it after the body was read.

        A leaving that happened before the watch began is seen too (granian keeps it). granian also
        completes the watch when the response has ended, which :meth:`unwatch` before that hides.
        """
        if self._watch is not None or self._on_gone is not None:
            return
        self._on_gone = on_gone
        self._arm()

    def _arm(self) -> None:
        watch = self._watch = asyncio.ensure_future(self.receive())
        watch.add_done_callback(self._watched)

    def _watched(self, watch: asyncio.Future[Message]) -> None:
        if watch is not self._watch:
            return
        self._watch = None
        on_gone = self._on_gone
        if on_gone is None or watch.cancelled():
            return
        error = watch.exception()
        if error is None and watch.result()["type"] == "http.request":
            self._arm()  # the body's closing message, left unread by read_body: now the leaving
            return
        self._on_gone = None
        on_gone()

    def unwatch(self) -> None:
        """Stop watching; nothing is called after this."""
        self._on_gone = None
        watch, self._watch = self._watch, None
        if watch is not None and not watch.cancel() and not watch.cancelled():
            watch.exception()  # retrieved, so a failed receive() is not logged as unretrieved

    async def start(self, status: int, headers: Headers) -> None:
        """Send the response head."""
        self.started = True
        self.status = status
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def respond(self, status: int, headers: Headers, body: bytes = b"") -> None:
        """A whole response: head and ``body`` in one piece."""
        await self.start(status, headers)
        await self.send({"type": "http.response.body", "body": body, "more_body": False})
