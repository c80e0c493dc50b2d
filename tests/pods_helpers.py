"""The harness of the pods tests, shared by every test that drives the real runtime process through
the real ``mcp`` client with a scripted engine as its dataplane (``test_runtime_pods``,
``test_runtime_durability``, ``test_runtime_child_tools``, ``test_runtime_tool_surface``,
``test_runtime_no_workspace``, ``test_runtime_monitor_*``, ``test_top``).

:class:`ScriptedEngine` answers each run from a script in its task (``script:`` and a JSON list of
steps, made by :func:`script`); the step taken is the number of assistant messages already in the
conversation, so a run re-opened by ``send`` takes the next step. Steps: ``{"call": tool, "args":
{...}}`` (one tool call), ``{"calls": [{"call": tool, "args": {...}}, ...]}`` (several in one
reply, ids ``call_<step>_<index>``), ``{"say": text}`` (an answer), ``{"echo": "new-system"}`` (answer with
the system messages that arrived since the run's last assistant message, or ``none``),
``{"refuse": 503, "error": text}`` (answer that status: the turn, and so the run, fails; with
``"times": n`` only the step's first ``n`` tries are refused, and the next is answered as the rest
of the step says), ``"sleep"``
seconds to wait before answering, and ``"hold": gate`` to wait before answering until the test
calls ``engine.release(gate)`` (so a run is busy exactly as long as a test needs, without timing).

:func:`start_pod` starts the engine and a runtime over it (a :class:`Pod`), with or without a
workspace, and whatever else a test's configuration adds (``[[mcp_servers]]``, limits);
:func:`call` calls an MCP tool and gives its structured result (:func:`payload`, of a result in
hand), :func:`until` polls a condition with a fail-safe bound, :func:`get_json` reads the
runtime's monitor JSON.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web
from mcp import Client
from mcp.types import CallToolResult, TextContent

from luftpause.config import DEFAULT_MODEL
from luftpause.runtime.runs.journal import JOURNAL_NAME, read_records
from luftpause.testkit.launch.procs import ChildProcess, free_port
from luftpause.testkit.launch.threaded_app import ThreadedApp


def script(*steps: dict[str, Any]) -> str:
    """A run's task the :class:`ScriptedEngine` follows: ``script:`` and ``steps`` as JSON."""
    return "script:" + json.dumps(list(steps))


def _reply(content: str | None, calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "model": DEFAULT_MODEL,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop"}],
        "usage": {"prompt_tokens": 10, "completion_tokens": 2},
    }


def _assistants(body: dict[str, Any]) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


