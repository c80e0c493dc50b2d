"""A caller's events (its runs answered, failed, stopped) are given once, by its next ``await`` or
``status``, and not again after the runtime restarts, on each store. On PostgreSQL the record that
says they were taken used to name the caller (``caller:<caller>``) rather than a run, so the store
refused it (a record is written only for a run its runtime holds) and every event came back after
a restart or a takeover."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from pods_helpers import Pod, call, script, start_pod, until

pytestmark = pytest.mark.integration


@asynccontextmanager
async def _as_alice(pod: Pod) -> AsyncIterator[Client]:
    """The real ``mcp`` client to ``pod`` as the caller ``alice`` (``x-luftpause-caller``)."""
    async with httpx2.AsyncClient(headers={"x-luftpause-caller": "alice"}, timeout=60) as http:
        async with Client(streamable_http_client(f"{pod.url}/mcp", http_client=http)) as client:
            yield client


async def _status(pod: Pod) -> dict[str, Any]:
    async with _as_alice(pod) as client:
        return await call(client, "status")


def test_a_callers_events_are_given_once_across_a_restart(tmp_path: Path, store: str) -> None:
    with start_pod(tmp_path, store=store) as pod:

        async def spawn_and_take() -> tuple[list[str], list[dict[str, Any]]]:
            async with _as_alice(pod) as client:
                handles = [
                    (await call(client, "spawn", task=script({"say": "hi"})))["handle"] for _ in range(2)
                ]
            taken: list[dict[str, Any]] = []

            async def both_taken() -> bool:
                taken.extend((await _status(pod)).get("events", []))
                return len(taken) >= 2

            await until(both_taken, "alice's two events")
            return handles, taken

        handles, taken = asyncio.run(spawn_and_take())
        assert sorted(event["handle"] for event in taken) == sorted(handles), taken
        assert asyncio.run(_status(pod)).get("events") is None  # given once
        assert pod.runtime is not None
        pod.runtime.kill()
        pod.start_runtime()
        after = asyncio.run(_status(pod))
        assert sorted(run["handle"] for run in after["runs"]) == sorted(handles), after
        assert after.get("events") is None, after  # not given again
