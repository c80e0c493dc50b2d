"""A capture server for agent harnesses: records every request, answers as a minimal model endpoint.

Claude Code speaks the Anthropic Messages API and Codex CLI the OpenAI Responses API. To learn what
they send (routes, headers, body fields, tool ids) and what they need back, each is pointed at a
:class:`CaptureServer` (``ANTHROPIC_BASE_URL``; a Codex ``[model_providers.*]`` ``base_url`` with
``wire_api = "responses"``). It records each request as one JSON object ``{"method", "path",
"query", "headers": [[name, value], ...], "body": <JSON or text or null>}`` and answers:

* ``POST /v1/messages``: an Anthropic Message (streamed when the body says ``"stream": true``).
  When the request's last user message carries a ``tool_result``, the answer is the text
  ``tool said: <its text>``; else, when ``tool`` names one of the request's ``tools``, a
  ``tool_use`` block calling it with ``tool_input``; else the text ``reply``.
* ``POST /v1/messages/count_tokens``: ``{"input_tokens": <body bytes // 4>}``.
* ``POST /v1/responses``: a Response, the same three answers keyed on ``function_call_output``
  items and function ``tools``.
* ``GET /v1/models`` (and ``/v1/models/{id}``): the model list in the Anthropic page shape, which
  OpenAI clients read too (``data`` of ``{"id", "object", ...}``).
* anything else: 404 in Anthropic's error shape, recorded like the rest.

The replies are written out here by hand from the two APIs' references (Anthropic "Streaming
Messages"; OpenAI "Streaming events" of the Responses API), not produced by luftpause's
translators: they are the yardstick those are checked against (``translate=True`` answers
through the translators instead, from a scripted Chat Completions stream, so a harness checks
them; ``fault=`` makes it answer a failure instead, to see what a harness does then).
``harness_runs`` runs Claude Code and Codex CLI against it; the samples under
``tests/data/harnesses/`` were recorded so.
"""

from __future__ import annotations

import itertools
import json
import threading
from typing import Any

from aiohttp import web

from luftpause.dataplane.apis.errors import Api, TranslationError, error_body
from luftpause.dataplane.apis.messages_request import messages_to_chat
from luftpause.dataplane.apis.messages_stream import MessagesStream, completion_to_message
from luftpause.dataplane.apis.responses_request import responses_to_chat
from luftpause.dataplane.apis.responses_stream import ResponsesStream, completion_to_response
from luftpause.testkit.launch.threaded_app import ThreadedApp

MODEL = "capture-model"

_Event = tuple[str, dict[str, Any]]


