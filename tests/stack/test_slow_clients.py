"""Slow and silent clients at every HTTP listener (dataplane, runtime, scheduler status) cost a
bounded time and get the JSON error where an answer can still be sent (:mod:`luftpause.serving.listeners`).

The issue's repro: 50 connections that sent one chunk of a body and went silent were all still
open 40 s later. Here each listener's ``body_timeout_s`` and ``header_timeout_s`` are 2 s, so
each such connection must be answered 408 (JSON) and closed, a request head that never ends and
a kept-alive connection left idle must be closed, and a request past ``max_connections`` is
answered 503 (JSON) at once. Raw sockets; every wait below is a fail-safe, never a measured bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import orjson
import pytest

from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

LIMITS = "[{}.limits]\nbody_timeout_s = 2\nheader_timeout_s = 2\nmax_connections = {}\n"
MAX_CONNECTIONS = 60
FAIL_SAFE_S = 60.0
SILENT = 50


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack.start(
        tmp_path_factory.mktemp("slow-clients"),
        env={"LUFTPAUSE_TOKEN": ""},
        sections={
            name: LIMITS.format(name, MAX_CONNECTIONS) for name in ("scheduler", "dataplane", "runtime")
        },
    )
    try:
        stack.wait_connected()
        yield stack
    finally:
        stack.stop()


def _port(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


LISTENERS = {
    "dataplane": (lambda s: _port(s.dataplane_url), "/v1/chat/completions"),
    "runtime": (lambda s: _port(s.runtime_url), "/mcp"),
}


async def _exchange(port: int, data: bytes) -> bytes:
    """Send ``data`` and go silent; everything the server sends until it closes the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), FAIL_SAFE_S)
    finally:
        writer.close()


def _one_chunk(path: str) -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        "Accept: application/json, text/event-stream\r\nContent-Length: 4096\r\n\r\n"
        '{"model": "llama'
    ).encode()


def _status_and_body(answer: bytes) -> tuple[int, dict[str, object]]:
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ", 2)[1]), orjson.loads(body)


@pytest.mark.parametrize("listener", sorted(LISTENERS))
def test_fifty_bodies_that_go_silent_are_answered_408_and_closed(slow: Stack, listener: str) -> None:
    port_of, path = LISTENERS[listener]
    port = port_of(slow)

    async def go() -> list[bytes]:
        return await asyncio.gather(*(_exchange(port, _one_chunk(path)) for _ in range(SILENT)))

    answers = asyncio.run(go())
    for answer in answers:  # every one came back, and the server closed each connection
        status, body = _status_and_body(answer)
        assert status == 408, answer[:200]
        assert b"connection: close" in answer.lower()
        message = body["error"]["message"]  # type: ignore[index]
        assert message.startswith("the request body was not complete 2 s after its headers (16 bytes came)")
    log = slow.children[listener].log_tail(200)
    assert f"{listener}: 408 to 127.0.0.1:" in log
    assert "Application callable raised an exception" not in log  # one line of ours, not a traceback


@pytest.mark.parametrize("listener", ["dataplane", "runtime", "scheduler"])
def test_a_head_that_never_ends_and_an_idle_connection_are_closed(slow: Stack, listener: str) -> None:
    port = {"scheduler": _port(slow.status_url), **{k: f(slow) for k, (f, _) in LISTENERS.items()}}[listener]

    async def go() -> tuple[bytes, bytes]:
        partial = _exchange(port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: 1")
        idle = _exchange(port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        return await asyncio.gather(partial, idle)

    partial, idle = asyncio.run(go())
    assert partial == b""  # no request was known: nothing can be answered, the connection is closed
    assert idle.startswith(b"HTTP/1.1 200")  # answered, then closed when it stayed idle


def test_the_scheduler_reads_no_body_it_does_not_use_for_long(slow: Stack) -> None:
    port = _port(slow.status_url)
    answer = asyncio.run(
        _exchange(port, b'GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 4096\r\n\r\n{"a"')
    )
    assert answer.startswith(b"HTTP/1.1 200")  # answered, then closed (aiohttp's lingering: 2 s)


@pytest.mark.parametrize("listener", sorted(LISTENERS))
def test_a_request_past_max_connections_is_answered_503_at_once(slow: Stack, listener: str) -> None:
    port_of, path = LISTENERS[listener]
    port = port_of(slow)

    async def go() -> tuple[bytes, list[bytes]]:
        # MAX_CONNECTIONS requests whose bodies never come hold every slot until their 408...
        held = [asyncio.ensure_future(_exchange(port, _one_chunk(path))) for _ in range(MAX_CONNECTIONS)]
        await asyncio.sleep(0.5)
        # ... and one more is answered at once, long before any of theirs.
        extra = await _exchange(port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        pending = [task for task in held if not task.done()]
        assert pending, "the held requests were answered before the extra one"
        return extra, await asyncio.gather(*held)

    extra, held = asyncio.run(go())
    status, body = _status_and_body(extra)
    assert status == 503, extra[:200]
    message = f"the {listener} serves {MAX_CONNECTIONS} requests at once (limits.max_connections); retry"
    assert body == {"error": {"message": message}}
    assert b"retry-after: 1" in extra.lower()
    assert all(answer.startswith(b"HTTP/1.1 408") for answer in held)


def test_the_scheduler_answers_a_connection_past_max_connections_503(slow: Stack) -> None:
    port = _port(slow.status_url)

    async def go() -> bytes:
        opened = [await asyncio.open_connection("127.0.0.1", port) for _ in range(MAX_CONNECTIONS)]
        try:
            return await _exchange(port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        finally:
            for _, writer in opened:
                writer.close()

    status, body = _status_and_body(asyncio.run(go()))
    assert status == 503
    assert body == {
        "error": {"message": f"the scheduler serves {MAX_CONNECTIONS} connections at once; retry"}
    }
