"""The dataplane's failure contract (docs/architecture.md "Failure contract") with real processes and
a fault-injecting engine.

The simulator misbehaves on request through the ``luftpause_fault`` body field, which the dataplane
forwards untouched. Every case also checks that the turn's slot is free afterwards.
"""

from __future__ import annotations

import asyncio
import io
import socket
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from luftpause.testkit.launch.procs import free_port
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

MODEL = "llama-3.2-1b"
DEAD_MODEL = "served-by-a-dead-replica"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    dead_port = free_port()  # nothing listens here
    extra = f"""
[[replicas]]
name = "dead"
url = "http://127.0.0.1:{dead_port}"
models = ["{DEAD_MODEL}"]
health_path = ""  # not health-checked: the scheduler's probes would take it out of rotation
"""
    running = Stack.start(tmp_path_factory.mktemp("faults"), decode_ms=5.0, extra_config=extra)
    try:
        yield running
    finally:
        running.stop()


def body(fault: dict[str, Any] | None = None, *, stream: bool = False, model: str = MODEL) -> dict[str, Any]:
    request: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "stream": stream,
        "max_tokens": 20,
    }
    if fault is not None:
        request["luftpause_fault"] = fault
    return request


def status(stack: Stack) -> dict[str, Any]:
    async def get() -> dict[str, Any]:
        async with aiohttp.ClientSession() as session, session.get(stack.status_url) as response:
            result: dict[str, Any] = orjson.loads(await response.read())
            return result

    return asyncio.run(get())


def settled(stack: Stack, failed_before: int, expect_failed: int = 1) -> dict[str, Any]:
    """/status once the failure has been reported and no turn is in flight (30 s at most: generous
    for a loaded machine, polled every 0.05 s)."""
    deadline = time.monotonic() + 30
    current = status(stack)
    while time.monotonic() < deadline:
        if (
            current["counters"]["failed"] - failed_before >= expect_failed
            and sum(r["inflight"] for r in current["replicas"]) == 0
        ):
            break
        time.sleep(0.05)
        current = status(stack)
    return current


async def post(
    stack: Stack, payload: dict[str, Any] | bytes, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    data = io.BytesIO(payload if isinstance(payload, bytes) else orjson.dumps(payload))
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{stack.dataplane_url}/v1/chat/completions",
            data=data,
            headers={"content-type": "application/json", **(headers or {})},
            timeout=aiohttp.ClientTimeout(total=30),
        ) as response,
    ):
        return response.status, dict(response.headers), await response.read()


def test_an_unreachable_engine_is_answered_502_naming_the_replica(stack: Stack) -> None:
    before = status(stack)["counters"]["failed"]
    code, headers, answer = asyncio.run(post(stack, body(model=DEAD_MODEL)))
    assert code == 502
    message = orjson.loads(answer)["error"]["message"]
    assert message.startswith("engine dead: ")
    assert headers["x-luftpause-run-id"].startswith("run-")
    assert settled(stack, before)["counters"]["failed"] == before + 1


@pytest.mark.parametrize(
    ("fault", "retry_after"),
    [
        ({"kind": "status", "status": 429, "retry_after": 7}, "7"),
        ({"kind": "status", "status": 503, "retry_after": 2}, "2"),
        ({"kind": "status", "status": 500}, None),
    ],
)
def test_an_engine_refusal_reaches_the_client_unchanged(
    stack: Stack, fault: dict[str, Any], retry_after: str | None
) -> None:
    before = status(stack)["counters"]["failed"]
    code, headers, answer = asyncio.run(post(stack, body(fault)))
    assert code == fault["status"]
    assert headers.get("Retry-After") == retry_after
    error = orjson.loads(answer)["error"]
    assert error["code"] == fault["status"]  # the engine's own body, not one of ours
    assert headers["x-luftpause-run-id"].startswith("run-")
    assert settled(stack, before)["counters"]["failed"] == before + 1


