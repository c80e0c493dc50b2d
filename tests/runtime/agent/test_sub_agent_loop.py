"""The sub-agent loop end to end: the real runtime process, driven through the real ``mcp`` client,
with a scripted engine as its dataplane and real upstream MCP servers (a stdio server the runtime
starts itself, the HTTP fake-mcp, and one configured server that is not there).

The scripted engine (an aiohttp app in a thread of the test process) answers every turn from the
run's task: the task's first word names a scenario (:data:`SCENARIOS`), the rest is its parameter.
It records every request it got, by run id, so a test can check the headers and bodies the runtime
sent, and it answers from the conversation it is sent, as a model does.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from pathlib import Path
from typing import Any

import httpx2
import pytest
from aiohttp import web
from mcp import Client
from mcp.types import CallToolResult, Implementation, TextContent
from postgres_helpers import STORES, on_the_file_journal, store_line, store_of

import luftpause
from luftpause.config import DEFAULT_MODEL
from luftpause.runtime.dataplane import TURN_TIMEOUT_SECONDS, DataplaneClient, retry_after_seconds
from luftpause.testkit.fakes.fake_mcp_stdio import CALLS_LOG_ENV, read_calls
from luftpause.testkit.launch.procs import ChildProcess, free_port
from luftpause.testkit.launch.threaded_app import ThreadedApp

pytestmark = pytest.mark.integration

Answer = tuple[int, dict[str, Any], dict[str, str]]
"""A scripted reply: (HTTP status, JSON body, headers)."""


def _reply(content: str | None, calls: list[dict[str, Any]] | None = None) -> Answer:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    body = {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "model": DEFAULT_MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12},
    }
    return 200, body, {}


def _call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_results(body: dict[str, Any]) -> list[str]:
    return [m["content"] for m in body["messages"] if m.get("role") == "tool"]


def _offered(body: dict[str, Any]) -> list[str]:
    return [tool["function"]["name"] for tool in body.get("tools", [])]


Scenario = Callable[[str, dict[str, Any], int], Answer]
"""(the task's parameter, the request body, how many requests this run made before) -> reply."""


def _answer(param: str, body: dict[str, Any], attempt: int) -> Answer:
    return _reply("ok")


def _coerce(param: str, body: dict[str, Any], attempt: int) -> Answer:
    # The model writes an integer as text, a common slip; the tool validates strictly.
    results = _tool_results(body)
    if not results:
        return _reply(None, [_call("call_c1", "count_items", '{"limit": "3"}')])
    return _reply(results[-1])


def _refuse_then_fix(param: str, body: dict[str, Any], attempt: int) -> Answer:
    results = _tool_results(body)
    if not results:
        return _reply(None, [_call("call_r1", "count_items", '{"limit": "three"}')])
    if len(results) == 1:
        return _reply(None, [_call("call_r2", "count_items", '{"limit": 5}')])
    return _reply("\n".join(results))


def _text_call(param: str, body: dict[str, Any], attempt: int) -> Answer:
    results = _tool_results(body)
    if not results:
        return _reply('<tool_call>\n{"name": "count_items", "arguments": {"limit": "4"}}\n</tool_call>')
    return _reply(results[-1])


def _text_not_offered(param: str, body: dict[str, Any], attempt: int) -> Answer:
    return _reply('{"name": "format_disk", "arguments": {}}')


def _two_at_once(param: str, body: dict[str, Any], attempt: int) -> Answer:
    results = _tool_results(body)
    if not results:
        seconds = float(param)
        return _reply(
            None,
            [
                _call("call_a", "rendezvous", json.dumps({"name": "a", "seconds": seconds})),
                _call("call_b", "rendezvous", json.dumps({"name": "b", "seconds": seconds})),
            ],
        )
    return _reply("\n".join(results))


def _twins(param: str, body: dict[str, Any], attempt: int) -> Answer:
    # Two identical calls in one reply (the review's case: one approval let both run).
    results = _tool_results(body)
    if not results:
        arguments = '{"limit": 2}'
        return _reply(
            None, [_call("call_t1", "count_items", arguments), _call("call_t2", "count_items", arguments)]
        )
    return _reply(" | ".join(results))


def _die(param: str, body: dict[str, Any], attempt: int) -> Answer:
    results = _tool_results(body)
    if not results:
        return _reply(None, [_call("call_d1", "exit_mid_call", "{}")])
    return _reply(results[-1])


def _greedy(param: str, body: dict[str, Any], attempt: int) -> Answer:
    # Calls a tool whenever one is offered; answers only when none is.
    results = _tool_results(body)
    if "count_items" in _offered(body):
        return _reply(None, [_call(f"call_g{len(results)}", "count_items", '{"limit": 1}')])
    return _reply(f"done after {len(results)} calls")


def _busy(param: str, body: dict[str, Any], attempt: int) -> Answer:
    if attempt == 0:
        return 429, {"error": {"message": "queue full"}}, {"Retry-After": "0"}
    if attempt == 1:  # an HTTP date (RFC 9110 section 10.2.3), already past: retry at once
        past = format_datetime(datetime.now(UTC) - timedelta(seconds=30), usegmt=True)
        return 429, {"error": {"message": "queue full"}}, {"Retry-After": past}
    return _reply("ok after waiting")


def _always_busy(param: str, body: dict[str, Any], attempt: int) -> Answer:
    return 429, {"error": {"message": "queue full"}}, {"Retry-After": "0.1"}


SCENARIOS: dict[str, Scenario] = {
    "answer": _answer,
    "coerce": _coerce,
    "refuse-then-fix": _refuse_then_fix,
    "text-call": _text_call,
    "text-not-offered": _text_not_offered,
    "two-at-once": _two_at_once,
    "twins": _twins,
    "die": _die,
    "greedy": _greedy,
    "busy": _busy,
    "always-busy": _always_busy,
}


@dataclass
class Request:
    headers: dict[str, str]
    body: dict[str, Any]


class ScriptedEngine(ThreadedApp):
    """The runtime's dataplane in these tests: an aiohttp app on a loopback port, in its own thread
    and event loop (the runtime calls it while the test's own loop waits on MCP calls)."""

    def __init__(self) -> None:
        super().__init__("scripted-engine")
        self.requests: dict[str, list[Request]] = defaultdict(list)
        self.ended: list[str] = []

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        run_id = request.headers.get("x-luftpause-run-id", "")
        attempt = len(self.requests[run_id])
        self.requests[run_id].append(Request(dict(request.headers), body))
        task = next(m["content"] for m in body["messages"] if m["role"] == "user")
        name, _, param = task.partition(" ")
        status, reply, headers = SCENARIOS[name](param, body, attempt)
        return web.json_response(reply, status=status, headers=headers)

    async def _end(self, request: web.Request) -> web.Response:
        self.ended.append(request.match_info["handle"])
        return web.json_response({})

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_delete("/v1/runs/{handle}", self._end)


@dataclass
class Setup:
    mcp_url: str
    engine: ScriptedEngine
    stdio_calls: Path
    runtime: ChildProcess


@pytest.fixture(scope="module", params=STORES)
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Setup]:
    """The scripted engine, fake-mcp (HTTP) and the runtime (which starts the stdio server); once
    on each store."""
    store = store_of(request)
    workdir = tmp_path_factory.mktemp("loop")
    mcp_port, runtime_port, nobody_port = free_port(), free_port(), free_port()
    stdio_calls = workdir / "stdio-calls.jsonl"
    source_root = Path(luftpause.__file__).resolve().parent.parent
    engine = ScriptedEngine()
    config = workdir / "luftpause.toml"
    config.write_text(
        f"""
[runtime]
listen = "127.0.0.1:{runtime_port}"
dataplane = "{engine.url}"
state_dir = "{workdir / "state"}"
{store_line(store)}
[[replicas]]
name = "scripted"
url = "{engine.url}"
models = ["{DEFAULT_MODEL}"]

[[mcp_servers]]
name = "local"
command = [{json.dumps(sys.executable)}, "-m", "luftpause.testkit.fakes.fake_mcp_stdio"]
env = {{ {CALLS_LOG_ENV} = {json.dumps(str(stdio_calls))}, PYTHONPATH = {json.dumps(str(source_root))} }}

[[mcp_servers]]
name = "web"
url = "http://127.0.0.1:{mcp_port}/mcp"

[[mcp_servers]]
name = "nobody"
url = "http://127.0.0.1:{nobody_port}/mcp"
"""
    )
    fake_mcp = ChildProcess(
        "fake-mcp",
        ["fake-mcp", "--port", str(mcp_port)],
        log_path=workdir / "fake-mcp.log",
        ready_port=("127.0.0.1", mcp_port),
    )
    runtime = ChildProcess(
        "runtime",
        ["runtime", "--config", str(config)],
        log_path=workdir / "runtime.log",
        env={"LUFTPAUSE_TOKEN": ""},
        ready_url=f"http://127.0.0.1:{runtime_port}/health",
    )
    started: list[ChildProcess] = []
    engine.start()
    try:
        for child in (fake_mcp, runtime):
            started.append(child.start())
            child.wait_ready()
        yield Setup(f"http://127.0.0.1:{runtime_port}/mcp", engine, stdio_calls, runtime)
    finally:
        for child in reversed(started):
            child.stop()
        engine.stop()


