"""Two caller keys on a full replica, one narrowing its turns into twelve callers, get equal shares
(issue 17), with real processes (scheduler, dataplane, simulated engines) and the ``openai`` client.

``team-a``'s holder sends each of its twelve turns under its own ``x-luftpause-caller``
(``team-a/job-0`` ... ``team-a/job-11``), ``team-b``'s its twelve under its key alone. The one
replica is full with another key's streams first, so all 24 are held; then the test frees one slot
at a time (closing the oldest open stream: the dataplane stops that engine request and frees its
slot) and waits for the one turn that slot goes to. Ranked as callers of their own, ``team-a``'s
twelve sub-callers would each have 0 in flight and come first every time (their runs started
first), ``team-b`` getting nothing until they were all placed; as sub-callers of one root they
take turns with ``team-b``: a, b, a, b, ... and the scheduler's ``/status`` shows the replica's
four slots two and two by root.

Turns are streams of 20,000 tokens at 20 ms each (about 400 s) that the test does not read: none
ends but by the test closing it.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import openai
import pytest
from caller_keys_helpers import keyed_stack, keys_file

from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

TOKEN = "shared-token-of-the-share-stack"
KEYS = {
    "team-a": "team-a-share-key-0123456789",
    "team-b": "team-b-share-key-0123456789",
    "filler": "filler-share-key-0123456789",
}
SLOTS = 4
TURNS_EACH = 12
WAIT_S = 60.0


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    keys = keys_file(*({"caller": caller, "key": key} for caller, key in KEYS.items()))
    with keyed_stack(
        tmp_path_factory.mktemp("shares"), keys, token=TOKEN, max_inflight=SLOTS, decode_ms=20.0
    ) as running:
        _remove_replica(running, "sim-1")  # one replica: its slots are the pool's
        status = running.wait_status(lambda s: [r["name"] for r in s["replicas"]] == ["sim-0"])
        assert [r["name"] for r in status["replicas"]] == ["sim-0"], status["replicas"]
        yield running


def _remove_replica(stack: Stack, name: str) -> None:
    admin = stack.status_url.removesuffix("/status") + f"/admin/replicas/{name}"
    request = urllib.request.Request(admin, method="DELETE", headers=stack.auth_headers)
    with urllib.request.urlopen(request, timeout=10) as response:
        assert response.status in (200, 202)  # 202: it leaves once its leases are back


async def _until(check: Callable[[], Awaitable[bool]], what: str, stack: Stack) -> None:
    """Poll ``check()`` every 50 ms until it holds; fail naming ``what`` after :data:`WAIT_S` (a
    bound for a broken stack on a loaded machine, never a measurement)."""
    deadline = time.monotonic() + WAIT_S
    while True:
        if await check():
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {WAIT_S:g} s\n{stack.logs()}")
        await asyncio.sleep(0.05)


async def _held(stack: Stack) -> int:
    """Turns held at the scheduler now (its ``/status``, read off the event loop)."""
    status = await asyncio.to_thread(stack.status)
    count: int = status["held"]["count"]
    return count


def test_a_key_narrowing_into_many_callers_gets_the_share_of_one(stack: Stack) -> None:
    async def go() -> tuple[list[str], dict[str, Any]]:
        clients = {
            caller: openai.AsyncOpenAI(base_url=f"{stack.dataplane_url}/v1", api_key=key, max_retries=0)
            for caller, key in KEYS.items()
        }
        tag = uuid.uuid4().hex[:6]
        open_streams: list[tuple[str, Any]] = []  # (root, stream) in placement order
        placed: list[str] = []  # the root of each turn placed from the held ones, in order

        async def turn(root: str, index: int, header: str | None, held: bool) -> None:
            headers = {"x-luftpause-run-id": f"{root}-{tag}-{index}"}
            if header is not None:
                headers["x-luftpause-caller"] = header
            stream = await clients[root].chat.completions.create(
                model=stack.model,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=20_000,
                stream=True,
                extra_headers=headers,
            )  # answered once the turn is placed: the engine's headers come at once
            open_streams.append((root, stream))
            if held:
                placed.append(root)

        tasks = [asyncio.create_task(turn("filler", i, None, held=False)) for i in range(SLOTS)]

        async def count_open(n: int) -> bool:
            return len(open_streams) == n

        async def count_placed(n: int) -> bool:
            return len(placed) == n

        async def count_held(n: int) -> bool:
            return await _held(stack) == n

        await _until(lambda: count_open(SLOTS), "the replica filling up", stack)
        # team-a's turns first, each its own narrowed caller (its runs start first: ranked by
        # caller alone they would win every tie), then team-b's under its key alone
        tasks += [asyncio.create_task(turn("team-a", i, f"job-{i}", held=True)) for i in range(TURNS_EACH)]
        await _until(lambda: count_held(TURNS_EACH), "team-a's turns held", stack)
        tasks += [asyncio.create_task(turn("team-b", i, None, held=True)) for i in range(TURNS_EACH)]
        await _until(lambda: count_held(2 * TURNS_EACH), "team-b's turns held", stack)
        try:
            for step in range(2 * TURNS_EACH - SLOTS):  # while both keys have turns held
                _, oldest = open_streams.pop(0)
                await oldest.close()  # its engine request stops, its slot frees: one turn goes there
                await _until(lambda n=step + 1: count_placed(n), f"placement {step + 1}", stack)  # type: ignore[misc]
            status = await asyncio.to_thread(stack.status)
        finally:
            for _, stream in open_streams:
                await stream.close()
            for task in tasks:
                task.cancel()  # the turns still held: their clients leave
            await asyncio.gather(*tasks, return_exceptions=True)
            for client in clients.values():
                await client.close()
        return placed, status

    placed, status = asyncio.run(go())
    assert placed == ["team-a", "team-b"] * ((2 * TURNS_EACH - SLOTS) // 2), placed
    assert status["inflight_by_root"] == {"team-a": SLOTS // 2, "team-b": SLOTS // 2}, status
    by_caller = status["inflight_by_caller"]
    assert by_caller.get("team-b") == SLOTS // 2, by_caller  # its two, and team-a's two sub-callers'
    assert sorted(n for c, n in by_caller.items() if c.startswith("team-a/job-")) == [1] * (SLOTS // 2)
