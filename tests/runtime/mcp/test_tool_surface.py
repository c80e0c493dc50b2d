"""The runtime's tool surface as a client sees it: ``run`` takes every argument ``spawn`` takes
(its input schema holds spawn's, property by property), on the blocking path and on the Tasks
extension's; and ``tools(handle)`` lists exactly what the run's turns are offered, the runtime's
built-in tools (workspace, orchestration) included as the ``luftpause`` entry.

Real processes: the runtime, driven through the real ``mcp`` client, with the scripted engine of
the pods tests as its dataplane (:class:`pods_helpers.ScriptedEngine`: it records every request,
so the tools a run's turn was offered can be compared with what ``tools`` says) and one upstream
stdio MCP server, written here, that serves ``lookup`` and a ``read_file`` of its own (a built-in
of the same name hides it from a run holding a scope, as the loop does). Two runtimes: ``rig`` has a
workspace (an MCP caller's run holds a scope in it, read-only when spawned without one), ``bare``
has none (a run holds no scope, so no workspace tools). A run's first turn is held
at a gate of the engine while a test looks at it: a finished run gives its scope back, so the
workspace tools are offered only while it runs.
"""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import pytest
from mcp import Client
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.types import CallToolResult
from mcp_types import Result
from pods_helpers import ScriptedEngine, call, script, start_pod, until
from postgres_helpers import STORES, on_the_file_journal, store_of

from luftpause.runtime.mcp.tasks_extension import TASKS_EXTENSION

pytestmark = pytest.mark.integration

UPSTREAM_SERVER = """\
from mcp.server import MCPServer

server = MCPServer("surface-upstream", log_level="WARNING")


@server.tool(name="lookup", description="Look a word up.")
def lookup(query: str) -> str:
    return f"Lookup: {query}."


@server.tool(name="read_file", description="The upstream server's own read_file.")
def read_file(path: str) -> str:
    return "upstream read_file"


server.run("stdio")
"""

WORKSPACE_TOOLS = ["read_file", "write_file", "edit_file", "list_directory"]
ORCHESTRATION_TOOLS = ["spawn", "send", "read", "stop", "list"]


@dataclass
class Rig:
    """The running runtime (``url``: its MCP endpoint), its scripted engine and its workspace
    (``None``: none configured, so a top-level run holds no filesystem scope)."""

    url: str
    engine: ScriptedEngine
    workspace: Path | None


@contextmanager
def _rig(workdir: Path, with_workspace: bool, store: str) -> Iterator[Rig]:
    """The scripted engine, the upstream stdio server and a runtime on ``store``; all stopped on
    exit."""
    upstream = workdir / "upstream_server.py"
    upstream.write_text(UPSTREAM_SERVER)
    server = f"""
[[mcp_servers]]
name = "upstream"
command = [{json.dumps(sys.executable)}, {json.dumps(str(upstream))}]
"""
    workspace = ("sub",) if with_workspace else None
    with start_pod(workdir, workspace=workspace, max_children=None, extra_toml=server, store=store) as pod:
        yield Rig(f"{pod.url}/mcp", pod.engine, pod.workspace)


