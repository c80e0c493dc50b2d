"""Tool calls across a runtime crash, with real processes: the runtime SIGKILLed while a round of
three calls is in flight (two completed, the third held at the tool server by a gate), then
restarted on the same store (the state directory's journal, or the same PostgreSQL database).

The scripted engine (tests/pods_helpers.py) answers the run's first turn with three ``lookup``
calls in one reply; the fake MCP server (``luftpause fake-mcp``) holds the query ``slow`` and
counts calls by the id in their ``_meta`` (``io.luftpause/call-id``). The kill comes once the
journal holds the completion of the first two and the third has reached the server, so what is
tested is known, not whatever a poll happened to see.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pods_helpers import Pod, call, script, start_pod, until
from runtime_helpers import destructive_tools

from luftpause.runtime.agent.upstream import call_id

pytestmark = pytest.mark.integration

QUERIES = ("alpha", "beta", "slow")


class ToolServer:
    """The fake MCP server next to the runtime: its URL, its counts, its gates."""

    def __init__(self, url: str) -> None:
        self.url = url

    def _get(self, route: str, method: str = "GET") -> Any:
        request = urllib.request.Request(
            self.url.removesuffix("/mcp") + route, data=b"" if method == "POST" else None
        )
        with urllib.request.urlopen(request, timeout=10) as response:
            return json.loads(response.read())

    def call_ids(self) -> dict[str, int]:
        counted: dict[str, int] = self._get("/testkit/call-ids")
        return counted

    def calls(self) -> dict[str, int]:
        counted: dict[str, int] = self._get("/testkit/calls")
        return counted

    def hold(self, query: str) -> None:
        self._get(f"/testkit/hold/{query}", "POST")

    def release(self, query: str) -> None:
        self._get(f"/testkit/release/{query}", "POST")


@pytest.fixture()
def rig(tmp_path: Path, store: str) -> Iterator[tuple[Pod, ToolServer]]:
    """The runtime over the scripted engine on each store (the file journal, PostgreSQL), and a
    fake MCP server (``--destructive``: it also serves ``delete_note``, which waits for a person)
    as its only tool server."""
    with destructive_tools(tmp_path) as url:
        extra = f'\n[[mcp_servers]]\nname = "tools"\nurl = "{url}"\n'
        with start_pod(tmp_path, workspace=None, extra_toml=extra, store=store) as pod:
            yield pod, ToolServer(url)


def _of(records: list[dict[str, Any]], handle: str, kind: str) -> list[dict[str, Any]]:
    return [r for r in records if r["handle"] == handle and r["type"] == kind]


@pytest.mark.parametrize("parallel", [False, True], ids=["in-order", "parallel"])
def test_a_restart_repeats_only_the_call_in_flight_with_the_same_id(
    rig: tuple[Pod, ToolServer], parallel: bool
) -> None:
    pod, tools = rig
    task = script(
        {"calls": [{"call": "lookup", "args": {"query": q}} for q in QUERIES]},
        {"say": "done"},
    )
    tools.hold("slow")

    async def spawn() -> str:
        async with Client(f"{pod.url}/mcp") as client:
            spawned = await call(client, "spawn", task=task, parallelToolCalls=parallel, tools=["lookup"])
            handle: str = spawned["handle"]
            return handle

    handle = asyncio.run(spawn())
    ids = [call_id(handle, 1, index) for index in range(len(QUERIES))]  # turn 1, calls 0-2

    async def in_flight() -> bool:
        done = {r["index"] for r in _of(pod.journal(), handle, "call")}
        return done == {0, 1} and tools.call_ids().get(ids[2]) == 1

    asyncio.run(until(in_flight, "two calls journaled and the third held at the tool server"))
    assert pod.runtime is not None
    pod.runtime.kill()

    at_kill = pod.journal()
    assert len(_of(at_kill, handle, "turn")) == 1 and not _of(at_kill, handle, "round")
    assert not _of(at_kill, handle, "end")
    turns_at_kill = len(pod.engine.requests[handle])
    assert turns_at_kill == 1
    tools.release("slow")
    pod.start_runtime()

    async def finish() -> dict[str, Any]:
        async with Client(f"{pod.url}/mcp") as client:
            return await call(client, "await", handles=[handle], timeout=60)

    result = asyncio.run(finish())["runs"][0]
    assert result["state"] == "completed" and result["answer"] == "done", result
    assert result["toolCalls"] == 3 and result["failedToolCalls"] == 0, result
    # The two completed calls were not made again; the one in flight was, with the id it had.
    assert {i: tools.call_ids().get(i) for i in ids} == {ids[0]: 1, ids[1]: 1, ids[2]: 2}
    assert Counter({q: tools.calls()[f"lookup {q}"] for q in QUERIES}) == Counter(alpha=1, beta=1, slow=2)
    # The reply was journaled before its calls ran: the engine was not asked for it again (one
    # turn before the kill, the answer after it), and that turn saw the whole round, in call order.
    requests = pod.engine.requests[handle]
    assert len(requests) == 2
    last = requests[1]["messages"]
    assert [m.get("tool_call_id") for m in last if m["role"] == "tool"] == [
        "call_0_0",
        "call_0_1",
        "call_0_2",
    ]
    results = [m["content"] for m in last if m["role"] == "tool"]
    assert all(r.startswith(f"Lookup: {q}.") for r, q in zip(results, QUERIES, strict=True)), results
    final = pod.journal()
    rounds = _of(final, handle, "round")
    assert len(rounds) == 1 and [m["role"] for m in rounds[0]["messages"]] == ["assistant", *["tool"] * 3]
    assert sorted(r["index"] for r in _of(final, handle, "call")) == [0, 1, 2]


def test_an_approved_call_that_completed_before_a_crash_is_neither_asked_nor_made_again(
    rig: tuple[Pod, ToolServer],
) -> None:
    """Approvals journaled stay what they were: the approved ``delete_note`` completed (its
    ``call`` record) before the kill, the ``lookup`` after it in the same round was in flight. After
    the restart nobody is asked again, ``delete_note`` is not made again, the lookup is."""
    pod, tools = rig
    task = script(
        {
            "calls": [
                {"call": "delete_note", "args": {"title": "draft"}},
                {"call": "lookup", "args": {"query": "slow"}},
            ]
        },
        {"say": "done"},
    )
    tools.hold("slow")

    async def spawn_and_approve() -> str:
        async with Client(f"{pod.url}/mcp") as client:
            handle: str = (await call(client, "spawn", task=task, tools=["delete_note", "lookup"]))["handle"]
            waiting = await call(client, "await", handles=[handle], timeout=60)
            assert waiting["runs"][0]["state"] == "AwaitingApproval", waiting
            await call(client, "approve", handle=handle, allow=True)
            return handle

    handle = asyncio.run(spawn_and_approve())
    ids = [call_id(handle, 1, index) for index in range(2)]

    async def in_flight() -> bool:
        done = {r["index"] for r in _of(pod.journal(), handle, "call")}
        return done == {0} and tools.call_ids().get(ids[1]) == 1

    asyncio.run(until(in_flight, "delete_note done and journaled, the lookup held at the tool server"))
    assert pod.runtime is not None
    pod.runtime.kill()
    tools.release("slow")
    pod.start_runtime()

    async def finish() -> dict[str, Any]:
        async with Client(f"{pod.url}/mcp") as client:  # no elicitation: a question would show
            return await call(client, "await", handles=[handle], timeout=60)

    result = asyncio.run(finish())["runs"][0]
    assert result["state"] == "completed" and result["answer"] == "done", result
    assert {i: tools.call_ids().get(i) for i in ids} == {ids[0]: 1, ids[1]: 2}
    journal = pod.journal()
    assert [r["allow"] for r in _of(journal, handle, "approval")] == [True]
    assert len(_of(journal, handle, "started")) == 1
