"""Restarts: the dataplane rides out a scheduler restart, and a restarted dataplane cleans up."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from luftpause.testkit.procs import ChildProcess
from luftpause.testkit.stack import Stack

pytestmark = pytest.mark.integration

BODY = {"model": "llama-3.2-1b", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.fixture
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack.start(tmp_path_factory.mktemp("restart"))
    try:
        yield running
    finally:
        running.stop()


def test_a_turn_sent_while_the_scheduler_is_down_is_admitted_after_it_returns(stack: Stack) -> None:
    url = f"{stack.dataplane_url}/v1/chat/completions"
    scheduler = stack.children["scheduler"]

    async def scenario() -> tuple[int, dict[str, Any]]:
        async with aiohttp.ClientSession() as session:
            headers = {"x-luftpause-run-id": "run-survivor"}
            async with session.post(url, json=BODY, headers=headers) as first:
                assert first.status == 200
            scheduler.kill()
            # Wait until the dataplane has noticed, so the next turn is held here, not in flight.
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                async with session.get(f"{stack.dataplane_url}/health") as health:
                    if (await health.json())["scheduler"] != "connected":
                        break
                await asyncio.sleep(0.05)
            held = asyncio.ensure_future(session.post(url, json=BODY, headers=headers))
            await asyncio.sleep(1.5)  # at least one Admit retry happens while nothing listens
            assert not held.done()
            restarted = ChildProcess(
                "scheduler", scheduler.argv[3:], scheduler.log_path, ready_url=scheduler.ready_url
            )
            stack.children["scheduler"] = restarted.start()
            await asyncio.to_thread(restarted.wait_ready)
            answer = await asyncio.wait_for(held, 30)
            status = answer.status
            answer.release()
            async with session.get(stack.status_url) as response:
                after: dict[str, Any] = orjson.loads(await response.read())
            return status, after

    status, after = asyncio.run(scenario())
    assert status == 200
    # The new scheduler learnt the run from the dataplane's resync and admitted the held turn.
    assert after["counters"]["admitted"] == 1
    assert after["runs"]["idle"] + after["runs"]["generating"] + after["runs"]["tool_paused"] >= 1


def _status(stack: Stack) -> dict[str, Any]:
    with urllib.request.urlopen(stack.status_url, timeout=10) as response:
        result: dict[str, Any] = orjson.loads(response.read())
        return result


def _settles(stack: Stack, check: Callable[[dict[str, Any]], bool], timeout: float = 15.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    status = _status(stack)
    while not check(status) and time.monotonic() < deadline:
        time.sleep(0.1)
        status = _status(stack)
    return status


def _idle(status: dict[str, Any]) -> bool:
    return (
        sum(r["inflight"] for r in status["replicas"]) == 0
        and status["held"]["count"] == 0
        and status["runs"]["generating"] == 0
    )


def _restart(stack: Stack, name: str) -> None:
    """Start ``name`` again, then wait until the dataplane has resynced with the scheduler."""
    old = stack.children[name]
    again = ChildProcess(name, old.argv[3:], old.log_path, ready_url=old.ready_url)
    stack.children[name] = again.start()
    again.wait_ready()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with urllib.request.urlopen(f"{stack.dataplane_url}/health", timeout=10) as response:
            if orjson.loads(response.read())["scheduler"] == "connected":
                return
        time.sleep(0.05)
    raise AssertionError("the dataplane did not resync with the scheduler")


@pytest.fixture
def slow_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack.start(tmp_path_factory.mktemp("slow-restart"), decode_ms=25.0)
    try:
        yield running
    finally:
        running.stop()


_STREAM_CLIENT = """
import sys, urllib.request
request = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), method="POST",
    headers={"content-type": "application/json", "x-luftpause-run-id": sys.argv[3]})
try:
    with urllib.request.urlopen(request, timeout=60) as response:
        while response.read(4096):
            pass
except OSError:
    sys.exit(1)
"""


def _streams(stack: Stack, count: int, tokens: int) -> list[subprocess.Popen[bytes]]:
    """``count`` streaming turns, each read to its end by its own process (it outlives kills)."""
    body = orjson.dumps({**BODY, "stream": True, "max_tokens": tokens}).decode()
    url = f"{stack.dataplane_url}/v1/chat/completions"
    return [
        subprocess.Popen(
            [sys.executable, "-c", _STREAM_CLIENT, url, body, f"stream-{i}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(count)
    ]


def test_turns_that_end_while_the_scheduler_is_away_are_not_left_in_flight(slow_stack: Stack) -> None:
    streams = _streams(slow_stack, 6, 80)  # about 2 s each
    busy = _settles(slow_stack, lambda s: sum(r["inflight"] for r in s["replicas"]) == 6)
    assert sum(r["inflight"] for r in busy["replicas"]) == 6, "the streams never all started"
    slow_stack.children["scheduler"].kill()
    time.sleep(3)  # every stream ends while nothing listens
    _restart(slow_stack, "scheduler")
    assert all(stream.wait(60) == 0 for stream in streams)
    status = _settles(slow_stack, _idle)
    assert _idle(status), status


def test_a_restarted_dataplane_releases_what_its_crashed_predecessor_held(slow_stack: Stack) -> None:
    streams = _streams(slow_stack, 4, 400)  # about 10 s each, cut short by the crash
    busy = _settles(slow_stack, lambda s: sum(r["inflight"] for r in s["replicas"]) == 4)
    assert sum(r["inflight"] for r in busy["replicas"]) == 4, "the streams never all started"
    slow_stack.children["dataplane"].kill()
    for stream in streams:
        stream.wait(60)
    _restart(slow_stack, "dataplane")
    status = _settles(slow_stack, _idle)
    assert _idle(status), status