class CaptureServer(ThreadedApp):
    """See the module docstring. ``requests`` holds what was recorded, oldest first (thread-safe to
    read after the harness exited); ``tool``/``tool_input`` script the tool call answer."""

    def __init__(
        self,
        tool: str | None = None,
        tool_input: dict[str, Any] | None = None,
        translate: bool = False,
        fault: str | None = None,
        faults: int = 1,
    ) -> None:
        super().__init__("harness-capture")
        self.translate = translate
        self.fault = fault
        self.faults = faults
        self.tool = tool
        self.tool_input = tool_input if tool_input is not None else {}
        self.requests: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._ids = itertools.count(1)

    def routes(self, app: web.Application) -> None:
        app.router.add_route("*", "/{tail:.*}", self._any)

    def recorded(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.requests)

    async def _any(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        body: Any = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                body = raw.decode("utf-8", "replace")
        with self._lock:
            self.requests.append(
                {
                    "method": request.method,
                    "path": request.path,
                    "query": request.query_string,
                    "headers": [[k, v] for k, v in request.headers.items()],
                    "body": body,
                }
            )
        path = request.path.rstrip("/")
        if request.method == "POST" and path == "/v1/messages" and isinstance(body, dict):
            return await self._messages(request, body)
        if request.method == "POST" and path == "/v1/messages/count_tokens":
            return web.json_response({"input_tokens": max(1, len(raw) // 4)})
        if request.method == "POST" and path == "/v1/responses" and isinstance(body, dict):
            return await self._responses(request, body)
        if request.method in ("GET", "HEAD") and path == "/v1/models":
            return web.json_response(_models_page())
        if request.method in ("GET", "HEAD") and path.startswith("/v1/models/"):
            return web.json_response(_model(path.rsplit("/", 1)[1]))
        return web.json_response(
            {"type": "error", "error": {"type": "not_found_error", "message": f"no route {path}"}},
            status=404,
        )

    # --- Anthropic Messages -----------------------------------------------------------------------

    def _messages_answer(self, body: dict[str, Any]) -> tuple[str, Any]:
        """``("text", str)`` or ``("tool", (id, name, input))``."""
        messages = body.get("messages") or []
        last = messages[-1] if messages else {}
        content = last.get("content") if isinstance(last, dict) else None
        if isinstance(content, list):
            for block in content:
                if isinstance(block, dict) and block.get("type") == "tool_result":
                    return "text", f"tool said: {_text_of(block.get('content'))}"
        names = {t.get("name") for t in body.get("tools") or () if isinstance(t, dict)}
        if self.tool is not None and self.tool in names:
            return "tool", (f"toolu_capture{next(self._ids):04d}", self.tool, self.tool_input)
        return "text", "reply"

    async def _messages(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if self.translate:
            return await self._messages_translated(request, body)
        kind, value = self._messages_answer(body)
        model = body.get("model") or MODEL
        message_id = f"msg_capture{next(self._ids):04d}"
        if kind == "text":
            block: dict[str, Any] = {"type": "text", "text": value}
            stop_reason = "end_turn"
        else:
            call_id, name, arguments = value
            block = {"type": "tool_use", "id": call_id, "name": name, "input": arguments}
            stop_reason = "tool_use"
        if not body.get("stream"):
            return web.json_response(
                {
                    "id": message_id,
                    "type": "message",
                    "role": "assistant",
                    "model": model,
                    "content": [block],
                    "stop_reason": stop_reason,
                    "stop_sequence": None,
                    "usage": {"input_tokens": 12, "output_tokens": 5},
                }
            )
        start_block = dict(block, text="") if kind == "text" else dict(block, input={})
        delta = (
            {"type": "text_delta", "text": value}
            if kind == "text"
            else {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
        )
        events: list[_Event] = [
            (
                "message_start",
                {
                    "type": "message_start",
                    "message": {
                        "id": message_id,
                        "type": "message",
                        "role": "assistant",
                        "model": model,
                        "content": [],
                        "stop_reason": None,
                        "stop_sequence": None,
                        "usage": {"input_tokens": 12, "output_tokens": 1},
                    },
                },
            ),
            (
                "content_block_start",
                {"type": "content_block_start", "index": 0, "content_block": start_block},
            ),
            ("ping", {"type": "ping"}),
            ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
            (
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": stop_reason, "stop_sequence": None},
                    "usage": {"output_tokens": 5},
                },
            ),
            ("message_stop", {"type": "message_stop"}),
        ]
        return await _sse(request, events)

    # --- OpenAI Responses -------------------------------------------------------------------------

    def _responses_answer(self, body: dict[str, Any]) -> tuple[str, Any]:
        items = body.get("input")
        last = items[-1] if isinstance(items, list) and items else {}
        if isinstance(last, dict) and last.get("type") == "function_call_output":
            return "text", f"tool said: {_text_of(last.get('output'))}"
        names: set[Any] = set()
        for tool in body.get("tools") or ():
            if isinstance(tool, dict) and tool.get("type") == "namespace":
                names.update(f"{tool.get('name')}/{t.get('name')}" for t in tool.get("tools") or ())
            elif isinstance(tool, dict):
                names.add(tool.get("name"))
        if self.tool is not None and self.tool in names:
            return "tool", (f"call_capture{next(self._ids):04d}", self.tool, self.tool_input)
        return "text", "reply"

    async def _responses(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        if self.translate:
            return await self._responses_translated(request, body)
        kind, value = self._responses_answer(body)
        n = next(self._ids)
        response_id = f"resp_capture{n:04d}"
        if kind == "text":
            item: dict[str, Any] = {
                "type": "message",
                "id": f"msg_capture{n:04d}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": value, "annotations": []}],
            }
        else:
            call_id, name, arguments = value
            namespace, _, name = name.rpartition("/")
            item = {
                "type": "function_call",
                "id": f"fc_capture{n:04d}",
                "call_id": call_id,
                "name": name,
                "arguments": json.dumps(arguments),
                "status": "completed",
            }
            if namespace:
                item["namespace"] = namespace
        usage = {
            "input_tokens": 12,
            "input_tokens_details": {"cached_tokens": 0},
            "output_tokens": 5,
            "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": 17,
        }

        def response(status: str, output: list[dict[str, Any]], with_usage: bool) -> dict[str, Any]:
            return {
                "id": response_id,
                "object": "response",
                "created_at": 1,
                "status": status,
                "model": body.get("model") or MODEL,
                "output": output,
                "parallel_tool_calls": True,
                "tool_choice": "auto",
                "tools": [],
                "usage": usage if with_usage else None,
            }

        if not body.get("stream"):
            return web.json_response(response("completed", [item], True))
        if kind == "text":
            opened = dict(item, status="in_progress", content=[])
            part = {"type": "output_text", "text": "", "annotations": []}
            middle: list[dict[str, Any]] = [
                {
                    "type": "response.content_part.added",
                    "item_id": item["id"],
                    "output_index": 0,
                    "content_index": 0,
                    "part": part,
                },
                {
                    "type": "response.output_text.delta",
                    "item_id": item["id"],
                    "output_index": 0,
                    "content_index": 0,
                    "delta": value,
                    "logprobs": [],
                },
                {
                    "type": "response.output_text.done",
                    "item_id": item["id"],
                    "output_index": 0,
                    "content_index": 0,
                    "text": value,
                    "logprobs": [],
                },
                {
                    "type": "response.content_part.done",
                    "item_id": item["id"],
                    "output_index": 0,
                    "content_index": 0,
                    "part": item["content"][0],
                },
            ]
        else:
            opened = dict(item, status="in_progress", arguments="")
            middle = [
                {
                    "type": "response.function_call_arguments.delta",
                    "item_id": item["id"],
                    "output_index": 0,
                    "delta": item["arguments"],
                },
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item["id"],
                    "output_index": 0,
                    "arguments": item["arguments"],
                },
            ]
        payloads: list[dict[str, Any]] = [
            {"type": "response.created", "response": response("in_progress", [], False)},
            {"type": "response.in_progress", "response": response("in_progress", [], False)},
            {"type": "response.output_item.added", "output_index": 0, "item": opened},
            *middle,
            {"type": "response.output_item.done", "output_index": 0, "item": item},
            {"type": "response.completed", "response": response("completed", [item], True)},
        ]
        events = [(p["type"], dict(p, sequence_number=i)) for i, p in enumerate(payloads)]
        return await _sse(request, events)

    # --- through luftpause's translators ----------------------------------------------------------

    def _chat_answer(self, chat: dict[str, Any]) -> tuple[str, Any]:
        """The scripted answer to a translated (Chat Completions) request: text after a tool
        result, a call of ``tool`` (its chat name) when offered, else text."""
        messages = chat["messages"]
        if messages and messages[-1]["role"] == "tool":
            return "text", f"tool said: {messages[-1]['content']}"
        names = {t["function"]["name"] for t in chat.get("tools") or ()}
        flat = self.tool.replace("/", "__") if self.tool is not None else None
        if flat is not None and flat in names:
            return "tool", (f"call_capture{next(self._ids):04d}", flat, self.tool_input)
        return "text", "reply"

    async def _messages_translated(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        try:
            turn = messages_to_chat(body)
        except TranslationError as exc:
            return web.Response(
                status=400,
                body=error_body("messages", 400, str(exc), exc.param),
                content_type="application/json",
            )
        stream = MessagesStream(turn.model, f"msg_capture{next(self._ids):04d}", turn.stop_sequences)
        fault = self._take_fault()
        if fault is not None:
            return await self._faulty(request, "messages", fault, stream)
        if not turn.stream:
            completion = chat_completion(*self._chat_answer(turn.body))
            message = completion_to_message(
                completion,
                turn.model,
                f"msg_capture{next(self._ids):04d}",
                turn.stop_sequences,
            )
            return web.json_response(message)
        chunks = chat_stream(*self._chat_answer(turn.body))
        return await _translated(request, [stream.feed(c) for c in chunks] + [stream.finish()])

    def _take_fault(self) -> str | None:
        """The fault to answer this turn with (``fault``, for the first ``faults`` turns), else None."""
        with self._lock:
            if self.fault is None or self.faults <= 0:
                return None
            self.faults -= 1
            return self.fault

    async def _faulty(self, request: web.Request, api: Api, fault: str, stream: Any) -> web.StreamResponse:
        """Answer with ``fault``: ``status:<n>`` (that status and the API's error body, with
        ``Retry-After: 1`` for 429), ``error`` (an engine error event after some text: the API's
        error event), ``length`` (some text, then the engine's ``finish_reason: length``) or
        ``abort`` (some text, then the connection cut without the stream's end)."""
        if fault.startswith("status:"):
            status = int(fault.partition(":")[2])
            headers = {"retry-after": "1"} if status == 429 else {}
            return web.Response(
                status=status,
                body=error_body(api, status, "capture fault"),
                headers=headers,
                content_type="application/json",
            )
        start = b'data: {"choices": [{"index": 0, "delta": {"content": "par"}, "finish_reason": null}]}\n\n'
        if fault == "length":
            cut = b'data: {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}\n\n'
            return await _translated(request, [stream.feed(start), stream.feed(cut), stream.finish()])
        if fault == "error":
            error = b'data: {"error": {"message": "capture fault", "code": 500}}\n\n'
            return await _translated(request, [stream.feed(start), stream.feed(error), stream.finish()])
        answer = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await answer.prepare(request)
        await answer.write(stream.feed(start))
        assert request.transport is not None
        request.transport.abort()
        return answer

    async def _responses_translated(self, request: web.Request, body: dict[str, Any]) -> web.StreamResponse:
        try:
            turn = responses_to_chat(body)
        except TranslationError as exc:
            return web.Response(
                status=400,
                body=error_body("responses", 400, str(exc), exc.param),
                content_type="application/json",
            )
        stream = ResponsesStream(
            f"resp_capture{next(self._ids):04d}", turn.model, 1, turn.echo, turn.tool_names
        )
        fault = self._take_fault()
        if fault is not None:
            return await self._faulty(request, "responses", fault, stream)
        if not turn.stream:
            completion = chat_completion(*self._chat_answer(turn.body))
            response_id = f"resp_capture{next(self._ids):04d}"
            return web.json_response(
                completion_to_response(completion, response_id, turn.model, 1, turn.echo, turn.tool_names)
            )
        chunks = chat_stream(*self._chat_answer(turn.body))
        return await _translated(request, [stream.feed(c) for c in chunks] + [stream.finish()])


def chat_completion(kind: str, value: Any) -> dict[str, Any]:
    """The whole ``chat.completion`` answering ``("text", str)`` or ``("tool", (id, name, input))``."""
    message: dict[str, Any] = {"role": "assistant", "content": value if kind == "text" else None}
    if kind == "tool":
        call_id, name, arguments = value
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments)},
            }
        ]
    return {
        "id": "chatcmpl-capture",
        "object": "chat.completion",
        "created": 1,
        "model": MODEL,
        "choices": [
            {"index": 0, "message": message, "finish_reason": "stop" if kind == "text" else "tool_calls"}
        ],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
    }


