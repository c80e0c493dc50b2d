"""Anthropic Messages and OpenAI Responses requests as the simulated engine reads them natively
(``--apis messages,responses``), as vLLM and llama.cpp's server serve ``/v1/messages`` and vLLM
serves ``/v1/responses``.

Each request becomes the simulator's own :class:`~.wire.ChatRequest`, so it is queued, decoded and
answered (:mod:`.replies`) like a chat turn; only its wire format differs. The reading is an
engine's, lenient: what the simulated model needs (the conversation's text and tool rounds, the
tools offered, the tool choice, the output limit, ``stream``) is read, anything else is ignored,
never refused; what cannot be read is refused with 400 (404 for a model not served). It is
written here from the APIs' references (Anthropic "Messages"; OpenAI "Create a model response"),
apart from luftpause's own translators, which the native path exists to bypass.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from luftpause.testkit.engine import wire
from luftpause.testkit.engine.wire import ChatRequest, RequestError

__all__ = ["parse_messages_request", "parse_responses_request"]


def _text_of(content: Any) -> str:
    """The text of a string, or of the text parts (``text``, ``input_text``, ``output_text``) of a
    list of content blocks, joined with LF."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        return ""
    return "\n".join(
        part["text"] for part in content if isinstance(part, Mapping) and isinstance(part.get("text"), str)
    )


def _finish(
    body: Mapping[str, Any],
    served: Sequence[str],
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]],
    tool_choice: Any,
    parallel: bool,
    max_tokens: int,
) -> ChatRequest:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise RequestError(400, "'model' must be a non-empty string", "model")
    stream = body.get("stream") is True
    for i, tool in enumerate(tools):
        if wire.nesting_depth(tool) > wire.MAX_SCHEMA_DEPTH:
            raise RequestError(
                400, f"tools[{i}] is nested deeper than {wire.MAX_SCHEMA_DEPTH} levels", "tools"
            )
    if tool_choice == "required" and not tools:
        raise RequestError(400, "a tool choice that requires a tool needs 'tools'", "tool_choice")
    if isinstance(tool_choice, dict) and all(
        t["function"]["name"] != tool_choice["function"]["name"] for t in tools
    ):
        raise RequestError(400, "the tool choice names a tool that is not in 'tools'", "tool_choice")
    fault = wire.fault_of(body)
    if model not in served:
        raise RequestError(404, f"The model `{model}` does not exist.", "model")
    return ChatRequest(
        model=model,
        messages=messages or [{"role": "user", "content": ""}],
        stream=stream,
        include_usage=stream,
        max_tokens=max_tokens,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=parallel,
        fault=fault,
    )


def _function(name: Any, parameters: Any, where: str) -> dict[str, Any]:
    if not isinstance(name, str) or not name:
        raise RequestError(400, f"{where} needs a 'name'", "tools")
    if not isinstance(parameters, dict):
        parameters = {"type": "object", "properties": {}}
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


def parse_messages_request(raw: bytes, served: Sequence[str]) -> ChatRequest:
    """A ``POST /v1/messages`` body (Anthropic Messages: ``system``, ``messages`` of content blocks
    with ``tool_use`` / ``tool_result``, ``tools`` with ``input_schema``, ``tool_choice``,
    ``max_tokens``, ``stream``). Raises :class:`~.wire.RequestError`."""
    body = wire.parse_json_body(raw)
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    max_tokens = body.get("max_tokens")
    if type(max_tokens) is not int or max_tokens < 1:
        raise RequestError(400, "'max_tokens' must be a positive integer", "max_tokens")
    chat: list[dict[str, Any]] = []
    system = _text_of(body.get("system"))
    if system:
        chat.append({"role": "system", "content": system})
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError(400, "'messages' must be a non-empty list", "messages")
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
            raise RequestError(400, f"messages[{i}] must be an object with a valid 'role'", "messages")
        content = message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise RequestError(400, f"messages[{i}].content must be a string or a list", "messages")
        role = message["role"]
        text = _text_of([b for b in blocks if isinstance(b, dict) and b.get("type") == "text"])
        if role == "assistant":
            calls = [
                {
                    "id": str(b.get("id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(b.get("name") or ""),
                        "arguments": json.dumps(b.get("input") or {}),
                    },
                }
                for b in blocks
                if isinstance(b, dict) and b.get("type") == "tool_use"
            ]
            assistant: dict[str, Any] = {"role": "assistant", "content": text or None}
            if calls:
                assistant["tool_calls"] = calls
            chat.append(assistant)
            continue
        for block in blocks:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                chat.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(block.get("tool_use_id") or ""),
                        "content": _text_of(block.get("content")),
                    }
                )
        if text or not any(isinstance(b, dict) and b.get("type") == "tool_result" for b in blocks):
            chat.append({"role": role, "content": text})
    tools = [
        _function(t.get("name"), t.get("input_schema"), f"tools[{i}]")
        for i, t in enumerate(body.get("tools") or ())
        if isinstance(t, dict)
    ]
    choice = body.get("tool_choice")
    tool_choice: Any = None
    parallel = True
    if isinstance(choice, dict):
        kind = choice.get("type")
        tool_choice = {"auto": "auto", "any": "required", "none": "none"}.get(str(kind))
        if kind == "tool":
            tool_choice = {"type": "function", "function": {"name": str(choice.get("name") or "")}}
        parallel = choice.get("disable_parallel_tool_use") is not True
    return _finish(body, served, chat, tools, tool_choice, parallel, max_tokens)


