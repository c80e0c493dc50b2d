"""One HTTP/1.1 connection to an engine and the exchange on it (:class:`EngineExchange`), the
client's errors and its constants; the contract is the package's
(:mod:`luftpause.dataplane.relay.upstream`)."""

from __future__ import annotations

import asyncio
import logging
import select
from typing import TYPE_CHECKING, cast

import httptools

from luftpause.dataplane.errors import EngineError

if TYPE_CHECKING:
    from luftpause.dataplane.relay.upstream.pool import EnginePool

log = logging.getLogger("luftpause.dataplane")

ENGINE_CONNECT_TIMEOUT_S = 2.0
KEEPALIVE_S = 3.0
"""Seconds an idle connection is kept for reuse, from the arrival of its answer's last byte.

The engines served close an idle connection 5 s after they finished writing (uvicorn: SGLang,
vLLM; cpp-httplib: llama-server). What separates the two clocks is the time this loop takes to read
what arrived, which passed a second on a loaded host (llama-server's flood, bench/README.md); 2 s
below the engines' 5 s keeps most reuses clear of their close, and a close that still crosses a
request is caught at checkout or by the one re-send. A single value for every engine, as the
replica's configuration does not say which server it runs; a reconnect on loopback costs well
under a millisecond, so a shorter bound costs little (a hosted API over TLS pays a handshake more
after 3 s idle)."""
HIGH_WATER_BYTES = 256 * 1024
"""Body bytes an exchange holds before it stops reading from the engine."""
RESEND_WINDOW_S = 0.5
"""Seconds from a request's write on a kept-alive connection within which that connection's close,
with no byte of answer, sends the request once more (on a new connection); a later close is the
turn's failure (502).

An engine's idle close that crosses a request lands within milliseconds of the write (the close
was on its way before the request arrived); an engine that crashes, or a load balancer that closes
a quiet connection, does it seconds into a generation, which a re-send would run again (a
non-streamed answer sends nothing before it is whole). Measured on the loop's clock, from the
write to the loop handling the close: a loop lagging more than this answers a crossing 502, as
before the re-send existed."""
BODY_END_GRACE_S = 0.5
"""Seconds a connection whose answer is whole (its last event relayed) waits for the end of its
HTTP body (the chunked terminator) after the relay let it go, before it is reset. uvicorn (SGLang,
vLLM) writes the end in the loop turn of the last event or the next; the grace covers a loaded
host, and missing it costs only a new connection for a later turn."""
DEFAULT_MAX_IDLE = 32
"""Idle connections a pool keeps at most when built without ``max_idle`` (the default
``[[replicas]] max_inflight``)."""


class EngineConnectError(EngineError):
    undelivered = True


class EngineClosed(EngineError):
    pass


class EngineTimeout(EngineError):
    pass


class EngineProtocolError(EngineError):
    pass


_Headers = list[tuple[bytes, bytes]]


