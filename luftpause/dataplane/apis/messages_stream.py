"""Chat Completions answer -> Anthropic Messages answer: the stream event by event, and a whole one.

Streamed (Anthropic API reference, "Streaming Messages"): :class:`MessagesStream` turns the
engine's ``text/event-stream`` of ``chat.completion.chunk`` s into Anthropic's events::

    message_start  ping  (content_block_start  content_block_delta*  content_block_stop)*
    message_delta  message_stop

* ``message_start`` (and one ``ping``) opens the answer at the first :meth:`MessagesStream.feed`
  (or at :meth:`MessagesStream.start`, to send it as soon as the engine answered 200), with
  ``usage.input_tokens`` 0: the engine reports usage at the end, and ``message_delta`` carries it.
* Content arrives as blocks, one open at a time, numbered from 0 in order: ``text`` (``text_delta``),
  ``thinking`` (``thinking_delta``, only when the request enabled thinking, ``signature`` empty:
  luftpause signs nothing) and ``tool_use`` (``input_json_delta`` with the engine's argument
  fragments as they come). A tool call of a new ``index`` closes the block before it, so parallel
  tool calls are several blocks. A tool call's block opens when its name is known (an engine that
  sends the name after the first fragment has those fragments held until then). The tool id is
  the engine's, unchanged (so the dataplane's ``tool_call_id -> run`` table needs no mapping);
  where the engine sent none, ``toolu_<message id>_<n>``. :attr:`MessagesStream.tool_call_ids` are
  the ids the client saw, in order: remember those.
* ``message_delta`` gives ``stop_reason``: ``stop`` -> ``end_turn`` (or ``stop_sequence`` with
  ``stop_sequence`` set, when the engine named the stop string that matched: vLLM's
  ``stop_reason``, SGLang's ``matched_stop``), ``length`` -> ``max_tokens``, ``tool_calls`` (or any
  tool call seen) -> ``tool_use``, ``content_filter`` -> ``refusal``; and ``usage``
  (``cache_read_input_tokens`` from ``prompt_tokens_details.cached_tokens``, and
  ``input_tokens`` the prompt tokens less those, as Anthropic counts them; ``output_tokens``).
* An engine error event (vLLM's and SGLang's ``{"error": ...}`` in place of a chunk) becomes
  Anthropic's ``error`` event (``api_error``), after which nothing more is sent: the route ends the
  body as the engine ended it (failure contract). An engine whose body breaks, or ends with neither
  a finish reason nor ``[DONE]``, is the relay's to abort: :meth:`MessagesStream.finish` raises
  :class:`StreamIncomplete` then, so a truncated answer never looks complete.

The events are written ``event: <type>\\ndata: <json>\\n\\n``. Nothing is buffered beyond the
scanner's one incomplete event and a tool call's fragments before its name.

Whole (``stream`` false): :func:`completion_to_message` turns a ``chat.completion`` into a Message.
"""

from __future__ import annotations

from typing import Any

import orjson

from luftpause.dataplane.apis._chat_events import (
    ChatEvents,
    StreamIncomplete,
    TranslationBroken,
    named_call,
    read_chunk,
    usage_of,
)
from luftpause.dataplane.apis.errors import anthropic_error
from luftpause.dataplane.sse import SSEScanner

__all__ = ["MessagesStream", "StreamIncomplete", "TranslationBroken", "completion_to_message", "stop_reason"]


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


