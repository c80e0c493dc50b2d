"""The dataplane's engine client (``luftpause.dataplane.relay.upstream``) when an engine closes a kept-alive
connection as it is reused: found closed when taken from the pool, it is dropped; closed or reset
after the request was written and before any byte of the answer, the request is sent once more on a
new connection; never otherwise (a new connection, a byte of the answer already in, a second
failure). The engine is :class:`raw_engine_helpers.RawEngine`, in threads, so that a test can hold
its own loop while the engine closes a connection. Each test runs on asyncio's loop and on uvloop
(the dataplane's)."""

from __future__ import annotations

import asyncio
import select
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

import pytest
import uvloop
from raw_engine_helpers import STREAM_HEAD, RawEngine, RawRequest, answer_json, chunked, close, reset

from luftpause.dataplane.relay.upstream import (
    KEEPALIVE_S,
    RESEND_WINDOW_S,
    EngineClosed,
    EngineConnectError,
    EngineExchange,
    EnginePool,
    Upstream,
)
from luftpause.dataplane.relay.upstream import connection as upstream_connection

T = TypeVar("T")
Runner = Callable[[Coroutine[Any, Any, T]], T]


@pytest.fixture(params=["asyncio", "uvloop"])
def run(request: pytest.FixtureRequest) -> Runner[Any]:
    runner: Runner[Any] = asyncio.run if request.param == "asyncio" else uvloop.run
    return runner


def _upstream(engine: RawEngine) -> tuple[Upstream, EnginePool]:
    upstream = Upstream(30.0)
    return upstream, upstream.pool("raw", engine.url, lambda: [("content-type", "application/json")])


async def _turn(pool: EnginePool, n: int) -> bytes:
    """One request with body ``{"n": n}``; the whole answer, the connection released."""
    exchange = await pool.send("/v1/chat/completions", b"", b'{"n": %d}' % n)
    body = await exchange.read_all(1 << 20)
    exchange.release()
    return body


async def _second_turn_closed(engine: RawEngine) -> tuple[str, int]:
    """A first turn answered, then a second on the kept-alive connection, which the engine ends:
    its ``EngineClosed`` message and how many requests the pool sent again."""
    upstream, pool = _upstream(engine)
    try:
        await _turn(pool, 1)
        with pytest.raises(EngineClosed) as caught:
            await _turn(pool, 2)
        return str(caught.value), pool.resent
    finally:
        await upstream.close()


def _echo(request: RawRequest) -> None:
    answer_json(request.sock, {"n": request.json["n"], "connection": request.connection})


def _first_answered_then(fail: Callable[[RawRequest], None]) -> Callable[[RawRequest], None]:
    """A script: every connection's first request answered, its second one ``fail``-ed."""

    def script(request: RawRequest) -> None:
        if request.nth == 0:
            _echo(request)
        else:
            fail(request)

    return script


def _wait_readable(pool: EnginePool) -> None:
    """Block the loop (on purpose) until the pool's idle connection's socket is readable: the
    engine's FIN is in, and the loop has not read it."""
    (exchange,) = pool._idle
    assert exchange._transport is not None
    poller = select.poll()
    poller.register(exchange._transport.get_extra_info("socket").fileno(), select.POLLIN)
    assert poller.poll(10_000), "the engine's close never arrived"


def test_an_idle_connection_found_closed_when_taken_is_dropped_and_the_request_goes_on_a_new_one(
    run: Runner[Any],
) -> None:
    async def scenario(engine: RawEngine) -> list[bytes]:
        upstream, pool = _upstream(engine)
        try:
            first = await _turn(pool, 1)
            assert engine.close_idle() == 1
            _wait_readable(pool)  # no await between this and the checkout in send
            second = await _turn(pool, 2)
            assert (pool.found_closed, pool.resent) == (1, 0)
            return [first, second]
        finally:
            await upstream.close()

    with RawEngine(_echo) as engine:
        answers = run(scenario(engine))
    assert answers == [b'{"n":1,"connection":0}', b'{"n":2,"connection":1}']
    # Never written on the closed connection.
    assert [(p.connection, p.nth) for p in engine.posts] == [(0, 0), (1, 0)]