def _text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def _payload(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, _text(result)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


async def _spawn_and_await(client: Client, task: str, **extra: Any) -> dict[str, Any]:
    handle = _payload(await client.call_tool("spawn", {"task": task, **extra}))["handle"]
    result = _payload(
        await client.call_tool("await", {"handles": [handle], "timeout": 60}, read_timeout_seconds=90)
    )
    (run,) = result["runs"]
    assert run["state"] != "running", run
    return dict(run)


def _run(setup: Setup, task: str, **extra: Any) -> dict[str, Any]:
    async def scenario() -> dict[str, Any]:
        async with Client(setup.mcp_url) as client:
            return await _spawn_and_await(client, task, **extra)

    return asyncio.run(scenario())


# Headers and limits.


def test_turns_carry_run_class_and_caller_in_both_protocol_eras(setup: Setup) -> None:
    async def scenario(mode: str, name: str) -> dict[str, Any]:
        info = Implementation(name=name, version="1.0")
        async with Client(setup.mcp_url, mode=mode, client_info=info) as client:  # type: ignore[arg-type]
            run = await _spawn_and_await(client, "answer", serviceClass="batch")
            status = _payload(await client.call_tool("status", {"handle": run["handle"]}))
            return {**run, "caller": status["run"]["caller"]}

    legacy = asyncio.run(scenario("legacy", "harness-legacy"))
    modern = asyncio.run(scenario("auto", "harness-modern"))
    for run in (legacy, modern):
        assert run["state"] == "completed", run
        (request,) = setup.engine.requests[run["handle"]]
        assert request.headers["x-luftpause-run-id"] == run["handle"]
        assert request.headers["x-luftpause-class"] == "batch"
        assert request.headers["x-luftpause-caller"] == run["caller"]
    # 2025-era: the MCP session (its id); 2026-07-28 has no session: the client's declared name.
    assert legacy["caller"] != "harness-legacy" and len(legacy["caller"]) >= 16
    assert modern["caller"] == "harness-modern"


def test_max_tokens_is_256_by_default_and_not_sent_when_zero(setup: Setup) -> None:
    default = _run(setup, "answer")
    engines = _run(setup, "answer", maxTokens=0)
    assert default["state"] == engines["state"] == "completed"
    assert setup.engine.requests[default["handle"]][0].body["max_tokens"] == 256
    assert "max_tokens" not in setup.engine.requests[engines["handle"]][0].body


def test_tool_budget_is_eight_by_default_then_no_tools_are_offered(setup: Setup) -> None:
    run = _run(setup, "greedy")
    assert run["state"] == "completed", run
    assert run["answer"] == "done after 8 calls"
    assert (run["toolCalls"], run["failedToolCalls"], run["turns"]) == (8, 0, 9)
    bodies = [request.body for request in setup.engine.requests[run["handle"]]]
    assert all("count_items" in _offered(body) for body in bodies[:8])
    assert "tools" not in bodies[8] and "parallel_tool_calls" not in bodies[8]


def test_spawn_tools_limits_what_the_model_is_offered(setup: Setup) -> None:
    run = _run(setup, "answer", tools=["count_items", "lookup"])
    assert run["state"] == "completed", run
    (request,) = setup.engine.requests[run["handle"]]
    assert sorted(_offered(request.body)) == ["count_items", "lookup"]


# 429s and timeouts.


def test_a_429_is_retried_after_retry_after_seconds_or_http_date(setup: Setup) -> None:
    run = _run(setup, "busy")
    assert run["state"] == "completed" and run["answer"] == "ok after waiting", run
    assert run["turns"] == 1  # the two refusals were waited out, not counted as turns
    requests = setup.engine.requests[run["handle"]]
    assert len(requests) == 3
    assert all(r.headers["x-luftpause-run-id"] == run["handle"] for r in requests)


def test_a_run_waiting_out_429s_stops_when_cancelled(setup: Setup) -> None:
    async def scenario() -> dict[str, Any]:
        async with Client(setup.mcp_url) as client:
            handle = _payload(await client.call_tool("spawn", {"task": "always-busy"}))["handle"]
            for _ in range(600):  # until refused at least twice and trying again
                if len(setup.engine.requests[handle]) >= 3:
                    break
                await asyncio.sleep(0.05)
            _payload(await client.call_tool("cancel", {"handle": handle}))
            result = _payload(await client.call_tool("await", {"handles": [handle], "timeout": 30}))
            return dict(result["runs"][0])

    run = asyncio.run(scenario())
    assert run["state"] == "cancelled" and run["turns"] == 0
    deadline = time.monotonic() + 30  # the end is sent after the run's answer: poll, generously
    while run["handle"] not in setup.engine.ended and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run["handle"] in setup.engine.ended  # the dataplane is told the run is over


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        (None, 1.0),
        ("0", 0.0),
        ("7", 7.0),
        ("2.5", 2.5),
        ("-3", 0.0),
        ("soon", 1.0),
        ("", 1.0),
        ("nan", 1.0),
        ("inf", 1.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 0.0),  # a date in the past: at once
        ("99999999", TURN_TIMEOUT_SECONDS),
    ],
)
def test_retry_after_reads_seconds_and_http_dates(header: str | None, seconds: float) -> None:
    assert retry_after_seconds(header) == seconds


