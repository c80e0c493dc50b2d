"""The OpenAI chat completions wire format, as vLLM and SGLang speak it.

Request: ``POST /v1/chat/completions`` with a JSON object (OpenAI API reference, "Create chat
completion"). Responses: a ``chat.completion`` object, or a stream of ``chat.completion.chunk``
objects as server-sent events (``data: {json}\\n\\n`` ... ``data: [DONE]\\n\\n``). Errors:
``{"error": {"message", "type", "param", "code"}}`` with the HTTP status, as vLLM answers them.
One extension: the optional field ``luftpause_fault`` asks for a fault (see :mod:`.faults`).

Every response object and chunk says it is simulated: ``"system_fingerprint":
"luftpause-simulator"``. ``usage`` carries ``prompt_tokens_details.cached_tokens`` (the prompt
tokens found in the prefix cache), as OpenAI and vLLM report them. The optional integer field
``priority`` (SGLang's and vLLM's) orders the waiting queue when the engine is set to.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from luftpause.testkit.engine.faults import FIELD as FAULT_FIELD
from luftpause.testkit.engine.faults import Fault, FaultSpecError, parse_fault
from luftpause.testkit.engine.replies import ContentPiece, Piece, Reply, ToolCallStart

# OpenAI's limit on top_logprobs.
MAX_TOP_LOGPROBS = 20

# Says, in every response object, that no real model answered.
SYSTEM_FINGERPRINT = "luftpause-simulator"

_ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})


class RequestError(Exception):
    """A request the engine refuses; ``status`` is the HTTP status (400 or 404)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param

    def body(self) -> dict[str, Any]:
        kind = "NotFoundError" if self.status == 404 else "BadRequestError"
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """A validated chat completion request; ``max_tokens`` is 0 when the client set no limit,
    ``fault`` is ``None`` when the body carries no ``luftpause_fault``."""

    model: str
    messages: Sequence[Mapping[str, Any]]
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False
    max_tokens: int = 0
    tools: Sequence[Mapping[str, Any]] = field(default_factory=tuple)
    tool_choice: Any = None
    parallel_tool_calls: bool = False
    logprobs: bool = False
    top_logprobs: int = 0
    priority: int = 0
    fault: Fault | None = None


MAX_SCHEMA_DEPTH = 64
"""Deepest nesting of a tool's ``parameters`` schema the simulator fills arguments for; deeper
ones are refused (400) rather than recursed into."""


