"""Approval of tool calls, through the real ``mcp`` client against the whole stack.

A second fake MCP server runs with ``--destructive``: its ``delete_note`` is marked
``destructiveHint: true`` and takes a second, so a runtime can be killed while an approved call is
in flight. A run spawned with ``tools=["delete_note"]`` and ``maxToolCalls=1`` makes exactly one
such call (the simulated model calls the only tool it is offered, then answers). ``approveTools``
gates a read-only tool (``lookup``) the same way.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from mcp import Client
from mcp.client.context import ClientRequestContext
from mcp.types import CallToolResult, ElicitRequestParams, ElicitResult, TextContent
from postgres_helpers import STORES, store_of
from runtime_helpers import stack_with_destructive_tools, stored

from luftpause.runtime.agent.approvals import DECLINED
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration


class Tools:
    """The destructive fake MCP server's URL next to the stack, and the runtime's store."""

    def __init__(self, stack: Stack, url: str, store: str) -> None:
        self.stack = stack
        self.url = url
        self.store = store

    def records(self) -> list[dict[str, Any]]:
        """Every record of the runtime's runs store, in order (``runs.jsonl``, or the rows)."""
        return stored(self.store, self.stack.workdir / "state")

    def calls(self, tool: str) -> int:
        with urllib.request.urlopen(self.url.removesuffix("/mcp") + "/testkit/calls", timeout=10) as response:
            counts: dict[str, int] = json.loads(response.read())
        return sum(n for key, n in counts.items() if key.split(" ", 1)[0] == tool)

    def delete_note_gate(self, action: str) -> None:
        """``hold`` or ``release`` the destructive server's ``delete_note`` calls."""
        url = self.url.removesuffix("/mcp") + f"/testkit/delete_note/{action}"
        with urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=10):
            pass


@pytest.fixture(scope="module", params=STORES)
def tools(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tools]:
    store = store_of(request)
    with stack_with_destructive_tools(tmp_path_factory.mktemp("approvals"), store=store) as (
        stack,
        danger_url,
    ):
        yield Tools(stack, danger_url, store)


def _payload(result: CallToolResult) -> dict[str, Any]:
    text = "\n".join(b.text for b in result.content if isinstance(b, TextContent))
    assert not result.is_error, text
    assert isinstance(result.structured_content, dict), text
    return result.structured_content


def _error(result: CallToolResult) -> str:
    assert result.is_error, result
    return "\n".join(b.text for b in result.content if isinstance(b, TextContent))


