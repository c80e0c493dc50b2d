"""Chat Completions answer -> OpenAI Responses answer: the stream event by event, and a whole one.

Streamed (OpenAI API reference, "Streaming events" of the Responses API): :class:`ResponsesStream`
turns the engine's ``chat.completion.chunk`` s into::

    response.created  response.in_progress
    ( response.output_item.added
      [ response.content_part.added  response.output_text.delta*  response.output_text.done
        response.content_part.done ]                                      # a message item
      | response.function_call_arguments.delta*  response.function_call_arguments.done  # a call
      | response.reasoning_text.delta*  response.reasoning_text.done      # a reasoning item
      response.output_item.done )*
    response.completed | response.incomplete | response.failed

Every event carries ``sequence_number``, from 0. ``response.created`` and ``response.in_progress``
go at the engine's first chunk, their ``usage`` the prompt's tokens as the engine counted them
(``stream_options.continuous_usage_stats``; ``null`` from an engine that ignores it). Output items
are numbered (``output_index``) in the order they open, one open at a time (``apis._answer``
keeps the order and holds back what must wait): the engine's reasoning (``reasoning_content``)
becomes a ``reasoning`` item, its text a ``message`` item with one ``output_text`` part, each tool
call a ``function_call`` item. A call is told apart by its id, or by its index where the engine
gives no distinct ids; its item is added once, when its name is known, and done only when its
arguments are whole (they parse as a JSON object when the engine moved on, or the engine
finished): every ``response.function_call_arguments.done`` carries whole arguments, and nothing of
an item follows its ``output_item.done``. A ``function_call`` item's ``call_id`` is the engine's
tool-call id unchanged (``call_<response id>_<n>`` where it sent none, or reused one) and its
``id`` is ``fc_...``; a call of a namespace member (``ResponsesTurn.tool_names``) carries
``namespace`` and the member's ``name``. :attr:`ResponsesStream.tool_call_ids` are the
``call_id`` s the client saw, in order.

The end: ``response.completed`` with the whole output and ``usage`` in Responses' names
(``input_tokens``, ``input_tokens_details.cached_tokens``, ``output_tokens``,
``output_tokens_details.reasoning_tokens``, ``total_tokens``); for ``finish_reason`` ``length``
(or ``content_filter``) ``response.incomplete`` with ``incomplete_details.reason``
``max_output_tokens`` (``content_filter``). An engine error event in the stream becomes
``response.failed`` (``error.code`` ``server_error``, the engine's message), after which nothing is
sent: the failure contract's "engine error mid-stream" (the route ends the body). An engine whose
body breaks, or ends without a finish reason or ``[DONE]``, is the relay's to abort:
:meth:`ResponsesStream.finish` raises :class:`StreamIncomplete` then, so a truncated answer never
gets ``response.completed``.

State held: each item's text or arguments (for its ``.done`` events) and the finished items (for
``response.completed``), as the API requires; events are held back only for the parts that wait
behind a call whose arguments are not whole yet.

Whole (``stream`` false): :func:`completion_to_response` turns a ``chat.completion`` into a Response.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson

from luftpause.dataplane.apis._answer import Assembler, Op, Part
from luftpause.dataplane.apis._chat_events import (
    ChatEvents,
    StreamIncomplete,
    TranslationBroken,
    read_chunk,
    usage_of,
)
from luftpause.dataplane.sse import SSEScanner

__all__ = [
    "ResponsesStream",
    "StreamIncomplete",
    "TranslationBroken",
    "completion_to_response",
    "response_object",
]

log = logging.getLogger(__name__)

_INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def response_object(
    response_id: str,
    model: str,
    created_at: int,
    echo: dict[str, Any],
    status: str,
    output: list[dict[str, Any]],
    usage: dict[str, Any] | None = None,
    error: dict[str, Any] | None = None,
    incomplete: str | None = None,
) -> dict[str, Any]:
    """The Response object (``object: "response"``), the request's parameters repeated from ``echo``."""
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": status,
        "error": error,
        "incomplete_details": {"reason": incomplete} if incomplete else None,
        "instructions": echo.get("instructions"),
        "max_output_tokens": echo.get("max_output_tokens"),
        "model": model,
        "output": output,
        "parallel_tool_calls": echo.get("parallel_tool_calls", True),
        "previous_response_id": None,
        "reasoning": echo.get("reasoning"),
        "store": False,
        "temperature": echo.get("temperature"),
        "text": echo.get("text", {"format": {"type": "text"}}),
        "tool_choice": echo.get("tool_choice", "auto"),
        "tools": echo.get("tools", []),
        "top_p": echo.get("top_p"),
        "truncation": echo.get("truncation", "disabled"),
        "metadata": echo.get("metadata", {}),
        "usage": usage,
    }


