"""The engine simulator's faults, each observed as a client sees it (see ``testkit/engine/faults.py``)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import openai
import pytest

from luftpause.testkit.engine import EngineSettings, RunningEngine
from luftpause.testkit.engine.faults import (
    CloseConnection,
    DieMidStream,
    FaultSpecError,
    Slow,
    Stall,
    StatusFault,
    parse_fault_option,
)
from luftpause.testkit.launch.procs import ChildProcess, free_port

pytestmark = pytest.mark.anyio

MODEL = "llama-3.2-1b"
MESSAGES: list[Any] = [{"role": "user", "content": "hello there"}]

Factory = Callable[..., Awaitable[RunningEngine]]


@pytest.fixture
def make_engine(make_engine: Factory) -> Factory:
    """conftest's factory with an instant engine (no prefill, no decode time) unless told."""

    def make(**settings: Any) -> Awaitable[RunningEngine]:
        return make_engine(**{"prefill_ms_per_1k": 0.0, "decode_ms": 0.0, **settings})

    return make


@pytest.fixture
async def engine(make_engine: Factory) -> RunningEngine:
    return await make_engine()


def body(fault: Any = None, stream: bool = False, max_tokens: int = 8) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": MODEL,
        "messages": MESSAGES,
        "stream": stream,
        "max_tokens": max_tokens,
    }
    if fault is not None:
        request["luftpause_fault"] = fault
    return request


def completions(engine: RunningEngine) -> str:
    return engine.url + "/v1/chat/completions"


async def eventually(check: Callable[[], bool], what: str) -> None:
    """Wait until ``check()`` holds (10 s at most, polled every 10 ms)."""
    for _ in range(1000):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never happened: {what}")


async def read_until_broken(resp: aiohttp.ClientResponse) -> tuple[bytes, aiohttp.ClientPayloadError | None]:
    """Every byte of the body that arrives, and the error that ended it (``None`` for a clean end).

    An engine that neither ends nor breaks the body fails the test after 10 s instead of hanging it.
    """
    received = bytearray()
    try:
        async with asyncio.timeout(10):
            async for data in resp.content.iter_any():
                received += data
    except aiohttp.ClientPayloadError as exc:
        return bytes(received), exc
    return bytes(received), None


def sse_payloads(data: bytes) -> list[Any]:
    """The ``data:`` payloads of complete events (``"[DONE]"`` kept as a string)."""
    events = data.decode().split("\n\n")
    assert events[-1] == "", "the bytes must end with a complete event"
    payloads: list[Any] = []
    for event in events[:-1]:
        assert event.startswith("data: "), event
        payload = event.removeprefix("data: ")
        payloads.append(payload if payload == "[DONE]" else json.loads(payload))
    return payloads


def assert_idle(engine: RunningEngine) -> None:
    assert (engine.stats.running, engine.stats.waiting) == (0, 0)


# --- status --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "status", "error_type", "retry_after"),
    [
        ({"kind": "status", "status": 429, "retry_after": 3}, 429, "RateLimitError", "3"),
        ({"kind": "status", "status": 500}, 500, "InternalServerError", None),
        ({"kind": "status", "status": 503, "retry_after": 0}, 503, "ServiceUnavailableError", "0"),
        ({"kind": "status"}, 503, "ServiceUnavailableError", None),
    ],
)
async def test_status_fault_answers_the_status_error_body_and_retry_after(
    engine: RunningEngine, fault: dict[str, Any], status: int, error_type: str, retry_after: str | None
) -> None:
    async with aiohttp.ClientSession() as session:
        for stream in (False, True):
            async with session.post(completions(engine), json=body(fault, stream)) as resp:
                assert resp.status == status
                assert resp.headers["Content-Type"].startswith("application/json")
                assert resp.headers.get("Retry-After") == retry_after
                error = (await resp.json())["error"]
            assert error["type"] == error_type
            assert error["code"] == status
            assert isinstance(error["message"], str) and error["message"]
    assert engine.stats.faults == {"status": 2}
    assert engine.stats.completed == 0
    assert engine.stats.max_running_seen == 0, "a refusal must not take a slot"


