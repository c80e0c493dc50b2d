"""Claude Code and Codex CLI on a real tool loop through luftpause: a scripted Chat Completions
engine behind a scheduler and a dataplane answers the harness's first turn with two parallel calls
of the fake MCP server's ``count_items``, streamed the hard way (both under one ``index``, told
apart only by their ids, their argument fragments interleaved), then, once both results came back,
with the final text. Each harness must run both calls and send both results back.

Skipped, saying why, where npm's harnesses are not installed.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from dataplane_procs import SchedulerAndDataplane, scheduler_and_dataplane
from harness_capture import MODEL
from harness_runs import HARNESSES_ENV, HarnessRun, harness_bin, run_claude_code, run_codex

from luftpause.testkit.threaded_app import ThreadedApp

pytestmark = pytest.mark.integration

LIMITS = (2, 5)
LIMIT_SAID = re.compile(r'"limit": (\d+)')
FINAL = "counted both"


def _sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


class ParallelCallsEngine(ThreadedApp):
    """The scripted engine (see the module docstring); ``requests``: every chat body, in order."""

    def __init__(self) -> None:
        super().__init__("parallel-calls-engine")
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def routes(self, app: web.Application) -> None:
        app.router.add_post("/v1/chat/completions", self._chat)
        app.router.add_get("/health", self._health)

    async def _health(self, request: web.Request) -> web.Response:
        return web.json_response({})

    def recorded(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.requests)

    def offered_the_tool(self) -> bool:
        """Whether a request so far offered ``count_items`` (a harness may send its first turn
        before its MCP server's tools are listed: Claude Code does so now and then on a loaded
        machine, whatever ``MCP_CONNECTION_NONBLOCKING`` says)."""
        return any(
            t["function"]["name"].endswith("count_items")
            for r in self.recorded()
            for t in r.get("tools") or ()
        )

    def forget(self) -> None:
        with self._lock:
            self.requests.clear()

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body: dict[str, Any] = await request.json()
        with self._lock:
            self.requests.append(body)
            n = len(self.requests)
        tool = next(
            (
                t["function"]["name"]
                for t in body.get("tools") or ()
                if t["function"]["name"].endswith("count_items")
            ),
            None,
        )
        results = [m for m in body["messages"] if m.get("role") == "tool"]
        base = {
            "id": f"chatcmpl-par{n}",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": body["model"],
        }

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            return _sse({**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

        events = [chunk({"role": "assistant", "content": ""})]
        if tool is not None and not results:
            ids = [f"call_par{n}a", f"call_par{n}b"]
            halves = [json.dumps({"limit": limit}) for limit in LIMITS]

            def fragment(i: int, name: str | None, arguments: str) -> bytes:
                function: dict[str, Any] = {"arguments": arguments}
                if name is not None:
                    function["name"] = name
                call = {"index": 0, "id": ids[i], "type": "function", "function": function}
                return chunk({"tool_calls": [call]})

            events += [
                fragment(0, tool, halves[0][:5]),
                fragment(1, tool, halves[1][:5]),
                fragment(0, None, halves[0][5:]),
                fragment(1, None, halves[1][5:]),
                chunk({}, "tool_calls"),
            ]
        else:
            events += [chunk({"content": FINAL if results else "nothing to count"}), chunk({}, "stop")]
        if not body.get("stream"):
            return web.json_response({"error": {"message": "the scripted engine only streams"}}, status=400)
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        events += [_sse({**base, "choices": [], "usage": usage}), b"data: [DONE]\n\n"]
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"".join(events))
        await response.write_eof()
        return response


def _require(name: str) -> None:
    if harness_bin(name) is None:
        pytest.skip(
            f"{name} is not installed: npm install --prefix ~/.cache/luftpause/harnesses "
            f"@anthropic-ai/claude-code @openai/codex (or set {HARNESSES_ENV})"
        )


@pytest.fixture
def through_luftpause(tmp_path: Path) -> Iterator[tuple[ParallelCallsEngine, SchedulerAndDataplane]]:
    engine = ParallelCallsEngine().start()
    replicas = (
        f'\n[[replicas]]\nname = "scripted"\nurl = "{engine.url}"\nmodels = ["{MODEL}"]\nhealth_path = ""\n'
    )
    try:
        with scheduler_and_dataplane(tmp_path, [], replicas=replicas) as pair:
            yield engine, pair
    finally:
        engine.stop()


def _both_results_came_back(engine: ParallelCallsEngine) -> None:
    answered = [r for r in engine.recorded() if any(m.get("role") == "tool" for m in r["messages"])]
    assert answered, "no request carried a tool result"
    messages = answered[0]["messages"]
    calls = [c for m in messages if m.get("role") == "assistant" for c in m.get("tool_calls") or ()]
    # the tool's answer as the harness passes it on (Codex prefixes its wall time)
    results = {
        m["tool_call_id"]: int(LIMIT_SAID.findall(str(m["content"]))[-1])
        for m in messages
        if m.get("role") == "tool"
    }
    assert len(calls) == 2 and {json.loads(c["function"]["arguments"])["limit"] for c in calls} == set(LIMITS)
    assert results == {c["id"]: json.loads(c["function"]["arguments"])["limit"] for c in calls}


def _until_offered(engine: ParallelCallsEngine, run: Callable[[], HarnessRun]) -> HarnessRun:
    """``run`` again (3 tries in all) while the harness offered its turns no ``count_items``: its MCP
    server was not listed yet, which is the harness's start-up race, not luftpause's doing."""
    for _ in range(3):
        engine.forget()
        done = run()
        if engine.offered_the_tool():
            return done
    pytest.fail(f"the harness never offered count_items: {done.stdout} {done.stderr}")


def test_claude_code_runs_both_parallel_calls_and_sends_both_results(
    through_luftpause: tuple[ParallelCallsEngine, SchedulerAndDataplane], home: str
) -> None:
    _require("claude")
    engine, pair = through_luftpause
    run = _until_offered(
        engine, lambda: run_claude_code(pair.dataplane_url, home, "Count items with limits 2 and 5", mcp=True)
    )
    assert run.returncode == 0, run.stdout + run.stderr
    result = json.loads(run.stdout)
    assert result["is_error"] is False and result["result"] == FINAL, run.stdout
    _both_results_came_back(engine)


def test_codex_runs_both_parallel_calls_and_sends_both_results(
    through_luftpause: tuple[ParallelCallsEngine, SchedulerAndDataplane], home: str
) -> None:
    _require("codex")
    engine, pair = through_luftpause
    run = run_codex(
        pair.dataplane_url, home, "Count items with limits 2 and 5 using the count_items tool", mcp=True
    )
    assert run.returncode == 0, run.stdout + run.stderr
    messages = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    said = [m["item"].get("text") for m in messages if m.get("type") == "item.completed"]
    assert FINAL in said, run.stdout
    _both_results_came_back(engine)