def test_retry_after_as_a_future_http_date_waits_until_then() -> None:
    now = datetime(2026, 11, 30, 12, 0, 0, tzinfo=UTC)
    header = format_datetime(now + timedelta(seconds=42), usegmt=True)
    assert retry_after_seconds(header, now=now) == 42.0


def test_no_http_client_timeout_cuts_a_turn_shorter_than_ten_minutes() -> None:
    async def timeouts() -> httpx2.Timeout:
        async with DataplaneClient("http://127.0.0.1:1") as client:
            return client.http.timeout

    timeout = asyncio.run(timeouts())
    assert TURN_TIMEOUT_SECONDS == 600.0
    # httpx's own default is 5 s for each part; none of them may be shorter than a turn.
    for part in (timeout.connect, timeout.read, timeout.write, timeout.pool):
        assert part is None or part >= TURN_TIMEOUT_SECONDS
    # (No pool cap either: tests/runtime/runs/test_shutdown_ends_runs.py holds 120 requests open at once.)


# Tool-call sanity, through the real stdio server.


def _calls(setup: Setup, tool: str) -> list[dict[str, Any]]:
    return [c for c in read_calls(setup.stdio_calls) if c["tool"] == tool and c["event"] == "start"]


def test_an_integer_written_as_text_reaches_the_tool_as_an_integer(setup: Setup) -> None:
    run = _run(setup, "coerce")
    assert run["state"] == "completed", run
    assert json.loads(run["answer"]) == {"limit": 3, "type": "int"}
    assert (run["toolCalls"], run["failedToolCalls"]) == (1, 0)
    # The conversation keeps the call as the model wrote it (engines match calls byte for byte).
    last = setup.engine.requests[run["handle"]][-1].body["messages"]
    assert last[1]["tool_calls"][0]["function"]["arguments"] == '{"limit": "3"}'