async def test_status_fault_carries_the_message_type_and_code_asked_for(engine: RunningEngine) -> None:
    fault = {"kind": "status", "status": 429, "message": "slow down", "type": "rate_limit", "code": "rl"}
    async with openai.AsyncOpenAI(
        base_url=engine.url + "/v1", api_key="x", max_retries=0, timeout=10
    ) as client:
        with pytest.raises(openai.RateLimitError) as raised:
            await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, extra_body={"luftpause_fault": fault}
            )
    assert raised.value.status_code == 429
    assert raised.value.body == {"message": "slow down", "type": "rate_limit", "param": None, "code": "rl"}


async def test_status_fault_is_answered_while_every_slot_is_busy(make_engine: Factory) -> None:
    engine = await make_engine(slots=1, decode_ms=1.0)
    endless = body(stream=True, max_tokens=10**7)
    async with aiohttp.ClientSession() as session:
        hog = await session.post(completions(engine), json=endless)
        try:
            await hog.content.readuntil(b"\n\n")
            assert engine.stats.running == 1
            # Queued behind the endless stream it would never be answered: the guard turns that
            # into a failure instead of a hung test.
            async with asyncio.timeout(10):
                async with session.post(
                    completions(engine), json=body({"kind": "status", "status": 429})
                ) as resp:
                    assert resp.status == 429
            assert engine.stats.max_waiting_seen == 0
        finally:
            hog.close()
    await eventually(lambda: engine.stats.running == 0, "the endless stream's slot is freed")


# --- die_mid_stream ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "chunks"),
    [
        ({"kind": "die_mid_stream"}, 2),
        ({"kind": "die_mid_stream", "after_chunks": 5}, 5),
        ({"kind": "die_mid_stream", "after_chunks": 0}, 0),
    ],
)
async def test_die_mid_stream_sends_some_chunks_then_breaks_the_connection(
    engine: RunningEngine, fault: dict[str, Any], chunks: int
) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(completions(engine), json=body(fault, stream=True, max_tokens=20)) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"] == "text/event-stream"
        received, error = await read_until_broken(resp)
    assert error is not None, "the client must see a broken connection, not a clean end"
    events = sse_payloads(received)
    assert len(events) == chunks
    assert "[DONE]" not in events
    assert all(e["choices"][0]["finish_reason"] is None for e in events)
    assert engine.stats.faults == {"die_mid_stream": 1}
    assert engine.stats.completed == 0
    await eventually(lambda: engine.stats.running == 0, "the cut stream's slot is freed")


async def test_die_mid_stream_after_more_chunks_than_the_answer_has_still_sends_no_done(
    engine: RunningEngine,
) -> None:
    fault = {"kind": "die_mid_stream", "after_chunks": 1000}
    async with (
        aiohttp.ClientSession() as session,
        session.post(completions(engine), json=body(fault, stream=True, max_tokens=3)) as resp,
    ):
        received, error = await read_until_broken(resp)
    assert error is not None
    events = sse_payloads(received)
    assert "[DONE]" not in events
    assert len(events) == 1 + 3 + 1  # role chunk, three tokens, the finish chunk
    assert engine.stats.completed == 0


async def test_die_mid_stream_without_streaming_sends_headers_and_no_body(engine: RunningEngine) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(completions(engine), json=body({"kind": "die_mid_stream"})) as resp,
    ):
        assert resp.status == 200
        assert resp.content_length is not None and resp.content_length > 0
        received, error = await read_until_broken(resp)
    assert error is not None
    assert received == b""
    assert engine.stats.faults == {"die_mid_stream": 1}
    assert engine.stats.completed == 0
    assert_idle(engine)