class EngineExchange(asyncio.Protocol):
    """One connection to an engine, and the exchange on it while one is going on.

    Read ``status`` and ``headers`` once :meth:`EnginePool.send` returned it; then :meth:`read`
    (or :meth:`take`) the body, and end with :meth:`release` or :meth:`abort`.
    """

    __slots__ = (
        "_body",
        "_buffered",
        "_chunked",
        "_fd",
        "_grace",
        "_has_length",
        "_head_done",
        "_idle",
        "_keep_alive",
        "_parser",
        "_paused",
        "_pool",
        "_received",
        "_stray",
        "_transport",
        "_waiter",
        "answered",
        "complete",
        "error",
        "headers",
        "idle_since",
        "quiet_since",
        "status",
    )

    def __init__(self, pool: EnginePool) -> None:
        self._pool = pool
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpResponseParser(self)
        self._waiter: asyncio.Future[None] | None = None
        self._body: list[bytes] = []
        self._buffered = 0
        self._paused = False
        self._head_done = False
        self._has_length = False
        self._chunked = False
        self._keep_alive = False
        self._fd = -1
        self._idle = False
        """In its pool's idle list: no request is outstanding on it."""
        self._received = False
        """A byte arrived since the last request was written (then it is never sent again)."""
        self._stray = False
        """A second message began after the answer's end, before another request was sent: bytes that
        answer nothing (ignored); the connection is never pooled."""
        self._grace: asyncio.TimerHandle | None = None
        """Set while the released exchange waits for its body's end (``BODY_END_GRACE_S``)."""
        self.answered = False
        """Set by the relay: the answer is whole (its last event came), whatever the body still owes;
        :meth:`release` then waits for the body's end without the relay."""
        self.status = 0
        self.headers: _Headers = []
        self.complete = False
        """The response's body has ended (what :meth:`read` returns after it is the last of it)."""
        self.error: EngineError | None = None
        self.idle_since = 0.0
        """``loop.time()`` the last byte of its last answer arrived: the start of its idle time."""
        self.quiet_since = 0.0
        """``loop.time()`` of the last byte received, or of the relay beginning to wait."""

    # --- asyncio.Protocol --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        sock = transport.get_extra_info("socket")  # also under TLS: the TCP socket beneath
        self._fd = sock.fileno() if sock is not None else -1

    def data_received(self, data: bytes) -> None:
        if self._idle:  # nothing was asked: the engine is closing (maybe with a 408 first)
            self.abort()
            return
        self._received = True
        self.quiet_since = self._pool.loop.time()
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fail(EngineProtocolError("the engine answered with a protocol upgrade"))
        except httptools.HttpParserError as exc:
            self._fail(EngineProtocolError(f"the engine's answer is not HTTP/1.1: {exc}"))
        if self._grace is not None:
            if self.complete or self.error is not None:
                self._end_grace()
                self.release()
            return
        if self._buffered > HIGH_WATER_BYTES and not self._paused and self._transport is not None:
            self._paused = True
            self._transport.pause_reading()
        self._wake()

    def eof_received(self) -> bool | None:
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None
        self._end_grace()
        self._pool.lost(self)
        if self.complete or self.error is not None:
            self._wake()
            return
        if self._head_done and not self._has_length and not self._chunked:
            self.complete = True  # a body delimited by the connection's end (RFC 9112 section 6.3)
        else:
            when = "mid-answer" if self._head_done else "before answering"
            self.error = EngineClosed(f"the engine closed the connection {when} ({exc or 'end of stream'})")
        self._wake()

    # --- httptools callbacks ------------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self.complete:
            self._stray = True  # the answer ended in this same read; what follows answers nothing

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._stray:
            return
        name = name.lower()
        if name == b"content-length":
            self._has_length = True
        elif name == b"transfer-encoding":
            self._chunked = b"chunked" in value.lower()
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        if self._stray:
            return
        self.status = self._parser.get_status_code()
        self._head_done = True

    def on_body(self, body: bytes) -> None:
        if self._grace is not None or self._stray:
            return  # after a whole answer (released, or a stray message after it): nobody reads it
        self._body.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
        if self._stray:
            return
        self.complete = True
        self._keep_alive = self._parser.should_keep_alive()
        self.idle_since = self.quiet_since  # the read that brought the last byte

    # --- the relay's side ---------------------------------------------------------------------------

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    def _fail(self, error: EngineError) -> None:
        if self.error is None and not self.complete:
            self.error = error
        if self._transport is not None:
            self._transport.abort()

    async def _wait(self) -> None:
        self.quiet_since = self._pool.loop.time()
        waiter = self._waiter = self._pool.loop.create_future()
        try:
            await waiter
        finally:
            self._waiter = None

    def timed_out(self, read_timeout_s: float) -> None:
        """Called by the pool's sweep for an exchange whose relay waits with nothing arriving."""
        self._fail(EngineTimeout(f"no answer from the engine for {read_timeout_s:g} s"))
        self._wake()

    @property
    def waiting(self) -> bool:
        """The relay is waiting on this exchange for bytes."""
        return self._waiter is not None

    async def _head(self) -> None:
        while not self._head_done:
            if self.error is not None:
                raise self.error
            if self.complete:  # cannot be: a message completes after its head
                raise EngineProtocolError("the engine's answer ended before its head")
            await self._wait()

    def take(self) -> bytes:
        """The body bytes received since the last call, ``b""`` when none are.

        Raises the exchange's :class:`EngineError` once the engine failed and nothing received
        before the failure is left to take. Resumes reading when it had stopped for the high water.
        """
        body = self._body
        if not body:
            if self.error is not None:
                raise self.error
            return b""
        data = body[0] if len(body) == 1 else b"".join(body)
        body.clear()
        self._buffered = 0
        if self._paused:
            self._paused = False
            if self._transport is not None:
                self._transport.resume_reading()
        return data

    async def read(self) -> bytes:
        """The body bytes received since the last call, waiting until there are some; ``b""`` once
        the body has ended (``complete``). Raises :class:`EngineError`."""
        while True:
            data = self.take()
            if data or self.complete:
                return data
            await self._wait()

    async def read_all(self, limit: int) -> bytes:
        """The whole body (at most ``limit`` bytes, else :class:`EngineProtocolError`)."""
        parts: list[bytes] = []
        size = 0
        while data := await self.read():
            size += len(data)
            if size > limit:
                raise EngineProtocolError(f"the engine's answer is over {limit} bytes")
            parts.append(data)
        return b"".join(parts)

    def release(self) -> None:
        """The relay is done with the answer: back to the pool once its body has ended (at once if
        it has; within ``BODY_END_GRACE_S`` if the relay set ``answered``), else closed."""
        if self.error is None and self._transport is not None:
            if self.complete:
                if self._keep_alive and not self._stray:
                    self._pool.put(self)
                    return
            elif self.answered:
                if self._grace is None:
                    self._body.clear()
                    self._buffered = 0
                    if self._paused:
                        self._paused = False
                        self._transport.resume_reading()
                    self._grace = self._pool.loop.call_later(BODY_END_GRACE_S, self.abort)
                return
        self.abort()

    def _end_grace(self) -> None:
        grace = self._grace
        if grace is not None:
            self._grace = None
            grace.cancel()

    def abort(self) -> None:
        """Reset the connection (an exchange given up mid-way); idempotent."""
        self._end_grace()
        transport = self._transport
        if transport is not None:
            self._transport = None
            transport.abort()
        self._pool.lost(self)

    def _reset_for_reuse(self) -> None:
        # llhttp is ready for the next message once one completed: the parser is kept.
        self._body.clear()
        self._buffered = 0
        self._head_done = self._has_length = self._chunked = self._keep_alive = False
        self._received = self.answered = False
        self.status = 0
        self.headers = []
        self.complete = False

    def _closed_while_idle(self) -> bool:
        """The engine closed this idle connection, or sent on it, and the loop has not read that
        yet: its socket is readable (one ``poll`` with no wait), or its transport is closing."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return True
        if self._fd < 0:
            return False
        poller = select.poll()
        poller.register(self._fd, select.POLLIN)
        return bool(poller.poll(0))

    def _write(self, data: bytes, body: bytes) -> None:
        assert self._transport is not None
        if len(body) <= 16384:
            self._transport.write(data + body)  # one copy of a small body, one write
        else:
            self._transport.writelines((data, body))
