"""Ending runs at the dataplane in bulk, all at once and bounded (``DataplaneClient.end_runs``).

The runtime's server journals its runs, so a run its shutdown interrupts resumes on the next start
and is deliberately not ended at the dataplane (tested in ``test_runtime_durability.py``). A
registry without a journal cannot resume what it stops; the server ends such runs with
``end_runs``, which must neither send them one at a time nor wait on a dead dataplane.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from aiohttp import web
from mcp.types import CallToolResult, TextContent

from luftpause.runtime.dataplane import DataplaneClient
from luftpause.testkit.launch.procs import free_port
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

RUNS = 3


@pytest.fixture()
def slow_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A stack whose engines decode at 50 ms per token, so a run stays mid-flight for seconds."""
    stack = Stack.start(tmp_path_factory.mktemp("shutdown"), decode_ms=50, env={"LUFTPAUSE_TOKEN": ""})
    try:
        yield stack
    finally:
        stack.stop()


def _scheduler_status(stack: Stack) -> dict[str, Any]:
    with urllib.request.urlopen(stack.status_url, timeout=10) as response:
        status: dict[str, Any] = json.loads(response.read())
        return status


def _wait_for(stack: Stack, holds: Any, what: str, seconds: float = 20.0) -> dict[str, Any]:
    """Poll the scheduler's status until ``holds(status)``; fail naming ``what`` after ``seconds``."""
    deadline = time.monotonic() + seconds
    while True:
        status = _scheduler_status(stack)
        if holds(status):
            return status
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}; last status: {status}\n{stack.logs()}")
        time.sleep(0.05)


def _text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


class StallingDataplane:
    """A dataplane double that takes ``DELETE /v1/runs/{handle}`` and answers none of them until
    ``release_after`` have arrived (``None``: never, until the test releases it)."""

    def __init__(self, release_after: int | None) -> None:
        self.release_after = release_after
        self.received: list[str] = []
        self.release = asyncio.Event()
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _delete(self, request: web.Request) -> web.Response:
        self.received.append(request.match_info["handle"])
        if self.release_after is not None and len(self.received) >= self.release_after:
            self.release.set()
        await self.release.wait()
        return web.Response(status=204)

    async def __aenter__(self) -> StallingDataplane:
        app = web.Application()
        app.router.add_delete("/v1/runs/{handle}", self._delete)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.release.set()  # a stalled handler would otherwise hold the cleanup up
        assert self._runner is not None
        await self._runner.cleanup()


HANDLES = [f"run-{i:016x}" for i in range(120)]
"""More than httpx's default pool of 100 connections: a cap there would leave the last ones
waiting behind the held first ones for ever."""


def test_end_runs_sends_every_delete_at_once() -> None:
    # Nothing is answered until all 120 have arrived: one at a time, or behind a pool cap, the
    # first would wait for ever.
    async def scenario() -> tuple[int, list[str]]:
        async with (
            StallingDataplane(release_after=len(HANDLES)) as dataplane,
            DataplaneClient(dataplane.url) as client,
        ):
            ended = await asyncio.wait_for(client.end_runs(HANDLES, seconds=30), 60)
            return ended, dataplane.received

    ended, received = asyncio.run(scenario())
    assert ended == len(HANDLES)
    assert sorted(received) == HANDLES


def test_end_runs_gives_up_on_a_dataplane_that_never_answers() -> None:
    async def scenario() -> tuple[int, list[str], int]:
        async with (
            StallingDataplane(release_after=None) as dataplane,
            DataplaneClient(dataplane.url) as client,
        ):
            # The outer wait_for only keeps a broken end_runs from hanging the test run.
            ended = await asyncio.wait_for(client.end_runs(HANDLES, seconds=0.5), 60)
            names = [getattr(task.get_coro(), "__qualname__", "") for task in asyncio.all_tasks()]
            open_tasks = names.count("DataplaneClient.end_run")
            return ended, dataplane.received, open_tasks

    ended, received, open_tasks = asyncio.run(scenario())
    assert ended == 0
    # none was answered; how many arrived within the 0.5 s depends on the machine's load (all 120
    # arriving is the test above's point), so only that nothing else did
    assert set(received) <= set(HANDLES)
    assert open_tasks == 0  # the unanswered requests were cancelled, not left to run on


def test_end_runs_counts_only_what_the_dataplane_acknowledged() -> None:
    async def scenario() -> tuple[int, int]:
        async with DataplaneClient(f"http://127.0.0.1:{free_port()}") as unreachable:
            return await unreachable.end_runs(HANDLES[:3]), await unreachable.end_runs([])

    assert asyncio.run(scenario()) == (0, 0)
