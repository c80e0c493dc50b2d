"""The MCP runtime end to end: fake MCP server, simulated engine and runtime as real processes.

The runtime's ``dataplane`` points straight at the simulated engine (it speaks the same OpenAI API
and ignores the luftpause headers), so these tests exercise the runtime alone. Every MCP call goes
through the official ``mcp`` client.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from aiohttp import web
from mcp import Client
from mcp.types import CallToolResult, Implementation, TextContent
from postgres_helpers import STORES, on_the_file_journal, store_line, store_of
from repo_paths import ROOT
from runtime_helpers import make_run

from luftpause.cli import main
from luftpause.config import DEFAULT_MODEL, McpServerConfig
from luftpause.runtime.agent.loop import SubAgentLoop
from luftpause.runtime.agent.upstream import UpstreamPool
from luftpause.runtime.dataplane import DataplaneClient
from luftpause.runtime.runs.registry import Run, RunRegistry
from luftpause.testkit.launch.procs import ChildProcess, free_port

pytestmark = pytest.mark.integration


@dataclass
class Runtime:
    mcp_url: str
    status_url: str
    upstream_url: str
    child: ChildProcess


@pytest.fixture(scope="module", params=STORES)
def runtime(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runtime]:
    """fake-mcp, fake-engine (two tool rounds per run) and the runtime, stopped after the module;
    once on each store (tests/postgres_helpers.py)."""
    store = store_of(request)
    workdir = tmp_path_factory.mktemp("runtime")
    mcp_port, engine_port, runtime_port = free_port(), free_port(), free_port()
    config = workdir / "luftpause.toml"
    config.write_text(
        f"""
[runtime]
listen = "127.0.0.1:{runtime_port}"
dataplane = "http://127.0.0.1:{engine_port}"
state_dir = "{workdir / "state"}"
{store_line(store)}
[[replicas]]
name = "sim"
url = "http://127.0.0.1:{engine_port}"
models = ["{DEFAULT_MODEL}"]

