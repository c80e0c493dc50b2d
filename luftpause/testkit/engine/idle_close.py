"""An engine's idle close of kept-alive connections, at its worst for a client
(``EngineSettings.idle_close_ms``, ``fake-engine --idle-close-ms``).

Servers close a kept-alive connection they have kept idle for a while: uvicorn (under SGLang and
vLLM) and cpp-httplib (under llama-server) 5 s after they finished writing their last answer. A
client that sends its next request on it just then finds the connection closed under it: the
request is written, and what comes back is a reset or an end of stream with no byte of answer; it
has to send the request again on a new connection. On loopback that crossing lasts microseconds
and cannot be aimed at, so here it is made certain: a ``POST`` that arrives on a connection idle
for ``idle_close_ms`` or more is never answered, and the connection is reset (``SO_LINGER`` 0: an
RST, as from a socket closed with a request unread in it). Nothing is closed while idle (aiohttp's
own keep-alive timeout still applies), so a client never gets the easy case of seeing the end of
stream before it writes.

Idle time runs from the end of the handler of the connection's last request: its last write for a
streamed answer, just before the body of a whole one. Only ``POST`` requests (what a proxy sends
turns as) are dropped, so that a prober's ``GET /health`` and ``GET /metrics`` keep a replica
healthy in a test. ``EngineStats.idle_closed`` counts the dropped requests.
"""

from __future__ import annotations

import asyncio
import socket
import struct
from weakref import WeakKeyDictionary

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from luftpause.testkit.engine.scheduling import EngineStats

__all__ = ["idle_close_middleware"]


def idle_close_middleware(idle_close_ms: float, stats: EngineStats) -> Middleware:
    """The aiohttp middleware that drops a ``POST`` arriving on a connection idle for
    ``idle_close_ms`` milliseconds or more (counted in ``stats.idle_closed``)."""
    idle_close_s = idle_close_ms / 1000.0
    answered: WeakKeyDictionary[asyncio.Transport, float] = WeakKeyDictionary()
    """Per connection, ``loop.time()`` its last request's handler ended."""

    @web.middleware
    async def idle_close(request: web.Request, handler: Handler) -> web.StreamResponse:
        transport = request.transport
        if transport is None:
            return await handler(request)
        loop = asyncio.get_running_loop()
        last = answered.get(transport)
        if request.method == "POST" and last is not None and loop.time() - last >= idle_close_s:
            stats.idle_closed += 1
            _reset(transport)
            # aiohttp finds the connection gone when it writes this and drops it quietly.
            return web.Response()
        try:
            return await handler(request)
        finally:
            answered[transport] = loop.time()

    return idle_close


def _reset(transport: asyncio.Transport) -> None:
    """Close the connection with an RST (``SO_LINGER`` on, 0 s), whatever is left unread."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    transport.abort()