def test_invalid_arguments_are_refused_to_the_model_which_may_try_again(setup: Setup) -> None:
    before = len(_calls(setup, "count_items"))
    run = _run(setup, "refuse-then-fix")
    assert run["state"] == "completed", run
    refusal, success = run["answer"].split("\n", 1)
    assert refusal.startswith("Error: invalid arguments for count_items: ")
    assert "integer" in refusal and "limit" in refusal
    assert json.loads(success) == {"limit": 5, "type": "int"}
    assert (run["toolCalls"], run["failedToolCalls"]) == (2, 1)
    # The refused call never reached the server.
    assert [c["arguments"] for c in _calls(setup, "count_items")[before:]] == [{"limit": 5}]


def test_a_tool_call_written_as_the_whole_reply_is_made(setup: Setup) -> None:
    run = _run(setup, "text-call")
    assert run["state"] == "completed", run
    assert json.loads(run["answer"]) == {"limit": 4, "type": "int"}
    assert (run["toolCalls"], run["failedToolCalls"], run["turns"]) == (1, 0, 2)
    messages = setup.engine.requests[run["handle"]][-1].body["messages"]
    assistant, tool = messages[1], messages[2]
    assert assistant["tool_calls"][0]["function"]["name"] == "count_items"
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"]


def test_text_naming_a_tool_not_offered_stays_the_answer(setup: Setup) -> None:
    run = _run(setup, "text-not-offered")
    assert run["state"] == "completed", run
    assert run["answer"] == '{"name": "format_disk", "arguments": {}}'
    assert run["toolCalls"] == 0


