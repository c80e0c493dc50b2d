"""The wire formats the simulated engine answers in: Chat Completions always, Anthropic Messages and
OpenAI Responses when it serves them natively (``EngineSettings.apis``).

A :class:`Dialect` reads a request of its API into the simulator's :class:`~.wire.ChatRequest`
and makes a :class:`Writer` per answer, which turns the reply's pieces (:mod:`.replies`, one per
output token) into that API's server-sent events, or into its whole answer; refusals and errors
take the API's error shape. The server (:mod:`.server`) drives every dialect the same way, so
queueing, decode pace, the prefix cache, usage and faults are the chat route's.

Formats, from the APIs' references:

* Chat Completions: :mod:`.wire` (``data: <chunk>`` ... ``data: [DONE]``).
* Messages ("Streaming Messages"): ``event: <type>`` / ``data: <json>`` events ``message_start``,
  ``ping``, per block ``content_block_start`` / ``content_block_delta`` (``text_delta``,
  ``input_json_delta``) / ``content_block_stop``, then ``message_delta`` (``stop_reason``
  ``end_turn`` | ``max_tokens`` | ``tool_use``, ``usage.output_tokens``) and ``message_stop``; a
  failure is an ``error`` event (``{"type": "error", "error": {"type": "api_error", ...}}``).
  Tool-use ids are ``toolu_...`` (the reply's ``call_...`` ids renamed), so a test can tell a
  natively served answer from a translated one. Errors: ``{"type": "error", "error": {"type",
  "message"}}``.
* Responses ("Streaming events"): ``response.created``, ``response.in_progress``, per item
  ``response.output_item.added``, a message's ``response.content_part.added`` /
  ``response.output_text.delta`` / ``.done`` / ``response.content_part.done``, a call's
  ``response.function_call_arguments.delta`` / ``.done``, ``response.output_item.done``; then
  ``response.completed`` (or ``response.incomplete``, ``max_output_tokens``, for a reply cut by
  its limit); every event with ``sequence_number``; a failure is ``response.failed``. Errors: the
  OpenAI error object.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any, Protocol

from luftpause.testkit.engine import wire
from luftpause.testkit.engine.faults import StatusFault
from luftpause.testkit.engine.native_requests import parse_messages_request, parse_responses_request
from luftpause.testkit.engine.replies import ContentPiece, Piece, Reply, ToolCallStart
from luftpause.testkit.engine.wire import ChatRequest, RequestError, ResponseIds

__all__ = ["DIALECTS", "Dialect", "Writer"]

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    503: "overloaded_error",
    529: "overloaded_error",
}


def _anthropic_error(status: int, message: str) -> dict[str, Any]:
    kind = _ANTHROPIC_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": message}}


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return (
        b"event: " + kind.encode() + b"\ndata: " + json.dumps(data, separators=(",", ":")).encode() + b"\n\n"
    )


class Writer(Protocol):
    """One answer's events: ``opening`` once decode has begun, ``piece`` per output token,
    ``closing`` after the last; ``failure`` in place of the rest when the engine fails mid-stream
    (ends the stream: no ``[DONE]`` or end event follows unless it is part of it); ``whole`` the
    non-streamed answer. Each returns one element per server-sent event."""

    def opening(self, prompt_tokens: int, cached_tokens: int) -> list[bytes]: ...

    def piece(self, piece: Piece) -> list[bytes]: ...

    def closing(self, prompt_tokens: int, cached_tokens: int) -> list[bytes]: ...

    def failure(self, message: str) -> bytes: ...

    def whole(self, prompt_tokens: int, cached_tokens: int) -> dict[str, Any]: ...


class Dialect(Protocol):
    """An API as the engine serves it: its route, how it reads a request, its answers' ids, its
    error shape and its writer."""

    api: str
    path: str

    def parse(self, raw: bytes, served: Sequence[str]) -> ChatRequest: ...

    def ids(self, model: str) -> ResponseIds: ...

    def request_error(self, error: RequestError) -> dict[str, Any]: ...

    def refusal(self, fault: StatusFault) -> dict[str, Any]: ...

    def writer(self, ids: ResponseIds, reply: Reply, chat: ChatRequest) -> Writer: ...


# --- Chat Completions -----------------------------------------------------------------------------


class _ChatWriter:
    def __init__(self, ids: ResponseIds, reply: Reply, chat: ChatRequest) -> None:
        self.ids, self.reply, self.chat = ids, reply, chat

    def opening(self, prompt_tokens: int, cached_tokens: int) -> list[bytes]:
        # With continuous_usage_stats the first chunk says the prompt's tokens, as vLLM's does
        # (the simulator's later chunks carry none; the usage chunk at the end says all).
        usage = wire.usage(prompt_tokens, 0, cached_tokens) if self.chat.continuous_usage else None
        return [wire.chunk(self.ids, {"role": "assistant", "content": ""}, with_usage=usage)]

    def piece(self, piece: Piece) -> list[bytes]:
        return [wire.piece_chunk(self.ids, self.reply, piece, self.chat)]

    def closing(self, prompt_tokens: int, cached_tokens: int) -> list[bytes]:
        tail = [wire.chunk(self.ids, {}, None, self.reply.finish_reason)]
        if self.chat.include_usage:
            tail.append(wire.usage_chunk(self.ids, prompt_tokens, self.reply.count, cached_tokens))
        tail.append(wire.SSE_DONE)
        return tail

    def failure(self, message: str) -> bytes:
        error = {"error": {"object": "error", "message": message, "type": "InternalServerError", "code": 500}}
        return wire.sse(error) + wire.SSE_DONE

    def whole(self, prompt_tokens: int, cached_tokens: int) -> dict[str, Any]:
        return wire.completion(self.ids, self.reply, self.chat, prompt_tokens, cached_tokens)


class _Chat:
    api = "chat"
    path = "/v1/chat/completions"

    def parse(self, raw: bytes, served: Sequence[str]) -> ChatRequest:
        return wire.parse_chat_request(raw, served)

    def ids(self, model: str) -> ResponseIds:
        return ResponseIds(model)

    def request_error(self, error: RequestError) -> dict[str, Any]:
        return error.body()

    def refusal(self, fault: StatusFault) -> dict[str, Any]:
        return fault.body()

    def writer(self, ids: ResponseIds, reply: Reply, chat: ChatRequest) -> Writer:
        return _ChatWriter(ids, reply, chat)


# --- Anthropic Messages ---------------------------------------------------------------------------


def _tool_use_id(call_id: str) -> str:
    return "toolu_" + call_id.removeprefix("call_")


def _stop_reason(reply: Reply) -> str:
    return {"length": "max_tokens", "tool_calls": "tool_use"}.get(reply.finish_reason, "end_turn")


def _anthropic_usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens - cached_tokens,
        "cache_read_input_tokens": cached_tokens,
        "cache_creation_input_tokens": 0,
        "output_tokens": output_tokens,
    }


class _MessagesWriter:
    def __init__(self, ids: ResponseIds, reply: Reply, chat: ChatRequest) -> None:
        self.ids, self.reply = ids, reply
        self.index = -1
        self.open: str | None = None  # "text" or "tool_use"

    def opening(self, prompt_tokens: int, cached_tokens: int) -> list[bytes]:
        message: dict[str, Any] = {
            "id": self.ids.id,
            "type": "message",
            "role": "assistant",
            "model": self.ids.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": _anthropic_usage(prompt_tokens, cached_tokens, 1),
        }
        return [
            _event("message_start", {"type": "message_start", "message": message}),
            _event("ping", {"type": "ping"}),
        ]

    def _close(self) -> list[bytes]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", {"type": "content_block_stop", "index": self.index})]

    def _start(self, kind: str, block: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.index += 1
        self.open = kind
        start = {"type": "content_block_start", "index": self.index, "content_block": block}
        return [*out, _event("content_block_start", start)]

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event(
            "content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta}
        )

    def piece(self, piece: Piece) -> list[bytes]:
        if isinstance(piece, ContentPiece):
            out = [] if self.open == "text" else self._start("text", {"type": "text", "text": ""})
            return [*out, self._delta({"type": "text_delta", "text": piece.text})]
        if isinstance(piece, ToolCallStart):
            block = {"type": "tool_use", "id": _tool_use_id(piece.call_id), "name": piece.name, "input": {}}
            return self._start("tool_use", block)
        return [self._delta({"type": "input_json_delta", "partial_json": piece.fragment})]

    def closing(self, prompt_tokens: int, cached_tokens: int) -> list[bytes]:
        delta = {
            "type": "message_delta",
            "delta": {"stop_reason": _stop_reason(self.reply), "stop_sequence": None},
            "usage": {"output_tokens": self.reply.count},
        }
        return [
            *self._close(),
            _event("message_delta", delta),
            _event("message_stop", {"type": "message_stop"}),
        ]

    def failure(self, message: str) -> bytes:
        return _event("error", _anthropic_error(500, message))

    def whole(self, prompt_tokens: int, cached_tokens: int) -> dict[str, Any]:
        message = wire.reply_message(self.reply)
        content: list[dict[str, Any]] = []
        if message.get("content"):
            content.append({"type": "text", "text": message["content"]})
        for call in message.get("tool_calls") or ():
            try:
                arguments = json.loads(call["function"]["arguments"])
            except ValueError:  # cut by the limit inside the arguments
                arguments = {}
            content.append(
                {
                    "type": "tool_use",
                    "id": _tool_use_id(call["id"]),
                    "name": call["function"]["name"],
                    "input": arguments if isinstance(arguments, dict) else {},
                }
            )
        return {
            "id": self.ids.id,
            "type": "message",
            "role": "assistant",
            "model": self.ids.model,
            "content": content,
            "stop_reason": _stop_reason(self.reply),
            "stop_sequence": None,
            "usage": _anthropic_usage(prompt_tokens, cached_tokens, self.reply.count),
        }


class _Messages:
    api = "messages"
    path = "/v1/messages"

    def parse(self, raw: bytes, served: Sequence[str]) -> ChatRequest:
        return parse_messages_request(raw, served)

    def ids(self, model: str) -> ResponseIds:
        return ResponseIds(model, id="msg_" + ResponseIds(model).id.removeprefix("chatcmpl-"))

    def request_error(self, error: RequestError) -> dict[str, Any]:
        return _anthropic_error(error.status, error.message)

    def refusal(self, fault: StatusFault) -> dict[str, Any]:
        message = fault.message or f"simulated engine fault: status {fault.status}"
        return _anthropic_error(fault.status, message)

    def writer(self, ids: ResponseIds, reply: Reply, chat: ChatRequest) -> Writer:
        return _MessagesWriter(ids, reply, chat)


# --- OpenAI Responses -----------------------------------------------------------------------------


def _responses_usage(prompt_tokens: int, cached_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {
        "input_tokens": prompt_tokens,
        "input_tokens_details": {"cached_tokens": cached_tokens},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": prompt_tokens + output_tokens,
    }


class _ResponsesWriter:
    def __init__(self, ids: ResponseIds, reply: Reply, chat: ChatRequest) -> None:
        self.ids, self.reply = ids, reply
        self.sequence = 0
        self.output: list[dict[str, Any]] = []
        self.text: list[str] = []  # the open item's text or arguments

    def _event(self, data: dict[str, Any]) -> bytes:
        data["sequence_number"] = self.sequence
        self.sequence += 1
        return _event(data["type"], data)

    def _response(self, status: str, usage: dict[str, Any] | None = None) -> dict[str, Any]:
        return {
            "id": self.ids.id,
            "object": "response",
            "created_at": self.ids.created,
            "status": status,
            "error": None,
            "incomplete_details": {"reason": "max_output_tokens"} if status == "incomplete" else None,
            "model": self.ids.model,
            "output": [dict(item) for item in self.output] if status != "in_progress" else [],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": usage,
        }

    def opening(self, prompt_tokens: int, cached_tokens: int) -> list[bytes]:
        return [
            self._event({"type": "response.created", "response": self._response("in_progress")}),
            self._event({"type": "response.in_progress", "response": self._response("in_progress")}),
        ]

    def _close(self) -> list[bytes]:
        if not self.output or self.output[-1]["status"] != "in_progress":
            return []
        index, item = len(self.output) - 1, self.output[-1]
        text = "".join(self.text)
        self.text = []
        item["status"] = "completed"
        if item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": []}
            item["content"] = [part]
            where = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out = [
                self._event({"type": "response.output_text.done", **where, "text": text}),
                self._event({"type": "response.content_part.done", **where, "part": part}),
            ]
        else:
            item["arguments"] = text
            out = [
                self._event(
                    {
                        "type": "response.function_call_arguments.done",
                        "item_id": item["id"],
                        "output_index": index,
                        "arguments": text,
                    }
                )
            ]
        out.append(
            self._event({"type": "response.output_item.done", "output_index": index, "item": dict(item)})
        )
        return out

    def _add(self, item: dict[str, Any]) -> list[bytes]:
        out = self._close()
        self.output.append(item)
        added = {
            "type": "response.output_item.added",
            "output_index": len(self.output) - 1,
            "item": dict(item),
        }
        return [*out, self._event(added)]

    def piece(self, piece: Piece) -> list[bytes]:
        base = self.ids.id.removeprefix("resp_")
        index = len(self.output) - 1
        if isinstance(piece, ContentPiece):
            out: list[bytes] = []
            if (
                not self.output
                or self.output[-1]["type"] != "message"
                or self.output[-1]["status"] != "in_progress"
            ):
                item_id = f"msg_{base}_{len(self.output)}"
                out = self._add(
                    {
                        "type": "message",
                        "id": item_id,
                        "status": "in_progress",
                        "role": "assistant",
                        "content": [],
                    }
                )
                index = len(self.output) - 1
                part = {"type": "output_text", "text": "", "annotations": []}
                out.append(
                    self._event(
                        {
                            "type": "response.content_part.added",
                            "item_id": item_id,
                            "output_index": index,
                            "content_index": 0,
                            "part": part,
                        }
                    )
                )
            self.text.append(piece.text)
            delta = {
                "type": "response.output_text.delta",
                "item_id": self.output[index]["id"],
                "output_index": index,
                "content_index": 0,
                "delta": piece.text,
            }
            return [*out, self._event(delta)]
        if isinstance(piece, ToolCallStart):
            item = {
                "type": "function_call",
                "id": f"fc_{base}_{len(self.output)}",
                "status": "in_progress",
                "call_id": piece.call_id,
                "name": piece.name,
                "arguments": "",
            }
            return self._add(item)
        self.text.append(piece.fragment)
        delta = {
            "type": "response.function_call_arguments.delta",
            "item_id": self.output[index]["id"],
            "output_index": index,
            "delta": piece.fragment,
        }
        return [self._event(delta)]

    def closing(self, prompt_tokens: int, cached_tokens: int) -> list[bytes]:
        out = self._close()
        usage = _responses_usage(prompt_tokens, cached_tokens, self.reply.count)
        if self.reply.finish_reason == "length":
            return [
                *out,
                self._event({"type": "response.incomplete", "response": self._response("incomplete", usage)}),
            ]
        return [
            *out,
            self._event({"type": "response.completed", "response": self._response("completed", usage)}),
        ]

    def failure(self, message: str) -> bytes:
        response = self._response("failed")
        response["error"] = {"code": "server_error", "message": message}
        return self._event({"type": "response.failed", "response": response})

    def whole(self, prompt_tokens: int, cached_tokens: int) -> dict[str, Any]:
        for piece in self.reply.pieces(0, self.reply.count):
            self.piece(piece)
        self._close()
        status = "incomplete" if self.reply.finish_reason == "length" else "completed"
        return self._response(status, _responses_usage(prompt_tokens, cached_tokens, self.reply.count))


class _Responses:
    api = "responses"
    path = "/v1/responses"

    def parse(self, raw: bytes, served: Sequence[str]) -> ChatRequest:
        return parse_responses_request(raw, served)

    def ids(self, model: str) -> ResponseIds:
        return ResponseIds(
            model, id="resp_" + ResponseIds(model).id.removeprefix("chatcmpl-"), created=int(time.time())
        )

    def request_error(self, error: RequestError) -> dict[str, Any]:
        return error.body()

    def refusal(self, fault: StatusFault) -> dict[str, Any]:
        return fault.body()

    def writer(self, ids: ResponseIds, reply: Reply, chat: ChatRequest) -> Writer:
        return _ResponsesWriter(ids, reply, chat)


DIALECTS: dict[str, Dialect] = {"chat": _Chat(), "messages": _Messages(), "responses": _Responses()}
"""Every API the simulator can serve, by its name in ``EngineSettings.apis``."""
