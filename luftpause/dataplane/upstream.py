"""The dataplane's HTTP/1.1 client to engines: one keep-alive pool per replica.

Why not aiohttp's client: a relay needs a small part of it (send one request, read a status, headers
and a body as it arrives), and its full stack cost about twice the CPU per turn of this module,
measured in one run through a bare granian relay (bench/README.md, "End to end": 0.39 against 0.23
ms per turn at one stream; a Rust client, ``pyreqwest``, 0.28).

What it is: an :class:`asyncio.Protocol` per connection with httptools' response parser (llhttp,
the parser of Node.js), which undoes chunked framing; the body is handed to the relay as it
arrives, everything one read brought joined into one piece.

Contract:

* :meth:`EnginePool.send` writes one request (``POST``, HTTP/1.1, ``Host``, ``Content-Length``,
  the pool's fixed headers and the turn's own) on an idle kept-alive connection, or a new one
  (``ENGINE_CONNECT_TIMEOUT_S`` to connect), and returns once the response's head has come:
  ``status``, ``headers`` (lower-case names, raw values, in order).
* :meth:`EngineExchange.read` returns the body as it comes: every byte received since the last call
  in one ``bytes``, waiting when none is there; ``b""`` once the body has ended.
  :meth:`EngineExchange.take` is its non-waiting half.
* Bounded: at most ``HIGH_WATER_BYTES`` of body wait in the exchange; past that the connection stops
  reading (TCP then stops the engine) until the relay has taken them. A relay that waits on a slow
  client therefore holds the engine back, never memory.
* Timeouts: ``read_timeout_s`` (seconds) bounds how long the relay waits for a head or a body byte
  with nothing arriving (the time it spends sending to a slow client does not count); checked
  every ``min(1, read_timeout_s / 4)`` seconds by one task per :class:`Upstream`.
* Ends: :meth:`EngineExchange.release` after the body ended returns the connection to its pool
  when the engine keeps it alive; :meth:`EngineExchange.abort` (the client left, the relay failed)
  resets the connection, which the engine sees at once (SGLang and vLLM abort the request then).
  An exchange whose relay set ``answered`` (the answer's last event came, the body's end has not:
  an engine writes its chunked terminator after its last event, maybe a loop turn or more later)
  is released without waiting: the connection goes back to its pool if the body's end arrives
  within ``BODY_END_GRACE_S`` (anything else still arriving is dropped unread), and is reset
  otherwise.
* Bounded idle: at most ``max_idle`` idle connections per pool (the replica's ``max_inflight``,
  as the relay builds its pools; ``DEFAULT_MAX_IDLE`` otherwise); a connection released past
  that is closed, never kept.

Kept-alive connections and the engine's own idle close. An engine closes a connection it has kept
idle for a while (uvicorn, under SGLang and vLLM: 5 s after it finished writing; cpp-httplib,
under llama-server: 5 s likewise), and its close can cross a request already on its way. So:

* an idle connection is kept ``KEEPALIVE_S`` from the arrival of its answer's last byte (the
  engine's clock starts when it wrote that byte, not when the relay let the connection go);
* one taken from the pool is checked first: found closed (its socket readable: the engine's end of
  stream, or bytes nobody asked for, arrived and the loop has not read them yet) it is dropped
  and the next taken, as urllib3 (``is_connection_dropped``) and httpcore (``has_expired``) do;
  bytes arriving on an idle connection close it likewise;
* a request sent on a kept-alive connection that then ends (reset or end of stream) before a
  single byte of its answer arrived, within ``RESEND_WINDOW_S`` of its write, is sent once more,
  on a new connection; ``EnginePool.resent`` counts these and each is logged. Never otherwise: a
  close later than that (an engine that crashed mid-generation, a load balancer closing a quiet
  connection: a whole answer's work would be done twice), a new connection's failure, any failure
  after a byte of the answer (the relay may have passed it on: the client's connection is aborted,
  as the failure contract says), a timeout or a protocol error are the turn's failure.

Re-sending a ``POST``: urllib3 re-sends after a read error only the methods its ``Retry`` allows
(idempotent ones), aiohttp only idempotent ones on a kept-alive connection (``IDEMPOTENT_METHODS``,
after RFC 9112 section 9.3.1), httpcore never once the request is written. RFC 9112 section 9.3.1
allows a non-idempotent request to be retried when the client knows its semantics are idempotent.
An engine's completion (chat, messages, responses, classify) changes nothing but its caches, and
an engine whose idle close crossed a request closed the connection before it could work on it
(the close lands within milliseconds of the write; ``RESEND_WINDOW_S`` bounds it), so the worst a
re-send costs is the prompt read twice. A close that comes later may end a generation under way
(a non-streamed answer sends no byte before it is whole), which is never sent again.

Errors: every failure is an :class:`EngineError` (the message says what happened):
``EngineConnectError`` (no connection), ``EngineClosed`` (the engine closed or reset the connection
before its answer ended), ``EngineTimeout`` (the read timeout passed), ``EngineProtocolError`` (not
HTTP/1.1 as the parser reads it).
"""