class Person:
    """An elicitation callback that answers every approval form with ``allow`` (or declines)."""

    def __init__(self, allow: bool | None) -> None:
        self.allow = allow
        self.asked: list[str] = []

    async def __call__(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        self.asked.append(params.message)
        assert params.mode == "form"
        assert params.requested_schema["properties"]["allow"]["type"] == "boolean"
        if self.allow is None:
            return ElicitResult(action="decline")
        return ElicitResult(action="accept", content={"allow": self.allow})


DELETE = {"task": "remove the obsolete note", "tools": ["delete_note"], "maxToolCalls": 1, "maxTokens": 32}


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
def test_run_asks_by_elicitation_and_an_allowed_call_goes_through(tools: Tools, mode: str) -> None:
    person = Person(allow=True)
    before = tools.calls("delete_note")

    async def go() -> dict[str, Any]:
        async with Client(tools.stack.runtime_url, elicitation_callback=person, mode=mode) as client:
            return _payload(await client.call_tool("run", {**DELETE, "timeout": 60}, read_timeout_seconds=90))

    result = asyncio.run(go())
    run = result["runs"][0]
    assert run["state"] == "completed", run
    assert (run["toolCalls"], run["failedToolCalls"]) == (1, 0)
    assert len(person.asked) == 1 and "delete_note" in person.asked[0], person.asked
    assert tools.calls("delete_note") == before + 1


@pytest.mark.parametrize("mode", ["2026-07-28", "legacy"])
@pytest.mark.parametrize("answer", [False, None], ids=["allow-false", "decline"])
def test_a_refusal_by_elicitation_fails_the_call_and_never_reaches_the_tool(
    tools: Tools, mode: str, answer: bool | None
) -> None:
    person = Person(allow=answer)
    before = tools.calls("delete_note")

    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(tools.stack.runtime_url, elicitation_callback=person, mode=mode) as client:
            handle = _payload(await client.call_tool("spawn", DELETE))["handle"]
            waited = _payload(
                await client.call_tool("await", {"handles": [handle], "timeout": 60}, read_timeout_seconds=90)
            )
            return waited, _payload(await client.call_tool("status", {"handle": handle}))

    waited, status = asyncio.run(go())
    run = waited["runs"][0]
    assert run["state"] == "completed", run
    assert (run["toolCalls"], run["failedToolCalls"]) == (1, 1)
    assert len(person.asked) == 1
    assert tools.calls("delete_note") == before
    assert "pendingApproval" not in status["run"]


def test_a_client_without_elicitation_sees_awaiting_approval_and_answers_with_approve(tools: Tools) -> None:
    before = tools.calls("delete_note")

    async def go() -> tuple[dict[str, Any], dict[str, Any], str, dict[str, Any], str]:
        async with Client(tools.stack.runtime_url) as client:
            handle = _payload(await client.call_tool("spawn", DELETE))["handle"]
            waiting = _payload(
                await client.call_tool("await", {"handles": [handle], "timeout": 60}, read_timeout_seconds=90)
            )
            answered = _payload(await client.call_tool("approve", {"handle": handle, "allow": True}))
            again = _error(await client.call_tool("approve", {"handle": handle, "allow": True}))
            done = _payload(
                await client.call_tool("await", {"handles": [handle], "timeout": 60}, read_timeout_seconds=90)
            )
            unknown = _error(
                await client.call_tool("approve", {"handle": "run-0000000000000000", "allow": False})
            )
            return waiting, answered, again, done, unknown

    waiting, answered, again, done, unknown = asyncio.run(go())
    run = waiting["runs"][0]
    # The wait ended early (no timeout) to say the run waits for the person.
    assert waiting["timedOut"] is False
    assert run["state"] == "AwaitingApproval", run
    assert run["pendingApproval"]["tool"] == "delete_note"
    assert isinstance(run["pendingApproval"]["arguments"].get("title"), str)
    assert answered["tool"] == "delete_note" and answered["allow"] is True
    assert answered["arguments"] == run["pendingApproval"]["arguments"]
    assert "waits for no approval" in again
    assert done["runs"][0]["state"] == "completed"
    assert (done["runs"][0]["failedToolCalls"], tools.calls("delete_note")) == (0, before + 1)
    assert "unknown" in unknown.lower() or "no run" in unknown.lower(), unknown


def test_approve_tools_gates_a_read_only_tool_and_a_refusal_is_declined(tools: Tools) -> None:
    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(tools.stack.runtime_url) as client:
            spawned = await client.call_tool(
                "spawn",
                {"task": "look it up", "tools": ["lookup"], "approveTools": ["lookup"], "maxToolCalls": 1},
            )
            handle = _payload(spawned)["handle"]
            waiting = _payload(await client.call_tool("await", {"handles": [handle], "timeout": 60}))
            _payload(await client.call_tool("approve", {"handle": handle, "allow": False}))
            done = _payload(await client.call_tool("await", {"handles": [handle], "timeout": 60}))
            return waiting, done

    waiting, done = asyncio.run(go())
    assert waiting["runs"][0]["pendingApproval"]["tool"] == "lookup"
    assert done["runs"][0]["state"] == "completed"
    assert done["runs"][0]["failedToolCalls"] == 1
    assert DECLINED == "Error: the user declined this tool call"


def test_an_approval_covers_one_execution_across_a_sigkill_and_an_unanswered_one_is_asked_again(
    tools: Tools,
) -> None:
    """Run A is allowed and killed while its call is in flight (held at the tool server); run B
    is still waiting for its person at the kill. The approval of A was used up when its call
    started (a ``started`` record), so after the restart A is asked again, told the call may have
    run already (the person decides whether it is repeated; it never is silently); B is asked
    again; both complete."""
    stack = tools.stack
    tasks = {"A": "erase the draft note", "B": "drop the stale note"}

    async def spawn() -> dict[str, str]:
        async with Client(stack.runtime_url) as client:
            handles = {}
            for name, task in tasks.items():
                handles[name] = _payload(await client.call_tool("spawn", {**DELETE, "task": task}))["handle"]
            for handle in handles.values():
                waiting = _payload(await client.call_tool("await", {"handles": [handle], "timeout": 60}))
                assert waiting["runs"][0]["state"] == "AwaitingApproval", waiting
            _payload(await client.call_tool("approve", {"handle": handles["A"], "allow": True}))
            return handles

    before = tools.calls("delete_note")
    tools.delete_note_gate("hold")  # A's call stays in flight until the runtime is killed
    try:
        handles = asyncio.run(spawn())
        deadline = time.monotonic() + 30
        while tools.calls("delete_note") == before:  # A's call reached the tool: it is in flight now
            assert time.monotonic() < deadline, stack.logs()
            time.sleep(0.01)
        stack.children["runtime"].kill()
    finally:
        tools.delete_note_gate("release")
    journal = tools.records()
    decisions = [r for r in journal if r["type"] == "approval"]
    assert [(r["handle"], r["allow"]) for r in decisions if r["handle"] in handles.values()] == [
        (handles["A"], True)
    ]
    assert not any(r["type"] in ("round", "end") and r["handle"] == handles["A"] for r in journal), (
        "A's round completed before the kill: nothing would be tested"
    )
    started = [r["handle"] for r in journal if r["type"] == "started" and r["handle"] in handles.values()]
    assert started == [handles["A"]]
    stack.restart("runtime")

    person = Person(allow=True)

    async def finish() -> dict[str, Any]:
        async with Client(stack.runtime_url, elicitation_callback=person) as client:
            return _payload(
                await client.call_tool(
                    "await", {"handles": list(handles.values()), "timeout": 60}, read_timeout_seconds=90
                )
            )

    result = asyncio.run(finish())
    assert [r["state"] for r in result["runs"]] == ["completed", "completed"], result
    assert [r["failedToolCalls"] for r in result["runs"]] == [0, 0]
    asked = {handle: [q for q in person.asked if handle in q] for handle in handles.values()}
    assert len(asked[handles["A"]]) == 1 and "may have run already" in asked[handles["A"]][0], person.asked
    assert len(asked[handles["B"]]) == 1 and "may have run already" not in asked[handles["B"]][0]
    journal = tools.records()
    decided = [(r["handle"], r["allow"]) for r in journal if r["type"] == "approval"]
    assert decided.count((handles["A"], True)) == 2 and decided.count((handles["B"], True)) == 1
