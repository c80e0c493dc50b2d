"""The dataplane against engines that misbehave in ways the simulator does not: a firehose engine
whose client never reads, content encodings, an engine that goes silent.

The engine here is a small aiohttp server in a thread of the test process (one route; what it does
is chosen by the request's ``model``); the scheduler and the dataplane are real processes.
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

from luftpause.testkit.procs import ChildProcess, free_port

pytestmark = pytest.mark.integration

EVENT = b"data: " + orjson.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 4000}}]}) + b"\n\n"
MODELS = ("firehose",)
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
        self._runner = web.AppRunner(app, handle_signals=False)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()

    def stop(self) -> None:
        if self._runner is not None:
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        model = (await request.json())["model"]
        if model == "firehose":
            return await self._firehose(request)
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
