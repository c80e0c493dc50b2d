"""Anthropic Messages request -> OpenAI Chat Completions request.

``messages_to_chat(payload)`` takes the JSON body of ``POST /v1/messages`` (Anthropic API
reference, "Messages": ``model``, ``max_tokens``, ``messages``, ``system`` ...) and returns a
:class:`MessagesTurn` whose ``body`` is the Chat Completions request sent to a replica that does
not speak Messages. Nothing is dropped silently: a field is translated, or ignored for a reason
given here, or refused with :class:`~luftpause.dataplane.apis.errors.TranslationError` (400 in
Anthropic's error shape) naming it.

Translated:

* ``system`` (a string, or text blocks joined with LF) -> the first ``system`` message; a
  ``system`` role inside ``messages`` (Claude Code sends one mid-conversation) -> a ``system``
  message at that place.
* ``user`` content blocks: ``text``; ``image`` (``base64`` source -> a ``data:`` URL, ``url``
  source -> that URL) -> ``image_url`` parts; ``tool_result`` -> a ``tool`` message per result
  (``tool_call_id`` = ``tool_use_id``; string or text-block content; ``is_error: true`` prefixes
  ``Error: `` because Chat Completions has no such flag; images in a result follow the tool
  messages as a ``user`` message, since engines take no images in ``tool`` messages). Tool messages
  come first, the rest of the user's blocks after them, as Chat Completions requires.
* ``assistant`` content: ``text`` -> ``content``; ``tool_use`` -> ``tool_calls`` (``arguments`` =
  the ``input`` as JSON); ``thinking`` -> ``reasoning_content`` (vLLM, SGLang and llama.cpp's
  server pass it to chat templates that keep past reasoning).
* ``tools`` (``input_schema`` -> ``parameters``), ``tool_choice`` (``auto`` -> ``"auto"``,
  ``any`` -> ``"required"``, ``tool`` -> that function, ``none`` -> ``"none"``;
  ``disable_parallel_tool_use`` -> ``parallel_tool_calls: false``), ``max_tokens``,
  ``stop_sequences`` -> ``stop``, ``temperature``, ``top_p``, ``stream`` (with
  ``stream_options.include_usage`` so the answer can report usage, and
  ``continuous_usage_stats``, which vLLM and SGLang read, so their first chunk gives the prompt's
  tokens for ``message_start``), ``metadata.user_id`` ->
  ``user``, ``output_config.format`` (``json_schema``) -> ``response_format``.
* ``thinking`` (Claude Code sends ``{"type": "adaptive"}`` on every main-agent turn) ->
  ``chat_template_kwargs.enable_thinking`` (``enabled`` / ``adaptive`` true, ``disabled`` false),
  which the chat templates of reasoning models (Qwen3, DeepSeek, ...) read; reasoning the engine
  streams is answered as ``thinking`` blocks. ``budget_tokens`` is held by ``max_tokens`` only, as
  Anthropic counts thinking in it (engines have no separate reasoning cap).
* ``top_k`` is passed on as the extra field ``top_k``, which vLLM, SGLang and llama.cpp's server
  read as a sampling parameter (decision: dropping it would change sampling without a word).

Ignored, with the reason:

* ``context_management`` (server-side edits of past thinking and tool results): luftpause keeps no
  conversation to edit: the messages the client sends are the conversation.
* ``output_config.effort``, ``service_tier``, ``cache_control`` on any block or tool: hints to
  Anthropic's service (engines cache prefixes by themselves).
* A ``system`` text block starting ``x-anthropic-billing-header:`` (Claude Code's first block, with
  a hash that differs between sessions): it is billing metadata, not an instruction, and as the
  first block it would keep an engine from sharing the long system prompt's prefix cache across
  sessions.

Refused: ``redacted_thinking`` blocks (Anthropic's encrypted reasoning: no engine can read it),
any other top-level field (``mcp_servers``, ``container``, ...), server tools (a tool whose
``type`` is not ``custom``), ``document``, ``search_result`` and server-tool blocks, ``n``-like
fields, and malformed shapes.

``tool_result_ids(payload)`` gives the ``tool_use_id`` s of the request's latest tool round, which
name the run that emitted them (docs/architecture.md "Front-door APIs": run identity by echoed tool ids).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from luftpause.dataplane.apis import _shape as shape
from luftpause.dataplane.apis.errors import TranslationError

__all__ = ["MAX_LOOKUP_IDS", "MessagesTurn", "messages_to_chat", "tool_result_ids"]

MAX_LOOKUP_IDS = 64
"""At most this many ids are taken from one request (as ``tool_calls.MAX_LOOKUP_IDS``)."""

_TOP_LEVEL = {
    "model",
    "messages",
    "max_tokens",
    "system",
    "tools",
    "tool_choice",
    "stop_sequences",
    "temperature",
    "top_p",
    "top_k",
    "stream",
    "metadata",
    "thinking",
    "context_management",
    "output_config",
    "service_tier",
}
_BILLING_BLOCK = "x-anthropic-billing-header:"


@dataclass(frozen=True, slots=True)
class MessagesTurn:
    """A translated Messages request.

    ``body``: the Chat Completions request (a dict, to be serialised with orjson); ``model`` as the
    client named it; ``stream``; ``thinking``: the client enabled thinking, so reasoning the engine
    streams is answered as ``thinking`` blocks; ``stop_sequences``: to tell ``stop_sequence`` from
    ``end_turn`` in the answer."""

    body: dict[str, Any]
    model: str
    stream: bool
    thinking: bool
    stop_sequences: tuple[str, ...]


def messages_to_chat(payload: dict[str, Any]) -> MessagesTurn:
    """Translate a Messages request body (parsed JSON) to Chat Completions; see the module docstring.

    Raises :class:`TranslationError` (400) for a missing, malformed or unsupported field.
    """
    shape.known_keys(payload, _TOP_LEVEL, "", "Messages")
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise TranslationError("'model' must be a non-empty string", "model")
    max_tokens = shape.integer(payload.get("max_tokens"), "max_tokens", 1)
    chat: list[dict[str, Any]] = []
    system = payload.get("system")
    if system is not None:
        text = _system_text(system, "system")
        if text:
            chat.append({"role": "system", "content": text})
    messages = shape.array(payload.get("messages"), "messages")
    for i, message in enumerate(messages):
        _message(shape.obj(message, f"messages[{i}]"), f"messages[{i}]", chat)
    body: dict[str, Any] = {"model": model, "messages": chat, "max_tokens": max_tokens}
    stream = bool(shape.boolean(payload["stream"], "stream")) if "stream" in payload else False
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    stops: tuple[str, ...] = ()
    if payload.get("stop_sequences") is not None:
        values = shape.array(payload["stop_sequences"], "stop_sequences")
        stops = tuple(shape.string(s, f"stop_sequences[{i}]") for i, s in enumerate(values))
        if stops:
            body["stop"] = list(stops)
    for key in ("temperature", "top_p"):
        if payload.get(key) is not None:
            body[key] = shape.number(payload[key], key)
    if payload.get("top_k") is not None:
        body["top_k"] = shape.integer(payload["top_k"], "top_k", 0)
    if payload.get("metadata") is not None:
        metadata = shape.obj(payload["metadata"], "metadata")
        shape.known_keys(metadata, ("user_id",), "metadata", "Messages")
        if metadata.get("user_id") is not None:
            body["user"] = shape.string(metadata["user_id"], "metadata.user_id")
    if payload.get("tools") is not None:
        tools = [
            _tool(shape.obj(t, f"tools[{i}]"), f"tools[{i}]")
            for i, t in enumerate(shape.array(payload["tools"], "tools"))
        ]
        if tools:
            body["tools"] = tools
    if payload.get("tool_choice") is not None:
        _tool_choice(shape.obj(payload["tool_choice"], "tool_choice"), body)
    if payload.get("output_config") is not None:
        _output_config(shape.obj(payload["output_config"], "output_config"), body)
    shape.no_tool_choice_without_tools(body)
    thinking = _thinking(payload.get("thinking"))
    if thinking is not None:
        body["chat_template_kwargs"] = {"enable_thinking": thinking}
    return MessagesTurn(body, model, stream, bool(thinking), stops)


def tool_result_ids(payload: dict[str, Any]) -> list[str]:
    """The ``tool_use_id`` of every ``tool_result`` in the last user message that has any, and the
    ``tool_use`` ids of the assistant message before it: the request's latest tool round (at most
    :data:`MAX_LOOKUP_IDS`, in order; empty and non-string ids skipped). Never raises."""
    messages = payload.get("messages")
    if not isinstance(messages, list):
        return []
    ids: list[str] = []
    for message in reversed(messages):
        if not isinstance(message, dict) or not isinstance(message.get("content"), list):
            continue
        role = message.get("role")
        for block in message["content"]:
            if not isinstance(block, dict):
                continue
            if role == "user" and block.get("type") == "tool_result":
                value = block.get("tool_use_id")
            elif role == "assistant" and block.get("type") == "tool_use":
                value = block.get("id")
            else:
                continue
            if isinstance(value, str) and value and value not in ids:
                ids.append(value)
                if len(ids) >= MAX_LOOKUP_IDS:
                    return ids
        if ids and role == "assistant":
            break
    return ids


def _thinking(value: Any) -> bool | None:
    """Whether the request enables thinking (``None``: it does not say)."""
    if value is None:
        return None
    thinking = shape.obj(value, "thinking")
    kind = thinking.get("type")
    if kind not in ("enabled", "adaptive", "disabled"):
        raise TranslationError("'thinking.type' must be 'enabled', 'adaptive' or 'disabled'", "thinking.type")
    shape.known_keys(thinking, ("type", "budget_tokens", "display"), "thinking", "Messages")
    return bool(kind != "disabled")


def _system_text(value: Any, path: str) -> str:
    """A system prompt (a string or text blocks) as one string."""
    if isinstance(value, str):
        return value
    parts: list[str] = []
    for i, block in enumerate(shape.array(value, path)):
        block = shape.obj(block, f"{path}[{i}]")
        if block.get("type") != "text":
            raise TranslationError(
                f"'{path}[{i}].type' must be 'text' in a system prompt", f"{path}[{i}].type"
            )
        text = shape.string(block.get("text"), f"{path}[{i}].text")
        if i == 0 and text.startswith(_BILLING_BLOCK):
            continue
        parts.append(text)
    return "\n".join(parts)


def _message(message: dict[str, Any], path: str, chat: list[dict[str, Any]]) -> None:
    role = message.get("role")
    shape.known_keys(message, ("role", "content"), path, "Messages")
    content = message.get("content")
    if role == "system":
        chat.append({"role": "system", "content": _system_text(content, f"{path}.content")})
        return
    if role not in ("user", "assistant"):
        raise TranslationError(f"'{path}.role' must be 'user', 'assistant' or 'system'", f"{path}.role")
    if isinstance(content, str):
        chat.append({"role": role, "content": content})
        return
    blocks = shape.array(content, f"{path}.content")
    if role == "user":
        _user(blocks, f"{path}.content", chat)
    else:
        _assistant(blocks, f"{path}.content", chat)


def _user(blocks: list[Any], path: str, chat: list[dict[str, Any]]) -> None:
    parts: list[dict[str, Any]] = []
    result_images: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        where = f"{path}[{i}]"
        block = shape.obj(block, where)
        kind = block.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": _text(block, where)})
        elif kind == "image":
            parts.append(_image(block, where))
        elif kind == "tool_result":
            chat.append(_tool_result(block, where, result_images))
        else:
            raise TranslationError(
                f"'{where}.type' {kind!r} is not supported in a user message", f"{where}.type"
            )
    if result_images:
        chat.append({"role": "user", "content": result_images})
    if parts:
        chat.append({"role": "user", "content": _content(parts)})


def _assistant(blocks: list[Any], path: str, chat: list[dict[str, Any]]) -> None:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict[str, Any]] = []
    for i, block in enumerate(blocks):
        where = f"{path}[{i}]"
        block = shape.obj(block, where)
        kind = block.get("type")
        if kind == "text":
            texts.append(_text(block, where))
        elif kind == "tool_use":
            shape.known_keys(
                block, ("type", "id", "name", "input", "cache_control", "caller"), where, "Messages"
            )
            call_id = shape.string(block.get("id"), f"{where}.id")
            name = shape.string(block.get("name"), f"{where}.name")
            arguments = shape.obj(block.get("input"), f"{where}.input")
            calls.append(
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": shape.json_text(arguments)},
                }
            )
        elif kind == "thinking":
            shape.known_keys(block, ("type", "thinking", "signature", "cache_control"), where, "Messages")
            thoughts.append(shape.string(block.get("thinking"), f"{where}.thinking"))
        elif kind == "redacted_thinking":
            raise TranslationError(
                f"'{where}.type' 'redacted_thinking' cannot be served: its reasoning is encrypted by "
                "Anthropic, and no engine can read it (luftpause never sends one); leave the block out",
                f"{where}.type",
            )
        else:
            raise TranslationError(
                f"'{where}.type' {kind!r} is not supported in an assistant message", f"{where}.type"
            )
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts else None}
    if calls:
        message["tool_calls"] = calls
    elif not texts:
        message["content"] = ""  # only thinking: still a turn of the assistant's
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    chat.append(message)


def _text(block: dict[str, Any], path: str) -> str:
    shape.known_keys(block, ("type", "text", "cache_control", "citations"), path, "Messages")
    return shape.string(block.get("text"), f"{path}.text")


def _image(block: dict[str, Any], path: str) -> dict[str, Any]:
    shape.known_keys(block, ("type", "source", "cache_control"), path, "Messages")
    source = shape.obj(block.get("source"), f"{path}.source")
    kind = source.get("type")
    if kind == "base64":
        media = shape.string(source.get("media_type"), f"{path}.source.media_type")
        data = shape.string(source.get("data"), f"{path}.source.data")
        url = f"data:{media};base64,{data}"
    elif kind == "url":
        url = shape.string(source.get("url"), f"{path}.source.url")
    else:
        raise TranslationError(f"'{path}.source.type' must be 'base64' or 'url'", f"{path}.source.type")
    return {"type": "image_url", "image_url": {"url": url}}


def _tool_result(block: dict[str, Any], path: str, images: list[dict[str, Any]]) -> dict[str, Any]:
    shape.known_keys(block, ("type", "tool_use_id", "content", "is_error", "cache_control"), path, "Messages")
    call_id = shape.string(block.get("tool_use_id"), f"{path}.tool_use_id")
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        texts: list[str] = []
        for j, part in enumerate(shape.array(content, f"{path}.content")):
            where = f"{path}.content[{j}]"
            part = shape.obj(part, where)
            if part.get("type") == "text":
                texts.append(_text(part, where))
            elif part.get("type") == "image":
                if not images:
                    images.append({"type": "text", "text": "Images returned by the tool calls above:"})
                images.append(_image(part, where))
            else:
                raise TranslationError(
                    f"'{where}.type' {part.get('type')!r} is not supported in a tool result", f"{where}.type"
                )
        text = "\n".join(texts)
    if block.get("is_error") is not None and shape.boolean(block["is_error"], f"{path}.is_error"):
        text = f"Error: {text}"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _content(parts: list[dict[str, Any]]) -> str | list[dict[str, Any]]:
    """Text parts alone as one string (what every chat template takes); with images, the parts."""
    if all(part["type"] == "text" for part in parts):
        return "\n".join(part["text"] for part in parts)
    return parts


def _tool(tool: dict[str, Any], path: str) -> dict[str, Any]:
    kind = tool.get("type")
    if kind not in (None, "custom"):
        raise TranslationError(
            f"'{path}.type' {kind!r}: luftpause serves client tools only (no server tools)", f"{path}.type"
        )
    shape.known_keys(
        tool, ("type", "name", "description", "input_schema", "cache_control", "strict"), path, "Messages"
    )
    function: dict[str, Any] = {
        "name": shape.string(tool.get("name"), f"{path}.name"),
        "parameters": shape.obj(tool.get("input_schema"), f"{path}.input_schema"),
    }
    if tool.get("description") is not None:
        function["description"] = shape.string(tool["description"], f"{path}.description")
    if tool.get("strict") is not None:
        function["strict"] = shape.boolean(tool["strict"], f"{path}.strict")
    return {"type": "function", "function": function}


def _tool_choice(choice: dict[str, Any], body: dict[str, Any]) -> None:
    kind = choice.get("type")
    shape.known_keys(choice, ("type", "name", "disable_parallel_tool_use"), "tool_choice", "Messages")
    if kind == "auto":
        body["tool_choice"] = "auto"
    elif kind == "any":
        body["tool_choice"] = "required"
    elif kind == "none":
        body["tool_choice"] = "none"
    elif kind == "tool":
        name = shape.string(choice.get("name"), "tool_choice.name")
        body["tool_choice"] = {"type": "function", "function": {"name": name}}
    else:
        raise TranslationError(
            "'tool_choice.type' must be 'auto', 'any', 'tool' or 'none'", "tool_choice.type"
        )
    if choice.get("disable_parallel_tool_use") is not None and shape.boolean(
        choice["disable_parallel_tool_use"], "tool_choice.disable_parallel_tool_use"
    ):
        body["parallel_tool_calls"] = False


def _output_config(config: dict[str, Any], body: dict[str, Any]) -> None:
    shape.known_keys(config, ("effort", "format"), "output_config", "Messages")
    if config.get("format") is None:
        return
    fmt = shape.obj(config["format"], "output_config.format")
    if fmt.get("type") != "json_schema":
        raise TranslationError(
            "'output_config.format.type' must be 'json_schema'", "output_config.format.type"
        )
    schema = shape.obj(fmt.get("schema"), "output_config.format.schema")
    body["response_format"] = {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