def _usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    prompt, completion, cached = usage_of(usage)
    reasoning = 0
    details = usage.get("completion_tokens_details") if usage else None
    if isinstance(details, dict) and type(details.get("reasoning_tokens")) is int:
        reasoning = details["reasoning_tokens"]
    return {
        "input_tokens": prompt,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": completion,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": prompt + completion,
    }


def _prompt_usage(usage: dict[str, Any] | None) -> dict[str, Any] | None:
    """The usage a Response in progress reports: the prompt's tokens, none generated yet."""
    if usage is None:
        return None
    counted = _usage(usage)
    counted["output_tokens"] = 0
    counted["output_tokens_details"] = {"reasoning_tokens": 0}
    counted["total_tokens"] = counted["input_tokens"]
    return counted


class ResponsesStream:
    """Translate one turn's Chat Completions stream to Responses events; see the module docstring.

    ``ResponsesStream(response_id, model, created_at, echo=None, tool_names=None)``:
    ``response_id`` (``resp_...``), ``model`` as the client named it, ``created_at`` (Unix seconds,
    given: this code reads no clock), ``echo`` and ``tool_names`` from
    :class:`~luftpause.dataplane.apis.responses_request.ResponsesTurn`.

    ``feed(chunk) -> bytes``: each read from the engine (cut anywhere) -> the bytes to send now;
    ``finish() -> bytes``: the closing events. ``feed`` raises :class:`TranslationBroken`,
    ``finish`` :class:`StreamIncomplete`: the relay then aborts the client's connection.
    ``scanner``: the :class:`SSEScanner` with the turn's facts; ``tool_call_ids``: the ``call_id`` s
    sent.
    """

    __slots__ = (
        "_answer",
        "_base",
        "_created_at",
        "_echo",
        "_events",
        "_failed",
        "_finish_reason",
        "_model",
        "_output",
        "_response_id",
        "_sequence",
        "_started",
        "_tool_names",
        "_usage",
        "tool_call_ids",
    )

    def __init__(
        self,
        response_id: str,
        model: str,
        created_at: int,
        echo: dict[str, Any] | None = None,
        tool_names: dict[str, tuple[str, str]] | None = None,
    ) -> None:
        self._response_id = response_id
        self._base = response_id.removeprefix("resp_")
        self._model = model
        self._created_at = created_at
        self._echo = echo or {}
        self._tool_names = tool_names or {}
        self._events = ChatEvents()
        self._answer = Assembler()
        self._sequence = 0
        self._started = False
        self._failed = False
        self._output: list[dict[str, Any]] = []  # every item opened, by output_index
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None
        self.tool_call_ids: list[str] = []

    @property
    def scanner(self) -> SSEScanner:
        return self._events.scanner

    def _event(self, data: dict[str, Any]) -> bytes:
        data["sequence_number"] = self._sequence
        self._sequence += 1
        kind: str = data["type"]
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"

    def _response(self, status: str, **extra: Any) -> dict[str, Any]:
        return response_object(self._response_id, self._model, self._created_at, self._echo, status, **extra)

    def start(self) -> bytes:
        """``response.created`` and ``response.in_progress``, once; empty afterwards. Their
        ``usage`` gives the prompt's tokens once the engine reported them (its first chunk, with
        ``stream_options.continuous_usage_stats``), else ``null``."""
        if self._started:
            return b""
        self._started = True
        usage = _prompt_usage(self._usage)
        created = self._event(
            {"type": "response.created", "response": self._response("in_progress", output=[], usage=usage)}
        )
        return created + self._event(
            {
                "type": "response.in_progress",
                "response": self._response("in_progress", output=[], usage=usage),
            }
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
                self._failed = True
                self._write(answer.close_open())  # the open item is not sent done: the answer failed
                error = {"code": "server_error", "message": parsed.error}
                output = [item for item in self._output if item.get("status") == "completed"]
                out.append(
                    self._event(
                        {
                            "type": "response.failed",
                            "response": self._response("failed", output=output, error=error),
                        }
                    )
                )
                break
            if parsed.reasoning:
                out.append(self._write(answer.text("reasoning", parsed.reasoning)))
            if parsed.content:
                out.append(self._write(answer.text("text", parsed.content)))
            for index, call_id, name, arguments in parsed.tool_calls:
                out.append(self._write(answer.tool(index, call_id, name, arguments)))
            if parsed.finish_reason is not None:
                self._finish_reason = parsed.finish_reason
                out.append(self._write(answer.finish()))
        return b"".join(out)

    def finish(self) -> bytes:
        """The closing events; empty after ``response.failed``. Raises :class:`StreamIncomplete`
        when the engine gave neither a finish reason nor ``[DONE]``."""
        if self._failed:
            return b""
        if self._finish_reason is None and not self.scanner.done:
            raise StreamIncomplete("the engine ended its stream before the answer finished")
        out = [self.start(), self._write(self._answer.finish())]
        incomplete = None if self._answer.calls else _INCOMPLETE.get(self._finish_reason or "")
        if self._finish_reason == "tool_calls" and not self._answer.calls:
            log.warning(
                "response %s: the engine finished with tool_calls but sent no tool call", self._response_id
            )
        usage = _usage(self._usage)
        if incomplete:
            response = self._response("incomplete", output=self._output, usage=usage, incomplete=incomplete)
            out.append(self._event({"type": "response.incomplete", "response": response}))
        else:
            response = self._response("completed", output=self._output, usage=usage)
            out.append(self._event({"type": "response.completed", "response": response}))
        return b"".join(out)

    # --- items ------------------------------------------------------------------------------------

    def _write(self, ops: list[Op]) -> bytes:
        """The Responses events of the answer's ops: an item per part, numbered as they open."""
        if not ops:
            return b""
        out: list[bytes] = []
        for op, part, text in ops:
            if op == "delta":
                out.append(self._delta(part, text))
            elif op == "open":
                out.append(self._add(part))
            else:
                out.append(self._close(part))
        return b"".join(out)

    def _add(self, part: Part) -> bytes:
        index = part.position
        if part.kind == "text":
            item: dict[str, Any] = {
                "type": "message",
                "id": f"msg_{self._base}_{index}",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        elif part.kind == "reasoning":
            item = {
                "type": "reasoning",
                "id": f"rs_{self._base}_{index}",
                "status": "in_progress",
                "summary": [],
                "content": [],
            }
        else:
            call_id = part.call_id or f"call_{self._base}_{index}"
            self.tool_call_ids.append(call_id)
            item = {
                "type": "function_call",
                "id": f"fc_{self._base}_{index}",
                "status": "in_progress",
                "call_id": call_id,
                "arguments": "",
            }
            name = part.name or ""
            namespaced = self._tool_names.get(name)
            if namespaced is not None:
                item["namespace"], item["name"] = namespaced
            else:
                item["name"] = name
        self._output.append(item)
        out = self._event({"type": "response.output_item.added", "output_index": index, "item": dict(item)})
        if part.kind == "text":
            out += self._event(
                {
                    "type": "response.content_part.added",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []},
                }
            )
        return out

    def _delta(self, part: Part, text: str) -> bytes:
        index = part.position
        event: dict[str, Any] = {"item_id": self._output[index]["id"], "output_index": index}
        if part.kind == "call":
            event["type"] = "response.function_call_arguments.delta"
        else:
            event["type"] = (
                "response.output_text.delta" if part.kind == "text" else "response.reasoning_text.delta"
            )
            event["content_index"] = 0
        event["delta"] = text
        if part.kind == "text":
            event["logprobs"] = []
        return self._event(event)

    def _close(self, part: Part) -> bytes:
        index = part.position
        item = self._output[index]
        text = part.content()
        cut = self._finish_reason in _INCOMPLETE and not self._answer.calls  # the part the finish cut
        item["status"] = "incomplete" if cut else "completed"
        if part.kind == "text":
            done = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
            item["content"] = [done]
            out = self._event(
                {
                    "type": "response.output_text.done",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "text": text,
                    "logprobs": [],
                }
            )
            out += self._event(
                {
                    "type": "response.content_part.done",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "part": done,
                }
            )
        elif part.kind == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": text}]
            out = self._event(
                {
                    "type": "response.reasoning_text.done",
                    "item_id": item["id"],
                    "output_index": index,
                    "content_index": 0,
                    "text": text,
                }
            )
        else:
            item["arguments"] = text
            out = self._event(
                {
                    "type": "response.function_call_arguments.done",
                    "item_id": item["id"],
                    "output_index": index,
                    "name": item["name"],
                    "arguments": text,
                }
            )
        return out + self._event({"type": "response.output_item.done", "output_index": index, "item": item})


def completion_to_response(
    completion: dict[str, Any],
    response_id: str,
    model: str,
    created_at: int,
    echo: dict[str, Any] | None = None,
    tool_names: dict[str, tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """A whole ``chat.completion`` (parsed JSON) as a Response object (the rules of the stream)."""
    echo = echo or {}
    tool_names = tool_names or {}
    base = response_id.removeprefix("resp_")
    choices = completion.get("choices")
    choice: dict[str, Any] = {}
    if isinstance(choices, list):
        choice = next((c for c in choices if isinstance(c, dict) and c.get("index", 0) == 0), {})
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    assert isinstance(message, dict)
    output: list[dict[str, Any]] = []
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if isinstance(reasoning, str) and reasoning:
        output.append(
            {
                "type": "reasoning",
                "id": f"rs_{base}_{len(output)}",
                "status": "completed",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": reasoning}],
            }
        )
    text = message.get("content")
    if isinstance(text, str) and text:
        output.append(
            {
                "type": "message",
                "id": f"msg_{base}_{len(output)}",
                "status": "completed",
                "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
            }
        )
    calls = message.get("tool_calls")
    for call in calls if isinstance(calls, list) else ():
        if not isinstance(call, dict):
            continue
        function = call.get("function") if isinstance(call.get("function"), dict) else {}
        assert isinstance(function, dict)
        n = len(output)
        call_id = call.get("id") if isinstance(call.get("id"), str) and call.get("id") else f"call_{base}_{n}"
        arguments = function.get("arguments")
        item: dict[str, Any] = {
            "type": "function_call",
            "id": f"fc_{base}_{n}",
            "status": "completed",
            "call_id": call_id,
            "arguments": arguments if isinstance(arguments, str) else "",
        }
        name = str(function.get("name") or "")
        if name in tool_names:
            item["namespace"], item["name"] = tool_names[name]
        else:
            item["name"] = name
        output.append(item)
    has_calls = any(item["type"] == "function_call" for item in output)
    reason = choice.get("finish_reason")
    if reason == "tool_calls" and not has_calls:
        log.warning("response %s: the engine finished with tool_calls but sent no tool call", response_id)
    incomplete = None if has_calls else _INCOMPLETE.get(reason if isinstance(reason, str) else "")
    usage = completion.get("usage")
    return response_object(
        response_id,
        model,
        created_at,
        echo,
        "incomplete" if incomplete else "completed",
        output,
        usage=_usage(usage if isinstance(usage, dict) else None),
        incomplete=incomplete,
    )