# Parallel tool calls.


def test_parallel_tool_calls_run_at_once_when_enabled(setup: Setup) -> None:
    run = _run(setup, "two-at-once 30", parallelToolCalls=True)
    assert run["state"] == "completed", run
    assert run["answer"] == "met a\nmet b"  # each saw the other in flight, results in call order
    assert setup.engine.requests[run["handle"]][0].body["parallel_tool_calls"] is True


def test_several_calls_in_one_reply_run_one_after_another_by_default(setup: Setup) -> None:
    before = len(read_calls(setup.stdio_calls))
    run = _run(setup, "two-at-once 0.3")
    assert run["state"] == "completed", run
    assert run["answer"] == "alone a\nalone b"
    assert setup.engine.requests[run["handle"]][0].body["parallel_tool_calls"] is False
    order = [(c["event"], c["arguments"].get("name")) for c in read_calls(setup.stdio_calls)[before:]]
    assert order == [("start", "a"), ("end", "a"), ("start", "b"), ("end", "b")]


# A stdio server that dies, and the tools tool.


async def _catalog(client: Client, **arguments: Any) -> dict[str, dict[str, Any]]:
    servers = _payload(await client.call_tool("tools", arguments))["servers"]
    return {server["server"]: server for server in servers}


def test_a_stdio_server_dying_mid_call_fails_that_call_once_and_is_restarted(setup: Setup) -> None:
    run = _run(setup, "die")
    assert run["state"] == "completed", run
    assert run["answer"].startswith("Error: ") and "Connection closed" in run["answer"]
    assert (run["toolCalls"], run["failedToolCalls"]) == (1, 1)

    async def until_back() -> dict[str, dict[str, Any]]:
        async with Client(setup.mcp_url) as client:
            for _ in range(400):
                catalog = await _catalog(client)
                if catalog["local"]["reachable"]:
                    return catalog
                await asyncio.sleep(0.05)
            raise AssertionError(f"the stdio server was not restarted: {catalog['local']}")

    asyncio.run(until_back())
    after = _run(setup, "coerce")
    assert after["state"] == "completed" and json.loads(after["answer"])["limit"] == 3
    (died,) = _calls(setup, "exit_mid_call")  # never sent again, neither by the loop nor the restart
    assert _calls(setup, "count_items")[-1]["pid"] != died["pid"]  # a new process answered