def test_an_engine_dying_mid_stream_gives_the_chunks_so_far_then_a_broken_stream(stack: Stack) -> None:
    before = status(stack)["counters"]["failed"]

    async def scenario() -> tuple[bytes, BaseException | None]:
        received = b""
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{stack.dataplane_url}/v1/chat/completions",
                json=body({"kind": "die_mid_stream", "after_chunks": 3}, stream=True),
                timeout=aiohttp.ClientTimeout(total=20),
            ) as response,
        ):
            assert response.status == 200
            try:
                async for part in response.content.iter_any():
                    received += part
            except aiohttp.ClientPayloadError as exc:
                return received, exc
        return received, None

    received, broken = asyncio.run(scenario())
    # The client's library says the stream broke: it never sees a clean end of a cut answer.
    assert isinstance(broken, aiohttp.ClientPayloadError)
    events = [e for e in received.split(b"\n\n") if e]
    assert len(events) == 3
    assert b"[DONE]" not in received
    assert settled(stack, before)["counters"]["failed"] == before + 1


def test_an_engine_dying_mid_stream_closes_the_connection_without_the_last_chunk(stack: Stack) -> None:
    """On the wire: the chunks so far, then the connection closes without ``0\\r\\n\\r\\n``."""
    before = status(stack)["counters"]["failed"]
    port = int(stack.dataplane_url.rsplit(":", 1)[1])
    payload = orjson.dumps(body({"kind": "die_mid_stream", "after_chunks": 3}, stream=True))
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(payload) + payload
    )
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(request)
        try:
            while chunk := sock.recv(65536):  # until the server closes (a keep-alive would time out)
                answer += chunk
        except ConnectionResetError:
            pass
    head, _, chunked = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert b"transfer-encoding: chunked" in head.lower()
    assert chunked.count(b"data: ") == 3
    assert not chunked.endswith(b"0\r\n\r\n")
    assert b"[DONE]" not in chunked
    assert settled(stack, before)["counters"]["failed"] == before + 1


def test_an_error_event_inside_a_stream_is_relayed_and_counts_the_turn_failed(stack: Stack) -> None:
    before = status(stack)["counters"]

    async def scenario() -> bytes:
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{stack.dataplane_url}/v1/chat/completions",
                json=body(
                    {"kind": "error_mid_stream", "after_chunks": 2, "message": "out of KV"}, stream=True
                ),
            ) as response,
        ):
            assert response.status == 200
            return await response.read()

    received = asyncio.run(scenario())
    assert b'"message": "out of KV"' in received or b'"message":"out of KV"' in received
    after = settled(stack, before["failed"])
    assert after["counters"]["failed"] == before["failed"] + 1
    assert after["counters"]["finished"] == before["finished"]


def test_an_engine_closing_without_an_answer_is_answered_502(stack: Stack) -> None:
    before = status(stack)["counters"]["failed"]
    code, _, answer = asyncio.run(post(stack, body({"kind": "close"})))
    assert code == 502
    assert orjson.loads(answer)["error"]["message"].startswith("engine sim-")
    # no byte of an answer came: the turn went to the other replica once (docs/failover.md), whose
    # engine, given the same fault, closed too
    assert settled(stack, before)["counters"]["failed"] == before + 2


def test_a_client_leaving_while_the_engine_stalls_closes_the_engine_request(stack: Stack) -> None:
    before = status(stack)["counters"]["failed"]

    async def running_at_engines(session: aiohttp.ClientSession) -> float:
        total = 0.0
        for url in stack.engine_urls:
            async with session.get(f"{url}/metrics") as response:
                for line in (await response.text()).splitlines():
                    if line.startswith("sglang:num_running_reqs{"):
                        total += float(line.rsplit(" ", 1)[1])
        return total

    async def scenario() -> tuple[float, float]:
        async with aiohttp.ClientSession() as session:
            request = asyncio.ensure_future(post(stack, body({"kind": "stall", "seconds": 30})))
            deadline = time.monotonic() + 30
            while await running_at_engines(session) < 1 and time.monotonic() < deadline:  # noqa: ASYNC110 - polls another process
                await asyncio.sleep(0.05)
            during = await running_at_engines(session)
            request.cancel()
            deadline = time.monotonic() + 30
            while await running_at_engines(session) > 0 and time.monotonic() < deadline:  # noqa: ASYNC110 - polls another process
                await asyncio.sleep(0.05)
            return during, await running_at_engines(session)

    during, after = asyncio.run(scenario())
    assert during == 1
    assert after == 0  # the engine saw its request closed, long before the 30 s stall ended
    assert settled(stack, before)["counters"]["failed"] == before + 1


