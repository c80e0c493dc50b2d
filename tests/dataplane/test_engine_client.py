"""The dataplane's engine client (``luftpause.dataplane.relay.upstream``) against small engines on raw
sockets in the test's own loop: keep-alive, the three ways a body ends, the ways an engine fails,
the bound on what it holds for a slow relay, the read timeout."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from luftpause.dataplane.relay.upstream import (
    HIGH_WATER_BYTES,
    EngineClosed,
    EngineConnectError,
    EnginePool,
    EngineTimeout,
    Upstream,
)
from luftpause.testkit.launch.procs import free_port

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _request(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One request's head and body (by its Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value)
    return head, await reader.readexactly(length)


class Engine:
    """A server on 127.0.0.1 whose ``handler`` answers each connection; counts connections."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.port = free_port()
        self.connections = 0
        self.heads: list[bytes] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Engine:
        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            self.connections += 1
            try:
                await self.handler(reader, writer)
            except (ConnectionError, asyncio.IncompleteReadError):
                pass
            finally:
                writer.close()

        self._server = await asyncio.start_server(serve, "127.0.0.1", self.port)
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _upstream(engine_url: str, read_timeout_s: float = 30.0) -> tuple[Upstream, EnginePool]:
    upstream = Upstream(read_timeout_s)
    pool = upstream.pool("e", engine_url, lambda: [("content-type", "application/json")])
    return upstream, pool


def test_a_kept_alive_connection_serves_the_next_request_and_the_request_is_as_written() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while True:
            head, body = await _request(reader)
            engine.heads.append(head + body)
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\n\r\n{}")
            await writer.drain()

    engine = Engine(handler)

    async def scenario() -> list[bytes]:
        async with engine:
            upstream = Upstream(30.0)
            pool = upstream.pool("e", engine.url + "/base/", lambda: [("authorization", "Bearer k")])
            bodies = []
            for _ in range(3):
                exchange = await pool.send("/v1/chat/completions", b"traceparent: 00-x\r\n", b'{"a":1}')
                assert exchange.status == 200
                assert (b"content-type", b"application/json") in exchange.headers
                bodies.append(await exchange.read_all(1024))
                exchange.release()
            await upstream.close()
            return bodies

    assert asyncio.run(scenario()) == [b"{}"] * 3
    assert engine.connections == 1
    head = engine.heads[0]
    assert head.startswith(b"POST /base/v1/chat/completions HTTP/1.1\r\n")
    assert f"host: 127.0.0.1:{engine.port}\r\n".encode() in head
    assert b"authorization: Bearer k\r\n" in head and b"traceparent: 00-x\r\n" in head
    assert head.endswith(b'content-length: 7\r\n\r\n{"a":1}')


def test_a_chunked_body_arrives_unchunked_and_a_connection_close_answer_is_not_reused() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\nconnection: close\r\n\r\n")
        for piece in (b"data: a\n\n", b"data: b\n\n"):
            writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
            await writer.drain()
            await asyncio.sleep(0.01)
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    engine = Engine(handler)

    async def scenario() -> bytes:
        async with engine:
            upstream, pool = _upstream(engine.url)
            received = b""
            for _ in range(2):
                exchange = await pool.send("/x", b"", b"{}")
                received = await exchange.read_all(1024)
                assert exchange.complete
                exchange.release()
            await upstream.close()
            return received

    assert asyncio.run(scenario()) == b"data: a\n\ndata: b\n\n"
    assert engine.connections == 2


def test_a_body_delimited_by_the_connections_end_ends_cleanly() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: [DONE]\n\n")
        await writer.drain()

    async def scenario() -> tuple[bytes, bool]:
        async with Engine(handler) as engine:
            upstream, pool = _upstream(engine.url)
            exchange = await pool.send("/x", b"", b"{}")
            body = await exchange.read_all(1024)
            await upstream.close()
            return body, exchange.complete

    assert asyncio.run(scenario()) == (b"data: [DONE]\n\n", True)


@pytest.mark.parametrize("when", ["before answering", "mid-answer"])
def test_an_engine_closing_early_is_an_error_naming_when(when: str) -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        if when == "mid-answer":
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\npartial")
            await writer.drain()

    async def scenario() -> str:
        async with Engine(handler) as engine:
            upstream, pool = _upstream(engine.url)
            try:
                exchange = await pool.send("/x", b"", b"{}")
                assert await exchange.read() == b"partial"
                await exchange.read()
            except EngineClosed as exc:
                return str(exc)
            finally:
                await upstream.close()
        raise AssertionError("no error")

    assert when in asyncio.run(scenario())


def test_no_engine_listening_is_a_connect_error() -> None:
    async def scenario() -> None:
        upstream, pool = _upstream(f"http://127.0.0.1:{free_port()}")
        try:
            await pool.send("/x", b"", b"{}")
        finally:
            await upstream.close()

    with pytest.raises(EngineConnectError, match="cannot connect"):
        asyncio.run(scenario())


def test_a_relay_that_does_not_take_the_body_stops_the_engine_at_the_high_water_mark() -> None:
    sent = 0
    total = 64 * 1024 * 1024

    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total)
        piece = b"x" * 65536
        while sent < total:
            writer.write(piece)
            sent += len(piece)
            await writer.drain()

    async def scenario() -> tuple[int, int]:
        async with Engine(handler) as engine:
            upstream, pool = _upstream(engine.url)
            exchange = await pool.send("/x", b"", b"{}")
            await asyncio.sleep(1.0)  # the relay is "sending to a slow client": nothing taken
            held = exchange._buffered
            taken = len(exchange.take())
            await asyncio.sleep(0.2)
            got = taken + len(await exchange.read())  # reading resumed
            exchange.abort()
            await upstream.close()
            return held, got

    held, got = asyncio.run(scenario())
    # One read past the mark at most (uvloop and asyncio read up to 256 KiB at a time).
    assert held <= HIGH_WATER_BYTES + 256 * 1024
    assert sent < total  # the engine was held back by TCP, not let run to the end
    assert got > held


def test_an_engine_silent_for_the_read_timeout_is_timed_out() -> None:
    async def handler(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
        await writer.drain()
        await asyncio.sleep(30)

    async def scenario() -> None:
        async with Engine(handler) as engine:
            upstream, pool = _upstream(engine.url, read_timeout_s=0.4)
            upstream.start()
            try:
                exchange = await pool.send("/x", b"", b"{}")
                assert await exchange.read() == b"hello"
                await asyncio.wait_for(exchange.read(), 10)
            finally:
                await upstream.close()

    with pytest.raises(EngineTimeout, match=r"no answer from the engine for 0\.4 s"):
        asyncio.run(scenario())