from __future__ import annotations

import asyncio
import logging
import select
import ssl
from collections.abc import Callable
from typing import cast
from urllib.parse import urlsplit

import httptools

__all__ = [
    "BODY_END_GRACE_S",
    "DEFAULT_MAX_IDLE",
    "ENGINE_CONNECT_TIMEOUT_S",
    "HIGH_WATER_BYTES",
    "KEEPALIVE_S",
    "RESEND_WINDOW_S",
    "EngineClosed",
    "EngineConnectError",
    "EngineError",
    "EngineExchange",
    "EnginePool",
    "EngineProtocolError",
    "EngineTimeout",
    "Upstream",
]

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


class EngineError(Exception):
    """The engine request failed; ``str(err)`` says how (it goes into the client's 502)."""


class EngineConnectError(EngineError):
    pass


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

    def on_header(self, name: bytes, value: bytes) -> None:
        name = name.lower()
        if name == b"content-length":
            self._has_length = True
        elif name == b"transfer-encoding":
            self._chunked = b"chunked" in value.lower()
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()
        self._head_done = True

    def on_body(self, body: bytes) -> None:
        if self._grace is not None:
            return  # after a whole answer, released: nobody reads it
        self._body.append(body)
        self._buffered += len(body)

    def on_message_complete(self) -> None:
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
                if self._keep_alive:
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