@pytest.mark.parametrize("fail", [close, reset], ids=["end-of-stream", "reset"])
def test_a_request_on_a_kept_alive_connection_ended_before_any_byte_is_sent_again_once_on_a_new_one(
    run: Runner[Any], fail: Callable[[Any], None]
) -> None:
    async def scenario(engine: RawEngine) -> tuple[list[bytes], int]:
        upstream, pool = _upstream(engine)
        try:
            answers = [await _turn(pool, n) for n in (1, 2, 3)]
            return answers, pool.resent
        finally:
            await upstream.close()

    with RawEngine(_first_answered_then(lambda r: fail(r.sock))) as engine:
        answers, resent = run(scenario(engine))
    # 2 met the closing connection 0 and went again on 1; 3 met 1 closing likewise, went on 2.
    assert answers == [b'{"n":1,"connection":0}', b'{"n":2,"connection":1}', b'{"n":3,"connection":2}']
    assert resent == 2
    assert [(p.connection, p.nth, p.json["n"]) for p in engine.posts] == [
        (0, 0, 1),
        (0, 1, 2),
        (1, 0, 2),
        (1, 1, 3),
        (2, 0, 3),
    ]


def test_a_new_connection_closed_before_any_byte_is_an_error_and_never_sent_again(run: Runner[Any]) -> None:
    async def scenario(engine: RawEngine) -> tuple[str, int]:
        upstream, pool = _upstream(engine)
        try:
            with pytest.raises(EngineClosed) as caught:
                await _turn(pool, 1)
            return str(caught.value), pool.resent
        finally:
            await upstream.close()

    with RawEngine(lambda request: reset(request.sock)) as engine:
        message, resent = run(scenario(engine))
    assert "before answering" in message
    assert resent == 0
    assert len(engine.posts) == 1


@pytest.mark.parametrize(
    "sent",
    [b"HTTP/1.1 200 OK\r\n", b'HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{"partial'],
    ids=["part-of-the-head", "head-and-part-of-the-body"],
)
def test_a_reused_connection_that_fails_after_a_byte_of_the_answer_is_never_sent_again(
    run: Runner[Any], sent: bytes
) -> None:
    def fail(request: RawRequest) -> None:
        request.sock.sendall(sent)
        reset(request.sock)

    with RawEngine(_first_answered_then(fail)) as engine:
        message, resent = run(_second_turn_closed(engine))
    assert resent == 0
    assert [p.json["n"] for p in engine.posts] == [1, 2]
    assert ("mid-answer" if sent.endswith(b"partial") else "before answering") in message


def test_a_streamed_answer_cut_on_a_reused_connection_gives_its_chunks_then_the_error(
    run: Runner[Any],
) -> None:
    def fail(request: RawRequest) -> None:
        request.sock.sendall(
            b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n" + chunked(b"data: {}\n\n")
        )
        reset(request.sock)

    async def scenario(engine: RawEngine) -> tuple[bytes, str]:
        upstream, pool = _upstream(engine)
        try:
            await _turn(pool, 1)
            exchange = await pool.send("/v1/chat/completions", b"", b'{"n": 2}')
            assert exchange.status == 200
            received = b""
            with pytest.raises(EngineClosed) as caught:
                while data := await exchange.read():
                    received += data
            exchange.abort()
            return received, str(caught.value)
        finally:
            await upstream.close()

    with RawEngine(_first_answered_then(fail)) as engine:
        received, message = run(scenario(engine))
    assert received == b"data: {}\n\n"
    assert "mid-answer" in message
    assert len(engine.posts) == 2


def test_the_request_sent_again_is_sent_once_only(run: Runner[Any]) -> None:
    def script(request: RawRequest) -> None:
        if request.connection == 0 and request.nth == 0:
            _echo(request)
        else:
            close(request.sock)

    async def scenario(engine: RawEngine) -> int:
        upstream, pool = _upstream(engine)
        try:
            await _turn(pool, 1)
            with pytest.raises(EngineClosed, match="before answering"):
                await _turn(pool, 2)
            return pool.resent
        finally:
            await upstream.close()

    with RawEngine(script) as engine:
        resent = run(scenario(engine))
    assert resent == 1
    assert [(p.connection, p.json["n"]) for p in engine.posts] == [(0, 1), (0, 2), (1, 2)]


def test_a_request_sent_again_to_an_engine_no_longer_listening_is_a_connect_error(run: Runner[Any]) -> None:
    async def scenario(engine: RawEngine) -> int:
        upstream, pool = _upstream(engine)
        try:
            await _turn(pool, 1)
            engine.stop_listening()
            with pytest.raises(EngineConnectError, match="cannot connect"):
                await _turn(pool, 2)
            return pool.resent
        finally:
            await upstream.close()

    with RawEngine(_first_answered_then(lambda r: reset(r.sock))) as engine:
        resent = run(scenario(engine))
    assert resent == 1
    assert [p.json["n"] for p in engine.posts] == [1, 2]


