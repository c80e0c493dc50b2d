"""Sub-agents ride out an engine killed under them (issue 25's acceptance: "killing one of two
engines under load loses ... no sub-agent run").

Real processes (:class:`~luftpause.testkit.launch.stack.Stack`: two simulated engines, the fake MCP
server, the scheduler, the dataplane, the runtime) and the real ``mcp`` client. Eight sub-agents are
spawned over MCP; each run takes three turns (two tool rounds of ``lookup``, then the answer). Half
of them are paused on a tool call the fake MCP server holds (``/testkit/hold``), so they will come
back to the replica that holds their prefix; the other half keep generating, and one of the
engines is SIGKILLed while a turn of theirs is on it. Then the held calls are released.

Every run must complete, with all its turns and tool calls: a turn the dead engine held or was
sent goes to the other replica (the dataplane's failover, docs/failover.md), and anything still
refused is retried by the runtime (``[runtime] turn_retry_seconds``). The killed replica must be
shown as down on the scheduler's ``GET /status``.
"""

from __future__ import annotations

import asyncio
import json
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pods_helpers import call, payload, until

from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

HELD = "zebrafish"
"""The held runs' task: its one word is what the simulated engine looks up."""
GOING = "kangaroo"
"""The other runs' task."""
RUNS_EACH = 4
DECODE_MS = 40.0
"""Per token: a 64-token answer takes about 2.6 s, long enough to kill its engine during it."""


def _get(url: str, method: str = "GET") -> Any:
    request = urllib.request.Request(url, method=method)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _dataplane_failovers(stack: Stack) -> float:
    with urllib.request.urlopen(f"{stack.dataplane_url}/metrics", timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith('luftpause_dataplane_failovers_total{reason="unreachable"}'):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_every_sub_agent_completes_when_one_of_two_engines_is_killed(tmp_path: Path) -> None:
    with Stack.start(tmp_path, decode_ms=DECODE_MS, tool_rounds=2) as stack:
        stack.wait_connected()
        tools = stack.mcp_url.removesuffix("/mcp")
        _get(f"{tools}/testkit/hold/{HELD}", "POST")

        async def go() -> tuple[str, list[dict[str, Any]]]:
            async with Client(stack.runtime_url) as client:
                handles = [
                    (await call(client, "spawn", task=task, tools=["lookup"], maxTokens=64))["handle"]
                    for task in [HELD] * RUNS_EACH + [GOING] * RUNS_EACH
                ]

                async def all_held() -> bool:
                    return bool(_get(f"{tools}/testkit/calls").get(f"lookup {HELD}") == RUNS_EACH)

                await until(all_held, "every held run paused on its lookup", 120)

                async def generating_on() -> str | None:
                    # a replica with a turn on it now (the going runs' answers take seconds)
                    busy = [r["name"] for r in stack.status()["replicas"] if r["inflight"] > 0]
                    return busy[0] if busy else None

                victim = await until(generating_on, "a turn in flight on an engine", 120)
                stack.children[f"engine{victim.removeprefix('sim-')}"].kill()
                _get(f"{tools}/testkit/release/{HELD}", "POST")
                waited = await client.call_tool(
                    "await", {"handles": handles, "timeout": 300}, read_timeout_seconds=360
                )
                return victim, payload(waited)["runs"]

        victim, runs = asyncio.run(go())
        down = stack.wait_status(
            lambda s: not next(r for r in s["replicas"] if r["name"] == victim)["healthy"], timeout=60
        )
        failovers = _dataplane_failovers(stack)
        logs = stack.logs()

    assert [(r["state"], r.get("error")) for r in runs] == [("completed", None)] * len(runs), logs
    assert all((r["turns"], r["toolCalls"]) == (3, 2) for r in runs), runs
    replica = next(r for r in down["replicas"] if r["name"] == victim)
    assert not replica["healthy"] and replica["breaker"] == "open", replica
    assert failovers >= 1, logs  # the turn on the killed engine was sent on, not lost
