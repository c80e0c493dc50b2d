"""Restarts: the dataplane rides out a scheduler restart, and a restarted dataplane cleans up."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from luftpause.testkit.launch.stack import Stack

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
            deadline = time.monotonic() + 30
            noticed = False
            while not noticed and time.monotonic() < deadline:
                async with session.get(f"{stack.dataplane_url}/health") as health:
                    noticed = (await health.json())["scheduler"] != "connected"
                if not noticed:
                    await asyncio.sleep(0.05)
            assert noticed, f"the dataplane never noticed the scheduler's death\n{stack.logs()}"
            held = asyncio.ensure_future(session.post(url, json=BODY, headers=headers))
            await asyncio.sleep(1.5)  # at least one Admit retry happens while nothing listens
            assert not held.done()
            await asyncio.to_thread(stack.restart, "scheduler")
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


def _inflight(status: dict[str, Any]) -> int:
    return sum(r["inflight"] for r in status["replicas"])


def _idle(status: dict[str, Any]) -> bool:
    return _inflight(status) == 0 and status["held"]["count"] == 0 and status["runs"]["generating"] == 0


@pytest.fixture
def slow_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    running = Stack.start(tmp_path_factory.mktemp("slow-restart"), decode_ms=25.0)
    try:
        yield running
    finally:
        running.stop()


def test_turns_that_end_while_the_scheduler_is_away_are_not_left_in_flight(slow_stack: Stack) -> None:
    streams = slow_stack.stream_clients(6, max_tokens=80)  # about 2 s each
    try:
        busy = slow_stack.wait_status(lambda s: _inflight(s) == 6)
        assert _inflight(busy) == 6, "the streams never all started"
        slow_stack.children["scheduler"].kill()
        # Every stream ends while nothing listens (a fixed sleep let a slow stream end after the
        # restart, where its end is reported the ordinary way and the case is not tested).
        assert [stream.wait(60) for stream in streams] == [0] * 6
        slow_stack.restart("scheduler")
        status = slow_stack.wait_status(_idle)
        assert _idle(status), status
    finally:
        for stream in streams:
            stream.kill()
            stream.wait()


def test_a_restarted_dataplane_releases_what_its_crashed_predecessor_held(slow_stack: Stack) -> None:
    streams = slow_stack.stream_clients(4, max_tokens=400)  # about 10 s each, cut short by the crash
    try:
        busy = slow_stack.wait_status(lambda s: _inflight(s) == 4)
        assert _inflight(busy) == 4, "the streams never all started"
        slow_stack.children["dataplane"].kill()
        for stream in streams:
            stream.wait(60)
        slow_stack.restart("dataplane")
        status = slow_stack.wait_status(_idle)
        assert _idle(status), status
    finally:
        for stream in streams:
            stream.kill()
            stream.wait()


LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look a word up.",
        "parameters": {"type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]},
    },
}


def _served_by(stack: Stack, completion_id: str) -> int:
    """Index of the engine that answered ``completion_id``."""
    for index, url in enumerate(stack.engine_urls):
        try:
            with urllib.request.urlopen(f"{url}/testkit/sent/{completion_id}", timeout=10):
                return index
        except urllib.error.HTTPError:
            continue
    raise AssertionError(f"no engine answered {completion_id}")


def _complete(stack: Stack, run_id: str, messages: list[Any]) -> dict[str, Any]:
    request = urllib.request.Request(
        f"{stack.dataplane_url}/v1/chat/completions",
        data=orjson.dumps(
            {"model": stack.model, "messages": messages, "tools": [LOOKUP_TOOL], "max_tokens": 40}
        ),
        headers={"content-type": "application/json", "x-luftpause-run-id": run_id},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        result: dict[str, Any] = orjson.loads(response.read())
        return result


def test_a_run_paused_on_a_tool_keeps_its_replica_across_a_scheduler_restart(slow_stack: Stack) -> None:
    # Keep the first replica busy so the run's first turn lands on the second one.
    busy = slow_stack.stream_clients(1, max_tokens=400, run_prefix="occupier")
    try:
        occupied = slow_stack.wait_status(lambda s: _inflight(s) == 1)
        assert _inflight(occupied) == 1, f"the occupier never started\n{slow_stack.logs()}"
        messages: list[Any] = [{"role": "user", "content": "What is a lighthouse?"}]
        first = _complete(slow_stack, "run-paused", messages)
        assert first["choices"][0]["finish_reason"] == "tool_calls"
        replica = _served_by(slow_stack, first["id"])
    finally:
        for client in busy:
            client.kill()
            client.wait()
    assert replica == 1, "the occupied first replica should have sent the turn to the second"
    paused = slow_stack.wait_status(lambda s: _idle(s) and s["runs"]["tool_paused"] == 1)
    assert paused["runs"]["tool_paused"] == 1, paused

    slow_stack.children["scheduler"].kill()
    slow_stack.restart("scheduler")
    assert slow_stack.status()["runs"]["tool_paused"] == 1  # learnt from the dataplane's Resync

    # The tool round's result comes back: the run must go to its replica, although the first one
    # is now idle too and would win a tie for a run without affinity.
    call = first["choices"][0]["message"]["tool_calls"][0]
    messages += [
        first["choices"][0]["message"],
        {"role": "tool", "tool_call_id": call["id"], "content": "A tower with a light."},
    ]
    second = _complete(slow_stack, "run-paused", messages)
    assert _served_by(slow_stack, second["id"]) == replica
    fresh = _complete(slow_stack, "run-fresh", [{"role": "user", "content": "Hello"}])
    assert _served_by(slow_stack, fresh["id"]) == 0  # the control: no affinity, the tie goes first
