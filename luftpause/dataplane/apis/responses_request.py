"""OpenAI Responses request -> OpenAI Chat Completions request.

``responses_to_chat(payload)`` takes the JSON body of ``POST /v1/responses`` (OpenAI API reference,
"Create a model response") and returns a :class:`ResponsesTurn` whose ``body`` is the Chat
Completions request sent to a replica that does not speak Responses. A field is translated,
ignored for a reason given here, or refused with :class:`~luftpause.dataplane.apis.errors.
TranslationError` (400 in OpenAI's error shape) naming it.

Translated:

* ``instructions`` -> the first ``system`` message; ``input`` as a string -> one ``user`` message.
* ``input`` items: ``message`` (also without ``type``) with role ``user``, ``assistant``,
  ``system`` or ``developer`` (-> ``system``: chat templates know no developer role), its content a
  string or ``input_text`` / ``output_text`` / ``refusal`` parts (text, joined with LF) and
  ``input_image`` parts (``image_url``, with ``detail``); ``function_call`` -> an assistant
  ``tool_calls`` entry (consecutive calls, and assistant text just before them, join one assistant
  message); ``function_call_output`` -> a ``tool`` message (``output`` a string, or text parts
  joined with LF; images in it follow as a ``user`` message); ``reasoning`` -> the
  ``reasoning_content`` of the assistant message after it (its ``content`` text, else its
  ``summary`` text), which chat templates that keep past reasoning read; one that holds only
  ``encrypted_content`` is refused (no engine can read it).
* ``tools``: ``function`` tools (flat shape: ``name``, ``description``, ``parameters``,
  ``strict``) -> chat functions; ``namespace`` tools (Codex sends its MCP servers' tools so:
  ``{"type": "namespace", "name": "mcp__fake", "tools": [...]}``) -> one chat function per member,
  named ``<namespace>__<name>`` (:data:`NAMESPACE_JOIN`); the answer maps the name back
  (``ResponsesTurn.tool_names``).
* ``tool_choice`` (``auto`` / ``none`` / ``required`` / a function), ``parallel_tool_calls``,
  ``max_output_tokens`` -> ``max_tokens``, ``temperature``, ``top_p``, ``stream`` (with
  ``stream_options.include_usage`` and ``continuous_usage_stats``: the prompt's tokens in the
  engine's first chunk, for ``response.created``), ``text.format`` (``json_schema`` -> ``response_format``
  ``json_schema``; ``json_object``; ``text``), ``reasoning.effort`` -> ``reasoning_effort``,
  ``safety_identifier`` / ``user`` -> ``user``.

Ignored, with the reason:

* ``store: false`` (what Codex sends): luftpause stores no response anyway.
* ``include`` (e.g. ``reasoning.encrypted_content``): luftpause returns no encrypted reasoning.
* ``prompt_cache_key``, ``client_metadata``, ``metadata``, ``service_tier``, ``truncation``,
  ``text.verbosity``, ``reasoning.summary``, ``stream_options``: hints or bookkeeping of OpenAI's
  service (``prompt_cache_key`` and Codex's headers are read as session signals, ``sessions``).

Refused: ``store: true`` (luftpause stores no responses: refusing it says so before a later
``previous_response_id`` would), ``previous_response_id`` and ``conversation``, ``background``,
``prompt``, hosted tools (``web_search``, which Codex offers unless ``web_search = "disabled"``,
as Messages refuses server tools), ``custom`` tools and tool calls, ``item_reference``
items, images by ``file_id``, files, and any other field.

``call_output_ids(payload)`` gives the ``call_id`` s of the request's latest tool round
(docs/architecture.md "Front-door APIs": run identity by echoed tool ids).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from luftpause.dataplane.apis import _shape as shape
from luftpause.dataplane.apis.errors import TranslationError

__all__ = ["MAX_LOOKUP_IDS", "NAMESPACE_JOIN", "ResponsesTurn", "call_output_ids", "responses_to_chat"]

MAX_LOOKUP_IDS = 64
NAMESPACE_JOIN = "__"
"""Joins a namespace tool's name and its member's in the chat function name (``mcp__fake__count_items``)."""

_TOP_LEVEL = {
    "model",
    "input",
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "temperature",
    "top_p",
    "stream",
    "store",
    "text",
    "reasoning",
    "include",
    "prompt_cache_key",
    "client_metadata",
    "metadata",
    "service_tier",
    "truncation",
    "user",
    "safety_identifier",
    "stream_options",
    "previous_response_id",
    "conversation",
}
_ECHOED = (
    "instructions",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "max_output_tokens",
    "temperature",
    "top_p",
    "text",
    "reasoning",
    "metadata",
    "truncation",
)
_TEXT_PARTS = {"input_text", "output_text", "refusal", "text"}


@dataclass(frozen=True, slots=True)
class ResponsesTurn:
    """A translated Responses request.

    ``body``: the Chat Completions request; ``model`` as the client named it; ``stream``;
    ``tool_names``: chat function name -> ``(namespace, name)`` for namespace members (the answer's
    ``function_call`` items carry ``namespace`` and the member's ``name``); ``echo``: the request's
    parameters that the Response object repeats (``instructions``, ``tools``, ``tool_choice``, ...)."""

    body: dict[str, Any]
    model: str
    stream: bool
    tool_names: dict[str, tuple[str, str]] = field(default_factory=dict)
    echo: dict[str, Any] = field(default_factory=dict)


def responses_to_chat(payload: dict[str, Any]) -> ResponsesTurn:
    """Translate a Responses request body (parsed JSON) to Chat Completions; see the module docstring.

    Raises :class:`TranslationError` (400) for a missing, malformed or unsupported field."""
    if payload.get("previous_response_id") is not None:
        raise TranslationError(
            "'previous_response_id' cannot be served: luftpause stores no responses; send the whole "
            "conversation in 'input' (Codex does, with store = false)",
            "previous_response_id",
        )
    if payload.get("conversation") is not None:
        raise TranslationError(
            "'conversation' cannot be served: luftpause stores no conversations; send the whole "
            "conversation in 'input'",
            "conversation",
        )
    shape.known_keys(payload, _TOP_LEVEL, "", "Responses")
    if payload.get("store") is not None and shape.boolean(payload["store"], "store"):
        raise TranslationError(
            "'store': true cannot be served: luftpause stores no responses; send 'store': false (or "
            "leave it out) and the whole conversation in 'input'",
            "store",
        )
    model = payload.get("model")
    if not isinstance(model, str) or not model:
        raise TranslationError("'model' must be a non-empty string", "model")
    chat: list[dict[str, Any]] = []
    instructions = payload.get("instructions")
    if instructions is not None and shape.string(instructions, "instructions"):
        chat.append({"role": "system", "content": instructions})
    tool_names: dict[str, tuple[str, str]] = {}
    tools: list[dict[str, Any]] = []
    if payload.get("tools") is not None:
        for i, tool in enumerate(shape.array(payload["tools"], "tools")):
            _tool(shape.obj(tool, f"tools[{i}]"), f"tools[{i}]", tools, tool_names)
    given = payload.get("input")
    if isinstance(given, str):
        chat.append({"role": "user", "content": given})
    else:
        for i, item in enumerate(shape.array(given, "input")):
            _item(shape.obj(item, f"input[{i}]"), f"input[{i}]", chat)
    body: dict[str, Any] = {"model": model, "messages": chat}
    if tools:
        body["tools"] = tools
    stream = shape.boolean(payload["stream"], "stream") if payload.get("stream") is not None else False
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    if payload.get("max_output_tokens") is not None:
        body["max_tokens"] = shape.integer(payload["max_output_tokens"], "max_output_tokens", 1)
    for key in ("temperature", "top_p"):
        if payload.get(key) is not None:
            body[key] = shape.number(payload[key], key)
    if payload.get("parallel_tool_calls") is not None:
        body["parallel_tool_calls"] = shape.boolean(payload["parallel_tool_calls"], "parallel_tool_calls")
    if payload.get("tool_choice") is not None:
        body["tool_choice"] = _tool_choice(payload["tool_choice"], tool_names)
    for key in ("safety_identifier", "user"):
        if payload.get(key) is not None:
            body["user"] = shape.string(payload[key], key)
    if payload.get("text") is not None:
        _text_config(shape.obj(payload["text"], "text"), body)
    if payload.get("reasoning") is not None:
        reasoning = shape.obj(payload["reasoning"], "reasoning")
        shape.known_keys(reasoning, ("effort", "summary", "generate_summary"), "reasoning", "Responses")
        if reasoning.get("effort") is not None:
            body["reasoning_effort"] = shape.string(reasoning["effort"], "reasoning.effort")
    shape.no_tool_choice_without_tools(body)
    echo = {key: payload[key] for key in _ECHOED if key in payload}
    return ResponsesTurn(body, model, stream, tool_names, echo)


def call_output_ids(payload: dict[str, Any]) -> list[str]:
    """The ``call_id`` s of the request's latest tool round: walking ``input`` from the end, every
    ``function_call_output`` and ``function_call`` up to the first item of another kind once some
    were found (at most :data:`MAX_LOOKUP_IDS`, in order; empty and non-string ids skipped). Never
    raises."""
    items = payload.get("input")
    if not isinstance(items, list):
        return []
    ids: list[str] = []
    for item in reversed(items):
        kind = item.get("type") if isinstance(item, dict) else None
        if kind in ("function_call_output", "function_call"):
            value = item.get("call_id")
            if isinstance(value, str) and value and value not in ids:
                ids.append(value)
                if len(ids) >= MAX_LOOKUP_IDS:
                    break
        elif ids and kind != "reasoning":
            break
    return ids


def _tool(
    tool: dict[str, Any], path: str, tools: list[dict[str, Any]], names: dict[str, tuple[str, str]]
) -> None:
    kind = tool.get("type")
    if kind == "function":
        function = _function(tool, path)
        _add(function, path, tools, names)
    elif kind == "namespace":
        shape.known_keys(tool, ("type", "name", "description", "tools"), path, "Responses")
        namespace = shape.string(tool.get("name"), f"{path}.name")
        for j, member in enumerate(shape.array(tool.get("tools"), f"{path}.tools")):
            where = f"{path}.tools[{j}]"
            member = shape.obj(member, where)
            if member.get("type") != "function":
                raise TranslationError(f"'{where}.type' must be 'function'", f"{where}.type")
            function = _function(member, where)
            flat = f"{namespace}{NAMESPACE_JOIN}{function['name']}"
            names[flat] = (namespace, function["name"])
            function["name"] = flat
            _add(function, where, tools, names)
    elif kind in ("web_search", "web_search_preview"):
        raise TranslationError(
            f"'{path}.type' {kind!r}: luftpause has no web search to serve (a hosted tool); offer "
            'function tools only (Codex: web_search = "disabled" in its config)',
            f"{path}.type",
        )
    else:
        raise TranslationError(
            f"'{path}.type' {kind!r}: luftpause serves function tools only (and namespaces of them)",
            f"{path}.type",
        )


def _function(tool: dict[str, Any], path: str) -> dict[str, Any]:
    shape.known_keys(
        tool,
        ("type", "name", "description", "parameters", "strict", "defer_loading", "output_schema"),
        path,
        "Responses",
    )
    function: dict[str, Any] = {"name": shape.string(tool.get("name"), f"{path}.name")}
    if tool.get("description") is not None:
        function["description"] = shape.string(tool["description"], f"{path}.description")
    function["parameters"] = (
        shape.obj(tool["parameters"], f"{path}.parameters")
        if tool.get("parameters") is not None
        else {"type": "object", "properties": {}}
    )
    if tool.get("strict") is not None:
        function["strict"] = shape.boolean(tool["strict"], f"{path}.strict")
    return function


def _add(
    function: dict[str, Any], path: str, tools: list[dict[str, Any]], names: dict[str, tuple[str, str]]
) -> None:
    name = function["name"]
    if any(t["function"]["name"] == name for t in tools):
        raise TranslationError(f"'{path}': two tools would both be called {name!r} in Chat Completions", path)
    tools.append({"type": "function", "function": function})


def _tool_choice(choice: Any, names: dict[str, tuple[str, str]]) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    choice = shape.obj(choice, "tool_choice")
    if choice.get("type") != "function":
        raise TranslationError(
            "'tool_choice' must be 'auto', 'none', 'required' or a function", "tool_choice.type"
        )
    shape.known_keys(choice, ("type", "name", "namespace"), "tool_choice", "Responses")
    name = shape.string(choice.get("name"), "tool_choice.name")
    if choice.get("namespace") is not None:
        name = f"{shape.string(choice['namespace'], 'tool_choice.namespace')}{NAMESPACE_JOIN}{name}"
    return {"type": "function", "function": {"name": name}}


def _text_config(text: dict[str, Any], body: dict[str, Any]) -> None:
    shape.known_keys(text, ("format", "verbosity"), "text", "Responses")
    if text.get("format") is None:
        return
    fmt = shape.obj(text["format"], "text.format")
    kind = fmt.get("type")
    if kind == "text":
        return
    if kind == "json_object":
        body["response_format"] = {"type": "json_object"}
        return
    if kind != "json_schema":
        raise TranslationError(
            "'text.format.type' must be 'text', 'json_object' or 'json_schema'", "text.format.type"
        )
    shape.known_keys(fmt, ("type", "name", "schema", "strict", "description"), "text.format", "Responses")
    schema: dict[str, Any] = {
        "name": shape.string(fmt.get("name", "output"), "text.format.name"),
        "schema": shape.obj(fmt.get("schema"), "text.format.schema"),
    }
    if fmt.get("strict") is not None:
        schema["strict"] = shape.boolean(fmt["strict"], "text.format.strict")
    if fmt.get("description") is not None:
        schema["description"] = shape.string(fmt["description"], "text.format.description")
    body["response_format"] = {"type": "json_schema", "json_schema": schema}


def _item(item: dict[str, Any], path: str, chat: list[dict[str, Any]]) -> None:
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        _message(item, path, chat)
    elif kind == "function_call":
        shape.known_keys(
            item, ("type", "id", "call_id", "name", "namespace", "arguments", "status"), path, "Responses"
        )
        name = shape.string(item.get("name"), f"{path}.name")
        if item.get("namespace") is not None:
            name = f"{shape.string(item['namespace'], f'{path}.namespace')}{NAMESPACE_JOIN}{name}"
        call = {
            "id": shape.string(item.get("call_id"), f"{path}.call_id"),
            "type": "function",
            "function": {"name": name, "arguments": shape.string(item.get("arguments"), f"{path}.arguments")},
        }
        last = chat[-1] if chat else None
        if last is not None and last["role"] == "assistant":
            last.setdefault("tool_calls", []).append(call)
        else:
            chat.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        shape.known_keys(item, ("type", "id", "call_id", "output", "status"), path, "Responses")
        call_id = shape.string(item.get("call_id"), f"{path}.call_id")
        output = item.get("output")
        images: list[dict[str, Any]] = []
        if isinstance(output, str):
            text = output
        else:
            texts: list[str] = []
            for j, part in enumerate(shape.array(output, f"{path}.output")):
                part = shape.obj(part, f"{path}.output[{j}]")
                if part.get("type") == "input_image":
                    images.append(_image(part, f"{path}.output[{j}]"))
                else:
                    texts.append(_part_text(part, f"{path}.output[{j}]"))
            text = "\n".join(texts)
        chat.append({"role": "tool", "tool_call_id": call_id, "content": text})
        if images:
            chat.append(
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Images returned by the tool call above:"}, *images],
                }
            )
    elif kind == "reasoning":
        _reasoning(item, path, chat)
    else:
        raise TranslationError(f"'{path}.type' {kind!r} is not supported as an input item", f"{path}.type")


def _reasoning(item: dict[str, Any], path: str, chat: list[dict[str, Any]]) -> None:
    """A past ``reasoning`` item -> ``reasoning_content`` of the assistant message it belongs to
    (the calls or text after it join that message), which chat templates that keep reasoning read;
    its ``content`` text, else its ``summary`` text."""
    shape.known_keys(
        item, ("type", "id", "summary", "content", "encrypted_content", "status"), path, "Responses"
    )
    texts: list[str] = []
    for key, part_kind in (("content", "reasoning_text"), ("summary", "summary_text")):
        for j, part in enumerate(shape.array(item.get(key) or [], f"{path}.{key}")):
            where = f"{path}.{key}[{j}]"
            part = shape.obj(part, where)
            if part.get("type") != part_kind:
                raise TranslationError(f"'{where}.type' must be '{part_kind}'", f"{where}.type")
            texts.append(shape.string(part.get("text"), f"{where}.text"))
        if texts:
            break
    if not texts:
        if item.get("encrypted_content") is not None:
            raise TranslationError(
                f"'{path}.encrypted_content': encrypted reasoning cannot be read by an engine (luftpause "
                "issues none); send the reasoning's text in 'content', or leave the item out",
                f"{path}.encrypted_content",
            )
        return  # a reasoning item with no text says nothing to pass on
    chat.append({"role": "assistant", "content": "", "reasoning_content": "\n".join(texts)})


def _message(item: dict[str, Any], path: str, chat: list[dict[str, Any]]) -> None:
    shape.known_keys(item, ("type", "id", "role", "content", "status", "phase"), path, "Responses")
    role = item.get("role")
    if role == "developer":
        role = "system"
    if role not in ("user", "assistant", "system"):
        raise TranslationError(
            f"'{path}.role' must be 'user', 'assistant', 'system' or 'developer'", f"{path}.role"
        )
    content = item.get("content")
    last = chat[-1] if chat else None
    if (
        role == "assistant"
        and last is not None
        and last["role"] == "assistant"
        and "reasoning_content" in last
    ):
        if not last["content"] and "tool_calls" not in last:
            chat.pop()  # the reasoning before this text: one assistant message with both
            reasoning = last["reasoning_content"]
            _message(item, path, chat)
            chat[-1]["reasoning_content"] = reasoning
            return
    if isinstance(content, str):
        chat.append({"role": role, "content": content})
        return
    texts: list[str] = []
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(shape.array(content, f"{path}.content")):
        where = f"{path}.content[{j}]"
        part = shape.obj(part, where)
        if part.get("type") == "input_image":
            if role != "user":
                raise TranslationError(f"'{where}': images are taken in user messages only", f"{where}.type")
            parts.append(_image(part, where))
        else:
            text = _part_text(part, where)
            texts.append(text)
            parts.append({"type": "text", "text": text})
    if len(texts) == len(parts):
        chat.append({"role": role, "content": "\n".join(texts)})
    else:
        chat.append({"role": role, "content": parts})


def _part_text(part: dict[str, Any], path: str) -> str:
    kind = part.get("type")
    if kind not in _TEXT_PARTS:
        raise TranslationError(f"'{path}.type' {kind!r} is not supported in message content", f"{path}.type")
    key = "refusal" if kind == "refusal" else "text"
    shape.known_keys(part, ("type", key, "annotations", "logprobs"), path, "Responses")
    return shape.string(part.get(key), f"{path}.{key}")


def _image(part: dict[str, Any], path: str) -> dict[str, Any]:
    shape.known_keys(part, ("type", "image_url", "file_id", "detail"), path, "Responses")
    if part.get("image_url") is None:
        raise TranslationError(
            f"'{path}': images are taken by 'image_url' only (luftpause keeps no files)", path
        )
    image: dict[str, Any] = {"url": shape.string(part["image_url"], f"{path}.image_url")}
    if part.get("detail") is not None and part["detail"] != "auto":
        image["detail"] = shape.string(part["detail"], f"{path}.detail")
    return {"type": "image_url", "image_url": image}
