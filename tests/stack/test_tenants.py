"""Tenants in the runtime (issue 25, item 1): with caller keys configured, ``/mcp``, ``/status``
and the monitor take the keys; a run belongs to the root caller of the key that spawned it; another
tenant's handle is answered exactly as one that does not exist, and lists, ``/status``, the monitor
and ``await`` show only the caller's own runs; an admin key sees all.

A real stack on loopback (scheduler, dataplane, runtime, simulated engines, the fake MCP server)
with a keys file, driven through the real ``mcp`` client with two tenants' keys: team B tries every
tool and route on team A's run (docs/security-tenants.md).
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from caller_keys_helpers import RUNTIME, TEAM_A, TEAM_B, TEAMS, keyed_stack, keys_file
from mcp import Client, MCPError
from mcp.client.session import ClientSession
from mcp.client.streamable_http import streamable_http_client
from mcp.types import CallToolResult, TextContent
from pods_helpers import script, start_pod, until
from tasks_client_helpers import RAW, CancelTask, CreatedTask, GetTask, TasksDeclared

from luftpause.auth.callers import CALLER_KEYS_ENV
from luftpause.runtime.mcp.tasks_extension import TaskIdParams
from luftpause.runtime.runs.journal import JOURNAL_NAME, read_records
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

ADMIN = "operator-key-0123456789abcd"
NOWHERE = "run-00000000000000000000"

KEYS_FILE = keys_file(*TEAMS, {"caller": "operator", "key": ADMIN, "admin": True}, RUNTIME)


@pytest.fixture(scope="module")
def keyed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with keyed_stack(
        tmp_path_factory.mktemp("tenants"), KEYS_FILE, token="shared-token-of-the-stack", runtime_key=True
    ) as stack:
        yield stack


@asynccontextmanager
async def _client(stack: Stack | str, key: str, *, tasks: bool = False) -> AsyncIterator[Client]:
    """An MCP client of the runtime (a stack's, or at a URL) carrying ``key``; with ``tasks``, a
    2026-07-28 client declaring the Tasks extension."""
    url = stack.runtime_url if isinstance(stack, Stack) else stack
    headers = {"Authorization": f"Bearer {key}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http:
        transport = streamable_http_client(url, http_client=http)
        client = (
            Client(transport, mode="2026-07-28", extensions=[TasksDeclared()]) if tasks else Client(transport)
        )
        async with client:
            yield client


def _text(result: CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, TextContent))


async def _ok(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await client.call_tool(tool, arguments, read_timeout_seconds=120)
    assert not result.is_error, _text(result)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def _refused(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments, read_timeout_seconds=60)
    assert result.is_error, (tool, result.structured_content)
    return _text(result)


def _http(
    stack: Stack, method: str, path: str, key: str | None, body: bytes | None = None
) -> tuple[int, Any]:
    base = stack.runtime_url.removesuffix("/mcp")
    request = urllib.request.Request(f"{base}{path}", data=body, method=method)
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    if body is not None:  # as the monitor page posts: its own origin, JSON
        request.add_header("Content-Type", "application/json")
        request.add_header("Origin", base)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_another_tenants_run_is_not_found_by_any_tool_or_route(keyed: Stack) -> None:
    held = {"task": "look it up", "tools": ["lookup"], "approveTools": ["lookup"], "maxToolCalls": 1}

    async def go() -> None:
        async with _client(keyed, TEAM_A) as a, _client(keyed, TEAM_B) as b:
            mine = await _ok(a, "spawn", name="alpha", **held)
            handle = mine["handle"]
            assert mine["caller"].startswith("team-a/"), mine
            waiting = await _ok(a, "await", handles=[handle], timeout=120)
            assert waiting["runs"][0]["state"] == "AwaitingApproval", waiting

            # Every tool naming A's run answers B as it answers a handle that does not exist.
            def same_as_nowhere(tool: str, **arguments: Any) -> Any:
                async def check() -> None:
                    theirs = await _refused(b, tool, **arguments)
                    swapped = {
                        k: (NOWHERE if v == handle else [NOWHERE] if v == [handle] else v)
                        for k, v in arguments.items()
                    }
                    nowhere = await _refused(b, tool, **swapped)
                    assert theirs.replace(handle, NOWHERE) == nowhere, (tool, theirs, nowhere)

                return check()

            await same_as_nowhere("status", handle=handle)
            await same_as_nowhere("await", handles=[handle], timeout=1)
            await same_as_nowhere("cancel", handle=handle)
            await same_as_nowhere("approve", handle=handle, allow=True)
            await same_as_nowhere("tools", handle=handle)
            await same_as_nowhere("send", handle=handle, message="hi")
            await same_as_nowhere("read", handle=handle)
            await same_as_nowhere("stop", handle=handle)
            await same_as_nowhere("list", handle=handle)
            await same_as_nowhere("spawn", task="under it", parent=handle)
            await same_as_nowhere("run", task="under it", parent=handle, timeout=1)
            # ... and by name: A's "alpha" is no name of B's.
            assert "alpha" in await _refused(b, "send", handle="alpha", message="hi")

            # Lists: B sees its own runs only, also when it names A's caller.
            theirs = await _ok(b, "spawn", task="count to three", maxTokens=8)
            listed = await _ok(b, "status")
            assert [r["handle"] for r in listed["runs"]] == [theirs["handle"]]
            assert (await _ok(b, "list", caller=mine["caller"]))["runs"] == []
            assert [r["handle"] for r in (await _ok(b, "list"))["runs"]] == [theirs["handle"]]
            assert [r["handle"] for r in (await _ok(a, "list"))["runs"]] == [handle]
            # Tools that name no run answer both as before.
            assert (await _ok(b, "tools"))["servers"]
            decided = await _ok(b, "decide", input="is water wet?", labels=["yes", "no"])
            assert decided["label"] in ("yes", "no")

            # A still has its run, untouched by all of that.
            status = (await _ok(a, "status", handle=handle))["run"]
            assert status["state"] == "AwaitingApproval" and "stopping" not in status
            await _ok(a, "approve", handle=handle, allow=False)
            done = await _ok(a, "await", handles=[handle], timeout=120)
            assert done["runs"][0]["state"] == "completed", done

        # Tasks: B cannot get or cancel A's task; its answer is an unknown task's.
        async with (
            _client(keyed, TEAM_A, tasks=True) as a_tasks,
            _client(keyed, TEAM_B, tasks=True) as b_tasks,
        ):
            created = await a_tasks.session.call_tool(
                "run",
                {"task": "tell me about otters", "maxTokens": 8},
                read_timeout_seconds=30,
                allow_claimed=True,
            )
            assert isinstance(created, CreatedTask), created
            answers = []
            for task_id in (created.task_id, "task-00000000000000000000000000000000"):
                for kind in (GetTask, CancelTask):
                    with pytest.raises(MCPError) as raised:
                        await _send(b_tasks.session, kind, task_id)
                    answers.append(
                        (raised.value.error.code, raised.value.error.message.replace(task_id, "?"))
                    )
            assert answers[:2] == answers[2:], answers
            got = await _send(a_tasks.session, GetTask, created.task_id)
            assert got["taskId"] == created.task_id

        return handle, theirs["handle"]

    handle, theirs = asyncio.run(go())

    # The HTTP routes: /status and the monitor show B its runs only; A's run is not found.
    status, body = _http(keyed, "GET", "/status", TEAM_B)
    assert status == 200 and handle not in json.dumps(body["runs"]) and theirs in json.dumps(body["runs"])
    status, body = _http(keyed, "GET", "/monitor/runs", TEAM_B)
    assert status == 200 and [r["handle"] for r in body["runs"]] == [theirs]
    for method, path, data in (
        ("GET", "/monitor/runs/{}", None),
        ("POST", "/monitor/runs/{}/send", b'{"message": "hi"}'),
        ("POST", "/monitor/runs/{}/stop", b"{}"),
    ):
        hidden = _http(keyed, method, path.format(handle), TEAM_B, data)
        missing = _http(keyed, method, path.format(NOWHERE), TEAM_B, data)
        assert hidden[0] == missing[0] == 404, (path, hidden, missing)
        assert json.dumps(hidden[1]).replace(handle, NOWHERE) == json.dumps(missing[1]), (hidden, missing)
    # No key, the shared token or an unknown key: 401 everywhere but the open paths.
    for key in (None, "shared-token-of-the-stack", "not-a-key-0123456789abcdef"):
        for path in ("/status", "/monitor/runs", f"/monitor/runs/{handle}"):
            assert _http(keyed, "GET", path, key)[0] == 401, (key, path)
    # The admin key sees every tenant's runs.
    status, body = _http(keyed, "GET", "/monitor/runs", ADMIN)
    assert {handle, theirs} <= {r["handle"] for r in body["runs"]}
    assert _http(keyed, "GET", f"/monitor/runs/{handle}", ADMIN)[0] == 200
    # Each run's tenant is in its journal record, for a restart to find.
    starts = {
        r["handle"]: r for r in read_records(keyed.workdir / "state" / JOURNAL_NAME) if r["type"] == "start"
    }
    assert starts[handle]["tenant"] == "team-a" and starts[theirs]["tenant"] == "team-b"


def test_the_monitors_series_counts_the_tenants_runs_only(keyed: Stack) -> None:
    """``/monitor/series`` (the monitor's chart, runs by state) counted every tenant's runs for
    every key: each key's samples must count what its ``/status`` lists, and an admin's all."""

    async def spawn() -> None:
        async with _client(keyed, TEAM_A) as a, _client(keyed, TEAM_B) as b:
            handles = [
                (await _ok(client, "spawn", task=f"count to {n}", maxTokens=8))["handle"]
                for client, n in ((a, 1), (b, 2), (b, 3))
            ]
            for client, handle in zip((a, b, b), handles, strict=True):
                done = await _ok(client, "await", handles=[handle], timeout=120)
                assert done["runs"][0]["state"] == "completed", done

    asyncio.run(spawn())
    keys = {"team-a": TEAM_A, "team-b": TEAM_B, "operator": ADMIN}

    def listed(key: str) -> dict[str, int]:
        status, body = _http(keyed, "GET", "/status", key)
        assert status == 200, body
        return dict(Counter(run["state"] for run in body["runs"]))

    def charted(key: str) -> dict[str, int]:
        status, body = _http(keyed, "GET", "/monitor/series", key)
        assert status == 200 and body["samples"], body
        assert all(set(sample) == {"seq", "t", "runs"} for sample in body["samples"]), body
        return {state: n for state, n in body["samples"][-1]["runs"].items() if n}

    async def sampled_since_the_runs_ended() -> bool:
        # the last sample may be older than the last run's end: wait for one that is not
        return all(charted(key) == listed(key) for key in keys.values())

    asyncio.run(until(sampled_since_the_runs_ended, "a sample after the runs ended", seconds=60))
    mine, theirs, everyone = (charted(key) for key in keys.values())
    # each counts its own runs (both have some), and the admin's are the two together
    assert mine and theirs and Counter(mine) + Counter(theirs) == Counter(everyone), (mine, theirs, everyone)
    assert _http(keyed, "GET", "/monitor/series", None)[0] == 401


async def _send(session: ClientSession, kind: Any, task_id: str) -> dict[str, Any]:
    return await session.send_request(kind(params=TaskIdParams(task_id=task_id)), RAW)


def test_the_tenant_holds_after_a_restart(keyed: Stack) -> None:
    async def spawn() -> str:
        async with _client(keyed, TEAM_A) as a:
            return str((await _ok(a, "spawn", task="count to two", maxTokens=8))["handle"])

    handle = asyncio.run(spawn())
    keyed.restart("runtime")

    async def ask() -> None:
        async with _client(keyed, TEAM_A) as a, _client(keyed, TEAM_B) as b:
            assert (await _ok(a, "status", handle=handle))["run"]["handle"] == handle
            refused = await _refused(b, "status", handle=handle)
            assert refused.replace(handle, NOWHERE) == await _refused(b, "status", handle=NOWHERE)

    asyncio.run(ask())


def test_a_sub_agents_own_spawns_belong_to_its_tenant(tmp_path: Path) -> None:
    kid = script({"hold": "kid", "say": "kid done"})
    parent = script({"call": "spawn", "args": {"task": kid, "name": "kid"}}, {"say": "spawned"})
    with start_pod(tmp_path, workspace=None, env={CALLER_KEYS_ENV: json.dumps(TEAMS)}) as pod:

        async def go() -> None:
            async with _client(f"{pod.url}/mcp", TEAM_A) as a, _client(f"{pod.url}/mcp", TEAM_B) as b:
                top = (await _ok(a, "spawn", task=parent, orchestrate=True))["handle"]

                async def kid_held() -> Any:
                    kids = (await _ok(a, "list", handle=top))["runs"]
                    return kids[0]["handle"] if kids and pod.engine.holding(kids[0]["handle"]) else None

                child = await until(kid_held, "the sub-agent's child, held at the engine")
                assert (await _ok(a, "read", handle="kid"))["handle"] == child
                refused = await _refused(b, "read", handle=child)
                assert refused.replace(child, NOWHERE) == await _refused(b, "read", handle=NOWHERE)
                assert (await _ok(b, "list"))["runs"] == []
                pod.engine.release("kid")

        asyncio.run(go())
        starts = {r["handle"]: r for r in pod.journal() if r["type"] == "start"}
        assert {r["tenant"] for r in starts.values()} == {"team-a"} and len(starts) == 2
