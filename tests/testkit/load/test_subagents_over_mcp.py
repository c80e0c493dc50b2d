"""Sub-agents over MCP in a closed loop (``luftpause.testkit.load.subagents``, bench/flood.py ``--via mcp``),
against the real stack: the runtime drives every run, each group's runs are its caller's."""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import urllib.request
import uuid
from typing import Any

import uvicorn
from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from luftpause.testkit.launch.stack import Stack
from luftpause.testkit.load.agents import AgentGroup
from luftpause.testkit.load.agents_summary import summarize_agents
from luftpause.testkit.load.subagents import SubagentSettings, closed_loop_subagents, spawn_arguments

DURATION_S = 4.0
"""The pass's length (s). A run of the stack's engines (1 ms a token, two tool rounds) takes well
under a second, so each agent's first run ends and is replaced within it."""


def _runtime_runs(stack: Stack) -> dict[str, dict[str, object]]:
    status_url = stack.runtime_url.removesuffix("/mcp") + "/status"
    with urllib.request.urlopen(status_url, timeout=10) as response:
        return {run["id"]: run for run in json.loads(response.read())["runs"]}


def test_each_callers_sub_agents_are_kept_running_and_the_deadline_cancels_the_rest(stack: Stack) -> None:
    tag = uuid.uuid4().hex[:8]
    groups = [
        AgentGroup(2, "interactive", f"claude-code-{tag}"),
        AgentGroup(3, "batch", f"batch-orchestrator-{tag}"),
    ]
    settings = SubagentSettings(
        runtime_url=stack.runtime_url,
        task="Look the question up, then answer.",
        context_tokens=64,
        max_tokens=16,
    )
    outcomes = asyncio.run(closed_loop_subagents(settings, groups, DURATION_S))
    runs = _runtime_runs(stack)
    for index, group in enumerate(groups):
        mine = [o for o in outcomes if o.group == index]
        # Every agent spawned a run at once, and each run that ended was replaced by another.
        assert len(mine) > group.agents, mine
        completed = [o for o in mine if o.state == "completed"]
        assert completed, mine
        for outcome in mine:
            assert outcome.state in ("completed", "unfinished"), outcome.error
            run = runs[outcome.run_id]
            assert (run["caller"], run["serviceClass"]) == (group.caller, group.service_class)
            if outcome.state == "unfinished":
                # Cut at the deadline: cancelled, unless it completed in between.
                assert run["state"] in ("cancelled", "completed"), run
        for outcome in completed:
            # The stack's engines call a tool twice, then answer: the runtime made the rounds.
            assert runs[outcome.run_id]["state"] == "completed"
            assert (outcome.turns, outcome.tool_calls) == (3, 2)
            assert outcome.prompt_tokens >= 3 * 64  # each turn carries the 64-token system prompt
            assert outcome.seconds > 0
    summary = summarize_agents(groups, outcomes, DURATION_S)
    assert [(g["class"], g["caller"], g["failed"]) for g in summary["groups"]] == [
        ("interactive", groups[0].caller, 0),
        ("batch", groups[1].caller, 0),
    ]


def test_a_spawn_asks_for_the_own_loop_prompt_shape_with_an_id_of_its_own() -> None:
    settings = SubagentSettings(
        runtime_url="http://127.0.0.1:1/mcp", task="t", context_tokens=100, max_tokens=7
    )
    first_id, first = spawn_arguments(settings, "batch")
    second_id, second = spawn_arguments(settings, "batch")
    assert first_id != second_id
    system = str(first["system"])
    assert system.startswith(f"run {first_id}: ") and len(system) == 400  # 100 tokens of 4 bytes
    assert str(second["system"]).startswith(f"run {second_id}: ")
    assert {k: v for k, v in first.items() if k != "system"} == {
        "task": "t",
        "serviceClass": "batch",
        "maxTokens": 7,
        "tools": ["lookup"],
        "parallelToolCalls": False,
    }


def _refusing_runtime(refused: int) -> MCPServer:
    """A stand-in for the runtime's three tools: its ``refused``-th ``spawn`` is refused (a tool
    error), every other spawn's run has completed by the time it is awaited."""
    server = MCPServer("refusing-runtime", log_level="WARNING")
    spawns = itertools.count(1)

    @server.tool(name="spawn")
    def spawn(
        task: str, system: str, serviceClass: str, maxTokens: int, tools: list[str], parallelToolCalls: bool
    ) -> dict[str, Any]:
        number = next(spawns)
        if number == refused:
            raise ToolError("too many runs, try later")
        return {"handle": f"run-{number}"}

    @server.tool(name="await")
    def await_runs(handles: list[str], mode: str, timeout: float) -> dict[str, Any]:
        done = {"state": "completed", "seconds": 0.01, "turns": 1, "toolCalls": 0}
        return {"runs": [{"handle": handle, **done, "usage": {"promptTokens": 64}} for handle in handles]}

    @server.tool(name="cancel")
    def cancel(handle: str) -> dict[str, Any]:
        return {}

    return server


class _Listening(uvicorn.Server):
    """uvicorn, saying when it listens."""

    def __init__(self, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.listening = asyncio.Event()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        await super().startup(sockets)
        self.listening.set()


async def _closed_loop_against(
    server: MCPServer, group: AgentGroup, duration_s: float, first_backoff_s: float
) -> list[Any]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(server.streamable_http_app(), log_level="warning", log_config=None, lifespan="on")
    web = _Listening(config)
    serving = asyncio.create_task(web.serve(sockets=[sock]))
    await web.listening.wait()
    try:
        settings = SubagentSettings(
            runtime_url=f"http://127.0.0.1:{port}/mcp", task="t", first_backoff_s=first_backoff_s
        )
        return await closed_loop_subagents(settings, [group], duration_s)
    finally:
        web.should_exit = True
        await serving
        sock.close()


def test_a_refused_spawn_backing_off_holds_up_none_of_its_groups_other_runs() -> None:
    """Review item 10: the first replacement spawn is refused, and its agent backs off for longer
    than the pass lasts. Before, the await loop waited for that back-off, so the group completed
    no run past its first two; now the other agent's runs go on ending and being replaced."""
    group = AgentGroup(2, "batch", "caller-a")
    # The refused agent's back-off outlasts the pass by far: a pass as short as the default
    # back-off (1 s) left a loaded machine too little time for the other agent's third run.
    duration_s = 3.0
    outcomes = asyncio.run(
        _closed_loop_against(_refusing_runtime(refused=3), group, duration_s, first_backoff_s=60.0)
    )
    refused = [o for o in outcomes if o.state == "failed"]
    assert len(refused) == 1, refused
    assert refused[0].error.startswith("spawn loadgen-") and refused[0].error.endswith("try later")
    completed = [o for o in outcomes if o.state == "completed"]
    assert len(completed) > group.agents, outcomes
    assert all((o.turns, o.prompt_tokens) == (1, 64) for o in completed)
