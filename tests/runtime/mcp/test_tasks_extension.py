"""The Tasks extension (``io.modelcontextprotocol/tasks``, 2026-07-28) on ``run``, through the real
``mcp`` client against the whole stack.

The client declares the extension through the SDK's own client-side extension API: a
``ClientExtension`` whose ``ResultClaim`` claims ``resultType: "task"`` (so the SDK advertises it in
every request's client capabilities and parses the task instead of refusing it). ``tasks/get``,
``tasks/update`` and ``tasks/cancel`` go out through ``ClientSession.send_request`` with request
models from tests/tasks_client_helpers.py (the SDK has none for the 2026-07-28 extension); their
``name_param`` makes the SDK set the ``Mcp-Name`` header to the task id, as the extension requires.
Tests poll faster than the suggested ``pollIntervalMs`` to stay quick.

A second fake MCP server runs with ``--destructive`` (as in ``test_runtime_approvals.py``): a run
spawned with :data:`DELETE` makes one ``delete_note`` call, which waits for approval, so a task
stays ``input_required`` until it is answered: a state the tests can hold deterministically,
including across a SIGKILL of the runtime.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, MCPError
from mcp.client.context import ClientRequestContext
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.types import CallToolResult, ElicitRequestParams, ElicitResult, TextContent
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS, MISSING_REQUIRED_CLIENT_CAPABILITY
from runtime_helpers import stack_with_destructive_tools
from tasks_client_helpers import TERMINAL, CreatedTask, cancel_task, get_task, poll, update_task

from luftpause.runtime.agent.approvals import Approvals
from luftpause.runtime.agent.upstream import UpstreamPool
from luftpause.runtime.mcp.spawn_tools import render_run_result
from luftpause.runtime.mcp.tasks import TASKS_JOURNAL_NAME, TaskJournal, TaskRegistry
from luftpause.runtime.mcp.tasks_extension import TASKS_EXTENSION
from luftpause.runtime.runs.journal import read_records
from luftpause.runtime.runs.postgres import PostgresDatabase
from luftpause.runtime.runs.registry import RunRegistry
from luftpause.runtime.runs.store import RecordStore
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

MODERN = "2026-07-28"
DELETE = {"task": "remove the obsolete note", "tools": ["delete_note"], "maxToolCalls": 1, "maxTokens": 32}


# The client side of the extension: tests/tasks_client_helpers.py.


class Tasks(ClientExtension):
    """Declares the extension; a task answered to ``Client.call_tool`` is polled to its end."""

    identifier = TASKS_EXTENSION

    def __init__(self) -> None:
        self.resolved: list[str] = []

    def claims(self) -> Sequence[ResultClaim[Any]]:
        return [ResultClaim(result_type="task", model=CreatedTask, resolve=self.resolve)]

    async def resolve(self, task: CreatedTask, ctx: ClaimContext) -> CallToolResult:
        self.resolved.append(task.task_id)
        state = await poll(ctx.session, task.task_id, lambda s: s["status"] in TERMINAL)
        assert state["status"] == "completed", state
        return CallToolResult.model_validate(state["result"])


# Fixtures and helpers.


class Tools:
    """The stack and the destructive fake MCP server beside it."""

    def __init__(self, stack: Stack, url: str) -> None:
        self.stack = stack
        self.url = url

    def calls(self, tool: str) -> int:
        with urllib.request.urlopen(self.url.removesuffix("/mcp") + "/testkit/calls", timeout=10) as response:
            counts: dict[str, int] = json.loads(response.read())
        return sum(n for key, n in counts.items() if key.split(" ", 1)[0] == tool)

    def journal(self) -> list[dict[str, Any]]:
        return list(read_records(self.stack.workdir / "state" / TASKS_JOURNAL_NAME))


@pytest.fixture(scope="module")
def tools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tools]:
    with stack_with_destructive_tools(tmp_path_factory.mktemp("tasks")) as (stack, danger_url):
        yield Tools(stack, danger_url)


class Person:
    """An elicitation callback; on the task path nobody should ever call it (questions travel in
    ``tasks/get``), so it records every call."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def __call__(self, context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
        self.asked.append(params.message)
        return ElicitResult(action="decline")


def _payload(result: CallToolResult) -> dict[str, Any]:
    text = "\n".join(b.text for b in result.content if isinstance(b, TextContent))
    assert not result.is_error, text
    assert isinstance(result.structured_content, dict), text
    return result.structured_content


def tasks_client(stack: Stack, **options: Any) -> Client:
    return Client(stack.runtime_url, mode=MODERN, extensions=[Tasks()], **options)