async def test_die_mid_stream_is_a_connection_error_to_the_openai_client(engine: RunningEngine) -> None:
    async with openai.AsyncOpenAI(
        base_url=engine.url + "/v1", api_key="x", max_retries=0, timeout=10
    ) as client:
        stream = await client.chat.completions.create(
            model=MODEL,
            messages=MESSAGES,
            stream=True,
            extra_body={"luftpause_fault": {"kind": "die_mid_stream"}},
        )
        seen: list[Any] = []
        with pytest.raises(openai.APIConnectionError):
            async for chunk in stream:
                seen.append(chunk)
    assert len(seen) == 2


# --- stall ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_stall_sends_nothing_and_a_client_that_leaves_frees_the_slot(
    make_engine: Factory, stream: bool
) -> None:
    engine = await make_engine(slots=1)
    async with aiohttp.ClientSession() as session:
        # post() returns when the status line and headers arrive: the timeout fires because
        # not even they come while the engine stalls.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await session.post(completions(engine), json=body({"kind": "stall", "seconds": 600}, stream))
        await eventually(lambda: engine.stats.disconnected == 1, "the engine sees the client leave")
    assert engine.stats.max_running_seen == 1, "a stalled request holds its slot"
    assert engine.stats.faults == {"stall": 1}
    assert engine.stats.completed == 0
    assert_idle(engine)


@pytest.mark.parametrize("stream", [True, False])
async def test_stall_then_answers_normally(engine: RunningEngine, stream: bool) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(completions(engine), json=body({"kind": "stall", "seconds": 0.05}, stream)) as resp,
    ):
        assert resp.status == 200
        received, error = await read_until_broken(resp)
    assert error is None
    if stream:
        assert sse_payloads(received)[-1] == "[DONE]"
    else:
        assert json.loads(received)["usage"]["completion_tokens"] == 8
    assert engine.stats.faults == {"stall": 1}
    assert engine.stats.completed == 1


# --- slow ----------------------------------------------------------------------------------------


async def test_slow_holds_back_the_next_chunk(engine: RunningEngine) -> None:
    fault = {"kind": "slow", "delay_ms": 600_000}
    async with (
        aiohttp.ClientSession() as session,
        session.post(completions(engine), json=body(fault, stream=True)) as resp,
    ):
        assert resp.status == 200
        first = await resp.content.readuntil(b"\n\n")
        assert sse_payloads(first)[0]["choices"][0]["delta"]["role"] == "assistant"
        # With decode_ms 0 every token is due at once; only the delay keeps the second chunk back.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.5):
                await resp.content.readuntil(b"\n\n")
    await eventually(lambda: engine.stats.disconnected == 1, "the engine sees the client leave")
    assert engine.stats.faults == {"slow": 1}
    assert_idle(engine)


@pytest.mark.parametrize("stream", [True, False])
async def test_slow_answer_arrives_whole_and_as_recorded(engine: RunningEngine, stream: bool) -> None:
    fault = {"kind": "slow", "delay_ms": 1}
    async with (
        aiohttp.ClientSession() as session,
        session.post(completions(engine), json=body(fault, stream, max_tokens=100)) as resp,
    ):
        assert resp.status == 200
        received, error = await read_until_broken(resp)
    assert error is None
    if stream:
        events = sse_payloads(received)
        assert events[-1] == "[DONE]"
        assert len(events) == 1 + 100 + 1 + 1
        completion_id = events[0]["id"]
    else:
        answer = json.loads(received)
        assert answer["usage"]["completion_tokens"] == 100
        completion_id = answer["id"]
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"{engine.url}/testkit/sent/{completion_id}") as r,
    ):
        assert await r.read() == received
    assert engine.stats.faults == {"slow": 1}
    assert engine.stats.completed == 1


