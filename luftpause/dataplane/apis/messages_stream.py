"""Chat Completions answer -> Anthropic Messages answer: the stream event by event, and a whole one.

Streamed (Anthropic API reference, "Streaming Messages"): :class:`MessagesStream` turns the
engine's ``text/event-stream`` of ``chat.completion.chunk`` s into Anthropic's events::

    message_start  ping  (content_block_start  content_block_delta*  content_block_stop)*
    message_delta  message_stop

* ``message_start`` (and one ``ping``) opens the answer at the engine's first chunk, its
  ``usage.input_tokens`` the prompt's tokens as the engine counted them: the translated request
  asks for ``stream_options.continuous_usage_stats`` (vLLM, SGLang), so that chunk carries them
  (an engine that ignores it: 0 there, the count in ``message_delta``).
* Content arrives as blocks, one open at a time, numbered from 0 in order (``apis._answer`` keeps
  the order and holds back what must wait): ``text`` (``text_delta``), ``thinking``
  (``thinking_delta``: the engine's ``reasoning_content``, ``signature`` empty: luftpause signs
  nothing) and ``tool_use`` (``input_json_delta``). A tool call is told apart by its id, or by its
  index where the engine gives no distinct ids; its block opens once, when its name is known, and
  stops only when its arguments are whole (they parse as a JSON object when the engine moved on,
  or the engine finished), so parallel calls are several blocks whatever index they came under,
  and fragments of a call that come while another call's block is open wait, whole, for it to
  stop. The tool id is the engine's, unchanged (so the dataplane's ``tool_call_id -> run`` table
  needs no mapping); where the engine sent none (or reused one), ``toolu_<message id>_<n>``.
  :attr:`MessagesStream.tool_call_ids` are the ids the client saw, in order: remember those.
* ``message_delta`` gives ``stop_reason``: ``stop`` -> ``end_turn`` (or ``stop_sequence`` with
  ``stop_sequence`` set, when the engine named the stop string that matched: vLLM's
  ``stop_reason``, SGLang's ``matched_stop``), ``length`` -> ``max_tokens``, any tool call
  delivered -> ``tool_use`` (and only then: an engine that says ``tool_calls`` but sent none gets
  ``end_turn``, logged), ``content_filter`` -> ``refusal``; and ``usage``
  (``cache_read_input_tokens`` from ``prompt_tokens_details.cached_tokens``, and
  ``input_tokens`` the prompt tokens less those, as Anthropic counts them; ``output_tokens``).
* An engine error event (vLLM's and SGLang's ``{"error": ...}`` in place of a chunk) becomes
  Anthropic's ``error`` event (``api_error``), after which nothing more is sent: the route ends the
  body as the engine ended it (failure contract). An engine whose body breaks, or ends with neither
  a finish reason nor ``[DONE]``, is the relay's to abort: :meth:`MessagesStream.finish` raises
  :class:`StreamIncomplete` then, so a truncated answer never looks complete.

The events are written ``event: <type>\\ndata: <json>\\n\\n``. Buffered: the scanner's one
incomplete event, a tool call's fragments before its name, and the parts that wait behind a call
whose arguments are not whole yet.

Whole (``stream`` false): :func:`completion_to_message` turns a ``chat.completion`` into a Message.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from luftpause.dataplane.apis._answer import Assembler, Op
from luftpause.dataplane.apis._chat_events import (
    ChatEvents,
    StreamIncomplete,
    TranslationBroken,
    read_chunk,
    usage_of,
)
from luftpause.dataplane.apis.errors import anthropic_error
from luftpause.dataplane.sse import SSEScanner

__all__ = ["MessagesStream", "StreamIncomplete", "TranslationBroken", "completion_to_message", "stop_reason"]

log = logging.getLogger(__name__)


def stop_reason(
    finish_reason: str | None, matched: str | None, stops: tuple[str, ...]
) -> tuple[str, str | None]:
    """Anthropic's ``(stop_reason, stop_sequence)`` for a Chat Completions finish reason."""
    if finish_reason == "length":
        return "max_tokens", None
    if finish_reason == "tool_calls":
        return "tool_use", None
    if finish_reason == "content_filter":
        return "refusal", None
    if matched is not None and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def _event(kind: str, data: dict[str, Any]) -> bytes:
    return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


def _input_usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    """Anthropic's input counts: ``input_tokens`` the prompt less its cached part, which is
    ``cache_read_input_tokens`` (present when not 0)."""
    prompt, _, cached = usage_of(usage)
    counted: dict[str, Any] = {"input_tokens": prompt - cached}
    if cached:
        counted["cache_read_input_tokens"] = cached
    return counted


