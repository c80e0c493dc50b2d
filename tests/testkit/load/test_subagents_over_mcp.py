"""Sub-agents over MCP in a closed loop (``luftpause.testkit.subagents``, bench/flood.py ``--via mcp``),
against the real stack: the runtime drives every run, each group's runs are its caller's."""

from __future__ import annotations

import asyncio
import json
import urllib.request
import uuid

from luftpause.testkit.agents import AgentGroup
from luftpause.testkit.agents_summary import summarize_agents
from luftpause.testkit.stack import Stack
from luftpause.testkit.subagents import SubagentSettings, closed_loop_subagents, spawn_arguments

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