class MessagesStream:
    """Translate one turn's Chat Completions stream to Anthropic's; see the module docstring.

    ``MessagesStream(model, message_id, thinking=False, stop_sequences=())``: ``model`` as the client
    named it, ``message_id`` the Message's id (``msg_...``), ``thinking`` and ``stop_sequences`` from
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
        "_block",
        "_calls",
        "_events",
        "_failed",
        "_finish_reason",
        "_index",
        "_matched",
        "_message_id",
        "_model",
        "_pending",
        "_started",
        "_stops",
        "_thinking",
        "_usage",
        "tool_call_ids",
    )

    def __init__(
        self, model: str, message_id: str, thinking: bool = False, stop_sequences: tuple[str, ...] = ()
    ) -> None:
        self._model = model
        self._message_id = message_id
        self._thinking = thinking
        self._stops = stop_sequences
        self._events = ChatEvents()
        self._started = False
        self._failed = False
        # the open block: ("text" | "thinking", None) or ("tool_use", engine tool index); None: none
        self._block: tuple[str, int | None] | None = None
        self._index = -1  # the open (or last) block's index
        self._calls: dict[int, int] = {}  # engine tool index -> block index
        self._pending: dict[int, list[Any]] = {}  # engine tool index -> [id, arguments] before its name
        self._finish_reason: str | None = None
        self._matched: str | None = None
        self._usage: dict[str, Any] | None = None
        self.tool_call_ids: list[str] = []

    @property
    def scanner(self) -> SSEScanner:
        return self._events.scanner

    def start(self) -> bytes:
        """``message_start`` and a ``ping``, once; empty afterwards."""
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
            "usage": {"input_tokens": 0, "output_tokens": 0},
        }
        return _event("message_start", {"type": "message_start", "message": message}) + _event(
            "ping", {"type": "ping"}
        )

    def feed(self, chunk: bytes | bytearray) -> bytes:
        out = [self.start()]
        for data in self._events.feed(chunk):
            if self._failed:
                break
            parsed = read_chunk(data)
            if parsed is None:
                continue
            if parsed.error is not None:
                out.append(self._close_block())
                out.append(_event("error", anthropic_error(500, parsed.error)))
                self._failed = True
                break
            if parsed.usage is not None:
                self._usage = parsed.usage
            if parsed.reasoning and self._thinking:
                out.append(self._delta("thinking", {"type": "thinking_delta", "thinking": parsed.reasoning}))
            if parsed.content:
                out.append(self._delta("text", {"type": "text_delta", "text": parsed.content}))
            for index, call_id, name, arguments in parsed.tool_calls:
                out.append(self._tool_delta(index, call_id, name, arguments))
            if parsed.finish_reason is not None:
                self._finish_reason = parsed.finish_reason
            if parsed.matched_stop is not None:
                self._matched = parsed.matched_stop
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
        out = [self.start()]
        for index in sorted(self._pending):  # a call never named: sent now, named by its id
            out.append(self._open_tool(index, self._pending.pop(index), ""))
        out.append(self._close_block())
        reason = "tool_calls" if self._calls else self._finish_reason
        kind, sequence = stop_reason(reason, self._matched, self._stops)
        prompt, completion, cached = usage_of(self._usage)
        usage: dict[str, Any] = {"input_tokens": prompt - cached, "output_tokens": completion}
        if cached:
            usage["cache_read_input_tokens"] = cached
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

    # --- blocks -----------------------------------------------------------------------------------

    def _close_block(self) -> bytes:
        if self._block is None:
            return b""
        self._block = None
        return _event("content_block_stop", {"type": "content_block_stop", "index": self._index})

    def _open(self, block: dict[str, Any], key: tuple[str, int | None]) -> bytes:
        closed = self._close_block()
        self._index += 1
        self._block = key
        return closed + _event(
            "content_block_start",
            {"type": "content_block_start", "index": self._index, "content_block": block},
        )

    def _delta(self, kind: str, delta: dict[str, Any]) -> bytes:
        opened = b""
        if self._block is None or self._block[0] != kind:
            start = (
                {"type": "text", "text": ""}
                if kind == "text"
                else {"type": "thinking", "thinking": "", "signature": ""}
            )
            opened = self._open(start, (kind, None))
        return opened + _event(
            "content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta}
        )

    def _tool_delta(self, index: int, call_id: str | None, name: str | None, arguments: str | None) -> bytes:
        block = self._calls.get(index)
        if block is None:
            named = named_call(self._pending, index, call_id, name, arguments)
            return b"" if named is None or name is None else self._open_tool(index, named, name)
        if not arguments:
            return b""
        delta = {"type": "input_json_delta", "partial_json": arguments}
        # A late fragment of an earlier call (engines send calls one after another, so this is
        # rare) is sent with that call's block index, which the client applies to that block.
        return _event("content_block_delta", {"type": "content_block_delta", "index": block, "delta": delta})

    def _open_tool(self, index: int, pending: list[Any], name: str) -> bytes:
        call_id = pending[0] or f"toolu_{self._message_id}_{len(self.tool_call_ids)}"
        self.tool_call_ids.append(call_id)
        out = self._open({"type": "tool_use", "id": call_id, "name": name, "input": {}}, ("tool_use", index))
        self._calls[index] = self._index
        if pending[1]:
            delta = {"type": "input_json_delta", "partial_json": pending[1]}
            out += _event(
                "content_block_delta", {"type": "content_block_delta", "index": self._index, "delta": delta}
            )
        return out


def completion_to_message(
    completion: dict[str, Any],
    model: str,
    message_id: str,
    thinking: bool = False,
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
    if thinking and isinstance(reasoning, str) and reasoning:
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
    reason = "tool_calls" if has_calls else choice.get("finish_reason")
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