# --- close ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("stream", [True, False])
async def test_close_gives_a_server_disconnected_error(engine: RunningEngine, stream: bool) -> None:
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            async with session.post(completions(engine), json=body({"kind": "close"}, stream)):
                pass
    assert engine.stats.faults == {"close": 1}
    assert engine.stats.max_running_seen == 0
    assert engine.stats.completed == 0


# --- bad fault specifications --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "param"),
    [
        ("stall", "luftpause_fault"),
        ([{"kind": "stall"}], "luftpause_fault"),
        ({}, "luftpause_fault.kind"),
        ({"kind": "explode"}, "luftpause_fault.kind"),
        ({"kind": 3}, "luftpause_fault.kind"),
        ({"kind": "slow", "delay": 5}, "luftpause_fault.delay"),
        ({"kind": "close", "seconds": 1}, "luftpause_fault.seconds"),
        ({"kind": "status", "status": 200}, "luftpause_fault.status"),
        ({"kind": "status", "status": 600}, "luftpause_fault.status"),
        ({"kind": "status", "status": "429"}, "luftpause_fault.status"),
        ({"kind": "status", "status": True}, "luftpause_fault.status"),
        ({"kind": "status", "retry_after": -1}, "luftpause_fault.retry_after"),
        ({"kind": "status", "retry_after": 1.5}, "luftpause_fault.retry_after"),
        ({"kind": "status", "message": 5}, "luftpause_fault.message"),
        ({"kind": "status", "code": False}, "luftpause_fault.code"),
        ({"kind": "die_mid_stream", "after_chunks": -1}, "luftpause_fault.after_chunks"),
        ({"kind": "die_mid_stream", "after_chunks": 2.0}, "luftpause_fault.after_chunks"),
        ({"kind": "stall", "seconds": -1}, "luftpause_fault.seconds"),
        ({"kind": "stall", "seconds": "1"}, "luftpause_fault.seconds"),
        ({"kind": "slow", "delay_ms": True}, "luftpause_fault.delay_ms"),
    ],
)
async def test_bad_fault_spec_is_400_naming_the_field(engine: RunningEngine, fault: Any, param: str) -> None:
    async with (
        aiohttp.ClientSession() as session,
        session.post(completions(engine), json=body(fault)) as resp,
    ):
        assert resp.status == 400
        error = (await resp.json())["error"]
    assert error["param"] == param
    assert param in error["message"]
    assert error["type"] == "BadRequestError"
    assert engine.stats.requests == 0
    assert engine.stats.faults == {}


async def test_no_fault_field_or_null_answers_normally(engine: RunningEngine) -> None:
    async with aiohttp.ClientSession() as session:
        for request in (body(), {**body(), "luftpause_fault": None}):
            async with session.post(completions(engine), json=request) as resp:
                assert resp.status == 200
                assert (await resp.json())["object"] == "chat.completion"
    assert engine.stats.completed == 2
    assert engine.stats.faults == {}


# --- configured faults ---------------------------------------------------------------------------


async def statuses(engine: RunningEngine, count: int) -> list[int]:
    async with aiohttp.ClientSession() as session:
        seen = []
        for _ in range(count):
            async with session.post(completions(engine), json=body()) as resp:
                await resp.read()
                seen.append(resp.status)
    return seen


async def test_configured_fault_hits_some_requests_repeatably_by_seed(make_engine: Factory) -> None:
    settings = {"fault": StatusFault(status=503, retry_after=1), "fault_rate": 0.5, "seed": 7}
    first = await statuses(await make_engine(**settings), 30)
    again = await statuses(await make_engine(**settings), 30)
    other_seed = await statuses(await make_engine(**{**settings, "seed": 8}), 30)
    assert set(first) == {200, 503}, "a rate of 0.5 must fault some requests but not all"
    assert again == first
    assert other_seed != first