def parse_json_body(raw: bytes) -> Any:
    """A request body as JSON (RFC 8259), parsed by orjson, whose nesting limit (1,024) and
    refusal of lone surrogates and NaN turn such bodies into :class:`RequestError` 400, as the
    dataplane answers them, instead of a ``RecursionError`` (500)."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestError(400, f"request body is not valid JSON: {exc}") from None


def nesting_depth(value: Any) -> int:
    """How deeply ``value`` nests lists and objects (a scalar: 0), walked without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            stack.extend((child, depth) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def parse_chat_request(raw: bytes, served: Sequence[str]) -> ChatRequest:
    """Validate a request body; raises :class:`RequestError` (400 malformed, too deeply nested or a
    tool schema deeper than :data:`MAX_SCHEMA_DEPTH`, 404 unknown model)."""
    body = parse_json_body(raw)
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(400, "'model' must be a non-empty string", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in _ROLES:
            raise RequestError(400, f"messages[{i}] must be an object with a valid 'role'", "messages")
        if not isinstance(message.get("content"), (str, list, type(None))):
            raise RequestError(400, f"messages[{i}].content must be a string, a list or null", "messages")
        calls = message.get("tool_calls")
        if calls is not None and not (isinstance(calls, list) and all(isinstance(c, dict) for c in calls)):
            raise RequestError(400, f"messages[{i}].tool_calls must be a list of objects", "messages")
    stream = _optional(body, "stream", bool, False)
    stream_options = _optional(body, "stream_options", dict, {})
    include_usage = stream_options.get("include_usage") is True
    continuous_usage = stream_options.get("continuous_usage_stats") is True
    max_tokens = _limit(body, "max_completion_tokens") or _limit(body, "max_tokens")
    n = _optional(body, "n", int, 1)
    if n != 1:
        raise RequestError(400, "the simulator answers only n=1", "n")
    tools = _tools(body)
    for i, tool in enumerate(tools):
        if nesting_depth(tool) > MAX_SCHEMA_DEPTH:
            raise RequestError(400, f"tools[{i}] is nested deeper than {MAX_SCHEMA_DEPTH} levels", "tools")
    tool_choice = _tool_choice(body, tools)
    parallel = _optional(body, "parallel_tool_calls", bool, False)
    logprobs = _optional(body, "logprobs", bool, False)
    top_logprobs = _optional(body, "top_logprobs", int, 0)
    if not 0 <= top_logprobs <= MAX_TOP_LOGPROBS:
        raise RequestError(400, f"'top_logprobs' must be between 0 and {MAX_TOP_LOGPROBS}", "top_logprobs")
    if top_logprobs and not logprobs:
        raise RequestError(400, "'top_logprobs' needs 'logprobs' to be true", "top_logprobs")
    priority = _optional(body, "priority", int, 0)
    fault = fault_of(body)
    if model not in served:
        raise RequestError(404, f"The model `{model}` does not exist.", "model")
    return ChatRequest(
        model=model,
        messages=messages,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
        max_tokens=max_tokens,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        logprobs=logprobs,
        top_logprobs=top_logprobs,
        priority=priority,
        fault=fault,
    )


def fault_of(body: Mapping[str, Any]) -> Fault | None:
    """The body's ``luftpause_fault``, parsed (``None`` without one); :class:`RequestError` 400 for a
    bad one."""
    spec = body.get(FAULT_FIELD)
    if spec is None:
        return None
    try:
        return parse_fault(spec)
    except FaultSpecError as exc:
        raise RequestError(400, exc.message, exc.param) from None


def _optional(body: Mapping[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key)
    if value is None:
        return default
    # bool is an int in Python, never in JSON Schema: refuse true for an integer field.
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise RequestError(400, f"'{key}' must be of type {kind.__name__}", key)
    return value


def _limit(body: Mapping[str, Any], key: str) -> int:
    value: int = _optional(body, key, int, 0)
    if value < 0:
        raise RequestError(400, f"'{key}' must not be negative", key)
    return value


def _tools(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    tools: list[dict[str, Any]] = _optional(body, "tools", list, [])
    for i, tool in enumerate(tools):
        function = tool.get("function") if isinstance(tool, dict) else None
        if (
            not isinstance(tool, dict)
            or tool.get("type") != "function"
            or not isinstance(function, dict)
            or not isinstance(function.get("name"), str)
            or not isinstance(function.get("parameters", {}), dict)
        ):
            raise RequestError(
                400,
                f"tools[{i}] must be {{'type': 'function', 'function': {{'name', 'parameters'}}}}",
                "tools",
            )
    return tools


def _tool_choice(body: Mapping[str, Any], tools: Sequence[Mapping[str, Any]]) -> Any:
    choice = body.get("tool_choice")
    if choice is None or choice in ("none", "auto", "required"):
        if choice == "required" and not tools:
            raise RequestError(400, "tool_choice 'required' needs 'tools'", "tool_choice")
        return choice
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise RequestError(
            400, "'tool_choice' must be none, auto, required or a named function", "tool_choice"
        )
    if all(t["function"]["name"] != name for t in tools):
        raise RequestError(400, f"tool_choice names '{name}', which is not in 'tools'", "tool_choice")
    return choice


@dataclass(slots=True)
class ResponseIds:
    """``id``, ``created`` and ``model`` shared by every chunk of one response."""

    model: str
    id: str = field(default_factory=lambda: f"chatcmpl-{secrets.token_hex(16)}")
    created: int = field(default_factory=lambda: int(time.time()))


def sse(payload: Mapping[str, Any]) -> bytes:
    """One server-sent event carrying ``payload`` as compact JSON."""
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"


def chunk(
    ids: ResponseIds,
    delta: Mapping[str, Any],
    logprobs: Any = None,
    finish: str | None = None,
    with_usage: Mapping[str, Any] | None = None,
) -> bytes:
    """A ``chat.completion.chunk`` event with one choice (and ``with_usage`` as its ``usage``, as
    vLLM and SGLang add it with ``stream_options.continuous_usage_stats``)."""
    choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}
    doc: dict[str, Any] = {
        "id": ids.id,
        "object": "chat.completion.chunk",
        "created": ids.created,
        "model": ids.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [choice],
    }
    if with_usage is not None:
        doc["usage"] = with_usage
    return sse(doc)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    """OpenAI's ``usage`` object; ``cached_tokens`` are the prompt tokens the prefix cache held."""
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
        "prompt_tokens_details": {"cached_tokens": cached_tokens},
    }


def usage_chunk(
    ids: ResponseIds, prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0
) -> bytes:
    """The usage-only chunk (``choices: []``) sent when ``stream_options.include_usage`` is true."""
    return sse(
        {
            "id": ids.id,
            "object": "chat.completion.chunk",
            "created": ids.created,
            "model": ids.model,
            "system_fingerprint": SYSTEM_FINGERPRINT,
            "choices": [],
            "usage": usage(prompt_tokens, completion_tokens, cached_tokens),
        }
    )


def logprob_item(reply: Reply, piece: ContentPiece, top_logprobs: int) -> dict[str, Any]:
    """One entry of ``logprobs.content``: the token, its log probability, its alternatives."""
    top = reply.top_logprobs(piece, max(top_logprobs, 1))
    token, logprob = top[0]
    return {
        "token": token,
        "logprob": logprob,
        "bytes": list(token.encode()),
        "top_logprobs": [
            {"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in top[:top_logprobs]
        ],
    }


def piece_chunk(ids: ResponseIds, reply: Reply, piece: Piece, request: ChatRequest) -> bytes:
    """The chunk that streams one piece (vLLM's shapes for content and tool-call deltas)."""
    if isinstance(piece, ContentPiece):
        logprobs = (
            {"content": [logprob_item(reply, piece, request.top_logprobs)]} if request.logprobs else None
        )
        return chunk(ids, {"content": piece.text}, logprobs)
    if isinstance(piece, ToolCallStart):
        call = {
            "index": piece.index,
            "id": piece.call_id,
            "type": "function",
            "function": {"name": piece.name, "arguments": ""},
        }
        return chunk(ids, {"tool_calls": [call]})
    return chunk(ids, {"tool_calls": [{"index": piece.index, "function": {"arguments": piece.fragment}}]})


def reply_message(reply: Reply) -> dict[str, Any]:
    """The assistant message of the whole of ``reply``, as a client gets it (and sends it back)."""
    texts: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    for piece in reply.pieces(0, reply.count):
        if isinstance(piece, ContentPiece):
            texts.append(piece.text)
        elif isinstance(piece, ToolCallStart):
            calls[piece.index] = {
                "id": piece.call_id,
                "type": "function",
                "function": {"name": piece.name, "arguments": ""},
            }
        else:
            calls[piece.index]["function"]["arguments"] += piece.fragment
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message


def completion(
    ids: ResponseIds, reply: Reply, request: ChatRequest, prompt_tokens: int, cached_tokens: int = 0
) -> dict[str, Any]:
    """The non-streamed ``chat.completion`` object for the whole of ``reply``."""
    message = reply_message(reply)
    items = []
    if request.logprobs:
        items = [
            logprob_item(reply, piece, request.top_logprobs)
            for piece in reply.pieces(0, reply.count)
            if isinstance(piece, ContentPiece)
        ]
    choice = {
        "index": 0,
        "message": message,
        "logprobs": {"content": items} if request.logprobs and items else None,
        "finish_reason": reply.finish_reason,
    }
    return {
        "id": ids.id,
        "object": "chat.completion",
        "created": ids.created,
        "model": ids.model,
        "system_fingerprint": SYSTEM_FINGERPRINT,
        "choices": [choice],
        "usage": usage(prompt_tokens, reply.count, cached_tokens),
    }