def test_bytes_on_an_idle_connection_close_it_and_are_never_read_as_the_next_answer(run: Runner[Any]) -> None:
    stray = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"

    async def scenario(engine: RawEngine, let_loop_read: bool) -> tuple[bytes, int]:
        upstream, pool = _upstream(engine)
        try:
            await _turn(pool, 1)
            assert engine.send_to_idle(stray) == 1
            if let_loop_read:  # the loop reads the bytes: the connection closes at once
                async with asyncio.timeout(10):
                    while pool._idle:  # noqa: ASYNC110 - waits on the loop's own read
                        await asyncio.sleep(0.01)
            else:  # the loop has not read them: found at checkout
                _wait_readable(pool)
            return await _turn(pool, 2), pool.resent
        finally:
            await upstream.close()

    for let_loop_read in (True, False):
        with RawEngine(_echo) as engine:
            answer, resent = run(scenario(engine, let_loop_read))
        assert answer == b'{"n":2,"connection":1}'
        assert resent == 0
        assert [(p.connection, p.json["n"]) for p in engine.posts] == [(0, 1), (1, 2)]


def test_bytes_after_an_answer_in_the_same_read_are_not_its_body_and_the_connection_is_not_kept(
    run: Runner[Any],
) -> None:
    """An engine that writes a second message right after its answer, in the same write: the parser
    read it as a second response, its body ("AB") was appended to the answer and the connection went
    back to the pool mid-message, so the next turn on it failed."""

    def answer_then_stray(request: RawRequest) -> None:
        body = b'{"n":%d}' % request.json["n"]
        head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % len(body)
        request.sock.sendall(head + body + b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nAB")

    async def scenario(engine: RawEngine) -> tuple[bytes, bytes, int]:
        upstream, pool = _upstream(engine)
        try:
            first = await _turn(pool, 1)
            idle = len(pool._idle)
            return first, await _turn(pool, 2), idle
        finally:
            await upstream.close()

    with RawEngine(answer_then_stray) as engine:
        first, second, idle = run(scenario(engine))
    assert (first, second) == (b'{"n":1}', b'{"n":2}')
    assert idle == 0  # never pooled
    assert [(p.connection, p.json["n"]) for p in engine.posts] == [(0, 1), (1, 2)]


def test_idle_time_runs_from_the_answers_last_byte_not_from_the_release(run: Runner[Any]) -> None:
    async def scenario(engine: RawEngine) -> tuple[float, float]:
        upstream, pool = _upstream(engine)
        loop = asyncio.get_running_loop()
        try:
            exchange = await pool.send("/v1/chat/completions", b"", b'{"n": 1}')
            await exchange.read_all(1024)
            read_by = loop.time()
            await asyncio.sleep(0.05)  # a relay still writing to its client
            exchange.release()
            return exchange.idle_since, read_by
        finally:
            await upstream.close()

    with RawEngine(_echo) as engine:
        idle_since, read_by = run(scenario(engine))
    assert 0 < idle_since <= read_by


# -- a late close is never sent again (RESEND_WINDOW_S) --------------------------------------------------


def test_a_reused_connection_closed_unanswered_1_s_after_the_request_is_an_error_and_never_sent_again(
    run: Runner[Any],
) -> None:
    """An engine that crashed into a generation (or a load balancer closing a quiet connection):
    sent again, the whole generation would run twice."""

    def late_close(request: RawRequest) -> None:
        time.sleep(1.0)  # past RESEND_WINDOW_S after the request's write
        close(request.sock)

    assert RESEND_WINDOW_S < 1.0
    with RawEngine(_first_answered_then(late_close)) as engine:
        message, resent = run(_second_turn_closed(engine))
    assert "before answering" in message
    assert resent == 0
    assert [(p.connection, p.json["n"]) for p in engine.posts] == [(0, 1), (0, 2)]  # the 2 once


# -- an answer whole before its body's end (BODY_END_GRACE_S) ---------------------------------------------


def _whole_then_end_on(end_now: threading.Event) -> Callable[[RawRequest], None]:
    """A script: to the first request, a streamed answer through ``[DONE]``, then one more event
    and the body's end once ``end_now`` is set; every later request echoed."""

    def script(request: RawRequest) -> None:
        if request.connection or request.nth:
            _echo(request)
            return
        request.sock.sendall(STREAM_HEAD + chunked(b"data: {}\n\n") + chunked(b"data: [DONE]\n\n"))
        end_now.wait(30)
        request.sock.sendall(chunked(b"data: after the end\n\n") + b"0\r\n\r\n")

    return script


async def _answered_and_released(pool: EnginePool) -> EngineExchange:
    """A streamed answer read through ``[DONE]``, marked ``answered`` and released before its
    body's end."""
    exchange = await pool.send("/v1/chat/completions", b"", b'{"n": 1}')
    received = b""
    while not received.endswith(b"data: [DONE]\n\n"):
        received += await exchange.read()
    assert not exchange.complete
    exchange.answered = True
    exchange.release()
    return exchange


def test_an_answered_exchange_released_before_its_body_end_goes_back_to_the_pool_when_the_end_comes(
    run: Runner[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(upstream_connection, "BODY_END_GRACE_S", 30.0)  # the end comes when told here
    end_now = threading.Event()

    async def scenario(engine: RawEngine) -> bytes:
        upstream, pool = _upstream(engine)
        try:
            exchange = await _answered_and_released(pool)
            assert not pool._idle  # not before its end
            end_now.set()
            async with asyncio.timeout(10):
                while exchange not in pool._idle:  # noqa: ASYNC110 - waits on the loop's own read
                    await asyncio.sleep(0.01)
            return await _turn(pool, 2)  # on the same connection; the bytes after [DONE] dropped
        finally:
            end_now.set()
            await upstream.close()

    with RawEngine(_whole_then_end_on(end_now)) as engine:
        answer = run(scenario(engine))
    assert answer == b'{"n":2,"connection":0}'
    assert [(p.connection, p.nth) for p in engine.posts] == [(0, 0), (0, 1)]


def test_an_answered_exchange_whose_body_end_does_not_come_within_the_grace_is_reset(
    run: Runner[Any],
) -> None:
    end_now = threading.Event()

    async def scenario(engine: RawEngine) -> bytes:
        upstream, pool = _upstream(engine)
        try:
            exchange = await _answered_and_released(pool)
            async with asyncio.timeout(10):
                while exchange in pool.busy:  # noqa: ASYNC110 - waits on the grace's timer
                    await asyncio.sleep(0.01)
            assert not pool._idle and exchange._transport is None
            end_now.set()  # too late: the connection is gone
            return await _turn(pool, 2)
        finally:
            end_now.set()
            await upstream.close()

    with RawEngine(_whole_then_end_on(end_now)) as engine:
        answer = run(scenario(engine))
    assert answer == b'{"n":2,"connection":1}'


def test_an_exchange_released_before_its_body_end_unanswered_is_reset_at_once(run: Runner[Any]) -> None:
    end_now = threading.Event()

    async def scenario(engine: RawEngine) -> None:
        upstream, pool = _upstream(engine)
        try:
            exchange = await pool.send("/v1/chat/completions", b"", b'{"n": 1}')
            await exchange.read()
            exchange.release()  # answered not set: mid-answer
            assert exchange not in pool.busy and exchange._transport is None
        finally:
            end_now.set()
            await upstream.close()

    with RawEngine(_whole_then_end_on(end_now)) as engine:
        run(scenario(engine))


# -- the idle connections: capped, swept in one pass -------------------------------------------------------


def test_a_pool_keeps_at_most_max_idle_connections_and_the_sweep_drops_every_expired_one(
    run: Runner[Any],
) -> None:
    async def scenario(engine: RawEngine) -> tuple[int, int, int]:
        upstream = Upstream(30.0)
        pool = upstream.pool("raw", engine.url, lambda: [], max_idle=3)
        try:
            exchanges = await asyncio.gather(
                *(pool.send("/v1/chat/completions", b"", b'{"n": %d}' % n) for n in range(8))
            )
            for exchange in exchanges:
                await exchange.read_all(1 << 20)
                exchange.release()
            kept = len(pool._idle)
            # the most recently released are kept: the older ones are nearer the engine's idle close
            assert list(pool._idle) == exchanges[-3:]
            assert upstream.pool("raw", engine.url, lambda: [], max_idle=5) is pool and pool.max_idle == 5
            pool.sweep(asyncio.get_running_loop().time() + KEEPALIVE_S)
            return kept, len(pool._idle), len(pool.busy)
        finally:
            await upstream.close()

    with RawEngine(_echo) as engine:
        kept, after_sweep, busy = run(scenario(engine))
    assert engine.connections == 8
    assert (kept, after_sweep, busy) == (3, 0, 0)
