"""The kept-alive connections to one engine (:class:`EnginePool`) and every engine's pools with
their timeout sweep (:class:`Upstream`); the contract is the package's
(:mod:`luftpause.dataplane.relay.upstream`)."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from urllib.parse import urlsplit

from luftpause.dataplane.relay.upstream.connection import (
    DEFAULT_MAX_IDLE,
    ENGINE_CONNECT_TIMEOUT_S,
    KEEPALIVE_S,
    RESEND_WINDOW_S,
    EngineClosed,
    EngineConnectError,
    EngineExchange,
    EngineTimeout,
    log,
)


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
        except (EngineClosed, EngineTimeout) as exc:
            exchange.abort()
            exc.undelivered = not exchange._received
            raise
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
        exchange._reset_for_reuse()
        exchange._idle = True
        self._idle[exchange] = None
        while len(self._idle) > self.max_idle:
            # as many idle as the pool keeps (more are never needed at once): the one idle longest
            # goes, the nearest to the engine's own idle close
            next(iter(self._idle)).abort()

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
