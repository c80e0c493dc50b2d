"""Sub-agents ride out transient failures of the dataplane (issue 25, item 3): a 429, 502 or 503,
or a dataplane that cannot be reached, is retried with capped, jittered exponential backoff
(tenacity) within ``[runtime] turn_retry_seconds``; past it the run fails with the last error.

The real runtime process over the scripted engine on loopback (:mod:`pods_helpers`), with the
waits shortened by configuration; then the client alone over ``httpx2.MockTransport`` for the
``Retry-After`` cap.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from pods_helpers import Pod, call, script, start_pod, until

from luftpause.runtime.dataplane import DataplaneClient, RetryPolicy
from luftpause.runtime.errors import TurnFailed

pytestmark = pytest.mark.integration

SHORT_WAITS = "turn_retry_max_wait = 0.2\n"


def _await_one(pod: Pod, task: str, before: Any = None) -> tuple[str, dict[str, Any]]:
    async def go() -> tuple[str, dict[str, Any]]:
        async with Client(f"{pod.url}/mcp") as client:
            handle = (await call(client, "spawn", task=task))["handle"]
            if before is not None:
                await before(handle)
            (run,) = (await call(client, "await", handles=[handle], timeout=60))["runs"]
            return handle, run

    return asyncio.run(go())


def test_a_turn_answered_502_twice_then_200_completes(tmp_path: Path, store: str) -> None:
    with start_pod(tmp_path, workspace=None, runtime_toml=SHORT_WAITS, store=store) as pod:
        handle, run = _await_one(
            pod, script({"refuse": 502, "times": 2, "error": "no engine", "say": "made it"})
        )
        assert (run["state"], run.get("answer")) == ("completed", "made it"), run
        assert len(pod.engine.requests[handle]) == 3
        assert run["turns"] == 1  # the refused tries are not turns of the run
        assert "dataplane answered 502: no engine; try 2 failed" in pod.runtime_log()


def test_a_dataplane_down_at_first_and_back_within_the_window_completes_the_run(
    tmp_path: Path, store: str
) -> None:
    settings = "turn_retry_max_wait = 0.5\nturn_retry_seconds = 120\n"
    with start_pod(tmp_path, workspace=None, runtime_toml=settings, engine_started=False, store=store) as pod:

        async def bring_it_back(handle: str) -> None:
            async def retried() -> bool:
                return "again in" in pod.runtime_log()

            await until(retried, "the runtime retrying the unreachable dataplane")
            pod.engine.start()

        handle, run = _await_one(pod, script({"say": "back"}), before=bring_it_back)
        assert (run["state"], run.get("answer")) == ("completed", "back"), run
        assert len(pod.engine.requests[handle]) == 1


def test_past_the_window_the_run_fails_with_the_last_error(tmp_path: Path, store: str) -> None:
    settings = SHORT_WAITS + "turn_retry_seconds = 1.5\n"
    with start_pod(tmp_path, workspace=None, runtime_toml=settings, store=store) as pod:
        handle, run = _await_one(pod, script({"refuse": 503, "error": "engine gone"}))
        assert run["state"] == "failed", run
        assert run["error"].startswith("dataplane answered 503: engine gone (tried "), run["error"]
        assert len(pod.engine.requests[handle]) > 1


# The client alone: Retry-After honoured, and capped.


def _client(answers: list[httpx2.Response], seen: list[httpx2.Request], seconds: float) -> DataplaneClient:
    def answer(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return answers.pop(0) if answers else httpx2.Response(200, json={"choices": []})

    return DataplaneClient(
        "http://dataplane.test",
        transport=httpx2.MockTransport(answer),
        retry=RetryPolicy(seconds=seconds, max_wait=0.1),
    )


async def _complete(client: DataplaneClient) -> dict[str, Any]:
    async with client:
        return await asyncio.wait_for(client.complete("run-1", "interactive", "c", {"messages": []}), 60)


def test_a_429s_retry_after_is_waited_then_the_turn_goes_on() -> None:
    seen: list[httpx2.Request] = []
    held = [httpx2.Response(429, headers={"Retry-After": "0"}, json={"error": {"message": "held"}})] * 2
    assert asyncio.run(_complete(_client(held, seen, seconds=30))) == {"choices": []}
    assert len(seen) == 3


def test_a_retry_after_longer_than_the_window_fails_at_once_with_the_429() -> None:
    # Capped at 30 s, which is past the 2 s window: no wait is taken (it used to wait 600 s).
    seen: list[httpx2.Request] = []
    held = [httpx2.Response(429, headers={"Retry-After": "1000"}, json={"error": {"message": "slow down"}})]
    with pytest.raises(TurnFailed, match=r"dataplane answered 429: slow down \(tried 1 times"):
        asyncio.run(_complete(_client(held, seen, seconds=2)))
    assert len(seen) == 1