[[mcp_servers]]
name = "fake"
url = "http://127.0.0.1:{mcp_port}/mcp"
"""
    )
    children = [
        ChildProcess(
            "fake-mcp",
            ["fake-mcp", "--port", str(mcp_port)],
            log_path=workdir / "fake-mcp.log",
            ready_port=("127.0.0.1", mcp_port),
        ),
        ChildProcess(
            "fake-engine",
            [
                "fake-engine",
                "--port",
                str(engine_port),
                "--model",
                DEFAULT_MODEL,
                "--slots",
                "4",
                "--tool-rounds",
                "2",
            ],
            log_path=workdir / "fake-engine.log",
            ready_url=f"http://127.0.0.1:{engine_port}/health",
        ),
        ChildProcess(
            "runtime",
            ["runtime", "--config", str(config)],
            log_path=workdir / "runtime.log",
            env={"LUFTPAUSE_TOKEN": ""},  # these tests are of an open runtime, whatever the shell has
            ready_url=f"http://127.0.0.1:{runtime_port}/health",
        ),
    ]
    started: list[ChildProcess] = []
    try:
        for child in children:
            started.append(child.start())
            child.wait_ready()
        yield Runtime(
            mcp_url=f"http://127.0.0.1:{runtime_port}/mcp",
            status_url=f"http://127.0.0.1:{runtime_port}/status",
            upstream_url=f"http://127.0.0.1:{mcp_port}/mcp",
            child=children[-1],
        )
    finally:
        for child in reversed(started):
            child.stop()


def _payload(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, _text(result)
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def _text(result: CallToolResult) -> str:
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


async def _spawn(client: Client, task: str, **extra: Any) -> str:
    handle = _payload(await client.call_tool("spawn", {"task": task, **extra}))["handle"]
    assert isinstance(handle, str) and handle.startswith("run-")
    return handle


async def _await(client: Client, handles: list[str], wait: float = 60, mode: str = "all") -> dict[str, Any]:
    return _payload(
        await client.call_tool(
            "await", {"handles": handles, "timeout": wait, "mode": mode}, read_timeout_seconds=wait + 30
        )
    )


def test_three_sub_agents_complete_with_answers_and_tool_calls(runtime: Runtime) -> None:
    async def scenario() -> dict[str, Any]:
        async with Client(runtime.mcp_url) as client:
            handles = await asyncio.gather(*(_spawn(client, f"Research topic {i}.") for i in range(3)))
            return await _await(client, list(handles))

    result = asyncio.run(scenario())
    assert result["timedOut"] is False
    assert len(result["runs"]) == 3
    for run in result["runs"]:
        assert run["state"] == "completed", run
        assert run["answer"].strip()
        assert run["toolCalls"] >= 1
        assert run["failedToolCalls"] == 0
        assert run["turns"] == run["toolCalls"] + 1  # one call per round (parallel_tool_calls false)
        assert run["usage"]["promptTokens"] > 0 and run["usage"]["completionTokens"] > 0


def test_run_survives_the_spawning_client_disconnecting(runtime: Runtime) -> None:
    async def spawn_and_leave() -> str:
        async with Client(runtime.mcp_url) as client:
            return await _spawn(client, "Research the history of lighthouses.")

    async def come_back(handle: str) -> dict[str, Any]:
        async with Client(runtime.mcp_url) as client:
            return await _await(client, [handle])

    handle = asyncio.run(spawn_and_leave())
    result = asyncio.run(come_back(handle))
    (run,) = result["runs"]
    assert run["handle"] == handle
    assert run["state"] == "completed", run
    assert run["toolCalls"] >= 1


def test_await_on_an_unknown_handle_is_a_tool_error_naming_it(runtime: Runtime) -> None:
    async def scenario() -> CallToolResult:
        async with Client(runtime.mcp_url) as client:
            return await client.call_tool("await", {"handles": ["run-doesnotexist"], "timeout": 1})

    result = asyncio.run(scenario())
    assert result.is_error
    assert "run-doesnotexist" in _text(result)


def test_bad_service_class_and_mode_are_tool_errors(runtime: Runtime) -> None:
    async def scenario() -> tuple[CallToolResult, CallToolResult]:
        async with Client(runtime.mcp_url) as client:
            bad_class = await client.call_tool("spawn", {"task": "x", "serviceClass": "gpu"})
            handle = await _spawn(client, "Quick one.")
            bad_mode = await client.call_tool("await", {"handles": [handle], "mode": "some"})
            await _await(client, [handle])
            return bad_class, bad_mode

    bad_class, bad_mode = asyncio.run(scenario())
    assert bad_class.is_error and "serviceClass" in _text(bad_class)
    assert bad_mode.is_error and "mode" in _text(bad_mode)


@on_the_file_journal("runtime")
def test_misspelt_arguments_are_refused_naming_the_key(runtime: Runtime) -> None:
    """``budgetToolcalls`` (lower-case c) was ignored and the run went without its budget."""

    async def scenario() -> tuple[CallToolResult, CallToolResult, dict[str, Any]]:
        async with Client(runtime.mcp_url) as client:
            spawn = await client.call_tool("spawn", {"task": "x", "budgetToolcalls": 1})
            run = await client.call_tool("run", {"task": "x", "timout": 5})
            listed = {tool.name: tool.input_schema for tool in (await client.list_tools()).tools}
            return spawn, run, listed

    spawn, run, listed = asyncio.run(scenario())
    assert spawn.is_error and "budgetToolcalls" in _text(spawn), _text(spawn)
    assert run.is_error and "timout" in _text(run), _text(run)
    assert (
        listed["spawn"]["additionalProperties"] is False and listed["await"]["additionalProperties"] is False
    )


def test_await_with_a_short_timeout_on_a_running_run_times_out(runtime: Runtime) -> None:
    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with Client(runtime.mcp_url) as client:
            # A long reply per turn keeps the run going well past a zero-second wait.
            handle = await _spawn(client, "Write at length.", maxTokens=2000)
            early = await _await(client, [handle], wait=0)
            final = await _await(client, [handle])
            return early, final

    early, final = asyncio.run(scenario())
    assert early["timedOut"] is True
    assert early["runs"][0]["state"] == "running"
    assert "answer" not in early["runs"][0]
    assert final["timedOut"] is False
    assert final["runs"][0]["state"] == "completed"


def test_status_tool_and_http_status_list_the_runs(runtime: Runtime) -> None:
    async def scenario() -> tuple[str, dict[str, Any], dict[str, Any]]:
        async with Client(runtime.mcp_url) as client:
            handle = await _spawn(client, "Status check.", serviceClass="batch")
            await _await(client, [handle])
            one = _payload(await client.call_tool("status", {"handle": handle}))
            every = _payload(await client.call_tool("status", {}))
            return handle, one, every

    handle, one, every = asyncio.run(scenario())
    assert one["run"]["handle"] == handle
    assert one["run"]["serviceClass"] == "batch"
    assert one["run"]["model"] == DEFAULT_MODEL
    assert handle in {run["handle"] for run in every["runs"]}

    with urllib.request.urlopen(runtime.status_url, timeout=10) as response:
        status = json.loads(response.read())
    by_id = {run["id"]: run for run in status["runs"]}
    run = by_id[handle]
    assert run["state"] == "completed"
    assert run["serviceClass"] == "batch"
    assert run["parent"] is None and run["children"] == []
    own = run["own"]
    assert set(own) == {
        "turns",
        "toolCalls",
        "failedToolCalls",
        "promptTokens",
        "completionTokens",
        "turnSeconds",
        "toolSeconds",
    }
    assert own["turns"] >= 2 and own["toolCalls"] >= 1
    assert own["promptTokens"] > 0 and own["completionTokens"] > 0
    assert own["turnSeconds"] > 0 and own["toolSeconds"] > 0
    assert run["subtree"] == own  # no children
    assert status["upstream"][0]["connected"] is True
    assert set(status["upstream"][0]["tools"]) == {"lookup", "deep_search"}


def test_status_listings_carry_no_answer_text_and_page(runtime: Runtime) -> None:
    """Every run's whole answer was in every listing, and listings were unbounded."""

    async def scenario() -> tuple[list[str], dict[str, Any], dict[str, Any], dict[str, Any]]:
        # A caller of its own (a 2026-07-28 client is its declared name): only these three runs.
        async with Client(runtime.mcp_url, client_info=Implementation(name="pager", version="1")) as client:
            handles = [await _spawn(client, f"Page {i}.") for i in range(3)]
            await _await(client, handles)
            one = _payload(await client.call_tool("status", {"handle": handles[0]}))
            first = _payload(await client.call_tool("status", {"limit": 2}))
            rest = _payload(await client.call_tool("status", {"limit": 2, "offset": first["nextOffset"]}))
            return handles, one, first, rest

    handles, one, first, rest = asyncio.run(scenario())
    assert isinstance(one["run"]["answer"], str) and one["run"]["answer"]
    assert first["total"] == rest["total"] == 3 and "nextOffset" not in rest
    listed = first["runs"] + rest["runs"]
    assert [run["handle"] for run in listed] == handles
    assert all("answer" not in run and run["answerChars"] > 0 for run in listed)
    assert listed[0]["answerChars"] == len(one["run"]["answer"])