def parse_responses_request(raw: bytes, served: Sequence[str]) -> ChatRequest:
    """A ``POST /v1/responses`` body (OpenAI Responses: ``instructions``, ``input`` as a string or
    items -- messages, ``function_call``, ``function_call_output`` --, flat ``function`` tools,
    ``tool_choice``, ``parallel_tool_calls``, ``max_output_tokens``, ``stream``). Tools of other
    types are ignored, as an engine that has none to run would. Raises
    :class:`~.wire.RequestError`."""
    body = wire.parse_json_body(raw)
    if not isinstance(body, dict):
        raise RequestError(400, "request body must be a JSON object")
    chat: list[dict[str, Any]] = []
    instructions = body.get("instructions")
    if isinstance(instructions, str) and instructions:
        chat.append({"role": "system", "content": instructions})
    given = body.get("input")
    if isinstance(given, str):
        chat.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for item in given:
            if not isinstance(item, dict):
                raise RequestError(400, "'input' items must be objects", "input")
            kind = item.get("type", "message")
            if kind == "message":
                role = item.get("role")
                role = "system" if role == "developer" else role
                if role not in ("user", "assistant", "system"):
                    raise RequestError(400, "an input message needs a valid 'role'", "input")
                chat.append({"role": role, "content": _text_of(item.get("content"))})
            elif kind == "function_call":
                call = {
                    "id": str(item.get("call_id") or ""),
                    "type": "function",
                    "function": {
                        "name": str(item.get("name") or ""),
                        "arguments": str(item.get("arguments") or ""),
                    },
                }
                last = chat[-1] if chat else None
                if last is not None and last["role"] == "assistant" and "tool_calls" in last:
                    last["tool_calls"].append(call)
                else:
                    chat.append({"role": "assistant", "content": None, "tool_calls": [call]})
            elif kind == "function_call_output":
                chat.append(
                    {
                        "role": "tool",
                        "tool_call_id": str(item.get("call_id") or ""),
                        "content": _text_of(item.get("output")),
                    }
                )
    else:
        raise RequestError(400, "'input' must be a string or a list of items", "input")
    tools = [
        _function(t.get("name"), t.get("parameters"), f"tools[{i}]")
        for i, t in enumerate(body.get("tools") or ())
        if isinstance(t, dict) and t.get("type") == "function"
    ]
    choice = body.get("tool_choice")
    tool_choice: Any = choice if choice in ("auto", "none", "required") else None
    if isinstance(choice, dict) and choice.get("type") == "function":
        tool_choice = {"type": "function", "function": {"name": str(choice.get("name") or "")}}
    max_tokens = body.get("max_output_tokens")
    if max_tokens is not None and (type(max_tokens) is not int or max_tokens < 1):
        raise RequestError(400, "'max_output_tokens' must be a positive integer", "max_output_tokens")
    parallel = body.get("parallel_tool_calls") is not False
    return _finish(body, served, chat, tools, tool_choice, parallel, max_tokens or 0)
