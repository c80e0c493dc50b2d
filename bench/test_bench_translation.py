"""Micro-benchmark of the front doors' translation: what a Messages or Responses turn served by a
Chat Completions replica costs on the hot path, against a chat turn relayed unchanged, same run.

Run: ``.venv/bin/pytest bench/test_bench_translation.py --benchmark-only``. One round takes one
turn's Chat Completions stream (``test_bench_sse``'s ``content`` and ``tool call`` streams: 304 and
305 events), fed in reads of 1-4 KB, through:

* ``baseline``: the chat scanner alone (the compiled twin when built), which is all a chat turn
  relayed unchanged costs per read besides the send;
* ``messages``: :class:`~luftpause.dataplane.apis.messages_stream.MessagesStream` (``feed`` per read,
  ``finish`` at the end), which also runs the chat scanner for the turn's facts;
* ``responses``: :class:`~luftpause.dataplane.apis.responses_stream.ResponsesStream`, the same.

The summary prints each per turn and per event, and its ratio to the baseline.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from typing import Any

import orjson
import pytest
from test_bench_sse import _WORDS, _base, _chunk, _reads, _stream, _text

from luftpause.dataplane.apis.messages_stream import MessagesStream
from luftpause.dataplane.apis.responses_stream import ResponsesStream
from luftpause.dataplane.sse import SSEScanner


def _messages() -> Any:
    return MessagesStream("qwen3-32b", "msg_bench")


def _responses() -> Any:
    return ResponsesStream("resp_bench", "qwen3-32b", 1730000000)


@pytest.mark.parametrize("label", ["baseline", "messages", "responses"])
@pytest.mark.parametrize("kind", ["content", "tool call"])
def test_translate_one_turn(
    benchmark: Any, record_against_baseline: Callable[[str, str, int], None], kind: str, label: str
) -> None:
    reads = _reads(_stream(kind))
    events = 304 if kind == "content" else 305
    group = f"translation: {kind} stream"
    benchmark.group = group

    if label == "baseline":

        def turn() -> Any:
            scanner = SSEScanner()
            for read in reads:
                scanner.feed(read)
            return scanner

    else:
        make = _messages if label == "messages" else _responses

        def turn() -> Any:
            translator = make()
            out = 0
            for read in reads:
                out += len(translator.feed(read))
            out += len(translator.finish())
            return translator.scanner

    scanner = benchmark(turn)
    record_against_baseline(group, label, events)
    assert scanner.done and scanner.event_count == events  # the whole stream was read
    assert scanner.finish_reason == ("tool_calls" if kind == "tool call" else "stop")


# --- what correct parallel calls and the prompt's count before content cost -----------------------

_CALLS, _FRAGMENTS = 4, 75


def _parallel_calls(interleaved: bool) -> bytes:
    """Four parallel calls of 75 argument fragments each (300 fragments, 306 events): one after
    another, as most engines send them, or interleaved fragment by fragment, where the translators
    hold calls 1-3 until call 0's arguments are whole."""
    rng = random.Random(5)
    fragments: list[list[dict[str, Any]]] = []
    for n in range(_CALLS):
        parts = [json.dumps(_text(rng, _WORDS, 40))[1:-1] for _ in range(_FRAGMENTS - 2)]
        pieces = ['{"text": "', *parts, '"}']
        start = {"index": n, "id": f"call_{n}", "type": "function", "function": {"name": "write_file"}}
        calls = [{**start, "function": {**start["function"], "arguments": pieces[0]}}]
        calls += [{"index": n, "function": {"arguments": piece}} for piece in pieces[1:]]
        fragments.append(calls)
    if interleaved:
        order = [fragments[n][i] for i in range(_FRAGMENTS) for n in range(_CALLS)]
    else:
        order = [call for calls in fragments for call in calls]
    objects = [_chunk({"role": "assistant", "content": None})]
    objects += [_chunk({"tool_calls": [call]}) for call in order]
    objects.append(_chunk({}, "tool_calls"))
    usage = {"prompt_tokens": 1834, "completion_tokens": 2400, "total_tokens": 4234}
    objects.append({**_base(), "choices": [], "usage": usage})
    return b"".join(b"data: " + orjson.dumps(obj) + b"\n\n" for obj in objects) + b"data: [DONE]\n\n"


def _with_continuous_usage(stream: bytes) -> bytes:
    """``stream`` with ``usage`` in every chunk, as vLLM and SGLang send it when the request asks
    for ``stream_options.continuous_usage_stats`` (what the translated requests ask)."""
    out = []
    for n, event in enumerate(stream.split(b"\n\n")[:-1]):
        data = event[len(b"data: ") :]
        if data != b"[DONE]":
            obj = orjson.loads(data)
            if obj["choices"]:
                obj["usage"] = {"prompt_tokens": 1834, "completion_tokens": n, "total_tokens": 1834 + n}
            data = orjson.dumps(obj)
        out.append(b"data: " + data + b"\n\n")
    return b"".join(out)


def _turn_of(make: Callable[[], Any], reads: list[bytes]) -> Callable[[], Any]:
    def turn() -> Any:
        translator = make()
        out = 0
        for read in reads:
            out += len(translator.feed(read))
        out += len(translator.finish())
        return translator

    return turn


@pytest.mark.parametrize(
    "label",
    [
        "baseline",
        "messages, one after another",
        "messages, interleaved",
        "responses, one after another",
        "responses, interleaved",
    ],
)
def test_parallel_calls_whole(
    benchmark: Any, record_against_baseline: Callable[[str, str, int], None], label: str
) -> None:
    """The cost of holding interleaved calls back until each is whole, against the same calls one
    after another (and the chat scanner alone, the baseline)."""
    group = "translation: four parallel calls"
    benchmark.group = group
    interleaved = label.endswith("interleaved")
    reads = _reads(_parallel_calls(interleaved))
    if label == "baseline":

        def turn() -> Any:
            scanner = SSEScanner()
            for read in reads:
                scanner.feed(read)
            return scanner

        benchmark(turn)
    else:
        make = _messages if label.startswith("messages") else _responses
        translator = benchmark(_turn_of(make, reads))
        assert translator.tool_call_ids == [f"call_{n}" for n in range(_CALLS)]
    record_against_baseline(group, label, 2 + _CALLS * _FRAGMENTS + 2)


@pytest.mark.parametrize(
    "label",
    [
        "baseline",
        "messages",
        "messages, usage in every chunk",
        "responses",
        "responses, usage in every chunk",
    ],
)
def test_prompt_count_in_every_chunk(
    benchmark: Any, record_against_baseline: Callable[[str, str, int], None], label: str
) -> None:
    """What ``continuous_usage_stats`` costs the translators (each chunk longer by its usage,
    parsed), against the same content stream without (and the chat scanner alone, the baseline)."""
    group = "translation: content, usage in every chunk"
    benchmark.group = group
    stream = _stream("content")
    reads = _reads(_with_continuous_usage(stream) if label.endswith("every chunk") else stream)
    if label == "baseline":

        def turn() -> Any:
            scanner = SSEScanner()
            for read in reads:
                scanner.feed(read)
            return scanner

        benchmark(turn)
    else:
        benchmark(_turn_of(_messages if label.startswith("messages") else _responses, reads))
    record_against_baseline(group, label, 304)
