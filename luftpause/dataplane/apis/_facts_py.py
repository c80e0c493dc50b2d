"""What a natively served Messages or Responses answer says, read on the side: pure-Python twins.

A replica that serves ``/v1/messages`` or ``/v1/responses`` itself (vLLM, llama.cpp's server, SGLang
Model Gateway) has its answer relayed to the client byte for byte, as chat turns are; the relay
still has to learn the turn's facts for the scheduler. :class:`MessagesScanner` and
:class:`ResponsesScanner` read them from those event formats with the interface of
:class:`luftpause.dataplane._sse_py.SSEScanner` -- ``feed(bytes) -> bool`` (the first token was seen
in this read) and the same attributes, in Chat Completions' terms, so the relay reports them as it
does a chat turn's:

* ``first_token_seen``: Messages: a ``content_block_delta`` with non-empty ``text`` or
  ``thinking``, any ``input_json_delta``, or a ``tool_use`` block started; Responses: a non-empty
  ``response.output_text.delta`` / ``response.reasoning_text.delta`` /
  ``response.reasoning_summary_text.delta`` / ``response.refusal.delta``, any
  ``response.function_call_arguments.delta``, or a ``function_call`` item added.
* ``tool_call_ids``: the ``id`` of each ``tool_use`` block (``toolu_...``); the ``call_id`` of each
  ``function_call`` (or ``custom_tool_call``) item added. ``saw_tool_calls`` as any was seen.
* ``finish_reason``: Messages' ``message_delta.delta.stop_reason`` mapped (``end_turn``,
  ``stop_sequence``, ``pause_turn`` -> ``stop``; ``max_tokens``, ``model_context_window_exceeded``
  -> ``length``; ``tool_use`` -> ``tool_calls``; ``refusal`` -> ``content_filter``; other values
  as they are); Responses' ``response.completed`` -> ``stop``, ``response.incomplete`` ->
  ``length`` (``max_output_tokens``) or ``content_filter``. ``tool_calls`` when any call was seen,
  whatever the end said, as for chat; but only once the end was said: a tool call alone sets no
  finish reason. ``stop_reason`` keeps the native value (Messages' ``stop_reason``, Responses'
  ``status``).
* ``choices_finished``: set with the finish reason (an answer of these APIs is one choice).
* ``prompt_tokens`` / ``completion_tokens``: Messages' ``usage`` of ``message_start`` and every
  ``message_delta`` (cumulative; ``input_tokens`` plus ``cache_read_input_tokens`` and
  ``cache_creation_input_tokens``, since a Chat Completions prompt count includes cached tokens;
  ``output_tokens``); Responses' ``usage`` of the final response (``input_tokens``,
  ``output_tokens``).
* ``done``: ``message_stop``; ``response.completed`` or ``response.incomplete``.
* ``error``: the message of an ``error`` event (``{"type": "error", "error": {"message": ...}}``
  in Messages; ``{"type": "error", "message": ...}`` in Responses) or of ``response.failed``
  (``response.error.message``), at most 500 characters, ``"engine error"`` when it has none.

Framing, the bound on an event's size, ``events``, ``event_count``, ``oversized_events`` and
``buffered_bytes`` are the chat scanner's own (WHATWG HTML 9.2.6; these classes subclass the pure
twin and replace only its ``_payload`` hook, what a dispatched event's data means; the compiled
twins in ``_speedups/_facts_c.pyx`` do the same on the compiled scanner). Once the first token has
been seen, an event whose ``type`` (the payload's first key, as both APIs write it) is a plain
content delta is not parsed: it can say nothing more. Never raises on what the engine sends.

:func:`message_facts` and :func:`response_facts` read the same from a whole (non-streamed) answer.
The compiled twins behave identically; ``tests/dataplane/front_doors/test_native_answer_facts.py``
runs every case on both and compares them on random streams.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

import orjson

from luftpause.dataplane._sse_py import DEFAULT_MAX_EVENT_BYTES, SSEScanner

__all__ = ["MessagesScanner", "ResponsesScanner", "message_facts", "response_facts"]

_MAX_ERROR_CHARS = 500
_NO_ERROR_MESSAGE = "engine error"

MESSAGES_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
"""Anthropic ``stop_reason`` -> Chat Completions ``finish_reason``."""

_MESSAGES_INERT = re.compile(
    rb'\{[ \t\r\n]*"type"[ \t\r\n]*:[ \t\r\n]*"(?:content_block_delta|content_block_stop|ping)"'
)
_RESPONSES_INERT = re.compile(
    rb'\{[ \t\r\n]*"type"[ \t\r\n]*:[ \t\r\n]*"response\.'
    rb'(?:output_text|function_call_arguments|reasoning_text|reasoning_summary_text|refusal)\.(?:delta|done)"'
)
_RESPONSES_TEXT_DELTAS = {
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.refusal.delta",
}
_CALL_ITEMS = ("function_call", "custom_tool_call")
"""A tuple, not a set: a ``type`` that is a list or an object must compare unequal, not raise."""


def _count(value: Any) -> int | None:
    return value if type(value) is int and value >= 0 else None


def _message_of(error: Any, fallback: Any = None) -> str:
    message = error.get("message") if isinstance(error, dict) else error if isinstance(error, str) else None
    if not isinstance(message, str) or not message:
        message = fallback
    if not isinstance(message, str) or not message:
        return _NO_ERROR_MESSAGE
    return message[:_MAX_ERROR_CHARS]


class _NativeScanner(SSEScanner):
    """The chat scanner's framing with another reading of each dispatched payload."""

    __slots__ = ("_inert", "stop_reason")

    _INERT: ClassVar[re.Pattern[bytes]]

    def __init__(self, keep_events: bool = False, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES) -> None:
        super().__init__(keep_events, max_event_bytes)
        self.stop_reason: str | None = None
        self._inert = self._INERT.match

    def _payload(self, data: bytes) -> None:
        if self.first_token_seen and self._inert(data) is not None:
            return
        try:
            obj = orjson.loads(data)
        except ValueError:
            return
        if type(obj) is dict:
            self._read(obj)

    def _read(self, obj: dict[str, Any]) -> None:
        raise NotImplementedError

    def _tool_call(self, call_id: Any) -> None:
        self.saw_tool_calls = True
        self.first_token_seen = True
        if self.finish_reason is not None:  # a call after the end was said
            self.finish_reason = "tool_calls"
        if isinstance(call_id, str) and call_id and call_id not in self._seen_ids:
            self._seen_ids.add(call_id)
            self.tool_call_ids.append(call_id)


