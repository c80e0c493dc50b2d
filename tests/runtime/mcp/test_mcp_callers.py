"""Who is the caller of an MCP request (issue 16): 2026-era clients that keep the SDK's default
``clientInfo.name`` (``mcp``) were all the one caller ``mcp``, sharing a fairness slot and each
other's runs and notifications. Now each such client is a caller of its own (a cookie the runtime
sets on its first answer, which the SDK's HTTP client sends back for its life), while the
documented reconnect holds: a run's caller is in ``spawn``'s answer and ``status``, and
``list(caller=...)`` from a new connection finds its runs. A client that names itself is still
that name; an ``x-luftpause-caller`` header names the caller explicitly.

Real processes: the runtime over the scripted engine of the pods tests, driven through the real
``mcp`` client (2026-07-28, its default mode against this runtime) and its HTTP client.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation
from pods_helpers import Pod, call, script, start_pod
from postgres_helpers import STORES, store_of

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=STORES)
def pod(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pod]:
    with start_pod(tmp_path_factory.mktemp("callers"), workspace=None, store=store_of(request)) as running:
        yield running


async def _spawn_and_list(client: Client, say: str) -> tuple[dict[str, Any], dict[str, Any]]:
    spawned = await call(client, "spawn", task=script({"say": say}))
    await call(client, "await", handles=[spawned["handle"]], timeout=60)
    return spawned, await call(client, "status")


def test_clients_with_the_sdks_default_name_are_callers_of_their_own_and_find_their_runs_again(
    pod: Pod,
) -> None:
    async def go() -> tuple[Any, ...]:
        async with Client(f"{pod.url}/mcp") as first, Client(f"{pod.url}/mcp") as second:
            first_run, first_status = await _spawn_and_list(first, "one")
            second_run, second_status = await _spawn_and_list(second, "two")
            again = await call(first, "status")  # the same client: the same caller for its life
        async with Client(f"{pod.url}/mcp") as later:
            mine_now = await call(later, "list")
            found = await call(later, "list", caller=first_run["caller"])
        return first_run, first_status, second_run, second_status, again, mine_now, found

    first_run, first_status, second_run, second_status, again, mine_now, found = asyncio.run(go())
    assert first_run["caller"].startswith("client-") and second_run["caller"].startswith("client-")
    assert first_run["caller"] != second_run["caller"]
    assert [r["handle"] for r in first_status["runs"]] == [first_run["handle"]]
    assert [r["handle"] for r in second_status["runs"]] == [second_run["handle"]]
    assert first_status["caller"] == again["caller"] == first_run["caller"]
    assert [r["handle"] for r in again["runs"]] == [first_run["handle"]]
    # A new connection is a new caller (as a new 2025-era session is): its own list is empty,
    # and the earlier caller's runs are found by naming it.
    assert mine_now["runs"] == []
    assert [r["handle"] for r in found["runs"]] == [first_run["handle"]]
    # The turns were scheduled as each client's own caller.
    for run in (first_run, second_run):
        assert pod.engine.requests[run["handle"]], run


def test_a_client_that_names_itself_is_that_caller_across_connections(pod: Pod) -> None:
    info = Implementation(name="nightly-review", version="1")

    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(f"{pod.url}/mcp", client_info=info) as client:
            spawned, _ = await _spawn_and_list(client, "named")
        async with Client(f"{pod.url}/mcp", client_info=info) as again:
            return spawned, await call(again, "status")

    spawned, status = asyncio.run(go())
    assert spawned["caller"] == status["caller"] == "nightly-review"
    assert spawned["handle"] in [r["handle"] for r in status["runs"]]


def test_an_x_luftpause_caller_header_names_the_caller(pod: Pod) -> None:
    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        async with httpx2.AsyncClient(headers={"x-luftpause-caller": "team-a"}) as http:
            async with Client(streamable_http_client(f"{pod.url}/mcp", http_client=http)) as client:
                return await _spawn_and_list(client, "team")

    spawned, status = asyncio.run(go())
    assert spawned["caller"] == status["caller"] == "team-a"
    assert [r["handle"] for r in status["runs"]] == [spawned["handle"]]


def test_a_2025_era_client_is_still_its_session(pod: Pod) -> None:
    async def go() -> dict[str, Any]:
        async with Client(f"{pod.url}/mcp", mode="legacy") as client:
            spawned, _ = await _spawn_and_list(client, "legacy")
            return spawned

    spawned = asyncio.run(go())
    assert not spawned["caller"].startswith("client-") and len(spawned["caller"]) >= 16
