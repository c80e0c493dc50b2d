"""A tool call the model wrote as text, recovered when the whole reply is that one call.

Engines turn a model's tool call into OpenAI ``tool_calls`` only when they run with the right tool
parser (vLLM ``--tool-call-parser llama3_json`` / ``hermes``, SGLang ``--tool-call-parser``); without
it, or when the model drifts from its template, the call arrives as the reply's text and the run
would end with it as its "answer". :func:`recover_tool_call` recognises the common written forms::

    Llama 3.x JSON   (the prompt of vLLM's tool_chat_template_llama3.1_json.jinja and Meta's docs)
        <|python_tag|>{"name": "search", "parameters": {"query": "x"}}  (trailing <|eom_id|> dropped)
        {"name": "search", "parameters": {"query": "x"}}
        {"type": "function", "name": "search", "parameters": {...}}          (Llama 3.2 often writes this)
    Hermes / Qwen2.5 (NousResearch Hermes 2 Pro, Qwen2.5's chat template; vLLM's ``hermes`` parser)
        <tool_call>
        {"name": "search", "arguments": {"query": "x"}}
        </tool_call>                                                       (closing tag may be missing)
    bare JSON        {"name": "search", "arguments": {...}} or "arguments": "<JSON text>"

Recovered only when all of these hold, so that an answer which merely *mentions* a call, or is
JSON for some other purpose, stays an answer:

* after stripping whitespace and at most one surrounding Markdown code fence (```` ``` ```` or
  ```` ```json ````; models fence JSON out of habit, and a fence adds nothing but the wrapper), the
  reply is exactly one of the forms above, with no other text before or after it;
* the JSON is one well-formed object whose keys are ``name`` (a string), exactly one of
  ``arguments`` / ``parameters`` (an object, or a string for :func:`prepare_arguments` to parse),
  and optionally ``"type": "function"``; nothing else. Inside explicit markers (``<tool_call>``,
  ``<|python_tag|>``) the arguments key may be missing and means ``{}``; bare JSON must have it;
* the name is one of the tools offered to the model in that turn.

Several calls in one reply (several ``<tool_call>`` blocks, or Llama's ``;``-separated objects)
are not recovered: this is a fallback for a model that failed to produce structured calls, and
guessing at a batch of them is where it would go wrong; parallel tool calls are off by default.
Pythonic (``[f(x=1)]``) and XML-argument forms (Qwen3-Coder's ``<function=...>``) are not read.

:func:`openai_tool_call` turns a recovered call into the OpenAI ``tool_calls`` entry the loop puts
on the assistant message, so the conversation replays as an ordinary tool round.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any, Final, NamedTuple

__all__ = ["RecoveredCall", "openai_tool_call", "recover_tool_call"]

PYTHON_TAG: Final = "<|python_tag|>"
LLAMA_END_TOKENS: Final = ("<|eom_id|>", "<|eot_id|>")
TOOL_CALL_OPEN: Final = "<tool_call>"
TOOL_CALL_CLOSE: Final = "</tool_call>"

_FENCE: Final = re.compile(r"```[A-Za-z0-9_-]*[ \t]*\n(.*)\n[ \t]*```", re.DOTALL)
_ALLOWED_KEYS: Final = frozenset({"name", "arguments", "parameters", "type"})


class RecoveredCall(NamedTuple):
    """One call recovered from text: the tool's ``name`` and its ``arguments`` as written, an
    object or JSON text (both accepted by
    :func:`~luftpause.runtime.agent.tool_arguments.prepare_arguments`)."""

    name: str
    arguments: dict[str, Any] | str


def recover_tool_call(text: str, offered: Iterable[str]) -> RecoveredCall | None:
    """The single tool call that ``text`` (a reply's ``message.content``) consists of, or None.

    ``offered`` are the names of the tools offered in the turn. Returns None for text around the
    call, several calls, a name not offered, malformed JSON, or any other key in the object; the
    forms and rules are in the module docstring. Never raises for any ``str``.
    """
    if not isinstance(text, str):
        return None
    body = text.lstrip("\ufeff").strip()  # a leading byte order mark is no text of the model's
    fenced = _FENCE.fullmatch(body)
    if fenced is not None:
        body = fenced.group(1).strip()
    marked = True
    if body.startswith(PYTHON_TAG):
        body = body.removeprefix(PYTHON_TAG)
        for end in LLAMA_END_TOKENS:
            body = body.strip().removesuffix(end)
    elif body.startswith(TOOL_CALL_OPEN):
        # Several blocks leave "</tool_call> <tool_call>" inside the body, which is no JSON; a tag
        # inside a JSON string (code the model passes on) is fine.
        body = body.removeprefix(TOOL_CALL_OPEN).rstrip().removesuffix(TOOL_CALL_CLOSE)
    else:
        marked = False
        # Llama's JSON form without <|python_tag|> still ends with its end-of-turn token.
        for end in LLAMA_END_TOKENS:
            body = body.strip().removesuffix(end)
    call = _parse_call(body.strip(), marked)
    if call is None or call.name not in set(offered):
        return None
    return call


def openai_tool_call(call: RecoveredCall, call_id: str) -> dict[str, Any]:
    """``call`` as an entry of an assistant message's ``tool_calls`` (OpenAI chat completions:
    ``{"id", "type": "function", "function": {"name", "arguments": <JSON text>}}``)."""
    arguments = call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments)
    return {"id": call_id, "type": "function", "function": {"name": call.name, "arguments": arguments}}


def _parse_call(body: str, marked: bool) -> RecoveredCall | None:
    if not body.startswith("{"):
        return None
    try:
        value = json.loads(body, parse_constant=_refuse_constant)
    except (ValueError, RecursionError):  # NaN and Infinity too: not JSON (RFC 8259 section 6)
        return None
    if not isinstance(value, dict) or not set(value) <= _ALLOWED_KEYS:
        return None
    name = value.get("name")
    if not isinstance(name, str) or not name:
        return None
    if "type" in value and value["type"] != "function":
        return None
    given = [value[key] for key in ("arguments", "parameters") if key in value]
    if len(given) > 1:
        return None  # both keys: which one the model meant is a guess
    if not given:
        return RecoveredCall(name, {}) if marked else None
    arguments = given[0]
    if not isinstance(arguments, dict | str):
        return None
    return RecoveredCall(name, arguments)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")