async def start_task(client: Client, arguments: dict[str, Any]) -> CreatedTask:
    created = await client.session.call_tool("run", arguments, read_timeout_seconds=30, allow_claimed=True)
    assert isinstance(created, CreatedTask), created
    return created


# Tests.


def test_a_tasks_client_gets_a_task_and_its_result_is_what_run_answers(tools: Tools) -> None:
    arguments = {"task": "tell me about otters", "maxTokens": 16}

    async def go() -> tuple[
        CreatedTask, list[dict[str, Any]], dict[str, Any], CallToolResult, CallToolResult
    ]:
        async with tasks_client(tools.stack) as client:
            created = await start_task(client, arguments)
            journal_at_answer = tools.journal()
            done = await poll(client.session, created.task_id, lambda s: s["status"] in TERMINAL)
            handle = done["result"]["structuredContent"]["runs"][0]["handle"]
            awaited = await client.call_tool("await", {"handles": [handle], "timeout": 0})
        async with Client(tools.stack.runtime_url, mode=MODERN) as plain:
            blocking = await plain.call_tool("run", {**arguments, "timeout": 60}, read_timeout_seconds=90)
        return created, journal_at_answer, done, awaited, blocking

    created, journal_at_answer, done, awaited, blocking = asyncio.run(go())
    assert created.status == "working" and created.task_id.startswith("task-")
    assert created.ttl_ms is None and created.poll_interval_ms is not None and created.poll_interval_ms > 0
    # Recorded durably before the answer was sent.
    assert [r["taskId"] for r in journal_at_answer if r["type"] == "task"][-1] == created.task_id
    assert done["status"] == "completed" and done["resultType"] == "complete", done
    assert done["createdAt"] == created.created_at and done["lastUpdatedAt"] >= done["createdAt"]
    assert isinstance(done["ttlMs"], int) and done["ttlMs"] > 0
    # Exactly what run (which answers as await does) gives for that run.
    result = CallToolResult.model_validate(done["result"])
    assert result.is_error is False
    assert result.structured_content == awaited.structured_content
    assert result.content == awaited.content
    assert (
        result.structured_content is not None and result.structured_content["runs"][0]["state"] == "completed"
    )
    # And the same shape a client without the extension gets from its one blocking call.
    blocking_payload = _payload(blocking)
    assert blocking_payload.keys() == result.structured_content.keys()
    assert blocking_payload["runs"][0].keys() == result.structured_content["runs"][0].keys()
    ended = [r for r in tools.journal() if r["type"] == "end" and r["taskId"] == created.task_id]
    assert [r["status"] for r in ended] == ["completed"]


def test_client_call_tool_resolves_a_task_through_the_claim(tools: Tools) -> None:
    """``Client.call_tool`` hands the task to the extension's resolver, which polls it: the caller
    sees an ordinary tool result."""
    extension = Tasks()

    async def go() -> CallToolResult:
        async with Client(tools.stack.runtime_url, mode=MODERN, extensions=[extension]) as client:
            return await client.call_tool("run", {"task": "tell me about seals", "maxTokens": 16})

    result = _payload(asyncio.run(go()))
    assert len(extension.resolved) == 1
    assert result["timedOut"] is False and result["runs"][0]["state"] == "completed"


@pytest.mark.parametrize("mode", [MODERN, "legacy"])
def test_a_client_without_the_extension_gets_the_blocking_run(tools: Tools, mode: str) -> None:
    async def go() -> tuple[Any, int]:
        async with Client(tools.stack.runtime_url, mode=mode) as client:
            answered = await client.session.call_tool(
                "run",
                {"task": "tell me about beavers", "maxTokens": 16},
                read_timeout_seconds=90,
                allow_claimed=True,
            )
            with pytest.raises(MCPError) as refused:
                await get_task(client.session, "task-0")
            return answered, refused.value.code

    answered, code = asyncio.run(go())
    assert isinstance(answered, CallToolResult), answered
    assert _payload(answered)["runs"][0]["state"] == "completed"
    # Modern: the extension's methods need the extension declared; legacy: no such method at all.
    assert code == (MISSING_REQUIRED_CLIENT_CAPABILITY if mode == MODERN else -32601)


def test_an_unknown_task_is_invalid_params(tools: Tools) -> None:
    async def go() -> list[MCPError]:
        errors = []
        async with tasks_client(tools.stack) as client:
            for call in (get_task, cancel_task):
                with pytest.raises(MCPError) as raised:
                    await call(client.session, "task-00000000000000000000000000000000")
                errors.append(raised.value)
        return errors

    errors = asyncio.run(go())
    assert [e.code for e in errors] == [INVALID_PARAMS, INVALID_PARAMS]
    assert "task-00000000000000000000000000000000" in errors[0].error.message