@pytest.fixture(scope="module", params=STORES)
def rig(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """A runtime with a workspace, on each store."""
    with _rig(tmp_path_factory.mktemp("tool-surface"), True, store_of(request)) as running:
        yield running


@pytest.fixture(scope="module", params=STORES)
def bare(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    """A runtime without a workspace: its runs hold no filesystem scope; on each store."""
    with _rig(tmp_path_factory.mktemp("tool-surface-bare"), False, store_of(request)) as running:
        yield running


def _workspace(rig: Rig) -> Path:
    assert rig.workspace is not None
    return rig.workspace


def _scope(path: Path) -> list[dict[str, Any]]:
    return [{"effect": "allow", "access": ["read", "write"], "path": str(path)}]


def _names(servers: list[dict[str, Any]]) -> dict[str, list[str]]:
    return {server["server"]: [tool["name"] for tool in server["tools"]] for server in servers}


def _offered_in_turn(engine: ScriptedEngine, handle: str, turn: int = 0) -> list[dict[str, Any]]:
    """The tools the run's turn ``turn`` was offered, as ``(name, description, schema)`` dicts."""
    tools = engine.requests[handle][turn].get("tools", ())
    return [
        {
            "name": t["function"]["name"],
            "description": t["function"]["description"],
            "schema": t["function"]["parameters"],
        }
        for t in tools
    ]


def _listed(servers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``tools``' answer in the same form, servers in order."""
    return [
        {"name": t["name"], "description": t["description"], "schema": t["inputSchema"]}
        for server in servers
        for t in server["tools"]
    ]


async def _upstream_reachable(client: Client) -> None:
    # The stdio server may still be starting when /health answers.
    async def reachable() -> bool:
        servers = (await call(client, "tools"))["servers"]
        return bool(servers) and all(server["reachable"] for server in servers)

    await until(reachable, "the upstream stdio server to be reachable")


async def _held(rig: Rig, client: Client, tool: str, **arguments: Any) -> str:
    """Start a run with ``tool`` (``spawn``, or ``run`` with no wait) whose task holds its first
    turn at a gate of the engine; its handle, once that turn is held."""
    if tool == "run":
        arguments["timeout"] = 0
    started = await call(client, tool, **arguments)
    handle: str = started["handle"] if tool == "spawn" else started["runs"][0]["handle"]

    async def holding() -> bool:
        return rig.engine.holding(handle)

    await until(holding, f"the first turn of {handle} to reach the engine")
    return handle


def _mine(listing: dict[str, Any], handle: str) -> dict[str, Any]:
    items: list[dict[str, Any]] = [run for run in listing["runs"] if run["handle"] == handle]
    (item,) = items
    return item


# run takes spawn's arguments.


@on_the_file_journal("rig")
def test_runs_input_schema_has_every_property_of_spawns_with_the_same_schema(rig: Rig) -> None:
    async def go() -> dict[str, dict[str, Any]]:
        async with Client(rig.url) as client:
            return {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}

    schemas = asyncio.run(go())
    spawn, run = schemas["spawn"], schemas["run"]
    missing = sorted(set(spawn["properties"]) - set(run["properties"]))
    assert missing == [], f"run lacks spawn's {missing}"
    for name, schema in spawn["properties"].items():
        assert run["properties"][name] == schema, name
    assert run.get("required") == spawn.get("required")
    assert set(run["properties"]) - set(spawn["properties"]) == {"timeout"}  # its own wait
    assert run["additionalProperties"] is False


def test_run_takes_name_scope_and_orchestrate_and_honours_them(rig: Rig) -> None:
    child = script({"say": "child done"})
    task = script(
        {"hold": "via-run", "call": "spawn", "args": {"task": child, "name": "kid"}},
        {"say": "parent done"},
    )
    scope = _scope(_workspace(rig) / "sub")

    async def go() -> tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with Client(rig.url) as client:
            handle = await _held(rig, client, "run", task=task, name="via-run", scope=scope, orchestrate=True)
            while_running = _mine(await call(client, "list"), handle)
            rig.engine.release("via-run")
            done = await call(client, "await", handles=[handle], timeout=60)
            return handle, while_running, done, await call(client, "list", handle="via-run")

    handle, while_running, done, children = asyncio.run(go())
    assert while_running["name"] == "via-run"
    assert while_running["scope"]["granted"] == scope
    offered = {tool["name"] for tool in _offered_in_turn(rig.engine, handle)}
    assert offered >= {*WORKSPACE_TOOLS, *ORCHESTRATION_TOOLS}
    (result,) = done["runs"]
    assert (result["state"], result["answer"]) == ("completed", "parent done"), result
    assert [run["name"] for run in children["runs"]] == ["kid"]  # orchestrate: it spawned a child


class CreatedTask(Result):
    """``CreateTaskResult`` (Tasks extension, 2026-07-28): the fields these tests read."""

    result_type: Literal["task"] = "task"
    task_id: str
    status: str


class DeclaresTasks(ClientExtension):
    """Declares the Tasks extension, so ``run`` answers with a task. The tests take the task as it
    comes (``allow_claimed``) and never ask the SDK to resolve it."""

    identifier = TASKS_EXTENSION

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self.resolve)]

    async def resolve(self, task: CreatedTask, ctx: ClaimContext) -> CallToolResult:
        raise AssertionError(f"task {task.task_id} was to be taken as it came, not resolved")


def test_run_as_a_task_takes_name_scope_and_orchestrate_too(rig: Rig) -> None:
    scope = _scope(_workspace(rig) / "sub")
    arguments = {
        "task": script({"hold": "task-pod", "say": "task done"}),
        "name": "task-pod",
        "scope": scope,
        "orchestrate": True,
    }

    async def go() -> tuple[Any, dict[str, Any], dict[str, Any]]:
        async with Client(rig.url, mode="2026-07-28", extensions=[DeclaresTasks()]) as client:
            created = await client.session.call_tool(
                "run", arguments, read_timeout_seconds=30, allow_claimed=True
            )
            listing = await call(client, "list")
            (mine,) = [run for run in listing["runs"] if run["name"] == "task-pod"]

            async def holding() -> bool:
                return rig.engine.holding(mine["handle"])

            await until(holding, "the task's run to reach the engine")
            tools = await call(client, "tools", handle=mine["handle"])
            rig.engine.release("task-pod")
            done = await call(client, "await", handles=[mine["handle"]], timeout=60)
            return created, {**mine, "tools": tools}, done

    created, mine, done = asyncio.run(go())
    assert isinstance(created, CreatedTask), created
    assert mine["scope"]["granted"] == scope
    assert _names(mine["tools"]["servers"])["luftpause"] == [*WORKSPACE_TOOLS, *ORCHESTRATION_TOOLS]
    assert done["runs"][0]["answer"] == "task done"


# tools(handle) lists what the run is offered.


def test_tools_of_a_run_with_scope_and_orchestrate_is_exactly_what_its_turn_was_offered(rig: Rig) -> None:
    async def go() -> tuple[str, dict[str, Any], dict[str, Any]]:
        async with Client(rig.url) as client:
            await _upstream_reachable(client)
            task = script({"hold": "offered-pod", "say": "done"})
            handle = await _held(
                rig, client, "spawn", task=task, scope=_scope(_workspace(rig)), orchestrate=True
            )
            listed = await call(client, "tools", handle=handle)
            everything = await call(client, "tools")
            rig.engine.release("offered-pod")
            await call(client, "await", handles=[handle], timeout=60)
            return handle, listed, everything

    handle, listed, everything = asyncio.run(go())
    servers = listed["servers"]
    assert _names(servers) == {
        "upstream": ["lookup"],  # its read_file is hidden by the built-in one, as in the turn
        "luftpause": [*WORKSPACE_TOOLS, *ORCHESTRATION_TOOLS],
    }
    builtin = servers[-1]
    assert (builtin["server"], builtin["transport"], builtin["reachable"]) == ("luftpause", "builtin", True)
    assert _listed(servers) == _offered_in_turn(rig.engine, handle)
    # Without a handle: what the servers offer, no built-ins (they depend on the run).
    assert _names(everything["servers"]) == {"upstream": ["lookup", "read_file"]}


def test_tools_of_a_run_without_scope_in_a_workspace_lists_the_workspace_tools(rig: Rig) -> None:
    # An MCP caller's run spawned without a scope reads the whole workspace: offered the
    # workspace tools (its scope refuses the writes), no orchestration tools.
    async def go() -> tuple[str, dict[str, Any]]:
        async with Client(rig.url) as client:
            await _upstream_reachable(client)
            handle = await _held(rig, client, "spawn", task=script({"hold": "read-only", "say": "done"}))
            listed = await call(client, "tools", handle=handle)
            rig.engine.release("read-only")
            await call(client, "await", handles=[handle], timeout=60)
            return handle, listed

    handle, listed = asyncio.run(go())
    assert _names(listed["servers"]) == {"upstream": ["lookup"], "luftpause": WORKSPACE_TOOLS}
    assert _listed(listed["servers"]) == _offered_in_turn(rig.engine, handle)


def test_tools_of_a_run_without_scope_or_orchestrate_lists_no_builtins(bare: Rig) -> None:
    async def go() -> tuple[str, dict[str, Any]]:
        async with Client(bare.url) as client:
            await _upstream_reachable(client)
            handle = await _held(bare, client, "spawn", task=script({"hold": "plain", "say": "done"}))
            listed = await call(client, "tools", handle=handle)
            bare.engine.release("plain")
            await call(client, "await", handles=[handle], timeout=60)
            return handle, listed

    handle, listed = asyncio.run(go())
    assert _names(listed["servers"]) == {"upstream": ["lookup", "read_file"], "luftpause": []}
    assert _listed(listed["servers"]) == _offered_in_turn(bare.engine, handle)


def test_tools_of_a_run_narrowed_to_some_tools_with_orchestrate_lists_those_and_the_orchestration(
    bare: Rig,
) -> None:
    async def go() -> tuple[str, dict[str, Any]]:
        async with Client(bare.url) as client:
            await _upstream_reachable(client)
            task = script({"hold": "narrow", "say": "done"})
            handle = await _held(bare, client, "spawn", task=task, tools=["read_file"], orchestrate=True)
            listed = await call(client, "tools", handle=handle)
            bare.engine.release("narrow")
            await call(client, "await", handles=[handle], timeout=60)
            return handle, listed

    handle, listed = asyncio.run(go())
    # No scope: the upstream read_file is the one offered, beside the orchestration tools.
    assert _names(listed["servers"]) == {"upstream": ["read_file"], "luftpause": ORCHESTRATION_TOOLS}
    assert _listed(listed["servers"]) == _offered_in_turn(bare.engine, handle)


# Tool annotations (issue 15) and the one spawn contract (issue 16).

EXPECTED_HINTS = {
    # tool: (readOnlyHint, destructiveHint, idempotentHint, openWorldHint)
    "spawn": (False, False, False, True),
    "run": (False, False, False, True),
    "await": (True, False, True, False),
    "status": (True, False, True, False),
    "cancel": (False, True, True, False),
    "send": (False, False, False, True),
    "read": (True, False, True, False),
    "stop": (False, True, True, False),
    "list": (True, False, True, False),
    "approve": (False, True, True, True),
    "decide": (True, False, True, False),
    "tools": (True, False, True, False),
}


@on_the_file_journal("rig")
def test_every_tool_carries_its_annotations_and_a_title_on_the_wire(rig: Rig) -> None:
    # Codex refuses every MCP tool not annotated read-only (approval policy "never"): the runtime
    # published no annotations at all. Listed here through the real mcp client, over HTTP.
    async def go() -> dict[str, Any]:
        async with Client(rig.url) as client:
            return {tool.name: tool for tool in (await client.list_tools()).tools}

    tools = asyncio.run(go())
    assert set(tools) == set(EXPECTED_HINTS)
    for name, (read_only, destructive, idempotent, open_world) in EXPECTED_HINTS.items():
        tool = tools[name]
        hints = tool.annotations
        assert hints is not None, name
        assert (
            hints.read_only_hint,
            hints.destructive_hint,
            hints.idempotent_hint,
            hints.open_world_hint,
        ) == (
            read_only,
            destructive,
            idempotent,
            open_world,
        ), name
        assert tool.title and hints.title == tool.title, name
    read_only_tools = sorted(
        name for name, tool in tools.items() if tool.annotations and tool.annotations.read_only_hint
    )
    assert read_only_tools == ["await", "decide", "list", "read", "status", "tools"]


@on_the_file_journal("rig")
def test_a_sub_agents_spawn_takes_what_the_mcp_spawn_takes_but_parent(rig: Rig) -> None:
    # One declaration of spawn's arguments: the sub-agent's built-in spawn has every property of
    # the MCP tool's (model, maxTokens, serviceClass, budgets, instruction among them) with the same
    # schema, and no parent (its parent is always itself).
    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(rig.url) as client:
            mcp_spawn = next(t for t in (await client.list_tools()).tools if t.name == "spawn").input_schema
            handle = await _held(
                rig, client, "spawn", task=script({"hold": "schema", "say": "done"}), orchestrate=True
            )
            listed = await call(client, "tools", handle=handle)
            rig.engine.release("schema")
            await call(client, "await", handles=[handle], timeout=60)
            (builtin,) = [tool for tool in listed["servers"][-1]["tools"] if tool["name"] == "spawn"]
            return mcp_spawn, builtin["inputSchema"]

    mcp_spawn, child_spawn = asyncio.run(go())
    assert set(child_spawn["properties"]) == set(mcp_spawn["properties"]) - {"parent"}
    for name, schema in child_spawn["properties"].items():
        assert schema == mcp_spawn["properties"][name], name
    assert {"model", "maxTokens", "serviceClass", "budgetTokens", "instruction"} <= set(
        child_spawn["properties"]
    )
    assert child_spawn["required"] == mcp_spawn["required"] == ["task"]
    assert child_spawn["additionalProperties"] is False


def test_await_and_run_say_when_they_cut_a_timeout_to_600_seconds(rig: Rig) -> None:
    async def go() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with Client(rig.url) as client:
            ran = await call(client, "run", task=script({"say": "quick"}), timeout=900)
            (done,) = ran["runs"]
            waited = await call(client, "await", handles=[done["handle"]], timeout=3600.5)
            within = await call(client, "await", handles=[done["handle"]], timeout=600)
            return ran, waited, within

    ran, waited, within = asyncio.run(go())
    assert ran["timeoutCut"] == {"asked": 900.0, "max": 600.0} and ran["runs"][0]["state"] == "completed"
    assert waited["timeoutCut"] == {"asked": 3600.5, "max": 600.0}
    assert "timeoutCut" not in within
