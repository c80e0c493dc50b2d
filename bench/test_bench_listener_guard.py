"""Micro-benchmark of what the listener guard (:class:`luftpause.serving.listeners.ListenerGuard`) adds to
each request, against the same application called bare, in the same run.

Run: ``.venv/bin/pytest bench/test_bench_listener_guard.py --benchmark-only``. Each round serves
1,000 requests to an ASGI application that reads its body (one message, as granian delivers a
small body) and answers with a head and three body chunks, in one event loop: ``bare`` calls the
application, ``guarded`` the guard around it. The cases: a POST with a body (the guard arms and
disarms the body deadline and watches the first ``receive``) and a GET without one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

import pytest

from luftpause.config import ListenerLimits
from luftpause.serving.listeners import ListenerGuard

REQUESTS = 1_000
Message = MutableMapping[str, Any]


async def app(scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Message]], send: Any) -> None:
    if scope["method"] == "POST":
        await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    for _ in range(3):
        await send({"type": "http.response.body", "body": b"data: {}\n\n", "more_body": True})


def _scope(method: str) -> dict[str, Any]:
    headers = [(b"host", b"127.0.0.1"), (b"content-type", b"application/json")]
    if method == "POST":
        headers.append((b"content-length", b"2"))
    return {"type": "http", "method": method, "path": "/v1/chat/completions", "headers": headers}


def _serve(target: Any, method: str, loop: asyncio.AbstractEventLoop) -> Callable[[], None]:

    async def receive() -> Message:
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message: Message) -> None:
        return None

    async def many() -> None:
        for _ in range(REQUESTS):
            await target(_scope(method), receive, send)

    def run() -> None:
        loop.run_until_complete(many())

    return run


@pytest.mark.parametrize("method", ["POST", "GET"])
@pytest.mark.parametrize("arrangement", ["bare", "guarded"])
def test_guard_cost_per_request(benchmark: Any, arrangement: str, method: str) -> None:
    benchmark.group = f"listener guard, {REQUESTS} {method} requests"
    target = app if arrangement == "bare" else ListenerGuard(app, ListenerLimits(), "bench")
    loop = asyncio.new_event_loop()
    try:
        benchmark(_serve(target, method, loop))
    finally:
        loop.close()