@pytest.mark.parametrize("allow", [True, None], ids=["allowed", "declined"])
def test_approval_is_input_required_and_tasks_update_answers_it(tools: Tools, allow: bool | None) -> None:
    person = Person()
    before = tools.calls("delete_note")

    async def go() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with tasks_client(tools.stack, elicitation_callback=person) as client:
            created = await start_task(client, DELETE)
            asking = await poll(client.session, created.task_id, lambda s: s["status"] != "working")
            [key] = asking["inputRequests"]
            # An answer to a key that is not outstanding is ignored: still waiting.
            ignored = await update_task(
                client.session,
                created.task_id,
                {"approve:nope": {"action": "accept", "content": {"allow": True}}},
            )
            still = await get_task(client.session, created.task_id)
            answer = {"action": "accept", "content": {"allow": True}} if allow else {"action": "decline"}
            ack = await update_task(client.session, created.task_id, {key: answer})
            # Answered: never asked again.
            after = await get_task(client.session, created.task_id)
            assert key not in after.get("inputRequests", {}), after
            done = await poll(client.session, created.task_id, lambda s: s["status"] in TERMINAL)
            return asking, ignored, still, ack, done

    asking, ignored, still, ack, done = asyncio.run(go())
    assert asking["status"] == "input_required", asking
    [(key, request)] = asking["inputRequests"].items()
    assert key.startswith("approve:")
    assert request["method"] == "elicitation/create"
    assert request["params"]["mode"] == "form" and "delete_note" in request["params"]["message"]
    assert request["params"]["requestedSchema"]["properties"]["allow"]["type"] == "boolean"
    assert ignored["resultType"] == "complete"
    assert still["status"] == "input_required" and still["inputRequests"] == asking["inputRequests"]
    assert ack["resultType"] == "complete"
    assert done["status"] == "completed", done
    run = done["result"]["structuredContent"]["runs"][0]
    assert run["state"] == "completed" and run["toolCalls"] == 1
    assert run["failedToolCalls"] == (0 if allow else 1)
    assert tools.calls("delete_note") == before + (1 if allow else 0)
    assert person.asked == []  # the question travelled in tasks/get, never as a callback


def test_a_client_without_elicitation_sees_working_and_answers_with_approve(tools: Tools) -> None:
    async def go() -> tuple[dict[str, Any], dict[str, Any]]:
        async with tasks_client(tools.stack) as client:
            created = await start_task(client, DELETE)
            waiting = await poll(
                client.session, created.task_id, lambda s: "approval" in (s.get("statusMessage") or "")
            )
            handle = waiting["statusMessage"].split()[1]
            _payload(await client.call_tool("approve", {"handle": handle, "allow": True}))
            done = await poll(client.session, created.task_id, lambda s: s["status"] in TERMINAL)
            return waiting, done

    waiting, done = asyncio.run(go())
    assert waiting["status"] == "working" and "inputRequests" not in waiting, waiting
    assert "approve" in waiting["statusMessage"]
    assert done["status"] == "completed"
    assert done["result"]["structuredContent"]["runs"][0]["failedToolCalls"] == 0


def test_tasks_cancel_cancels_the_run_and_its_running_descendants(tools: Tools) -> None:
    before = tools.calls("delete_note")

    async def go() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with tasks_client(tools.stack, elicitation_callback=Person()) as client:
            created = await start_task(client, DELETE)
            asking = await poll(client.session, created.task_id, lambda s: s["status"] == "input_required")
            handle = asking["statusMessage"].split()[1]  # "run <handle> waits for approval ..."
            child = _payload(await client.call_tool("spawn", {**DELETE, "parent": handle}))["handle"]
            ack = await cancel_task(client.session, created.task_id)
            cancelled = await poll(client.session, created.task_id, lambda s: s["status"] in TERMINAL)
            awaited = _payload(await client.call_tool("await", {"handles": [handle, child], "timeout": 5}))
            return ack, cancelled, awaited, {"handle": handle, "child": child}

    ack, cancelled, awaited, handles = asyncio.run(go())
    assert ack["resultType"] == "complete"
    assert cancelled["status"] == "cancelled" and "tasks/cancel" in cancelled["statusMessage"], cancelled
    assert "result" not in cancelled and "error" not in cancelled
    assert [r["handle"] for r in awaited["runs"]] == [handles["handle"], handles["child"]]
    assert [r["state"] for r in awaited["runs"]] == ["cancelled", "cancelled"], awaited
    assert tools.calls("delete_note") == before