@pytest.mark.parametrize(("rate", "expected"), [(0.0, {200}), (1.0, {503})])
async def test_configured_fault_rate_bounds(make_engine: Factory, rate: float, expected: set[int]) -> None:
    engine = await make_engine(fault=StatusFault(status=503), fault_rate=rate)
    assert set(await statuses(engine, 10)) == expected
    assert engine.stats.faults["status"] == (10 if rate else 0)


async def test_a_request_s_own_fault_wins_over_the_configured_one(make_engine: Factory) -> None:
    engine = await make_engine(fault=StatusFault(status=503))
    async with (
        aiohttp.ClientSession() as session,
        session.post(completions(engine), json=body({"kind": "slow", "delay_ms": 0})) as resp,
    ):
        assert resp.status == 200
        await resp.read()
    assert engine.stats.faults == {"slow": 1}


def test_fault_rate_out_of_range_is_refused() -> None:
    for rate in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="fault_rate"):
            EngineSettings(fault=CloseConnection(), fault_rate=rate)


def test_fault_option_takes_a_kind_or_the_json_shape() -> None:
    assert parse_fault_option("stall") == Stall()
    assert parse_fault_option("die_mid_stream") == DieMidStream(after_chunks=2)
    assert parse_fault_option('{"kind": "status", "status": 429, "retry_after": 1}') == StatusFault(
        status=429, retry_after=1
    )
    assert parse_fault_option('{"kind": "slow", "delay_ms": 5}') == Slow(delay_ms=5.0)
    for bad in ("boom", "{not json", '{"kind": "stall", "seconds": -2}'):
        with pytest.raises(FaultSpecError, match="--fault"):
            parse_fault_option(bad)


# --- a real process ------------------------------------------------------------------------------


def test_real_process_injects_faults_by_flag_and_by_field(tmp_path: Path) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    fault = '{"kind": "status", "status": 503, "retry_after": 2}'
    child = ChildProcess(
        "fake-engine",
        ["fake-engine", "--port", str(port), "--decode-ms", "0", "--fault", fault, "--fault-rate", "0.5"],
        log_path=tmp_path / "engine.log",
        ready_url=url + "/health",
    )
    child.start()
    try:
        child.wait_ready()
        with openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=10) as client:
            outcomes = []
            for _ in range(20):
                try:
                    client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
                    outcomes.append(200)
                except openai.InternalServerError as exc:
                    assert exc.response.headers["Retry-After"] == "2"
                    outcomes.append(exc.status_code)
            assert set(outcomes) == {200, 503}
            # The request's own fault wins over the flag; the cut stream and the closed
            # connection must not make the engine log an error.
            stream = client.chat.completions.create(
                model=MODEL,
                messages=MESSAGES,
                stream=True,
                extra_body={"luftpause_fault": {"kind": "die_mid_stream", "after_chunks": 1}},
            )
            with pytest.raises(openai.APIConnectionError):
                for _ in stream:
                    pass
            with pytest.raises(openai.APIConnectionError):
                client.chat.completions.create(
                    model=MODEL, messages=MESSAGES, extra_body={"luftpause_fault": {"kind": "close"}}
                )
    finally:
        child.stop()
    assert child.poll() == 0
    assert child.log_tail().strip() == f"luftpause fake-engine: serving {MODEL} on {url}"


async def test_error_mid_stream_sends_chunks_then_an_error_event_and_done(engine: RunningEngine) -> None:
    fault = {"kind": "error_mid_stream", "after_chunks": 2, "message": "out of KV cache"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            engine.url + "/v1/chat/completions",
            json={
                "model": MODEL,
                "messages": [{"role": "user", "content": "hi"}],
                "stream": True,
                "luftpause_fault": fault,
            },
        ) as response,
    ):
        assert response.status == 200
        events = [e for e in (await response.read()).split(b"\n\n") if e]
    assert len(events) == 4
    assert json.loads(events[2].removeprefix(b"data: "))["error"]["message"] == "out of KV cache"
    assert events[3] == b"data: [DONE]"
    assert engine.stats.faults["error_mid_stream"] == 1