_START_BLOCK: dict[str, dict[str, Any]] = {
    "text": {"type": "text", "text": ""},
    "reasoning": {"type": "thinking", "thinking": "", "signature": ""},
}
_DELTA_KEY = {"text": ("text_delta", "text"), "reasoning": ("thinking_delta", "thinking")}


class MessagesStream:
    """Translate one turn's Chat Completions stream to Anthropic's; see the module docstring.

    ``MessagesStream(model, message_id, stop_sequences=())``: ``model`` as the client named it,
    ``message_id`` the Message's id (``msg_...``), ``stop_sequences`` from
    :class:`~luftpause.dataplane.apis.messages_request.MessagesTurn`.

    ``feed(chunk) -> bytes`` takes each read from the engine (cut anywhere) and returns the bytes
    to send the client now (maybe empty); ``finish() -> bytes`` at the end of the engine's body
    returns the last events. ``feed`` raises :class:`TranslationBroken`, ``finish``
    :class:`StreamIncomplete`: the relay then aborts the client's connection.

    ``scanner`` is the :class:`SSEScanner` that read the engine's stream: the turn's facts for the
    scheduler (first token, usage, finish reason, ``error``), as for a chat turn.
    ``tool_call_ids``: the ids of the ``tool_use`` blocks sent, in order.
    """

    __slots__ = (
        "_answer",
        "_claimed_calls",
        "_events",
        "_failed",
        "_finish_reason",
        "_flushed",
        "_matched",
        "_message_id",
        "_model",
        "_started",
        "_stops",
        "_usage",
        "tool_call_ids",
    )

    def __init__(self, model: str, message_id: str, stop_sequences: tuple[str, ...] = ()) -> None:
        self._model = model
        self._message_id = message_id
        self._stops = stop_sequences
        self._events = ChatEvents()
        self._answer = Assembler(keep_text=False)
        self._started = False
        self._failed = False
        self._flushed = False
        self._finish_reason: str | None = None
        self._claimed_calls = False
        self._matched: str | None = None
        self._usage: dict[str, Any] | None = None
        self.tool_call_ids: list[str] = []

    @property
    def scanner(self) -> SSEScanner:
        return self._events.scanner

    def start(self) -> bytes:
        """``message_start`` and a ``ping``, once; empty afterwards. ``usage.input_tokens`` is the
        prompt's count if the engine reported it yet (``stream_options.continuous_usage_stats``
        puts it in the engine's first chunk), else 0."""
        if self._started:
            return b""
        self._started = True
        message: dict[str, Any] = {
            "id": self._message_id,
            "type": "message",
            "role": "assistant",
            "model": self._model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {**_input_usage(self._usage), "output_tokens": 0},
        }
        return _event("message_start", {"type": "message_start", "message": message}) + _event(
            "ping", {"type": "ping"}
        )

    def feed(self, chunk: bytes | bytearray) -> bytes:
        out: list[bytes] = []
        answer = self._answer
        for data in self._events.feed(chunk):
            if self._failed:
                break
            parsed = read_chunk(data)
            if parsed is None:
                continue
            if parsed.usage is not None:
                self._usage = parsed.usage
            if not self._started:
                out.append(self.start())
            if parsed.error is not None:
                out.append(self._write(answer.close_open()))
                out.append(_event("error", anthropic_error(500, parsed.error)))
                self._failed = True
                break
            if parsed.reasoning:
                out.append(self._write(answer.text("reasoning", parsed.reasoning)))
            if parsed.content:
                out.append(self._write(answer.text("text", parsed.content)))
            for index, call_id, name, arguments in parsed.tool_calls:
                out.append(self._write(answer.tool(index, call_id, name, arguments)))
            if parsed.matched_stop is not None:
                self._matched = parsed.matched_stop
            if parsed.finish_reason is not None:
                self._finish_reason = parsed.finish_reason
                self._claimed_calls = self._claimed_calls or parsed.finish_reason == "tool_calls"
                out.append(self._write(answer.finish()))
        return b"".join(out)

    def finish(self) -> bytes:
        """The closing events: the open block's stop, ``message_delta``, ``message_stop``.

        Empty after an engine error event (its ``error`` event was the end). Raises
        :class:`StreamIncomplete` when the engine gave neither a finish reason nor ``[DONE]``."""
        if self._failed:
            return b""
        scanner = self.scanner
        if self._finish_reason is None and not scanner.done:
            raise StreamIncomplete("the engine ended its stream before the answer finished")
        out = [self.start(), self._write(self._answer.finish())]
        reason = self._finish_reason
        if self._answer.calls:
            reason = "tool_calls"
        elif reason == "tool_calls":
            log.warning(
                "message %s: the engine finished with tool_calls but sent no tool call; answered end_turn",
                self._message_id,
            )
            reason = "stop"
        kind, sequence = stop_reason(reason, self._matched, self._stops)
        _, completion, _ = usage_of(self._usage)
        usage = {**_input_usage(self._usage), "output_tokens": completion}
        out.append(
            _event(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": kind, "stop_sequence": sequence},
                    "usage": usage,
                },
            )
        )
        out.append(_event("message_stop", {"type": "message_stop"}))
        return b"".join(out)

    def _write(self, ops: list[Op]) -> bytes:
        """The Anthropic events of the answer's ops: a block per part, numbered as they open."""
        if not ops:
            return b""
        out: list[bytes] = []
        for op, part, text in ops:
            if op == "delta":
                if part.kind == "call":
                    delta = {"type": "input_json_delta", "partial_json": text}
                else:
                    kind, key = _DELTA_KEY[part.kind]
                    delta = {"type": kind, key: text}
                out.append(
                    _event(
                        "content_block_delta",
                        {"type": "content_block_delta", "index": part.position, "delta": delta},
                    )
                )
            elif op == "open":
                if part.kind == "call":
                    call_id = part.call_id or f"toolu_{self._message_id}_{len(self.tool_call_ids)}"
                    self.tool_call_ids.append(call_id)
                    block = {"type": "tool_use", "id": call_id, "name": part.name or "", "input": {}}
                else:
                    block = _START_BLOCK[part.kind]
                out.append(
                    _event(
                        "content_block_start",
                        {"type": "content_block_start", "index": part.position, "content_block": block},
                    )
                )
            else:
                out.append(
                    _event("content_block_stop", {"type": "content_block_stop", "index": part.position})
                )
        return b"".join(out)