def test_a_task_open_at_a_sigkill_fails_on_restart_and_its_run_resumes_and_completes(tools: Tools) -> None:
    """Runs last in this module: it restarts the runtime."""
    stack = tools.stack

    async def start() -> tuple[str, str]:
        async with tasks_client(stack, elicitation_callback=Person()) as client:
            created = await start_task(client, DELETE)
            asking = await poll(client.session, created.task_id, lambda s: s["status"] == "input_required")
            return created.task_id, asking["statusMessage"].split()[1]

    task_id, handle = asyncio.run(start())
    stack.children["runtime"].kill()
    assert [r["type"] for r in tools.journal() if r["taskId"] == task_id] == ["task"]
    # A crash mid-write leaves a torn last line: the restart must skip it, not fail on it.
    with (stack.workdir / "state" / TASKS_JOURNAL_NAME).open("ab") as journal:
        journal.write(b'{"type": "end", "taskId": "' + task_id.encode() + b'", "handle": "run-')
    stack.restart("runtime")

    async def after() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with tasks_client(stack) as client:
            failed = await get_task(client.session, task_id)
            # The run resumed, and asks for its approval again (it was never answered).
            waiting = _payload(await client.call_tool("await", {"handles": [handle], "timeout": 60}))
            _payload(await client.call_tool("approve", {"handle": handle, "allow": True}))
            done = _payload(await client.call_tool("await", {"handles": [handle], "timeout": 60}))
            return failed, waiting, done

    failed, waiting, done = asyncio.run(after())
    assert failed["status"] == "failed", failed
    assert failed["error"]["code"] == INTERNAL_ERROR
    assert "restarted" in failed["error"]["message"] and handle in failed["error"]["message"]
    assert failed["statusMessage"] == failed["error"]["message"]
    assert waiting["runs"][0]["state"] == "AwaitingApproval", waiting
    assert done["runs"][0]["state"] == "completed", done
    assert done["runs"][0]["failedToolCalls"] == 0
    assert [r["status"] for r in tools.journal() if r["taskId"] == task_id and r["type"] == "end"] == [
        "failed"
    ]


# The journal alone, in-process: replay, restart failure, retention, a torn last line.


def test_replay_fails_open_tasks_keeps_ended_ones_drops_expired_and_skips_a_torn_line(
    tmp_path: Path, store: str
) -> None:
    now = time.time()
    kept = {"type": "task", "taskId": "task-kept", "handle": "run-a", "at": now - 60, "elicits": True}
    kept_end = {
        "type": "end",
        "taskId": "task-kept",
        "handle": "run-a",
        "at": now - 30,
        "status": "completed",
        "statusMessage": "run run-a completed",
        "result": {"content": [], "isError": False},
    }
    old = {"type": "task", "taskId": "task-old", "handle": "run-b", "at": now - 7200, "elicits": False}
    old_end = {**kept_end, "taskId": "task-old", "handle": "run-b", "at": now - 7100}
    open_ = {"type": "task", "taskId": "task-open", "handle": "run-c", "at": now - 10, "elicits": False}
    path = tmp_path / TASKS_JOURNAL_NAME
    journal: RecordStore = TaskJournal(tmp_path)
    if store == "file":  # a torn last line too
        path.write_bytes(
            b"".join(json.dumps(r).encode() + b"\n" for r in (kept, old, open_, kept_end, old_end))
            + b'{"type": "end", "taskId": "task-open", "sta'
        )
    else:
        journal = PostgresDatabase(store).journal("tasks")
        journal.compact([kept, old, open_, kept_end, old_end])

    async def go() -> tuple[dict[str, Any], dict[str, Any], int]:
        runs = RunRegistry()
        approvals = Approvals(runs, UpstreamPool([]))
        tasks = TaskRegistry(journal, runs, approvals, render_run_result, retention_seconds=3600)
        async with tasks:
            failed = tasks.describe(tasks.get("task-open"))
            completed = tasks.describe(tasks.get("task-kept"))
            with pytest.raises(MCPError) as dropped:
                tasks.get("task-old")
        return failed, completed, dropped.value.code

    failed, completed, dropped_code = asyncio.run(go())
    assert failed["status"] == "failed" and failed["error"]["code"] == INTERNAL_ERROR
    assert "restarted" in failed["statusMessage"] and "run-c" in failed["statusMessage"]
    assert completed["status"] == "completed" and completed["result"] == kept_end["result"]
    assert completed["ttlMs"] == int((kept_end["at"] + 3600 - kept["at"]) * 1000)
    assert dropped_code == INVALID_PARAMS
    # Rewritten with the tasks still kept: the expired one and the torn line are gone.
    records = list(journal.records())
    assert [(r["type"], r["taskId"]) for r in records] == [
        ("task", "task-kept"),
        ("end", "task-kept"),
        ("task", "task-open"),
        ("end", "task-open"),
    ]
    if store == "file":
        assert path.read_bytes().endswith(b"\n")
