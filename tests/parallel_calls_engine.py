"""A scripted Chat Completions engine that answers a turn offering a ``count_items`` tool with two
parallel calls of it, streamed the hard way (both under one ``index``, told apart only by their
ids, their argument fragments interleaved), and a turn that carries tool results with
:data:`FINAL`. For the front doors' end-to-end tests and the real harnesses' tool loops."""

from __future__ import annotations

import json
import re
import threading
from typing import Any

from aiohttp import web

from luftpause.testkit.launch.threaded_app import ThreadedApp

LIMITS = (2, 5)
LIMIT_SAID = re.compile(r'"limit": (\d+)')
FINAL = "counted both"


def _sse(doc: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(doc).encode() + b"\n\n"


class ParallelCallsEngine(ThreadedApp):
    """The scripted engine (see the module docstring); ``requests``: every chat body, in order.
    Each answer's call ids are ``call_par<n>a`` and ``call_par<n>b`` for its ``n``-th request."""

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
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if not body.get("stream"):  # the same answer whole
            calls = [
                {
                    "id": f"call_par{n}{c}",
                    "type": "function",
                    "function": {"name": tool, "arguments": json.dumps({"limit": limit})},
                }
                for c, limit in zip("ab", LIMITS, strict=True)
            ]
            message: dict[str, Any] = {"role": "assistant", "content": None, "tool_calls": calls}
            finish = "tool_calls"
            if tool is None or results:
                message, finish = (
                    {"role": "assistant", "content": FINAL if results else "nothing to count"},
                    "stop",
                )
            choice = {"index": 0, "message": message, "finish_reason": finish}
            whole = {**base, "object": "chat.completion", "choices": [choice], "usage": usage}
            return web.json_response(whole)
        events += [_sse({**base, "choices": [], "usage": usage}), b"data: [DONE]\n\n"]
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"".join(events))
        await response.write_eof()
        return response