class MessagesScanner(_NativeScanner):
    """Facts of an Anthropic Messages event stream; see the module docstring."""

    __slots__ = ()
    _INERT = _MESSAGES_INERT

    def _read(self, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        if kind == "content_block_delta":
            delta = obj.get("delta")
            if not self.first_token_seen and isinstance(delta, dict):
                dtype = delta.get("type")
                text: Any = None
                if dtype == "input_json_delta":
                    self.first_token_seen = True
                elif dtype == "text_delta":
                    text = delta.get("text")
                elif dtype == "thinking_delta":
                    text = delta.get("thinking")
                if isinstance(text, str) and text:
                    self.first_token_seen = True
        elif kind == "content_block_start":
            block = obj.get("content_block")
            if isinstance(block, dict):
                if block.get("type") in ("tool_use", "server_tool_use"):
                    self._tool_call(block.get("id"))
                elif isinstance(block.get("text"), str) and block["text"]:
                    self.first_token_seen = True
        elif kind == "message_start":
            message = obj.get("message")
            if isinstance(message, dict):
                self._usage(message.get("usage"))
        elif kind == "message_delta":
            delta = obj.get("delta")
            if isinstance(delta, dict):
                reason = delta.get("stop_reason")
                if isinstance(reason, str) and reason:
                    self.stop_reason = reason
                    self.finish_reason = (
                        "tool_calls" if self.saw_tool_calls else MESSAGES_FINISH.get(reason, reason)
                    )
                    self.choices_finished = True
            self._usage(obj.get("usage"))
        elif kind == "message_stop":
            self.done = True
        elif kind == "error" and self.error is None:
            self.error = _message_of(obj.get("error"))

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, dict):
            return
        tokens = _count(usage.get("input_tokens"))
        if tokens is not None:
            for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
                tokens += _count(usage.get(key)) or 0
            self.prompt_tokens = tokens
        tokens = _count(usage.get("output_tokens"))
        if tokens is not None:
            self.completion_tokens = tokens


