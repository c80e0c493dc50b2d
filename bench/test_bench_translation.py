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

from collections.abc import Callable
from typing import Any

import pytest
from test_bench_sse import _reads, _stream

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
