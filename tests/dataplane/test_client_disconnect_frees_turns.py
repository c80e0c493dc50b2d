"""A client that leaves: a held turn leaves the queue at once, a streaming turn frees its slot.

A stack with one slot per replica (``max_inflight = 1``) and a slow engine, so turns are held.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

BODY = {"model": "llama-3.2-1b", "messages": [{"role": "user", "content": "hi"}], "stream": True}


@pytest.fixture(scope="module")
def slow_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # 20 ms per token: a stream of 1,000 tokens lasts about 20 s unless its client leaves.
    running = Stack.start(tmp_path_factory.mktemp("slow"), max_inflight=1, decode_ms=20.0)
    try:
        yield running
    finally:
        running.stop()


async def _status(session: aiohttp.ClientSession, stack: Stack) -> dict[str, Any]:
    async with session.get(stack.status_url) as response:
        result: dict[str, Any] = orjson.loads(await response.read())
        return result


async def _until(
    session: aiohttp.ClientSession, stack: Stack, check: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Poll /status until ``check`` holds (30 s at most, for a loaded machine); the last status."""
    deadline = time.monotonic() + 30
    status = await _status(session, stack)
    while not check(status) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
        status = await _status(session, stack)
    return status


def test_a_held_turn_leaves_the_queue_when_its_client_leaves(slow_stack: Stack) -> None:
    url = f"{slow_stack.dataplane_url}/v1/chat/completions"

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with aiohttp.ClientSession() as session:
            before = await _status(session, slow_stack)
            # Fill both replicas' single slot with long streams, then queue one more turn. The
            # streams must outlast the held turn's whole round (it would be placed and admitted
            # when a slot freed): 20 s, closed by the test, not 4 s as a loaded machine may need.
            streams = [
                await session.post(
                    url, json={**BODY, "max_tokens": 1000}, headers={"x-luftpause-run-id": f"busy-{i}"}
                )
                for i in range(2)
            ]
            for stream in streams:
                await stream.content.readline()  # the engine has started: the slot is taken
            held = asyncio.ensure_future(session.post(url, json=BODY, headers={"x-luftpause-run-id": "held"}))
            seen_held = await _until(session, slow_stack, lambda s: s["held"]["count"] == 1)
            held.cancel()
            with pytest.raises(asyncio.CancelledError):
                await held
            after = await _until(session, slow_stack, lambda s: s["held"]["count"] == 0)
            for stream in streams:
                stream.close()
            return seen_held, {**after, "before": before}

    seen_held, after = asyncio.run(scenario())
    assert seen_held["held"]["count"] == 1
    assert after["held"]["count"] == 0
    assert after["counters"]["abandoned"] - after["before"]["counters"]["abandoned"] == 1
    # The abandoned turn never reached an engine: only the two busy turns were admitted.
    assert after["counters"]["admitted"] - after["before"]["counters"]["admitted"] == 2


def test_a_client_leaving_mid_stream_frees_the_slot_at_once(slow_stack: Stack) -> None:
    url = f"{slow_stack.dataplane_url}/v1/chat/completions"

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], float]:
        async with aiohttp.ClientSession() as session:
            before = await _until(
                session, slow_stack, lambda s: sum(r["inflight"] for r in s["replicas"]) == 0
            )
            stream = await session.post(url, json={**BODY, "max_tokens": 500})
            await stream.content.readline()
            # A run the dataplane made up is placed under a lease: the scheduler counts it in
            # flight when the dataplane's report arrives, which may be after the first chunk.
            during = await _until(
                session, slow_stack, lambda s: sum(r["inflight"] for r in s["replicas"]) == 1
            )
            stream.close()
            left = time.monotonic()
            after = await _until(
                session,
                slow_stack,
                lambda s: (
                    s["counters"]["failed"] > before["counters"]["failed"]
                    and sum(r["inflight"] for r in s["replicas"]) == 0
                ),
            )
            return during, {**after, "before": before}, time.monotonic() - left

    during, after, _ = asyncio.run(scenario())
    assert sum(r["inflight"] for r in during["replicas"]) == 1
    assert sum(r["inflight"] for r in after["replicas"]) == 0
    assert after["counters"]["failed"] - after["before"]["counters"]["failed"] == 1
    assert after["counters"]["finished"] == after["before"]["counters"]["finished"]


def test_turns_beyond_capacity_are_held_then_all_placed_and_answered(slow_stack: Stack) -> None:
    url = f"{slow_stack.dataplane_url}/v1/chat/completions"

    async def scenario() -> tuple[list[int], int, dict[str, Any], dict[str, Any]]:
        async with aiohttp.ClientSession() as session:
            before = await _status(session, slow_stack)

            async def turn(i: int) -> int:
                body = {**BODY, "stream": False, "max_tokens": 25}  # about 0.5 s each
                async with session.post(url, json=body, headers={"x-luftpause-run-id": f"wave-{i}"}) as r:
                    await r.read()
                    return r.status

            turns = asyncio.gather(*(turn(i) for i in range(6)))
            most_held = 0
            while not turns.done():
                status = await _status(session, slow_stack)
                most_held = max(most_held, status["held"]["count"])
                assert all(r["inflight"] <= r["capacity"] for r in status["replicas"])
                await asyncio.sleep(0.02)
            return await turns, most_held, before, await _status(session, slow_stack)

    codes, most_held, before, after = asyncio.run(scenario())
    assert codes == [200] * 6
    assert most_held >= 1  # two slots in all, six turns: some had to wait
    assert after["counters"]["admitted"] - before["counters"]["admitted"] == 6