@on_the_file_journal("setup")
def test_tools_lists_tools_by_server_with_schemas_annotations_and_reachability(setup: Setup) -> None:
    async def scenario() -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
        async with Client(setup.mcp_url) as client:
            everything = await _catalog(client)
            run = await _spawn_and_await(client, "answer", tools=["count_items", "lookup"])
            return everything, await _catalog(client, handle=run["handle"])

    everything, limited = asyncio.run(scenario())
    assert list(everything) == ["local", "web", "nobody"]
    local, web_server, nobody = everything["local"], everything["web"], everything["nobody"]
    assert local["transport"] == "stdio" and local["reachable"] is True
    tools = {tool["name"]: tool for tool in local["tools"]}
    assert set(tools) == {"count_items", "rendezvous", "exit_mid_call", "pid", "delete_note"}
    assert tools["count_items"]["inputSchema"]["properties"]["limit"]["type"] == "integer"
    assert tools["count_items"]["annotations"]["readOnlyHint"] is True
    assert tools["delete_note"]["annotations"]["destructiveHint"] is True
    assert tools["delete_note"]["description"]
    assert web_server["transport"] == "http" and web_server["reachable"] is True
    assert {tool["name"] for tool in web_server["tools"]} == {"lookup", "deep_search"}
    assert nobody["reachable"] is False and nobody["error"] and nobody["tools"] == []
    assert [t["name"] for t in limited["local"]["tools"]] == ["count_items"]
    assert [t["name"] for t in limited["web"]["tools"]] == ["lookup"]


def test_tools_for_an_unknown_handle_is_a_tool_error(setup: Setup) -> None:
    async def scenario() -> CallToolResult:
        async with Client(setup.mcp_url) as client:
            return await client.call_tool("tools", {"handle": "run-nosuchrun"})

    result = asyncio.run(scenario())
    assert result.is_error and "run-nosuchrun" in _text(result)


# Approvals of several calls in one reply.


def test_two_gated_calls_in_one_reply_are_each_asked_and_answered_on_their_own(setup: Setup) -> None:
    """Two identical gated calls in one parallel reply: both are pending with their own ids (the
    old single slot lost the first, which then waited for ever), ``approve`` without ``call``
    refuses to guess, and each answer lets exactly its own call go (one approval never covers
    both)."""

    async def scenario() -> tuple[dict[str, Any], str, dict[str, Any]]:
        async with Client(setup.mcp_url) as client:
            spawned = await client.call_tool(
                "spawn", {"task": "twins", "parallelToolCalls": True, "approveTools": ["count_items"]}
            )
            handle = _payload(spawned)["handle"]
            deadline = time.monotonic() + 30
            while True:
                status = _payload(await client.call_tool("status", {"handle": handle}))["run"]
                if len(status.get("pendingApprovals", [])) == 2:
                    break
                assert time.monotonic() < deadline, status
                await asyncio.sleep(0.05)
            unnamed = await client.call_tool("approve", {"handle": handle, "allow": True})
            assert unnamed.is_error
            first, second = status["pendingApprovals"]
            await client.call_tool("approve", {"handle": handle, "allow": True, "call": first["id"]})
            await client.call_tool("approve", {"handle": handle, "allow": False, "call": second["id"]})
            done = _payload(await client.call_tool("await", {"handles": [handle], "timeout": 60}))
            return status, _text(unnamed), done["runs"][0]

    status, refusal, run = asyncio.run(scenario())
    assert status["state"] == "AwaitingApproval"
    assert [(p["tool"], p["arguments"]) for p in status["pendingApprovals"]] == [
        ("count_items", {"limit": 2})
    ] * 2
    assert "waits for 2 approvals" in refusal and status["pendingApprovals"][0]["id"] in refusal
    assert run["state"] == "completed", run
    assert run["toolCalls"] == 2 and run["failedToolCalls"] == 1
    first, second = run["answer"].split(" | ")
    assert not first.startswith("Error") and second == "Error: the user declined this tool call"


def test_a_tool_call_budget_of_one_lets_exactly_one_call_run(setup: Setup) -> None:
    """``budgetToolCalls=1`` on a model that keeps calling: the second call is not made (it used
    to run, and the subtree was cancelled only after its round)."""
    before = len(_calls(setup, "count_items"))
    run = _run(setup, "greedy", budgetToolCalls=1)
    assert run["state"] == "cancelled", run
    assert run["error"] == "budget exceeded: toolCalls 2/1"
    assert run["toolCalls"] == 1 and run["used"] == {"toolCalls": 1}
    assert len(_calls(setup, "count_items")) == before + 1