def test_a_200_kb_task_runs_and_only_status_for_its_handle_repeats_it_whole(runtime: Runtime) -> None:
    task = "Summarise this report. " + "x" * 200_000 + " THE END"

    async def scenario() -> tuple[str, dict[str, Any], dict[str, Any], CallToolResult]:
        async with Client(runtime.mcp_url) as client:
            handle = await _spawn(client, task)
            await _await(client, [handle])
            every = _payload(await client.call_tool("status", {}))
            one = _payload(await client.call_tool("status", {"handle": handle}))
            # Past the 1 MiB bound, yet well within the SDK's 4 MiB request body: the tool answers.
            too_long = await client.call_tool("spawn", {"task": "y" * (1536 * 1024)})
            return handle, every, one, too_long

    handle, every, one, too_long = asyncio.run(scenario())
    listed = next(run for run in every["runs"] if run["handle"] == handle)
    assert listed["task"] == task[:200] + "…" and listed["taskChars"] == len(task)
    assert one["run"]["task"] == task and one["run"]["state"] == "completed"
    assert too_long.is_error and "task is 1,572,864 bytes" in _text(too_long)

    with urllib.request.urlopen(runtime.status_url, timeout=10) as response:
        body = response.read()
    assert b"THE END" not in body
    run = next(run for run in json.loads(body)["runs"] if run["id"] == handle)
    assert run["task"] == task[:200] + "…" and run["taskChars"] == len(task)


def test_tools_argument_limits_what_the_sub_agent_may_call(runtime: Runtime) -> None:
    async def scenario() -> tuple[dict[str, Any], CallToolResult]:
        async with Client(runtime.mcp_url) as client:
            limited = await _spawn(client, "Only look things up.", tools=["lookup"], maxToolCalls=1)
            unknown = await client.call_tool("spawn", {"task": "x", "tools": ["no_such_tool"]})
            return await _await(client, [limited]), unknown

    result, unknown = asyncio.run(scenario())
    (run,) = result["runs"]
    assert run["state"] == "completed"
    assert run["toolCalls"] == 1  # the budget: the next turn offered no tools, so it answered
    assert unknown.is_error and "no_such_tool" in _text(unknown)


