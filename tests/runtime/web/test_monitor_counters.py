"""The monitor's network shows a run's turns and tool calls as they change (review of
``luftpause top``): the network's JSON is cached per registry version, and a turn that ends in a
long tool round, or a tool call still running, changed the counters without a new version, so the
monitor (and ``luftpause top``) showed ``0``/``0`` while ``status`` said ``1``/``1``.

End to end: the real runtime process, the scripted engine of the pods tests
(:mod:`pods_helpers`) holding the run's first turn at a gate, and an MCP tool server in this
process whose ``hold`` tool answers only when the test releases it, so the run is inside its tool
round exactly as long as the test needs, without timing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import anyio
import pytest
import uvicorn
from mcp.server import MCPServer
from mcp.types import ToolAnnotations
from pods_helpers import Pod, call, get_json, script, start_pod, until
from pydantic import Field

from luftpause.testkit.commands.loadgen import runtime_client
from luftpause.testkit.launch.procs import free_port

pytestmark = pytest.mark.integration


class HoldingToolServer:
    """An MCP server (streamable HTTP at ``{url}``) with one read-only tool, ``hold(gate)``, that
    answers once :meth:`release` was called for its gate; served by uvicorn in a thread."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/mcp"
        self.started: set[str] = set()  # the gates a call is waiting at, or was
        self._released: set[str] = set()
        self._lock = threading.Lock()
        server = MCPServer("holding-tools", log_level="WARNING")

        async def hold(gate: Annotated[str, Field(description="The gate to wait at.")]) -> str:
            with self._lock:
                self.started.add(gate)
            while True:
                with self._lock:
                    if gate in self._released:
                        return f"released {gate}"
                await anyio.sleep(0.05)

        server.add_tool(
            hold,
            description="Wait until the test releases the gate.",
            annotations=ToolAnnotations(read_only_hint=True, destructive_hint=False),
            structured_output=False,
        )
        config = uvicorn.Config(
            server.streamable_http_app(host="127.0.0.1"),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            log_config=None,
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=1,
        )
        self._server = uvicorn.Server(config)  # no signal handlers off the main thread
        self._thread = threading.Thread(target=self._server.run, name="holding-tools", daemon=True)

    def release(self, gate: str) -> None:
        with self._lock:
            self._released.add(gate)

    def holding(self, gate: str) -> bool:
        with self._lock:
            return gate in self.started and gate not in self._released

    def __enter__(self) -> HoldingToolServer:
        self._thread.start()
        deadline = 30.0  # a fail-safe bound only
        while not self._server.started and self._thread.is_alive() and deadline > 0:
            threading.Event().wait(0.05)
            deadline -= 0.05
        assert self._server.started, "the holding tool server did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._released.update(self.started)
        self._server.should_exit = True
        self._thread.join(30)


@pytest.fixture()
def pod(tmp_path: Path, store: str) -> Iterator[tuple[Pod, HoldingToolServer]]:
    """The runtime with the scripted engine as its dataplane and the holding tool server."""
    with HoldingToolServer() as tools:
        holding = f'[[mcp_servers]]\nname = "holding"\nurl = "{tools.url}"\n'
        with start_pod(
            tmp_path, workspace=None, max_depth=None, max_children=None, extra_toml=holding, store=store
        ) as running:
            yield running, tools


def _network_row(pod: Pod, handle: str) -> dict[str, Any]:
    runs = get_json(f"{pod.url}/monitor/runs")["runs"]
    row: dict[str, Any] = next(r for r in runs if r["handle"] == handle)
    return row


def test_the_monitor_shows_a_turn_and_a_tool_call_while_the_tool_round_runs(
    pod: tuple[Pod, HoldingToolServer],
) -> None:
    runtime, tools = pod
    task = script({"hold": "turn", "call": "hold", "args": {"gate": "tool"}}, {"say": "done"})

    async def scenario() -> None:
        async with runtime_client(f"{runtime.url}/mcp") as client:
            handle = str((await call(client, "spawn", task=task, name="r"))["handle"])

            async def in_first_turn() -> bool:
                return runtime.engine.holding(handle)

            await until(in_first_turn, "the run's first turn held at the engine")
            # Read while the turn runs: the monitor builds (and caches) the network now.
            before = await asyncio.to_thread(_network_row, runtime, handle)
            assert (before["state"], before["turns"], before["toolCalls"]) == ("running", 0, 0)
            runtime.engine.release("turn")

            async def in_tool_round() -> bool:
                return tools.holding("tool")

            await until(in_tool_round, "the run's tool call waiting at the tool server")
            status = (await call(client, "status", handle=handle))["run"]
            assert (status["turns"], status["toolCalls"]) == (1, 1), status
            during = await asyncio.to_thread(_network_row, runtime, handle)
            assert (during["state"], during["turns"], during["toolCalls"]) == ("running", 1, 1), during
            tools.release("tool")

            async def answered() -> dict[str, Any] | None:
                row = await asyncio.to_thread(_network_row, runtime, handle)
                return row if row["state"] == "idle" else None

            after = await until(answered, "the run's answer")
            assert (after["turns"], after["toolCalls"], after["lastAnswer"]) == (2, 1, "done")

    asyncio.run(scenario())