class ScriptedEngine(ThreadedApp):
    """The runtime's dataplane: an aiohttp app in its own thread and event loop."""

    def __init__(self) -> None:
        super().__init__("pods-engine")
        self.requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.open: set[str] = set()
        self.ends: list[tuple[str, int]] = []
        self.hold_run_ends = False
        self._gates: dict[str, asyncio.Event] = {}

    def _gate(self, name: str) -> asyncio.Event:
        return self._gates.setdefault(name, asyncio.Event())

    def release(self, gate: str) -> None:
        """Let every turn held at ``gate`` (and every later one) answer."""
        self.call_soon(lambda: self._gate(gate).set())

    def holding(self, run_id: str) -> bool:
        """Whether the engine has a request of ``run_id`` it answered no reply to yet."""
        return run_id in self.open

    async def _complete(self, request: web.Request) -> web.Response:
        body = await request.json()
        run_id = request.headers.get("x-luftpause-run-id", "")
        self.requests[run_id].append(body)
        messages = body["messages"]
        task = next(m["content"] for m in messages if m["role"] == "user")
        steps = json.loads(task.removeprefix("script:"))
        done = sum(1 for m in messages if m["role"] == "assistant")
        step = steps[min(done, len(steps) - 1)]
        await asyncio.sleep(float(step.get("sleep", 0)))
        if "hold" in step:
            self.open.add(run_id)
            try:
                await self._gate(step["hold"]).wait()
            finally:
                self.open.discard(run_id)
        tries = sum(1 for asked in self.requests[run_id] if _assistants(asked) == done)
        if "refuse" in step and tries <= int(step.get("times", tries)):  # the engine's error status
            error = {"error": {"message": step.get("error", "refused")}}
            return web.json_response(error, status=int(step["refuse"]))
        if "call" in step:
            call = {
                "id": f"call_{done}",
                "type": "function",
                "function": {"name": step["call"], "arguments": json.dumps(step.get("args", {}))},
            }
            return web.json_response(_reply(None, [call]))
        if "calls" in step:
            calls = [
                {
                    "id": f"call_{done}_{index}",
                    "type": "function",
                    "function": {"name": one["call"], "arguments": json.dumps(one.get("args", {}))},
                }
                for index, one in enumerate(step["calls"])
            ]
            return web.json_response(_reply(None, calls))
        if "echo" in step:
            last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
            fresh = [m["content"] for m in messages[last + 1 :] if m["role"] == "system"]
            return web.json_response(_reply("\n".join(fresh) or "none"))
        return web.json_response(_reply(step["say"]))

    async def _end(self, request: web.Request) -> web.Response:
        # Each run ending notes how many turns of the run the engine had seen by then; held at the
        # gate "ends" once a test calls hold_ends() (a slow dataplane ending a run).
        handle = request.match_info["handle"]
        self.ends.append((handle, len(self.requests.get(handle, ()))))
        if self.hold_run_ends:
            self.open.add(f"end:{handle}")
            try:
                await self._gate("ends").wait()
            finally:
                self.open.discard(f"end:{handle}")
        return web.json_response({})

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_delete("/v1/runs/{handle}", self._end)

    def stop(self) -> None:
        for gate in ("ends", *self._gates):  # nothing held keeps the server from closing
            self.release(gate)
        super().stop()


@dataclass
class Pod:
    """A runtime over the scripted engine: its folder (``workdir``: configuration, ``state``,
    ``runtime.log``), its workspace (resolved; ``None`` when none is configured), the TOML file it
    reads, its port, and the token and environment it is started with (:meth:`start_runtime`, which
    a test calls again to restart it on the same state)."""

    workdir: Path
    workspace: Path | None
    engine: ScriptedEngine
    config: Path
    port: int
    runtime: ChildProcess | None = None
    token: str = ""
    env: dict[str, str] = field(default_factory=dict)
    store: str = "file"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start_runtime(self) -> None:
        self.runtime = ChildProcess(
            "runtime",
            ["runtime", "--config", str(self.config)],
            log_path=self.workdir / "runtime.log",
            env={"LUFTPAUSE_TOKEN": self.token, **self._store_env(), **self.env},
            ready_url=f"{self.url}/health",
        )
        self.runtime.start()
        self.runtime.wait_ready()

    def runtime_log(self) -> str:
        """Everything the runtime process has logged so far (``runtime.log``)."""
        path = self.workdir / "runtime.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _store_env(self) -> dict[str, str]:
        # From the environment, as a deployment gives it (from a secret), not the file.
        return {} if self.store == "file" else {"LUFTPAUSE_RUNTIME__STORE": self.store}

    def journal(self) -> list[dict[str, Any]]:
        """Every record of the runtime's store (``runs.jsonl``, or the database's rows)."""
        if self.store == "file":
            return list(read_records(self.workdir / "state" / JOURNAL_NAME))
        from luftpause.runtime.runs.postgres import PostgresDatabase

        return list(PostgresDatabase(self.store).journal("runs").records())