class ResponsesScanner(_NativeScanner):
    """Facts of an OpenAI Responses event stream; see the module docstring."""

    __slots__ = ()
    _INERT = _RESPONSES_INERT

    def _read(self, obj: dict[str, Any]) -> None:
        kind = obj.get("type")
        if type(kind) is not str:
            return
        if kind in _RESPONSES_TEXT_DELTAS:
            delta = obj.get("delta")
            if isinstance(delta, str) and delta:
                self.first_token_seen = True
        elif kind == "response.function_call_arguments.delta":
            self.first_token_seen = True
        elif kind == "response.output_item.added" or kind == "response.output_item.done":
            item = obj.get("item")
            if isinstance(item, dict) and item.get("type") in _CALL_ITEMS:
                self._tool_call(item.get("call_id"))
        elif kind in ("response.completed", "response.incomplete"):
            self.done = True
            response = obj.get("response")
            response = response if isinstance(response, dict) else {}
            self.stop_reason = str(response.get("status") or kind.rpartition(".")[2])
            output = response.get("output")
            for item in output if type(output) is list else ():
                if isinstance(item, dict) and item.get("type") in _CALL_ITEMS:
                    self._tool_call(item.get("call_id"))
            if self.saw_tool_calls:
                self.finish_reason = "tool_calls"
            else:
                self.finish_reason = "stop" if kind == "response.completed" else _incomplete(response)
            self.choices_finished = True
            usage = response.get("usage")
            if isinstance(usage, dict):
                tokens = _count(usage.get("input_tokens"))
                if tokens is not None:
                    self.prompt_tokens = tokens
                tokens = _count(usage.get("output_tokens"))
                if tokens is not None:
                    self.completion_tokens = tokens
        elif kind == "response.failed" and self.error is None:
            response = obj.get("response")
            self.error = _message_of(response.get("error") if isinstance(response, dict) else None)
        elif kind == "error" and self.error is None:
            self.error = _message_of(obj.get("error"), obj.get("message"))


def _incomplete(response: dict[str, Any]) -> str:
    details = response.get("incomplete_details")
    reason = details.get("reason") if isinstance(details, dict) else None
    return "content_filter" if reason == "content_filter" else "length"


def message_facts(body: bytes) -> tuple[str, bool, int, int, list[str]]:
    """``(finish_reason, tool calls emitted, prompt tokens, completion tokens, tool ids)`` of a whole
    Anthropic Message (``-1`` for unknown counts, blanks for an unknown shape); never raises."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "", False, -1, -1, []
    if not isinstance(doc, dict):
        return "", False, -1, -1, []
    scanner = MessagesScanner()
    content = doc.get("content")
    for block in content if type(content) is list else ():
        if isinstance(block, dict) and block.get("type") in ("tool_use", "server_tool_use"):
            scanner._tool_call(block.get("id"))
    scanner._usage(doc.get("usage"))
    reason = doc.get("stop_reason")
    finish = MESSAGES_FINISH.get(reason, reason) if isinstance(reason, str) else ""
    if scanner.saw_tool_calls:
        finish = "tool_calls"
    return (
        finish,
        scanner.saw_tool_calls,
        scanner.prompt_tokens,
        scanner.completion_tokens,
        scanner.tool_call_ids,
    )


def response_facts(body: bytes) -> tuple[str, bool, int, int, list[str]]:
    """The same for a whole Response object; never raises."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return "", False, -1, -1, []
    if not isinstance(doc, dict):
        return "", False, -1, -1, []
    scanner = ResponsesScanner()
    status = doc.get("status")
    kind = "response.incomplete" if status == "incomplete" else "response.completed"
    scanner._read({"type": kind, "response": doc})
    finish = scanner.finish_reason or ""
    return (
        finish,
        scanner.saw_tool_calls,
        scanner.prompt_tokens,
        scanner.completion_tokens,
        scanner.tool_call_ids,
    )