def chat_stream(kind: str, value: Any) -> list[bytes]:
    """A Chat Completions stream answering ``("text", str)`` or ``("tool", (id, name, input))``,
    as an engine sends it: a role chunk, content or a tool call in two argument fragments, the
    finish reason, usage, ``[DONE]``."""

    def chunk(delta: dict[str, Any] | None, finish: str | None = None, usage: bool = False) -> bytes:
        doc: dict[str, Any] = {
            "id": "chatcmpl-capture",
            "object": "chat.completion.chunk",
            "created": 1,
            "model": MODEL,
            "choices": [],
        }
        if usage:
            doc["usage"] = {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17}
        else:
            doc["choices"] = [{"index": 0, "delta": delta or {}, "finish_reason": finish}]
        return f"data: {json.dumps(doc)}\n\n".encode()

    out = [chunk({"role": "assistant", "content": ""})]
    if kind == "text":
        out += [
            chunk({"content": value[: len(value) // 2]}),
            chunk({"content": value[len(value) // 2 :]}),
            chunk({}, "stop"),
        ]
    else:
        call_id, name, arguments = value
        text = json.dumps(arguments)
        out += [
            chunk(
                {
                    "tool_calls": [
                        {
                            "index": 0,
                            "id": call_id,
                            "type": "function",
                            "function": {"name": name, "arguments": text[:3]},
                        }
                    ]
                }
            ),
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": text[3:]}}]}),
            chunk({}, "tool_calls"),
        ]
    return [*out, chunk(None, usage=True), b"data: [DONE]\n\n"]


async def _translated(request: web.Request, parts: list[bytes]) -> web.StreamResponse:
    answer = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
    await answer.prepare(request)
    for part in parts:
        if part:
            await answer.write(part)
    await answer.write_eof()
    return answer


def _text_of(content: Any) -> str:
    """The text of a tool result's content: a string, or the ``text`` of its text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(b.get("text", "") for b in content if isinstance(b, dict))
    return ""


def _model(model_id: str) -> dict[str, Any]:
    return {
        "type": "model",
        "id": model_id,
        "display_name": model_id,
        "created_at": "2026-01-01T00:00:00Z",
        "object": "model",
        "created": 0,
        "owned_by": "capture",
    }


def _models_page() -> dict[str, Any]:
    return {"object": "list", "data": [_model(MODEL)], "has_more": False, "first_id": MODEL, "last_id": MODEL}


async def _sse(request: web.Request, events: list[_Event]) -> web.StreamResponse:
    answer = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
    await answer.prepare(request)
    for name, data in events:
        await answer.write(f"event: {name}\ndata: {json.dumps(data)}\n\n".encode())
    await answer.write_eof()
    return answer