def completion_to_message(
    completion: dict[str, Any],
    model: str,
    message_id: str,
    stop_sequences: tuple[str, ...] = (),
) -> dict[str, Any]:
    """A whole ``chat.completion`` (parsed JSON) as an Anthropic Message (the rules of the stream).

    Tool arguments that are not a JSON object cannot be an ``input``: they are given as
    ``{"_raw_arguments": <the text>}``, so the harness (and the model, in the tool error it gets
    back) sees what the model wrote rather than an empty call. (Streamed, the fragments go out as
    they came, and the client's own JSON parsing reports them.)
    ``tool_call_ids`` of the answer are the ``id`` s of its ``tool_use`` blocks."""
    choices = completion.get("choices")
    choice: dict[str, Any] = {}
    if isinstance(choices, list):
        choice = next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), {})
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    assert isinstance(message, dict)
    content: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    text = message.get("content")
    if isinstance(text, str) and text:
        content.append({"type": "text", "text": text})
    calls = message.get("tool_calls")
    for n, call in enumerate(calls if isinstance(calls, list) else ()):
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        assert isinstance(function, dict)
        raw = function.get("arguments")
        try:
            arguments = orjson.loads(raw) if isinstance(raw, str) and raw else {}
        except orjson.JSONDecodeError:
            arguments = None
        if not isinstance(arguments, dict):
            arguments = {"_raw_arguments": raw}
        call_id = (
            call.get("id")
            if isinstance(call.get("id"), str) and call.get("id")
            else f"toolu_{message_id}_{n}"
        )
        content.append(
            {"type": "tool_use", "id": call_id, "name": str(function.get("name") or ""), "input": arguments}
        )
    has_calls = any(block["type"] == "tool_use" for block in content)
    matched = choice.get("stop_reason") or choice.get("matched_stop")
    reason = choice.get("finish_reason")
    if has_calls:
        reason = "tool_calls"
    elif reason == "tool_calls":
        log.warning(
            "message %s: the engine finished with tool_calls but sent no tool call; answered end_turn",
            message_id,
        )
        reason = "stop"
    kind, sequence = stop_reason(
        reason if isinstance(reason, str) else None,
        matched if isinstance(matched, str) else None,
        stop_sequences,
    )
    usage = completion.get("usage")
    prompt, completion_tokens, cached = usage_of(usage if isinstance(usage, dict) else None)
    answer_usage: dict[str, Any] = {"input_tokens": prompt - cached, "output_tokens": completion_tokens}
    if cached:
        answer_usage["cache_read_input_tokens"] = cached
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": kind,
        "stop_sequence": sequence,
        "usage": answer_usage,
    }