@contextmanager
def start_pod(
    workdir: Path,
    *,
    workspace: Sequence[str] | None = ("b/d",),
    token: str = "",
    max_depth: int | None = 3,
    max_children: int | None = 2,
    extra_toml: str = "",
    runtime_toml: str = "",
    env: Mapping[str, str] | None = None,
    engine_started: bool = True,
    store: str = "file",
) -> Iterator[Pod]:
    """The scripted engine and a runtime over it (its dataplane and only replica), ready; both
    stopped when the ``with`` block ends, on failure too.

    ``workspace``: the folders (relative paths) made in the workspace ``workdir/ws``, or ``None``
    for a runtime with no ``[runtime] workspace`` (its runs hold no filesystem scope). ``token``:
    the runtime's ``LUFTPAUSE_TOKEN`` (``""``: none). ``max_depth``/``max_children``: the
    ``[runtime]`` limits, left out when ``None``. ``extra_toml``: appended to the file as it is
    (``[[mcp_servers]]`` and more ``[[replicas]]`` tables; ``{engine_url}`` in it is the scripted
    engine's URL); ``runtime_toml``: more ``[runtime]`` keys. ``env``: more environment for the
    runtime process. ``engine_started=False``: the engine's port is chosen but nothing listens on
    it until the test calls ``pod.engine.start()`` (a dataplane that is down). ``store``: its
    ``[runtime] store`` (``"file"``, or a PostgreSQL URL given as ``LUFTPAUSE_RUNTIME__STORE``).
    """
    folder: Path | None = None
    settings = ""
    if workspace is not None:
        folder = workdir / "ws"
        folder.mkdir()
        for sub in workspace:
            (folder / sub).mkdir(parents=True)
        settings += f'workspace = "{folder}"\n'
    if max_depth is not None:
        settings += f"max_depth = {max_depth}\n"
    if max_children is not None:
        settings += f"max_children = {max_children}\n"
    settings += runtime_toml
    engine = ScriptedEngine()
    if engine_started:
        engine.start()
    running: Pod | None = None
    try:
        port = free_port()
        config = workdir / "luftpause.toml"
        config.write_text(
            f"""
[runtime]
listen = "127.0.0.1:{port}"
dataplane = "{engine.url}"
state_dir = "{workdir / "state"}"
{settings}
[[replicas]]
name = "scripted"
url = "{engine.url}"
models = ["{DEFAULT_MODEL}"]
{extra_toml.replace("{engine_url}", engine.url)}"""
        )
        resolved = folder.resolve() if folder is not None else None
        running = Pod(workdir, resolved, engine, config, port, token=token, env=dict(env or {}), store=store)
        running.start_runtime()
        yield running
    finally:
        if running is not None and running.runtime is not None:
            running.runtime.stop()
        engine.stop()


def tool_text(result: CallToolResult) -> str:
    """The text blocks of a tool's result, one per line."""
    return "\n".join(block.text for block in result.content if isinstance(block, TextContent))


def payload(result: CallToolResult) -> dict[str, Any]:
    """The structured result of a tool's call; ``AssertionError`` with the tool's text when the
    call failed or gave no structured result."""
    # Raised, not asserted: pytest rewrites the asserts of test modules only, and a bare
    # ``assert`` here would fail without saying what the tool answered.
    if result.is_error:
        raise AssertionError(tool_text(result))
    if not isinstance(result.structured_content, dict):
        raise AssertionError(f"no structured content in the tool's result: {tool_text(result)!r}")
    return result.structured_content


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """The structured result of ``tool`` called with ``arguments`` (60 s read timeout); raises
    ``AssertionError`` with the tool's text when the call failed."""
    return payload(await client.call_tool(tool, arguments, read_timeout_seconds=60))


async def until(check: Callable[[], Any], what: str, seconds: float = 30.0) -> Any:
    """Poll ``check`` (awaitable result) until it gives something truthy; a fail-safe bound only."""
    deadline = time.monotonic() + seconds
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.1)


def get_json(url: str) -> Any:
    """``GET url`` (10 s timeout), its body parsed as JSON (the runtime's monitor)."""
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.loads(response.read())