def test_loadgen_spawns_three_and_reports_them_completed(runtime: Runtime) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "luftpause",
            "loadgen",
            "--runtime",
            runtime.mcp_url,
            "--spawn",
            "3",
            "--timeout",
            "120",
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["spawned"] == 3
    assert summary["completed"] == 3
    assert summary["failed"] == 0
    assert summary["toolCalls"] >= 3
    assert summary["runTimeP50"] is not None


def test_loadgen_help_says_which_mode_drives_the_runtime_and_which_the_proxy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["loadgen", "--help"])
    assert exited.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines at the terminal width
    assert "load over MCP (--spawn) or through the proxy (--agents)" in text
    assert "--spawn drives the runtime over MCP" in text
    assert "--agents drives the proxy with own-loop agents" in text


def _tool_call(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _reply(message: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "chatcmpl-x",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13},
    }


Script = list[tuple[int, dict[str, Any], dict[str, str]]]
"""Replies of a scripted dataplane, in order: (HTTP status, JSON body, headers)."""


class ScriptedDataplane:
    """A dataplane double on a loopback port: answers turns from a script, records what it got."""

    def __init__(self, script: Script) -> None:
        self.script = list(script)
        self.turns: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.deleted: list[str] = []
        self.delete_headers: list[dict[str, str]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _complete(self, request: web.Request) -> web.Response:
        self.turns.append((dict(request.headers), await request.json()))
        status, body, headers = self.script.pop(0)
        return web.json_response(body, status=status, headers=headers)

    async def _delete(self, request: web.Request) -> web.Response:
        self.deleted.append(request.match_info["handle"])
        self.delete_headers.append(dict(request.headers))
        return web.json_response({})

    async def __aenter__(self) -> ScriptedDataplane:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_delete("/v1/runs/{handle}", self._delete)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        port = free_port()
        await web.TCPSite(self._runner, "127.0.0.1", port).start()
        self.url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


async def _drive(
    dataplane: ScriptedDataplane, run: Run, upstream_url: str | None, token: str | None = None
) -> None:
    servers = [McpServerConfig(name="fake", url=upstream_url)] if upstream_url else []
    registry = RunRegistry()
    async with DataplaneClient(dataplane.url, token) as client, UpstreamPool(servers) as upstream:
        loop = SubAgentLoop(registry, client, upstream)
        async with registry.serving(loop.drive):
            registry.add(run)
            registry.start(run)
            assert await registry.wait([run], "all", 30) is False


def test_turns_carry_run_headers_retry_429_and_keep_tool_call_ids(runtime: Runtime) -> None:
    lookup = _tool_call("call_Ab1", "lookup", '{"query": "q"}')
    script: Script = [
        (429, {"error": {"message": "busy"}}, {"Retry-After": "0"}),
        (200, _reply({"content": None, "tool_calls": [lookup]}), {}),
        (200, _reply({"content": "", "tool_calls": [_tool_call("call_Zz9", "rm_rf", "{}")]}), {}),
        (200, _reply({"content": "the answer"}), {}),
    ]
    run = make_run("run-scripted1")

    async def scenario() -> ScriptedDataplane:
        async with ScriptedDataplane(script) as dataplane:
            await _drive(dataplane, run, runtime.upstream_url)
        return dataplane

    dataplane = asyncio.run(scenario())
    assert run.state == "completed" and run.answer == "the answer"
    assert (run.costs.turns, run.costs.tool_calls, run.costs.failed_tool_calls) == (3, 2, 1)
    assert (run.costs.prompt_tokens, run.costs.completion_tokens) == (30, 9)
    assert len(dataplane.turns) == 4  # the 429 was retried, not counted as a turn
    for headers, body in dataplane.turns:
        assert headers["x-luftpause-run-id"] == "run-scripted1"
        assert headers["x-luftpause-class"] == "batch"
        assert headers["x-luftpause-caller"] == "tester"
        assert body["model"] == DEFAULT_MODEL and body["max_tokens"] == 256
        assert body["parallel_tool_calls"] is False
        assert {t["function"]["name"] for t in body["tools"]} == {"lookup", "deep_search"}
    last = dataplane.turns[-1][1]["messages"]
    assert [m["role"] for m in last] == ["user", "assistant", "tool", "assistant", "tool"]
    assert last[1]["tool_calls"][0]["id"] == "call_Ab1" and last[2]["tool_call_id"] == "call_Ab1"
    assert "Error" not in last[2]["content"] and last[2]["content"].strip()
    assert last[4]["tool_call_id"] == "call_Zz9" and last[4]["content"].startswith("Error")
    assert dataplane.deleted == ["run-scripted1"]


def test_spent_tool_budget_offers_no_tools(runtime: Runtime) -> None:
    script: Script = [
        (200, _reply({"content": None, "tool_calls": [_tool_call("c1", "lookup", '{"query": "q"}')]}), {}),
        (200, _reply({"content": "done"}), {}),
    ]
    run = make_run("run-budget", max_tool_calls=1, max_tokens=0, allowed_tools=frozenset({"lookup"}))

    async def scenario() -> ScriptedDataplane:
        async with ScriptedDataplane(script) as dataplane:
            await _drive(dataplane, run, runtime.upstream_url)
        return dataplane

    dataplane = asyncio.run(scenario())
    first, second = (body for _, body in dataplane.turns)
    assert [t["function"]["name"] for t in first["tools"]] == ["lookup"]
    assert "tools" not in second and "parallel_tool_calls" not in second
    assert "max_tokens" not in first  # 0 = the engine's default
    assert run.state == "completed" and run.costs.tool_calls == 1


def test_dataplane_error_fails_the_run_with_its_message_and_still_ends_it() -> None:
    # A 500 is not retried (a 502, 503 or 429 is: tests/runtime/test_turns_ride_out_a_failing_dataplane.py).
    script: Script = [(500, {"error": {"message": "engine sim-a: overloaded"}}, {})]
    run = make_run("run-refused")

    async def scenario() -> ScriptedDataplane:
        async with ScriptedDataplane(script) as dataplane:
            await _drive(dataplane, run, None)
        return dataplane

    dataplane = asyncio.run(scenario())
    assert run.state == "failed"
    assert run.error == "dataplane answered 500: engine sim-a: overloaded"
    assert dataplane.deleted == ["run-refused"]


def test_turns_and_run_endings_carry_the_token_and_only_when_one_is_set() -> None:
    script: Script = [(200, _reply({"content": "a"}), {}), (200, _reply({"content": "b"}), {})]
    with_token, without = make_run("run-token"), make_run("run-open")

    async def scenario() -> ScriptedDataplane:
        async with ScriptedDataplane(script) as dataplane:
            await _drive(dataplane, with_token, None, token="tok-123")
            await _drive(dataplane, without, None)
        return dataplane

    dataplane = asyncio.run(scenario())
    assert with_token.state == without.state == "completed"
    (turn_with, _), (turn_without, _) = dataplane.turns
    assert turn_with["Authorization"] == "Bearer tok-123"
    assert dataplane.deleted == ["run-token", "run-open"]
    assert dataplane.delete_headers[0]["Authorization"] == "Bearer tok-123"
    assert "Authorization" not in turn_without and "Authorization" not in dataplane.delete_headers[1]


@on_the_file_journal("runtime")
def test_without_a_token_the_runtime_warns_at_start_and_accepts_requests(runtime: Runtime) -> None:
    assert runtime.child.log_path is not None
    log = runtime.child.log_path.read_text()
    assert "LUFTPAUSE_TOKEN is not set" in log
    with urllib.request.urlopen(runtime.status_url, timeout=10) as response:  # no Authorization
        assert response.status == 200


def test_long_wait_reports_progress_until_the_run_finishes() -> None:
    async def scenario() -> tuple[bool, list[tuple[float, int]], bool]:
        progress: list[tuple[float, int]] = []

        async def on_progress(elapsed: float, finished: int) -> None:
            progress.append((elapsed, finished))

        registry = RunRegistry()

        async def body(run: Run) -> None:
            await asyncio.sleep(0.3)
            registry.finish(run, "completed", answer="ok")

        async with registry:
            slow, never = registry.add(make_run("run-slow")), registry.add(make_run("run-never"))
            registry.start(slow, body(slow))
            registry.start(never, asyncio.sleep(3600))
            any_timed_out = await registry.wait([slow, never], "any", 30, on_progress, progress_interval=0.05)
            all_timed_out = await registry.wait([slow, never], "all", 0.1)
        return any_timed_out, progress, all_timed_out

    any_timed_out, progress, all_timed_out = asyncio.run(scenario())
    assert any_timed_out is False
    assert all_timed_out is True
    assert progress, "a wait longer than the progress interval must report progress"
    elapsed = [e for e, _ in progress]
    assert elapsed == sorted(elapsed) and len(set(elapsed)) == len(elapsed)  # strictly increasing


def test_runtime_exits_zero_on_sigterm(runtime: Runtime) -> None:
    # Last in the module: it stops the shared runtime.
    runtime.child.stop()
    assert runtime.child.poll() == 0, runtime.child.log_tail()
