"""Tools only narrow down a run tree (issues 5 and 6), end to end: a sub-agent never gives its
child a tool it lacks, and a run never has a tool executed that it was not offered.

Real processes: the runtime and the fake MCP server (``lookup``, ``deep_search``; it counts the
calls it is sent), driven through the real ``mcp`` client. The runtime's dataplane is the scripted
engine of the pods tests (:class:`pods_helpers.ScriptedEngine`, a JSON script in each run's
task says which tool the model calls at each step): the test kit's simulated engine picks among
the offered tools itself, and a model calling a tool it was *not* offered is exactly what must be
scripted here. The top-level run A is given ``tools=["lookup"]`` and ``orchestrate`` (the built-in
orchestration tools come with ``orchestrate``, not with ``tools``).
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from mcp import Client
from mcp.types import CallToolResult
from pods_helpers import ScriptedEngine, call, script, start_pod, tool_text
from postgres_helpers import STORES, store_of

from luftpause.testkit.launch.procs import ChildProcess, free_port

pytestmark = pytest.mark.integration


@dataclass
class Rig:
    """The running runtime (``url``: its HTTP root), its scripted engine and fake MCP server."""

    url: str
    mcp_url: str
    engine: ScriptedEngine


@pytest.fixture(scope="module", params=STORES)
def rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    store = store_of(request)
    workdir = tmp_path_factory.mktemp("child-tools")
    mcp_port = free_port()
    tools = ChildProcess(
        "mcp",
        ["fake-mcp", "--port", str(mcp_port)],
        workdir / "mcp.log",
        ready_port=("127.0.0.1", mcp_port),
    )
    try:
        tools.start()
        tools.wait_ready()
        fake = f'[[mcp_servers]]\nname = "fake"\nurl = "http://127.0.0.1:{mcp_port}/mcp"\n'
        with start_pod(workdir, workspace=None, max_children=None, extra_toml=fake, store=store) as pod:
            yield Rig(pod.url, f"http://127.0.0.1:{mcp_port}", pod.engine)
    finally:
        tools.stop()


async def _spawn_a(client: Client, task: str) -> str:
    """A top-level run allowed ``lookup`` only, with the orchestration tools; run to its answer."""
    a = (await call(client, "spawn", task=task, tools=["lookup"], orchestrate=True))["handle"]
    assert isinstance(a, str)
    await _await(client, [a])
    return a


async def _await(client: Client, handles: list[str]) -> list[dict[str, Any]]:
    done = await call(client, "await", handles=handles, timeout=60)
    assert done["timedOut"] is False, done
    runs: list[dict[str, Any]] = done["runs"]
    return runs


def _tool_results(engine: ScriptedEngine, handle: str) -> list[str]:
    """The tool results the run's model was given, as its last turn's request carried them."""
    messages = engine.requests[handle][-1]["messages"]
    return [m["content"] for m in messages if m["role"] == "tool"]


def _offered(engine: ScriptedEngine, handle: str) -> list[set[str]]:
    """Per turn of the run, the names of the tools its model was offered."""
    return [{tool["function"]["name"] for tool in body.get("tools", ())} for body in engine.requests[handle]]


def _calls_seen(rig: Rig) -> dict[str, int]:
    """What the fake MCP server was sent: ``{"<tool> <query>": calls}``."""
    with urllib.request.urlopen(f"{rig.mcp_url}/testkit/calls", timeout=10) as response:
        seen: dict[str, int] = json.loads(response.read())
        return seen


def test_a_sub_agent_asking_for_a_tool_it_lacks_for_its_child_is_refused_naming_it(rig: Rig) -> None:
    wider = script({"call": "deep_search", "args": {"query": "never spawned"}}, {"say": "wide done"})
    a_task = script(
        {"call": "spawn", "args": {"task": wider, "name": "wide", "tools": ["lookup", "deep_search"]}},
        {"say": "A done"},
    )

    async def go() -> tuple[str, list[dict[str, Any]]]:
        async with Client(f"{rig.url}/mcp") as client:
            a = await _spawn_a(client, a_task)
            return a, (await call(client, "list", handle=a))["runs"]

    a, children = asyncio.run(go())
    (refusal,) = _tool_results(rig.engine, a)
    assert refusal == "Error: tools: deep_search not among the tools you may use", refusal
    assert children == []  # no run was started with it
    assert "deep_search never spawned" not in _calls_seen(rig)


def test_a_child_spawned_without_tools_gets_its_spawners_tools_not_the_servers(rig: Rig) -> None:
    b_task = script({"say": "B done"})
    a_task = script({"call": "spawn", "args": {"task": b_task, "name": "b"}}, {"say": "A done"})

    async def go() -> tuple[str, dict[str, Any], dict[str, Any]]:
        async with Client(f"{rig.url}/mcp") as client:
            a = await _spawn_a(client, a_task)
            (b,) = (await call(client, "list", handle=a))["runs"]
            await _await(client, [b["handle"]])
            everything = await call(client, "tools")
            return b["handle"], await call(client, "tools", handle=b["handle"]), everything

    b, b_tools, everything = asyncio.run(go())
    names = [tool["name"] for server in b_tools["servers"] for tool in server["tools"]]
    assert names == ["lookup"], b_tools
    # ... though the server offers more, so the narrowing is the spawner's doing.
    assert {tool["name"] for server in everything["servers"] for tool in server["tools"]} >= {
        "lookup",
        "deep_search",
    }
    assert _offered(rig.engine, b) == [{"lookup"}]  # what B's model was offered: no spawn either


def test_a_tool_call_for_a_tool_not_offered_is_a_failed_call_never_executed(rig: Rig) -> None:
    b_task = script(
        {"call": "deep_search", "args": {"query": "not offered to b"}},
        {"call": "spawn", "args": {"task": script({"say": "x"})}},
        {"call": "lookup", "args": {"query": "offered to b"}},
        {"say": "B done"},
    )
    a_task = script({"call": "spawn", "args": {"task": b_task, "name": "b"}}, {"say": "A done"})

    async def go() -> tuple[str, dict[str, Any], list[dict[str, Any]]]:
        async with Client(f"{rig.url}/mcp") as client:
            a = await _spawn_a(client, a_task)
            (b,) = (await call(client, "list", handle=a))["runs"]
            (b_run,) = await _await(client, [b["handle"]])
            return b["handle"], b_run, (await call(client, "list", handle=b["handle"]))["runs"]

    b, b_run, b_children = asyncio.run(go())
    not_offered, no_spawn, looked_up = _tool_results(rig.engine, b)
    assert not_offered == "Error: the tool 'deep_search' is not offered to you"
    assert no_spawn == "Error: the tool 'spawn' is not offered to you"
    assert looked_up.startswith("Lookup: offered to b.")
    assert (b_run["state"], b_run["toolCalls"], b_run["failedToolCalls"]) == ("completed", 3, 2)
    assert b_children == []
    seen = _calls_seen(rig)
    assert seen.get("lookup offered to b") == 1  # the server is reached for what B may call ...
    assert "deep_search not offered to b" not in seen  # ... and never for what it may not


def test_an_mcp_callers_spawn_under_a_parent_is_narrowed_to_the_parents_tools(rig: Rig) -> None:
    # A reviewer's case: the tree's rule held for a sub-agent's own spawn only; an MCP caller's
    # spawn(parent=A) with no tools gave the child every tool the servers offer.
    async def go() -> tuple[str, dict[str, Any], CallToolResult, dict[str, Any]]:
        async with Client(f"{rig.url}/mcp") as client:
            a = await _spawn_a(client, script({"say": "A done"}))
            inherit = (await call(client, "spawn", task=script({"say": "C done"}), parent=a))["handle"]
            wider = await client.call_tool(
                "spawn", {"task": script({"say": "never"}), "parent": a, "tools": ["deep_search"]}
            )
            await _await(client, [inherit])
            c_tools = await call(client, "tools", handle=inherit)
            return a, c_tools, wider, await call(client, "list", handle=a)

    a, c_tools, wider, a_children = asyncio.run(go())
    assert [tool["name"] for server in c_tools["servers"] for tool in server["tools"]] == ["lookup"]
    assert wider.is_error
    assert tool_text(wider).endswith(f"tools: deep_search not among the tools the parent run {a!r} may use")
    assert len(a_children["runs"]) == 1  # the refused spawn started nothing


def test_an_mcp_callers_spawn_under_a_parent_keeps_the_parents_approvals(rig: Rig) -> None:
    # A's calls of lookup wait for a person; so must those of a child the caller starts under A.
    child = script({"call": "lookup", "args": {"query": "needs approval"}}, {"say": "C done"})

    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(f"{rig.url}/mcp") as client:
            a = (
                await call(
                    client, "spawn", task=script({"say": "A done"}), tools=["lookup"], approveTools=["lookup"]
                )
            )["handle"]
            await _await(client, [a])
            c = (await call(client, "spawn", task=child, parent=a))["handle"]

            async def waiting() -> dict[str, Any] | None:
                status: dict[str, Any] = (await call(client, "status", handle=c))["run"]
                return status if status["state"] == "AwaitingApproval" else None

            deadline = asyncio.get_running_loop().time() + 30
            while (pending := await waiting()) is None:
                assert asyncio.get_running_loop().time() < deadline, await call(client, "status", handle=c)
                await asyncio.sleep(0.1)
            await call(client, "approve", handle=c, allow=True)
            (done,) = await _await(client, [c])
            return pending, done

    pending, done = asyncio.run(go())
    assert [approval["tool"] for approval in pending["pendingApprovals"]] == ["lookup"]
    assert (done["state"], done["toolCalls"], done["failedToolCalls"]) == ("completed", 1, 0)
    assert _calls_seen(rig).get("lookup needs approval") == 1  # run once, after the approval
