"""The engine simulator's idle close (``idle_close_ms``, ``testkit/engine/idle_close.py``) as a client
on a raw kept-alive connection sees it: a ``POST`` on a connection idle that long is dropped and
the connection reset, with no byte of answer; sooner it is answered; a ``GET`` always is."""

from __future__ import annotations

import argparse
import asyncio
import math
from collections.abc import Awaitable, Callable

import orjson
import pytest

from luftpause.testkit.commands.fake_engine import add_arguments, settings_from_args
from luftpause.testkit.engine import EngineSettings, RunningEngine

pytestmark = pytest.mark.anyio

Factory = Callable[..., Awaitable[RunningEngine]]
MODEL = "llama-3.2-1b"
BODY = orjson.dumps({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})


def _post(host: str) -> bytes:
    return (
        b"POST /v1/chat/completions HTTP/1.1\r\nhost: %s\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (host.encode(), len(BODY), BODY)
    )


async def _answer(reader: asyncio.StreamReader) -> tuple[bytes, bytes]:
    """One answer's head and body (by its Content-Length)."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    return head, await reader.readexactly(length)


async def _after_idle(engine: RunningEngine, idle_s: float, second: bytes) -> bytes:
    """A ``POST`` answered whole, ``idle_s`` seconds of idle, then ``second`` on the same
    connection; the head of its answer, or what came before the connection ended (``b""``: none)."""
    reader, writer = await asyncio.open_connection(engine.host, engine.port)
    try:
        writer.write(_post(f"{engine.host}:{engine.port}"))
        head, _ = await _answer(reader)
        assert head.startswith(b"HTTP/1.1 200")
        await asyncio.sleep(idle_s)
        writer.write(second)
        try:
            async with asyncio.timeout(10):
                return (await _answer(reader))[0]
        except asyncio.IncompleteReadError as exc:
            return exc.partial
        except ConnectionResetError:
            return b""
    finally:
        writer.close()


async def test_a_post_on_a_connection_idle_past_the_bound_is_dropped_unanswered(make_engine: Factory) -> None:
    engine = await make_engine(idle_close_ms=50.0, prefill_ms_per_1k=0.0, decode_ms=0.0)
    received = await _after_idle(engine, 0.3, _post("x"))
    assert received == b""
    assert engine.stats.idle_closed == 1
    assert engine.stats.requests == 1  # the dropped one never reached the route


async def test_a_post_within_the_bound_is_answered_on_the_same_connection(make_engine: Factory) -> None:
    engine = await make_engine(idle_close_ms=60_000.0, prefill_ms_per_1k=0.0, decode_ms=0.0)
    received = await _after_idle(engine, 0.05, _post("x"))
    assert received.startswith(b"HTTP/1.1 200")
    assert engine.stats.idle_closed == 0
    assert engine.stats.requests == 2


async def test_a_probe_is_answered_whatever_the_idle_time(make_engine: Factory) -> None:
    engine = await make_engine(idle_close_ms=50.0, prefill_ms_per_1k=0.0, decode_ms=0.0)
    received = await _after_idle(engine, 0.3, b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n")
    assert received.startswith(b"HTTP/1.1 200")
    assert engine.stats.idle_closed == 0


@pytest.mark.parametrize("value", [0.0, -1.0, math.nan, math.inf])
def test_a_bound_that_is_not_a_positive_number_is_refused(value: float) -> None:
    with pytest.raises(ValueError, match="idle_close_ms must be a positive number"):
        EngineSettings(idle_close_ms=value)


def test_the_flag_sets_the_bound() -> None:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    settings = settings_from_args(parser.parse_args(["--idle-close-ms", "250"]))
    assert settings.idle_close_ms == 250.0
    assert settings_from_args(parser.parse_args([])).idle_close_ms is None
