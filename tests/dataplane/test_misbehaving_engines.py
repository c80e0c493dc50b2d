"""The dataplane against engines that misbehave in ways the simulator does not: a firehose engine
whose client never reads, content encodings, an engine that goes silent.

The engine here is a small aiohttp server in a thread of the test process (one route; what it does
is chosen by the request's ``model``); the scheduler and the dataplane are real processes. A body
that ends cleanly before its answer did (a tool call's first delta, then the end) is the relay
machine's rule, tested without sockets in ``test_relay_machine``.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
from aiohttp import web

from luftpause.testkit.launch.procs import ChildProcess, free_port

pytestmark = pytest.mark.integration

EVENT = b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 4000}}]}) + b"\n\n"
MODELS = ("firehose", "silent", "silent-mid-stream")
READ_TIMEOUT_S = 2.0
"""The dataplane's engine read timeout here (LUFTPAUSE_ENGINE_READ_TIMEOUT_S); 600 s by default."""
RSS_BOUND_BYTES = 300 * 1024 * 1024
FIREHOSE_BYTES = 1024**3


class ScriptedEngine:
    """An OpenAI-like engine in a thread; ``sent`` counts the bytes the firehose has written."""

    def __init__(self) -> None:
        self.port = free_port()
        self.sent = 0
        self._loop = asyncio.new_event_loop()
        self._runner: web.AppRunner | None = None
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    def start(self) -> ScriptedEngine:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(app), self._loop).result(10)
        return self

    async def _serve(self, app: web.Application) -> None:
        self._released = asyncio.Event()
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    async def _release(self) -> None:
        self._released.set()

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._release(), self._loop).result(10)
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        model = (await request.json())["model"]
        if model == "firehose":
            return await self._firehose(request)
        if model == "silent":  # never answers at all (until the test ends)
            await self._released.wait()
            return web.Response()
        if model == "silent-mid-stream":  # one event, then nothing
            response = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await response.prepare(request)
            await response.write(EVENT)
            await self._released.wait()
            return response
        raise web.HTTPNotFound

    async def _firehose(self, request: web.Request) -> web.StreamResponse:
        """4 KB events as fast as the connection takes them, up to ``FIREHOSE_BYTES``."""
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        while self.sent < FIREHOSE_BYTES:
            await response.write(EVENT)
            self.sent += len(EVENT)
        return response


@pytest.fixture(scope="module")
def engine() -> Iterator[ScriptedEngine]:
    running = ScriptedEngine().start()
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def dataplane(tmp_path_factory: pytest.TempPathFactory, engine: ScriptedEngine) -> Iterator[ChildProcess]:
    workdir: Path = tmp_path_factory.mktemp("engine-faults")
    grpc_port, http_port, dp_port = free_port(), free_port(), free_port()
    replicas = "".join(
        f"""
[[replicas]]
name = "{model}"
url = "http://127.0.0.1:{engine.port}"
models = ["{model}"]
health_path = ""
"""
        for model in MODELS
    )
    config = workdir / "luftpause.toml"
    config.write_text(
        f"""
[scheduler]
grpc = "127.0.0.1:{grpc_port}"
http = "127.0.0.1:{http_port}"

[dataplane]
listen = "127.0.0.1:{dp_port}"
scheduler = "127.0.0.1:{grpc_port}"
{replicas}"""
    )
    scheduler = ChildProcess(
        "scheduler",
        ["scheduler", "--config", str(config)],
        workdir / "scheduler.log",
        ready_url=f"http://127.0.0.1:{http_port}/health",
    )
    dp = ChildProcess(
        "dataplane",
        ["dataplane", "--config", str(config)],
        workdir / "dataplane.log",
        env={"LUFTPAUSE_ENGINE_READ_TIMEOUT_S": str(READ_TIMEOUT_S)},
        ready_url=f"http://127.0.0.1:{dp_port}/health",
    )
    dp.port = dp_port  # type: ignore[attr-defined]
    try:
        scheduler.start().wait_ready()
        dp.start().wait_ready()
        yield dp
    finally:
        dp.stop()
        scheduler.stop()


def _rss(pid: int) -> int:
    """VmRSS of ``pid`` in bytes (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass
    return 0


def test_a_client_that_never_reads_does_not_make_the_dataplane_buffer(
    dataplane: ChildProcess, engine: ScriptedEngine
) -> None:
    payload = orjson.dumps(
        {"model": "firehose", "messages": [{"role": "user", "content": "go"}], "stream": True}
    )
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n\r\n" % len(payload) + payload
    )
    engine.sent = 0
    with socket.create_connection(("127.0.0.1", dataplane.port), timeout=10) as client:  # type: ignore[attr-defined]
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        client.sendall(request)  # and never read a byte of the answer
        # Until the engine has sent its gigabyte (no backpressure), or stops being able to send
        # (the dataplane stopped reading it): its count still for a whole second.
        deadline = time.monotonic() + 60
        last = -1
        while engine.sent < FIREHOSE_BYTES and time.monotonic() < deadline:
            time.sleep(1.0)
            if engine.sent == last:
                break
            last = engine.sent
        rss = max(_rss(pid) for pid in dataplane.group_pids())
    assert engine.sent > 0  # the turn reached the engine
    assert rss < RSS_BOUND_BYTES, (
        f"dataplane RSS {rss / 2**20:.0f} MiB after the engine sent {engine.sent} bytes"
    )


def _exchange(port: int, model: str, stream: bool) -> bytes:
    """One request on a raw socket, read until the server closes (or 30 s pass)."""
    payload = orjson.dumps(
        {"model": model, "messages": [{"role": "user", "content": "hi"}], "stream": stream}
    )
    request = (
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Connection: close\r\nContent-Length: %d\r\n\r\n" % len(payload) + payload
    )
    answer = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as client:
        client.sendall(request)
        try:
            while chunk := client.recv(65536):
                answer += chunk
        except ConnectionResetError:
            pass
    return answer


def test_an_engine_that_never_answers_is_answered_502_after_the_read_timeout(dataplane: ChildProcess) -> None:
    answer = _exchange(dataplane.port, "silent", stream=False)  # type: ignore[attr-defined]
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 502")
    assert orjson.loads(body)["error"]["message"].startswith("engine silent: ")


def test_an_engine_silent_mid_stream_breaks_the_clients_stream_after_the_read_timeout(
    dataplane: ChildProcess,
) -> None:
    answer = _exchange(dataplane.port, "silent-mid-stream", stream=True)  # type: ignore[attr-defined]
    head, _, chunked = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    assert chunked.count(b"data: ") == 1
    assert not chunked.endswith(b"0\r\n\r\n")  # closed without the last chunk: broken