class EnginePool:
    """The kept-alive connections to one engine (``url``: ``http://`` or ``https://``, maybe with a
    path prefix), and how a request to it is written.

    ``fixed_headers``: ``(name, value)`` text pairs sent with every request (the replica's
    ``Authorization``, ``Content-Type``, ``Accept-Encoding``); ``name``: the replica's, for the
    log. Build it in the running loop.

    ``max_idle``: the idle connections kept at most (at least 1); one released past it is closed.

    Counters: ``resent``, requests sent again on a new connection after a kept-alive one ended
    before any byte of the answer; ``found_closed``, idle connections found closed when taken.
    """

    def __init__(
        self,
        url: str,
        fixed_headers: list[tuple[str, str]],
        read_timeout_s: float,
        name: str = "",
        max_idle: int = DEFAULT_MAX_IDLE,
    ) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.loop = asyncio.get_running_loop()
        self.host = parts.hostname
        self.port = parts.port or (443 if parts.scheme == "https" else 80)
        self.ssl: ssl.SSLContext | None = ssl.create_default_context() if parts.scheme == "https" else None
        self.prefix = parts.path.rstrip("/")
        self.read_timeout_s = read_timeout_s
        authority = parts.netloc.rpartition("@")[2]  # never the URL's userinfo
        self.name = name or authority
        self.resent = 0
        self.found_closed = 0
        fixed = "".join(f"{name}: {value}\r\n" for name, value in fixed_headers)
        self._fixed = f"host: {authority}\r\n{fixed}".encode("latin-1")
        self.max_idle = max(max_idle, 1)
        # Idle connections in the order they were idled (a dict: O(1) to take the newest, to drop
        # any one, and ordered), and those with an exchange going on.
        self._idle: dict[EngineExchange, None] = {}
        self.busy: set[EngineExchange] = set()

    def head(self, path: str, extra: bytes, length: int) -> bytes:
        """The request's head: ``POST`` of ``path`` (after the URL's own path), the fixed headers,
        ``extra`` (whole header lines) and ``Content-Length``."""
        return b"POST %s%s HTTP/1.1\r\n%s%scontent-length: %d\r\n\r\n" % (
            self.prefix.encode(),
            path.encode(),
            self._fixed,
            extra,
            length,
        )

    async def send(self, path: str, extra: bytes, body: bytes) -> EngineExchange:
        """Send ``POST path`` with ``body`` and return the exchange once its response's head came.

        On a kept-alive connection that ends before any byte of the answer, sent once more on a new
        connection (the module's docstring says when and why). Raises :class:`EngineError`;
        cancellation aborts the connection.
        """
        head = self.head(path, extra, len(body))
        exchange = self._idle_connection()
        if exchange is not None:
            written_at = self.loop.time()  # _exchange writes before its first await
            try:
                return await self._exchange(exchange, head, body)
            except EngineClosed as exc:
                if exchange._received:
                    raise
                after = self.loop.time() - written_at
                if after > RESEND_WINDOW_S:
                    log.info(
                        "engine %s: %s, %.1f s after the request on a kept-alive connection; "
                        "not sent again (over %g s: the engine may have worked on it)",
                        self.name,
                        exc,
                        after,
                        RESEND_WINDOW_S,
                    )
                    raise
                self.resent += 1
                log.info(
                    "engine %s: %s, on a kept-alive connection; sending the request again on a new one",
                    self.name,
                    exc,
                )
        return await self._exchange(await self._connect(), head, body)

    async def _exchange(self, exchange: EngineExchange, head: bytes, body: bytes) -> EngineExchange:
        self.busy.add(exchange)
        try:
            exchange._write(head, body)
            await exchange._head()
        except BaseException:
            exchange.abort()
            raise
        return exchange

    def _idle_connection(self) -> EngineExchange | None:
        """The most recently idled connection still usable, dropping those past ``KEEPALIVE_S``
        and those found closed; ``None`` when none is left."""
        idle = self._idle
        now = self.loop.time()
        while idle:
            exchange, _ = idle.popitem()  # the newest
            exchange._idle = False
            if now - exchange.idle_since >= KEEPALIVE_S:
                exchange.abort()
            elif exchange._closed_while_idle():
                self.found_closed += 1
                exchange.abort()
            else:
                return exchange
        return None

    async def _connect(self) -> EngineExchange:
        try:
            async with asyncio.timeout(ENGINE_CONNECT_TIMEOUT_S):
                _, exchange = await self.loop.create_connection(
                    lambda: EngineExchange(self),
                    self.host,
                    self.port,
                    ssl=self.ssl,
                    server_hostname=self.host if self.ssl is not None else None,
                )
        except TimeoutError:
            raise EngineConnectError(f"connect timed out after {ENGINE_CONNECT_TIMEOUT_S:g} s") from None
        except OSError as exc:
            raise EngineConnectError(f"cannot connect: {exc.strerror or exc}") from None
        return exchange

    def put(self, exchange: EngineExchange) -> None:
        self.busy.discard(exchange)
        if len(self._idle) >= self.max_idle:
            exchange.abort()  # as many idle as the pool keeps: more are never needed at once
            return
        exchange._reset_for_reuse()
        exchange._idle = True
        self._idle[exchange] = None

    def lost(self, exchange: EngineExchange) -> None:
        self.busy.discard(exchange)
        if exchange._idle:
            exchange._idle = False
            del self._idle[exchange]

    def sweep(self, now: float) -> None:
        """Time out the exchanges whose relay has waited ``read_timeout_s`` with nothing arriving,
        and close the connections idle for ``KEEPALIVE_S``."""
        timeout = self.read_timeout_s
        for exchange in list(self.busy):
            if exchange.waiting and now - exchange.quiet_since >= timeout:
                exchange.timed_out(timeout)
        # Not in idle order (a connection is put back when its relay ends, after its last byte): one
        # pass over them all, each expired one dropped from the dict in O(1).
        for exchange in [e for e in self._idle if now - e.idle_since >= KEEPALIVE_S]:
            exchange.abort()

    def close(self) -> None:
        for exchange in [*self._idle, *self.busy]:
            exchange.abort()


class Upstream:
    """Every replica's :class:`EnginePool`, by replica name, and the one task that sweeps them.

    ``Upstream(read_timeout_s)``; :meth:`pool` builds a replica's pool on first use (``headers``
    gives its fixed headers); :meth:`start` and :meth:`close` in the running loop.
    """

    def __init__(self, read_timeout_s: float) -> None:
        self.read_timeout_s = read_timeout_s
        self.pools: dict[str, EnginePool] = {}
        self._task: asyncio.Task[None] | None = None

    def pool(
        self,
        name: str,
        url: str,
        headers: Callable[[], list[tuple[str, str]]],
        max_idle: int = DEFAULT_MAX_IDLE,
    ) -> EnginePool:
        """Replica ``name``'s pool, built on first use; ``max_idle`` applies from this call on (a
        replica's ``max_inflight`` may change at run time)."""
        pool = self.pools.get(name)
        if pool is None:
            pool = self.pools[name] = EnginePool(url, headers(), self.read_timeout_s, name, max_idle)
        else:
            pool.max_idle = max(max_idle, 1)
        return pool

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._sweep_forever(), name="luftpause-upstream")

    async def _sweep_forever(self) -> None:
        loop = asyncio.get_running_loop()
        every = min(1.0, self.read_timeout_s / 4)
        while True:
            await asyncio.sleep(every)
            now = loop.time()
            for pool in self.pools.values():
                pool.sweep(now)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
        for pool in self.pools.values():
            pool.close()