def _raw_exchange(stack: Stack, head: bytes, body_parts: Iterator[bytes]) -> tuple[bytes, bytes]:
    """Send ``head`` then the parts until the server stops reading; its answer's head and body."""
    port = int(stack.dataplane_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(head)
        try:
            for part in body_parts:
                sock.sendall(part)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the server answered and closed before the whole body was sent: expected
        answer = b""
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    answer_head, _, answer_body = answer.partition(b"\r\n\r\n")
    return answer_head, answer_body


def test_a_declared_body_over_32_mib_is_refused_413_before_it_is_read(stack: Stack) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % (33 * 1024 * 1024)
    )
    answer_head, answer_body = _raw_exchange(stack, head, iter(()))  # not one byte of the body
    assert answer_head.startswith(b"HTTP/1.1 413")
    assert "limit" in orjson.loads(answer_body)["error"]["message"]


def test_a_chunked_body_growing_past_32_mib_is_refused_413(stack: Stack) -> None:
    head = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    piece = b"x" * (1024 * 1024)
    parts = (b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(40))
    answer_head, answer_body = _raw_exchange(stack, head, parts)
    assert answer_head.startswith(b"HTTP/1.1 413")
    assert "limit" in orjson.loads(answer_body)["error"]["message"]


def test_a_body_of_a_few_mib_is_accepted(stack: Stack) -> None:
    request = body()
    request["messages"].append({"role": "user", "content": "x" * (4 * 1024 * 1024)})
    code, _, _ = asyncio.run(post(stack, request))
    assert code == 200


@pytest.mark.parametrize(
    ("raw_header", "message_part"),
    [
        (b"x-luftpause-run-id: " + b"r" * 300, "longer than 256 bytes"),
        (b"x-luftpause-class: \xffbatch", "must be ASCII"),
        (b"x-luftpause-run-id: run-\xff", "must be ASCII"),
        ("x-luftpause-caller: équipe-ü".encode(), "percent-encode other characters"),
    ],
)
def test_bad_luftpause_headers_are_refused_400(stack: Stack, raw_header: bytes, message_part: str) -> None:
    port = int(stack.dataplane_url.rsplit(":", 1)[1])
    payload = orjson.dumps(body())
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + raw_header
        + b"\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(payload)
        + payload
    )
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, content = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert message_part in orjson.loads(content)["error"]["message"]


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/v1/models", "GET, HEAD"),
        ("POST", "/health", "GET, HEAD"),
        ("GET", "/v1/runs/abc", "DELETE"),
    ],
)
def test_a_wrong_method_is_answered_405_with_allow(stack: Stack, method: str, path: str, allow: str) -> None:
    async def call() -> tuple[int, dict[str, str], bytes]:
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, f"{stack.dataplane_url}{path}") as response,
        ):
            return response.status, dict(response.headers), await response.read()

    code, headers, answer = asyncio.run(call())
    assert code == 405
    assert headers["Allow"] == allow
    assert method in orjson.loads(answer)["error"]["message"]


@pytest.mark.parametrize(
    ("method", "path", "payload", "status_code"),
    [
        ("POST", "/v1/chat/completions", b"{not json", 400),
        ("GET", "/v1/chat/completions", None, 405),
        ("POST", "/v1/chat/completions", b'{"model": "nope", "messages": []}', 404),
    ],
)
def test_an_error_answer_echoes_the_clients_run_id(
    stack: Stack, method: str, path: str, payload: bytes | None, status_code: int
) -> None:
    async def call() -> tuple[int, dict[str, str]]:
        async with (
            aiohttp.ClientSession() as session,
            session.request(
                method,
                f"{stack.dataplane_url}{path}",
                data=payload,
                headers={"x-luftpause-run-id": "run-mine"},
            ) as response,
        ):
            await response.read()
            return response.status, dict(response.headers)

    code, headers = asyncio.run(call())
    assert code == status_code
    assert headers["x-luftpause-run-id"] == "run-mine"
