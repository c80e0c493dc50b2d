"""The dataplane rides out a scheduler restart: turns sent meanwhile are held, then admitted."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
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
