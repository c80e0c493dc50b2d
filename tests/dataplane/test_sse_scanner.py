"""The incremental SSE event scanner, both twins.

Every behaviour test runs on the pure twin (``py``) and the compiled one (``c``); the Hypothesis tests
feed both the same random streams cut at random offsets and require them to agree on everything, with
the pure twin, which parses every payload, as the reference for the compiled twin's shortcuts. Every
scan also checks, after each read, that the scanner holds no more than its ``max_event_bytes``.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import subprocess
import sys
import tracemalloc
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from luftpause.dataplane import _sse_py, sse
from luftpause.dataplane.sse import NO_EXTENSIONS

DEFAULT = sse.DEFAULT_MAX_EVENT_BYTES

ATTRIBUTES = (
    "first_token_seen",
    "finish_reason",
    "choices_finished",
    "saw_tool_calls",
    "tool_call_ids",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "response_id",
    "response_model",
    "done",
    "error",
    "event_count",
    "events",
    "oversized_events",
    "buffered_bytes",
)


class Scanner(Protocol):
    first_token_seen: bool
    finish_reason: str | None
    saw_tool_calls: bool
    tool_call_ids: list[str]
    prompt_tokens: int
    completion_tokens: int
    done: bool
    error: str | None
    event_count: int
    events: list[bytes]

    @property
    def oversized_events(self) -> int: ...
    @property
    def buffered_bytes(self) -> int: ...
    @property
    def max_event_bytes(self) -> int: ...

    def feed(self, chunk: bytes | bytearray) -> bool: ...


class ScannerClass(Protocol):
    def __call__(self, keep_events: bool = False, max_event_bytes: int = ...) -> Scanner: ...


def _compiled_twin() -> ScannerClass:
    # An ImportError here is a failure, not a skip: a normal install must have built the twin.
    compiled: Any = importlib.import_module("luftpause.dataplane._sse_c")
    return compiled.SSEScanner  # type: ignore[no-any-return]


TWINS: dict[str, ScannerClass] = {"py": _sse_py.SSEScanner}
if not NO_EXTENSIONS:
    TWINS["c"] = _compiled_twin()


@pytest.fixture(params=["py", "c"])
def scanner_cls(request: pytest.FixtureRequest) -> ScannerClass:
    if request.param not in TWINS:
        pytest.skip("LUFTPAUSE_NO_EXTENSIONS is set: the compiled twin is not used")
    return TWINS[request.param]


# --- building streams ------------------------------------------------------------------------------

_BASE = {
    "id": "chatcmpl-7f3a",
    "object": "chat.completion.chunk",
    "created": 1730000000,
    "model": "qwen3-32b",
}


def chunk_object(
    delta: dict[str, Any] | None = None,
    finish_reason: str | None = None,
    *,
    index: int = 0,
    usage: dict[str, Any] | None = None,
    choices: list[Any] | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk`` object as an engine sends it."""
    obj: dict[str, Any] = dict(_BASE)
    if choices is None:
        choices = [{"index": index, "delta": delta or {}, "logprobs": None, "finish_reason": finish_reason}]
    obj["choices"] = choices
    if usage is not None:
        obj["usage"] = usage
    return obj


def event(obj: object, end: bytes = b"\n") -> bytes:
    """One SSE event whose single data line is ``obj`` as JSON (or raw bytes)."""
    payload = obj if isinstance(obj, bytes) else orjson.dumps(obj)
    return b"data: " + payload + end + end


def openai_stream(words: Sequence[str] = ("Hello", ",", " world", "!")) -> list[bytes]:
    """A streamed chat completion, one event per element: role, content, finish, usage, [DONE]."""
    events = [event(chunk_object({"role": "assistant", "content": ""}))]
    events += [event(chunk_object({"content": word})) for word in words]
    events.append(event(chunk_object({}, "stop")))
    usage = {"prompt_tokens": 31, "completion_tokens": len(words), "total_tokens": 31 + len(words)}
    events.append(event(chunk_object(choices=[], usage=usage)))
    events.append(b"data: [DONE]\n\n")
    return events


def tool_call_stream() -> list[bytes]:
    """Two parallel tool calls (indexes 0 and 1), their arguments streamed in pieces."""

    def call(index: int, call_id: str | None = None, name: str | None = None, args: str = "") -> Any:
        piece: dict[str, Any] = {"index": index, "function": {"arguments": args}}
        if call_id is not None:
            piece["id"] = call_id
            piece["type"] = "function"
        if name is not None:
            piece["function"]["name"] = name
        return piece

    deltas: list[dict[str, Any]] = [
        {"role": "assistant", "content": None},
        {"tool_calls": [call(0, "call_a1", "read_file")]},
        {"tool_calls": [call(0, args='{"path": ')]},
        {"tool_calls": [call(0, "", args='"a.txt"}')]},
        {"tool_calls": [call(1, "call_b2", "list_dir")]},
        {"tool_calls": [call(1, args='{"dir": "."}')]},
    ]
    events = [event(chunk_object(delta)) for delta in deltas]
    events.append(event(chunk_object({}, "tool_calls")))
    events.append(b"data: [DONE]\n\n")
    return events


def scan(
    cls: ScannerClass,
    reads: Iterable[bytes],
    keep_events: bool = True,
    max_event_bytes: int = DEFAULT,
) -> tuple[Scanner, list[int]]:
    """Feed ``reads`` in order; return the scanner and the indexes of reads whose feed said True.

    After every read, the scanner must hold no more than its bound.
    """
    scanner = cls(keep_events=keep_events, max_event_bytes=max_event_bytes)
    firsts = []
    for i, read in enumerate(reads):
        if scanner.feed(read):
            firsts.append(i)
        assert 0 <= scanner.buffered_bytes <= max_event_bytes, (i, scanner.buffered_bytes)
    return scanner, firsts


def state(scanner: Scanner) -> dict[str, object]:
    return {name: getattr(scanner, name) for name in ATTRIBUTES}


def split_at(data: bytes, cuts: Iterable[int]) -> list[bytes]:
    points = [0, *sorted(set(cuts)), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(points)]


# --- the stream as the engine sends it -----------------------------------------------------------


def test_the_answers_id_model_and_cached_prompt_tokens_are_read(scanner_cls: ScannerClass) -> None:
    """From the first chunk that has them (the role chunk), and the last usage's
    ``prompt_tokens_details.cached_tokens`` (what the metrics count as cached prompt tokens and
    the spans as ``gen_ai.usage.cache_read.input_tokens``)."""
    events = openai_stream()
    scanner, _ = scan(scanner_cls, events)
    assert (scanner.response_id, scanner.response_model, scanner.cached_tokens) == (
        _BASE["id"],
        _BASE["model"],
        -1,
    )
    usage = {"prompt_tokens": 31, "completion_tokens": 2, "prompt_tokens_details": {"cached_tokens": 24}}
    first = chunk_object({"role": "assistant", "content": ""})
    first["id"], first["model"] = "", None  # not said here: read from the next chunk that says it
    later = chunk_object({"content": "hi"})
    later["id"], later["model"] = "chatcmpl-2", "served-model"
    stream = [event(first), event(later), event(chunk_object(choices=[], usage=usage)), b"data: [DONE]\n\n"]
    scanner, _ = scan(scanner_cls, stream)
    assert (scanner.response_id, scanner.response_model, scanner.cached_tokens) == (
        "chatcmpl-2",
        "served-model",
        24,
    )
    bad = {"prompt_tokens": 1, "completion_tokens": 1, "prompt_tokens_details": {"cached_tokens": -3}}
    scanner, _ = scan(scanner_cls, [event(chunk_object(choices=[], usage=bad))])
    assert scanner.cached_tokens == -1


def test_openai_stream_gives_first_token_finish_reason_usage_and_done(scanner_cls: ScannerClass) -> None:
    events = openai_stream()
    scanner, firsts = scan(scanner_cls, events)
    assert firsts == [1]  # the first content delta, not the role chunk
    assert scanner.first_token_seen
    assert scanner.finish_reason == "stop"
    assert not scanner.saw_tool_calls
    assert scanner.tool_call_ids == []
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (31, 4)
    assert scanner.done
    assert scanner.event_count == len(events)
    assert scanner.events == [e[len(b"data: ") : -2] for e in events]


def test_fresh_scanner_reports_nothing(scanner_cls: ScannerClass) -> None:
    scanner = scanner_cls()
    assert state(scanner) == {
        "first_token_seen": False,
        "finish_reason": None,
        "choices_finished": False,
        "saw_tool_calls": False,
        "tool_call_ids": [],
        "prompt_tokens": -1,
        "completion_tokens": -1,
        "cached_tokens": -1,
        "response_id": None,
        "response_model": None,
        "done": False,
        "error": None,
        "event_count": 0,
        "events": [],
        "oversized_events": 0,
        "buffered_bytes": 0,
    }
    assert scanner.max_event_bytes == 16 * 1024 * 1024 == DEFAULT


def test_events_are_kept_only_when_asked(scanner_cls: ScannerClass) -> None:
    scanner, _ = scan(scanner_cls, openai_stream(), keep_events=False)
    assert scanner.events == []
    assert scanner.event_count == 8


def test_tool_call_stream_collects_each_id_once_in_order(scanner_cls: ScannerClass) -> None:
    scanner, firsts = scan(scanner_cls, tool_call_stream())
    assert firsts == [1]  # the first tool-call delta is the first token
    assert scanner.saw_tool_calls
    assert scanner.tool_call_ids == ["call_a1", "call_b2"]
    assert scanner.finish_reason == "tool_calls"
    assert scanner.done


def test_tool_calls_win_over_the_engines_finish_reason(scanner_cls: ScannerClass) -> None:
    reads = [
        event(chunk_object({"tool_calls": [{"index": 0, "id": "call_x", "function": {"name": "f"}}]})),
        event(chunk_object({"tool_calls": [{"index": 0, "id": "call_x", "function": {"arguments": "{}"}}]})),
        event(chunk_object({}, "stop")),
    ]
    scanner, _ = scan(scanner_cls, reads)
    assert scanner.finish_reason == "tool_calls"
    assert scanner.tool_call_ids == ["call_x"]  # an engine repeating the id does not repeat it here


def test_last_non_null_finish_reason_wins(scanner_cls: ScannerClass) -> None:
    reads = [
        event(chunk_object({"content": "a"}, "length", index=0)),
        event(chunk_object({"content": "b"}, None, index=1)),
        event(chunk_object({"content": "c"}, "stop", index=1)),
        event(chunk_object({}, None)),
    ]
    scanner, _ = scan(scanner_cls, reads)
    assert scanner.finish_reason == "stop"


# --- what counts as the first token --------------------------------------------------------------


@pytest.mark.parametrize(
    "delta",
    [
        {"role": "assistant"},
        {"role": "assistant", "content": ""},
        {"content": None},
        {"content": ""},
        {"reasoning_content": ""},
        {"tool_calls": []},
        {"tool_calls": None},
        {"content": ["not", "a", "string"]},
        {},
    ],
)
def test_first_token_not_triggered_by(scanner_cls: ScannerClass, delta: dict[str, Any]) -> None:
    scanner, firsts = scan(scanner_cls, [event(chunk_object(delta))])
    assert firsts == []
    assert not scanner.first_token_seen
    assert not scanner.saw_tool_calls


@pytest.mark.parametrize(
    "delta",
    [
        {"content": "x"},
        {"reasoning_content": "Let me think"},
        {"reasoning": "Let me think"},
        {"role": "assistant", "content": "", "reasoning_content": "hm"},
        {"tool_calls": [{"index": 0}]},
    ],
)
def test_first_token_triggered_by(scanner_cls: ScannerClass, delta: dict[str, Any]) -> None:
    reads = [
        event(chunk_object({"role": "assistant"})),
        event(chunk_object(delta)),
        event(chunk_object(delta)),
    ]
    scanner, firsts = scan(scanner_cls, reads)
    assert firsts == [1]  # and only once
    assert scanner.first_token_seen


def test_first_token_in_a_later_choice_counts(scanner_cls: ScannerClass) -> None:
    choices = [
        {"index": 0, "delta": {"role": "assistant"}, "finish_reason": None},
        {"index": 1, "delta": {"content": "y"}, "finish_reason": None},
    ]
    _, firsts = scan(scanner_cls, [event(chunk_object(choices=choices))])
    assert firsts == [0]


# --- usage ---------------------------------------------------------------------------------------


def test_usage_only_chunk_with_empty_choices_is_read(scanner_cls: ScannerClass) -> None:
    reads = [
        event(chunk_object({"content": "hi"}, usage=None)),
        event({**_BASE, "choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 1}}),
    ]
    scanner, _ = scan(scanner_cls, reads)
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (12, 1)


def test_last_usage_wins_and_null_usage_is_ignored(scanner_cls: ScannerClass) -> None:
    reads = [
        event({**_BASE, "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 2}}),
        event({**_BASE, "choices": [{"index": 0, "delta": {"content": "a"}}], "usage": None}),
        event({**_BASE, "choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}}),
        event({**_BASE, "choices": [], "usage": None}),
    ]
    scanner, _ = scan(scanner_cls, reads)
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (7, 3)


@pytest.mark.parametrize("bad", ["12", 1.5, True, -3, None, [1], 2**70])
def test_usage_of_the_wrong_type_is_ignored(scanner_cls: ScannerClass, bad: object) -> None:
    usage = {"prompt_tokens": bad, "completion_tokens": bad}
    reads = [event(json.dumps({"choices": [], "usage": usage}).encode())]  # orjson refuses 2**70
    scanner, _ = scan(scanner_cls, reads)
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (-1, -1)


def test_usage_read_after_first_token_whatever_the_spacing(scanner_cls: ScannerClass) -> None:
    """Keys written with spaces, with \\u escapes, or looking like content must all be read."""
    reads = [
        event(chunk_object({"content": 'she said "usage": null and \\u0041'})),
        b'data: {"choices": [], "usage" :\t{"prompt_tokens": 3, "completion_tokens": 4}}\n\n',
        b'data: {"choices":[{"delta":{},"finish_reason" : "length"}]}\n\n',
        b'data: {"choices":[],"\\u0075sage":{"prompt_tokens":8}}\n\n',
    ]
    scanner, _ = scan(scanner_cls, reads)
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (8, 4)
    assert scanner.finish_reason == "length"


def test_tool_calls_after_content_are_read(scanner_cls: ScannerClass) -> None:
    reads = [
        event(chunk_object({"content": "I will call a tool"})),
        b'data: {"choices":[{"delta":{"tool_calls" : [{"index":0,"id":"call_q"}]}}]}\n\n',
        b'data: {"choices":[{"delta":{"tool_c\\u0061lls":[{"index":1,"id":"call_r"}]}}]}\n\n',
    ]
    scanner, _ = scan(scanner_cls, reads)
    assert scanner.tool_call_ids == ["call_q", "call_r"]
    assert scanner.finish_reason is None  # nothing said the answer ended
    scanner, _ = scan(scanner_cls, [*reads, b"data: [DONE]\n\n"])
    assert scanner.finish_reason == "tool_calls"


def test_a_tool_call_delta_alone_does_not_say_the_answer_ended(scanner_cls: ScannerClass) -> None:
    """The stream a relay must abort when the engine's body ends here: a tool call's first delta,
    then nothing (no finish chunk, no ``[DONE]``). The finish reason is what the relay takes as the
    answer's end, so it must stay unset (it was ``"tool_calls"`` from the first delta)."""
    reads = [
        event(chunk_object({"role": "assistant", "content": ""})),
        event(chunk_object({"tool_calls": [{"index": 0, "id": "call_cut", "function": {"name": "f"}}]})),
        event(chunk_object({"tool_calls": [{"index": 0, "function": {"arguments": '{"a": '}}]})),
    ]
    scanner, firsts = scan(scanner_cls, reads)
    assert firsts == [1] and scanner.saw_tool_calls and scanner.tool_call_ids == ["call_cut"]
    assert scanner.finish_reason is None and not scanner.done
    # once the engine says the end, by a finish reason of any name or by [DONE], it is a tool round
    for end in (event(chunk_object({}, "stop")), event(chunk_object({}, "tool_calls")), b"data: [DONE]\n\n"):
        scanner, _ = scan(scanner_cls, [*reads, end])
        assert scanner.finish_reason == "tool_calls"


def test_a_tool_call_after_the_finish_reason_still_makes_it_a_tool_round(scanner_cls: ScannerClass) -> None:
    reads = [
        event(chunk_object({"content": "x"}, "stop")),
        event(chunk_object({"tool_calls": [{"index": 0, "id": "call_late", "function": {"name": "f"}}]})),
    ]
    scanner, _ = scan(scanner_cls, reads)
    assert scanner.finish_reason == "tool_calls"


# --- [DONE] --------------------------------------------------------------------------------------


def test_missing_done_leaves_done_false(scanner_cls: ScannerClass) -> None:
    scanner, _ = scan(scanner_cls, openai_stream()[:-1])
    assert not scanner.done
    assert scanner.finish_reason == "stop"


def test_duplicated_done_is_counted_and_harmless(scanner_cls: ScannerClass) -> None:
    scanner, _ = scan(scanner_cls, [*openai_stream(), b"data: [DONE]\n\n"])
    assert scanner.done
    assert scanner.events[-2:] == [b"[DONE]", b"[DONE]"]


def test_done_needs_the_exact_payload(scanner_cls: ScannerClass) -> None:
    scanner, _ = scan(scanner_cls, [b"data: [DONE] \n\n", b"data:  [DONE]\n\n", b"data: [done]\n\n"])
    assert not scanner.done
    assert scanner.event_count == 3


# --- framing -------------------------------------------------------------------------------------


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"], ids=["LF", "CR", "CRLF"])
def test_every_line_ending_gives_the_same_events(scanner_cls: ScannerClass, eol: bytes) -> None:
    lf_stream = b"".join(openai_stream())
    scanner, _ = scan(scanner_cls, [lf_stream.replace(b"\n", eol)])
    reference, _ = scan(scanner_cls, [lf_stream])
    assert state(scanner) == state(reference)
    assert scanner.event_count == 8


def test_mixed_line_endings(scanner_cls: ScannerClass) -> None:
    stream = b"data: a\rdata: b\r\ndata: c\n\r\ndata: d\r\r: note\r\ndata: e\n\n"
    scanner, _ = scan(scanner_cls, [stream])
    assert scanner.events == [b"a\nb\nc", b"d", b"e"]


def test_crlf_split_between_reads_is_one_line_end(scanner_cls: ScannerClass) -> None:
    scanner, _ = scan(
        scanner_cls, [b"data: a\r", b"\ndata: b\r", b"\n", b"\r", b"\n", b"data: c\r\n\r", b"\n"]
    )
    assert scanner.events == [b"a\nb", b"c"]


def test_cr_at_the_end_of_a_read_ends_the_line_at_once(scanner_cls: ScannerClass) -> None:
    scanner = scanner_cls(keep_events=True)
    scanner.feed(b"data: [DONE]\r")
    assert not scanner.done
    scanner.feed(b"\r")
    assert scanner.done  # dispatched without waiting to see whether an LF follows
    scanner.feed(b"\n")  # completes the CRLF: no extra empty line, nothing else happens
    assert scanner.events == [b"[DONE]"]


def test_data_with_and_without_the_space(scanner_cls: ScannerClass) -> None:
    stream = b"data:x\n\ndata: x\n\ndata:  x\n\ndata\n\ndata:\n\ndata: \n\n"
    scanner, _ = scan(scanner_cls, [stream])
    assert scanner.events == [b"x", b"x", b" x", b"", b"", b""]


def test_multi_line_data_joins_with_lf_and_parses(scanner_cls: ScannerClass) -> None:
    stream = b'data: {"choices": [],\ndata: "usage": {"prompt_tokens": 9,\ndata:"completion_tokens": 2}}\n\n'
    scanner, _ = scan(scanner_cls, [stream])
    assert scanner.events == [b'{"choices": [],\n"usage": {"prompt_tokens": 9,\n"completion_tokens": 2}}']
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (9, 2)


def test_comments_and_other_fields_are_ignored(scanner_cls: ScannerClass) -> None:
    stream = (
        b": keep-alive\n\n"
        b":\n"
        b"event: message\nid: 7\nretry: 1000\ndata: one\n\n"
        b"event: ping\n\n"
        b"id\nretry\n\n"
        b"database: x\ndatum: y\nDATA: z\n data: w\n\n"
        b"data: two\n: inside an event\ndata: three\n\n"
    )
    scanner, _ = scan(scanner_cls, [stream])
    assert scanner.events == [b"one", b"two\nthree"]
    assert scanner.event_count == 2


def test_empty_data_events_are_dispatched_and_empty_events_are_not(scanner_cls: ScannerClass) -> None:
    scanner, _ = scan(scanner_cls, [b"\n\n\n", b"data:\n\n", b"event: x\n\n", b"data\ndata\n\n"])
    assert scanner.events == [b"", b"\n"]
    assert scanner.event_count == 2
    assert not scanner.first_token_seen


def test_unfinished_event_is_not_dispatched(scanner_cls: ScannerClass) -> None:
    scanner, _ = scan(scanner_cls, [b"data: [DONE]\n", b"data: [DONE]"])
    assert scanner.event_count == 0
    assert not scanner.done


def test_leading_byte_order_mark_is_ignored_once(scanner_cls: ScannerClass) -> None:
    bom = b"\xef\xbb\xbf"
    scanner, _ = scan(scanner_cls, [bom[:2], bom[2:] + b"data: a\n\n" + bom + b"data: b\n\n"])
    assert scanner.events == [b"a"]  # a BOM later in the stream is part of a field name


def test_utf8_characters_split_between_reads(scanner_cls: ScannerClass) -> None:
    text = "héllo 世界 🎉 — ok"
    stream = b"".join([event(chunk_object({"content": text})), event(chunk_object({}, "stop"))])
    start = stream.index("é".encode())
    for cut in range(start, start + len(text.encode())):
        scanner, firsts = scan(scanner_cls, [stream[:cut], stream[cut:]])
        assert firsts == [1]  # the first event ends in the second read
        assert orjson.loads(scanner.events[0])["choices"][0]["delta"]["content"] == text
        assert scanner.finish_reason == "stop"


def test_very_long_tool_argument_line(scanner_cls: ScannerClass) -> None:
    arguments = json.dumps({"content": "x" * 300_000, "path": "big.txt"})
    first = event(chunk_object({"tool_calls": [{"index": 0, "id": "call_big", "function": {"name": "w"}}]}))
    big = event(chunk_object({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}))
    stream = first + big + event(chunk_object({}, "tool_calls")) + b"data: [DONE]\n\n"
    scanner, _ = scan(scanner_cls, split_at(stream, range(1024, len(stream), 1024)))
    assert scanner.tool_call_ids == ["call_big"]
    assert scanner.done
    assert len(scanner.events[1]) > 300_000
    assert orjson.loads(scanner.events[1])["choices"][0]["delta"]["tool_calls"][0]["function"] == {
        "arguments": arguments
    }


def test_bytearray_reads_are_accepted(scanner_cls: ScannerClass) -> None:
    scanner = scanner_cls()
    firsts = [i for i, read in enumerate(openai_stream()) if scanner.feed(bytearray(read))]
    assert firsts == [1]
    assert scanner.done


# --- the bound on what is held of one event ------------------------------------------------------


def every_split(stream: bytes) -> Iterable[list[bytes]]:
    """The stream whole, cut once at every offset, and one byte per read."""
    yield [stream]
    for cut in range(len(stream) + 1):
        yield [stream[:cut], stream[cut:]]
    yield [stream[i : i + 1] for i in range(len(stream))]


@pytest.mark.parametrize("bad", [0, -1, -(2**70), sys.maxsize + 1, 2**70])
def test_bound_out_of_range_is_refused(scanner_cls: ScannerClass, bad: int) -> None:
    with pytest.raises(ValueError, match="at least 1 and at most"):
        scanner_cls(max_event_bytes=bad)


@pytest.mark.parametrize("bad", [1.5, "64", None])
def test_bound_that_is_not_an_integer_is_refused(scanner_cls: ScannerClass, bad: Any) -> None:
    with pytest.raises(TypeError):
        scanner_cls(max_event_bytes=bad)


def test_compiled_twin_has_the_same_default_bound() -> None:
    if "c" not in TWINS:
        pytest.skip("LUFTPAUSE_NO_EXTENSIONS is set: the compiled twin is not used")
    compiled: Any = importlib.import_module("luftpause.dataplane._sse_c")
    assert compiled.DEFAULT_MAX_EVENT_BYTES == _sse_py.DEFAULT_MAX_EVENT_BYTES == 16 * 1024 * 1024


@pytest.mark.parametrize(("bound", "events", "oversized"), [(9, [b"abc", b"ok"], 0), (8, [b"ok"], 1)])
def test_line_of_exactly_the_bound_is_read_and_one_byte_more_is_dropped(
    scanner_cls: ScannerClass, bound: int, events: list[bytes], oversized: int
) -> None:
    stream = b"data: abc\n\ndata: ok\n\n"  # "data: abc" is 9 bytes: the prefix counts
    for reads in every_split(stream):
        scanner, _ = scan(scanner_cls, reads, max_event_bytes=bound)
        assert (scanner.events, scanner.oversized_events) == (events, oversized), reads
        assert scanner.event_count == len(events)


@pytest.mark.parametrize(("bound", "events", "oversized"), [(10, [b"ab\ncd", b"ok"], 0), (9, [b"ok"], 1)])
def test_bound_counts_the_data_so_far_plus_the_line_being_read(
    scanner_cls: ScannerClass, bound: int, events: list[bytes], oversized: int
) -> None:
    # after "data: ab" the event holds 2 bytes of data; "data: cd" is 8 more: 10 held at most,
    # though the event's data is only 5 bytes once joined
    stream = b"data: ab\ndata: cd\n\ndata: ok\n\n"
    for reads in every_split(stream):
        scanner, _ = scan(scanner_cls, reads, max_event_bytes=bound)
        assert (scanner.events, scanner.oversized_events) == (events, oversized), reads


@pytest.mark.parametrize("eol", [b"\n", b"\r", b"\r\n"], ids=["LF", "CR", "CRLF"])
def test_dropped_event_is_read_past_up_to_its_blank_line(scanner_cls: ScannerClass, eol: bytes) -> None:
    lines = [b"data: small", b"data: " + b"x" * 100, b"data: more", b": a comment", b"", b"data: next", b""]
    stream = eol.join(lines) + eol
    for reads in every_split(stream):
        scanner, _ = scan(scanner_cls, reads, max_event_bytes=50)
        assert scanner.events == [b"next"], reads
        assert (scanner.event_count, scanner.oversized_events, scanner.buffered_bytes) == (1, 1, 0)


def test_an_over_long_comment_or_field_line_drops_its_event(scanner_cls: ScannerClass) -> None:
    stream = (
        b": "
        + b"c" * 100
        + b"\ndata: lost\n\n"
        + b"data: kept\n\n"
        + b"event: "
        + b"e" * 100
        + b"\ndata: lost too\n\n"
        + b": "
        + b"c" * 100
        + b"\n\n"  # a block with no data at all is counted too
        + b"data: last\n\n"
    )
    for reads in every_split(stream):
        scanner, _ = scan(scanner_cls, reads, max_event_bytes=64)
        assert scanner.events == [b"kept", b"last"], reads
        assert scanner.oversized_events == 3


def test_first_token_and_tool_calls_in_a_dropped_event_are_not_seen(scanner_cls: ScannerClass) -> None:
    big_call = {"index": 0, "id": "call_big", "function": {"name": "w", "arguments": "x" * 2000}}
    reads = [
        event(chunk_object({"role": "assistant"})),
        event(chunk_object({"tool_calls": [big_call]})),
        event(chunk_object({"content": "after"})),
        event(chunk_object({}, "stop")),
        event(chunk_object(choices=[], usage={"prompt_tokens": 3, "completion_tokens": 9})),
        b"data: [DONE]\n\n",
    ]
    scanner, firsts = scan(scanner_cls, reads, max_event_bytes=1024)
    assert scanner.oversized_events == 1
    assert firsts == [2]  # the tool call would have been the first token
    assert not scanner.saw_tool_calls and scanner.tool_call_ids == []
    assert scanner.finish_reason == "stop"
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (3, 9)
    assert scanner.done and scanner.event_count == 5
    # and with the default bound the same stream is read whole
    scanner, firsts = scan(scanner_cls, reads)
    assert (firsts, scanner.tool_call_ids, scanner.oversized_events) == ([1], ["call_big"], 0)


def test_over_long_first_line_ends_the_byte_order_mark_window(scanner_cls: ScannerClass) -> None:
    bom = b"\xef\xbb\xbf"
    stream = bom + b": " + b"c" * 100 + b"\n\n" + bom + b"data: b\n\ndata: c\n\n"
    for reads in every_split(stream):
        scanner, _ = scan(scanner_cls, reads, max_event_bytes=64)
        # the second BOM is not at the start of the stream: "\xef\xbb\xbfdata" is another field
        assert (scanner.events, scanner.oversized_events) == ([b"c"], 1), reads


def test_event_still_over_the_bound_when_the_stream_ends_holds_nothing(scanner_cls: ScannerClass) -> None:
    reads = [b"data: [DONE]\n\n", b"data: ", b"y" * 300, b"y" * 300]
    scanner, _ = scan(scanner_cls, reads, max_event_bytes=500)
    assert (scanner.oversized_events, scanner.buffered_bytes, scanner.event_count) == (1, 0, 1)
    assert scanner.done


def test_buffered_bytes_counts_the_unfinished_line_and_the_data_so_far(scanner_cls: ScannerClass) -> None:
    scanner = scanner_cls()
    scanner.feed(b"data: abc\ndata: de")  # data "abc" (3) + unfinished line "data: de" (8)
    assert scanner.buffered_bytes == 11
    scanner.feed(b"\n")  # data "abc\nde"
    assert scanner.buffered_bytes == 6
    scanner.feed(b"\n")  # dispatched
    assert scanner.buffered_bytes == 0


@pytest.mark.parametrize("twin", ["py", "c"])
def test_held_memory_stays_bounded_on_a_50_mb_line_without_newline(twin: str) -> None:
    """The reviewer's case: a line that never ends must not grow the scanner past its bound."""
    if twin not in TWINS:
        pytest.skip("LUFTPAUSE_NO_EXTENSIONS is set: the compiled twin is not used")
    cls = TWINS[twin]
    read_size = bound = 64 * 1024
    read = b"data: " + b"x" * (read_size - 6)  # made before tracing: only the scanner's bytes count
    reads = 800  # 52 MB in all
    tracemalloc.start()
    try:
        # Control: with the default bound, four reads of the line are held and tracemalloc sees
        # them, so the measurement below would catch a twin that held the line.
        unbounded = cls()
        for _ in range(4):
            unbounded.feed(read)
        _, control_peak = tracemalloc.get_traced_memory()
        assert unbounded.buffered_bytes == 4 * read_size
        assert control_peak >= 4 * read_size
        del unbounded

        tracemalloc.reset_peak()
        scanner = cls(max_event_bytes=bound)
        held = []
        for _ in range(reads):
            scanner.feed(read)
            held.append(scanner.buffered_bytes)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert max(held) <= bound
    assert held[-1] == 0  # the line was given up, not kept
    assert peak <= bound + read_size, peak
    assert scanner.oversized_events == 1
    # the blank line ends the dropped event; the turn that follows is read as usual
    firsts = [i for i, r in enumerate([b"xyz\n\n", *openai_stream()]) if scanner.feed(r)]
    assert firsts == [2]
    assert scanner.finish_reason == "stop"
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (31, 4)
    assert scanner.done and scanner.event_count == 8
    assert scanner.oversized_events == 1


# --- errors the engine reports in the stream -----------------------------------------------------

# Error events as the engines write them (vLLM: ``create_streaming_error_response``, pydantic's
# compact JSON; SGLang and older vLLM: ``json.dumps``, with spaces), and the message each gives.
ENGINE_ERRORS = {
    "vllm": (
        b'{"error":{"object":"error","message":"CUDA out of memory. Tried to allocate 2.00 GiB",'
        b'"type":"InternalServerError","param":null,"code":500}}',
        "CUDA out of memory. Tried to allocate 2.00 GiB",
    ),
    "vllm top level": (
        b'{"object": "error", "message": "The model `qwen3-32b` does not exist.", '
        b'"type": "NotFoundError", "param": null, "code": 404}',
        "The model `qwen3-32b` does not exist.",
    ),
    "sglang": (
        b'{"error": {"message": "Request aborted: KV cache pool is full", "type": '
        b'"BadRequestError", "code": 400}}',
        "Request aborted: KV cache pool is full",
    ),
    "bare string": (b'{"error": "engine overloaded"}', "engine overloaded"),
    "escaped key": (b'{"\\u0065rror": {"message": "escaped \\u00fcber"}}', "escaped über"),
    "escaped object": (b'{"object": "\\u0065rror", "message": "old vLLM, escaped"}', "old vLLM, escaped"),
}


def error_stream(payload: bytes, *, first_token: bool = True, eol: bytes = b"\n") -> bytes:
    """Role chunk, maybe a content delta, the engine's error event, then ``[DONE]``."""
    parts = [event(chunk_object({"role": "assistant", "content": ""}), eol)]
    if first_token:  # then the compiled twin's shortcut is live when the error arrives
        parts.append(event(chunk_object({"content": "Hel"}), eol))
    parts.append(event(payload, eol))
    parts.append(b"data: [DONE]" + eol + eol)
    return b"".join(parts)


@pytest.mark.parametrize("first_token", [True, False], ids=["after first token", "before first token"])
@pytest.mark.parametrize("shape", list(ENGINE_ERRORS))
def test_engine_error_event_is_seen_however_the_stream_is_cut(
    scanner_cls: ScannerClass, shape: str, first_token: bool
) -> None:
    payload, message = ENGINE_ERRORS[shape]
    stream = error_stream(payload, first_token=first_token, eol=b"\r\n" if shape == "sglang" else b"\n")
    for reads in every_split(stream):
        scanner, _ = scan(scanner_cls, reads)
        assert scanner.error == message, reads
        # the error changes nothing else: the caller decides that the turn failed
        assert (scanner.done, scanner.finish_reason, scanner.first_token_seen) == (True, None, first_token)
        assert scanner.event_count == len(scanner.events) == 3 + first_token


def test_stream_without_an_error_reports_none(scanner_cls: ScannerClass) -> None:
    for reads in (openai_stream(), tool_call_stream()):
        scanner, _ = scan(scanner_cls, reads)
        assert scanner.error is None


def test_error_event_over_several_data_lines_is_seen(scanner_cls: ScannerClass) -> None:
    # the lines join with LF, which is JSON whitespace between the key and its value
    reads = [event(chunk_object({"content": "a"})), b'data: {"error"\ndata: : {"message": "split"}}\n\n']
    scanner, _ = scan(scanner_cls, reads)
    assert scanner.events[1] == b'{"error"\n: {"message": "split"}}'
    assert scanner.error == "split"


def test_first_error_event_wins(scanner_cls: ScannerClass) -> None:
    reads = [
        event(chunk_object({"content": "a"})),
        event({"error": {"message": "first"}}),
        event(chunk_object({"content": "b"}, "stop")),
        event({"error": {"message": "second"}}),
        b"data: [DONE]\n\n",
    ]
    scanner, _ = scan(scanner_cls, reads)
    assert scanner.error == "first"
    assert scanner.finish_reason == "stop"


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b'{"error": {"code": 500}}', "engine error"),
        (b'{"error": {"message": ""}}', "engine error"),
        (b'{"error": {"message": 7}}', "engine error"),
        (b'{"error": {"message": null, "code": 500}}', "engine error"),
        (b'{"error": {}}', "engine error"),
        (b'{"error": ""}', "engine error"),
        (b'{"error": 500}', "engine error"),
        (b'{"error": true}', "engine error"),
        (b'{"error": false}', "engine error"),
        (b'{"error": ["x"]}', "engine error"),
        (b'{"object": "error"}', "engine error"),
        (b'{"object": "error", "message": ""}', "engine error"),
        (b'{"object": "error", "message": {"text": "x"}}', "engine error"),
        (b'{"error": {"message": "inner"}, "object": "error", "message": "outer"}', "inner"),
        (b'{"error": {"code": 1}, "object": "error", "message": "outer"}', "outer"),
        (b'{"error": {"message": "a"}, "message": "not read without object: error"}', "a"),
        (b'{"error" :\t {"message" : "spaced"}}', "spaced"),
        (b'{"error": null, "object": "error", "message": "m"}', "m"),
        (
            b'{"error": null, "error": {"message": "the last key wins, as orjson decodes it"}}',
            "the last key wins, as orjson decodes it",
        ),
        (b'{"choices": [{"delta": {"content": "partial"}}], "error": {"message": "mid"}}', "mid"),
    ],
)
def test_error_message_is_taken_from_the_shape_it_has(
    scanner_cls: ScannerClass, payload: bytes, message: str
) -> None:
    for first_token in (True, False):
        scanner, _ = scan(scanner_cls, [error_stream(payload, first_token=first_token)])
        assert scanner.error == message, first_token


@pytest.mark.parametrize(
    "payload",
    [
        # content, reasoning and tool arguments that talk about errors are content
        orjson.dumps(chunk_object({"content": 'error: {"error": {"message": "x"}}'})),
        orjson.dumps(chunk_object({"reasoning_content": 'the "error" key, "object": "error"'})),
        orjson.dumps(chunk_object({"content": "error"})),
        orjson.dumps(
            chunk_object({"tool_calls": [{"index": 0, "function": {"arguments": '{"error": "x"}'}}]})
        ),
        # an error key below the top level, or an object that is not "error"
        b'{"choices": [{"index": 0, "delta": {}, "error": {"message": "m"}}]}',
        b'{"choices": [], "usage": {"error": "m"}}',
        b'{"choices": [], "object": "errors", "message": "m"}',
        b'{"choices": [], "object": "chat.completion.chunk", "message": "m"}',
        b'{"choices": [], "message": "m", "type": "error"}',
        # a null error is no error, as a null usage is no usage
        b'{"choices": [{"delta": {"content": "x"}}], "error": null}',
        b'{"choices": [], "error" : null}',
        # JSON that is not an object, or not JSON
        b'[{"error": {"message": "m"}}]',
        b'"error"',
        b'{"error": {"message": "m"}',
        b"error: something broke",
    ],
)
def test_payload_that_is_not_an_error_event_is_not_counted(scanner_cls: ScannerClass, payload: bytes) -> None:
    for first_token in (True, False):
        for reads in every_split(error_stream(payload, first_token=first_token)):
            scanner, _ = scan(scanner_cls, reads)
            assert scanner.error is None, (first_token, reads)
            assert scanner.done


def test_sse_event_type_error_alone_is_not_an_error(scanner_cls: ScannerClass) -> None:
    """Only the payload counts, so an ``event: error`` field does not make a chunk an error."""
    stream = b"event: error\n" + event(chunk_object({"content": "x"})) + b"event: error\ndata: [DONE]\n\n"
    scanner, _ = scan(scanner_cls, [stream])
    assert scanner.error is None and scanner.done


@pytest.mark.parametrize(("length", "kept"), [(499, 499), (500, 500), (501, 500), (20_000, 500)])
def test_long_error_message_is_cut_to_500_characters(
    scanner_cls: ScannerClass, length: int, kept: int
) -> None:
    message = ("é日x" * length)[:length]  # characters, not bytes: cut at 500 code points
    for payload in (orjson.dumps({"error": {"message": message}}), orjson.dumps({"error": message})):
        scanner, _ = scan(scanner_cls, [error_stream(payload)])
        assert scanner.error == message[:kept]
        assert scanner.error is not None and len(scanner.error) == kept


def test_error_in_a_dropped_event_is_not_seen(scanner_cls: ScannerClass) -> None:
    big = orjson.dumps({"error": {"message": "m" * 2000, "code": 500}})
    small = orjson.dumps({"error": {"message": "small"}})
    stream = error_stream(big)
    for reads in every_split(stream):
        scanner, _ = scan(scanner_cls, reads, max_event_bytes=1024)
        assert (scanner.error, scanner.oversized_events, scanner.done) == (None, 1, True), reads
    # the next error event that fits is the first one seen
    scanner, _ = scan(scanner_cls, [stream, event(small)], max_event_bytes=1024)
    assert scanner.error == "small"
    # and with the default bound the big one is read, its message cut
    scanner, _ = scan(scanner_cls, [stream])
    assert (scanner.error, scanner.oversized_events) == ("m" * 500, 0)


# --- robustness ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        b"{",
        b"not json",
        b'{"choices": [{"delta": {"content": "\xff\xfe"}}]}',  # bad UTF-8 inside a string
        b'{"choices": [{"delta": {"content": "\xed\xa0\x80"}}]}',  # a lone surrogate
        b"[1, 2, 3]",
        b'"a string"',
        b"42",
        b"null",
        b'{"choices": "nope"}',
        b'{"choices": [null, 1, "x", []]}',
        b'{"choices": [{"delta": null, "finish_reason": 7}]}',
        b'{"choices": [{"delta": [], "finish_reason": ""}]}',
        b'{"choices": [{"delta": {"content": 5, "tool_calls": {"id": "x"}}}]}',
        b'{"choices": [{"delta": {"tool_calls": "call"}}]}',
        b'{"usage": [1, 2], "choices": {}}',
        b"[" * 5000 + b"]" * 5000,
        b"\x00\x01\x02",
    ],
)
def test_bad_payloads_are_ignored(scanner_cls: ScannerClass, payload: bytes) -> None:
    scanner, firsts = scan(scanner_cls, [b"data: " + payload + b"\n\n"])
    assert firsts == []
    assert state(scanner) | {"event_count": 0, "events": []} == state(scanner_cls())
    assert scanner.events == [payload]


def test_tool_call_entries_of_the_wrong_shape_count_but_give_no_id(scanner_cls: ScannerClass) -> None:
    reads = [event(chunk_object({"tool_calls": [None, 3, {"id": 5}, {"id": ""}, {"id": "call_ok"}]}))]
    scanner, _ = scan(scanner_cls, reads)
    assert scanner.saw_tool_calls
    assert scanner.tool_call_ids == ["call_ok"]


@settings(max_examples=200, deadline=None)
@given(reads=st.lists(st.binary(max_size=64), max_size=12))
def test_garbage_bytes_never_raise(reads: list[bytes]) -> None:
    for cls in TWINS.values():
        for bound in (DEFAULT, 1, 7):
            scan(cls, reads, max_event_bytes=bound)
            scan(cls, [b"".join(reads).replace(b"\n", b"\ndata: ")], max_event_bytes=bound)


# --- the twins agree, however the stream is cut ---------------------------------------------------


def _kitchen_sink_stream() -> bytes:
    """One stream with every feature: BOM, CR/LF/CRLF, comments, multi-line data, UTF-8, tools.

    Its lines are 5-238 bytes long, but for three events that a small bound drops: one line of 306
    bytes (CRLF), a comment of 302 bytes, and two data lines of 156 bytes (CR).
    """
    return (
        b"\xef\xbb\xbf: hello\r\n\r\n"
        + event(chunk_object({"role": "assistant", "content": ""}), b"\r\n")
        + event(chunk_object({"reasoning_content": "Überlegung…"}), b"\r")
        + b"event: message\nid: 1\ndata:"
        + orjson.dumps(chunk_object({"content": "日本"}))
        + b"\n\n"
        + b"data: "
        + b"y" * 300
        + b"\r\ndata: tail\r\n\r\n"
        + b': keep-alive\n\ndata: {"choices":[{"delta":\r\ndata: {"content":"x"}}]}\n\n'
        + b": "
        + b"z" * 300
        + b"\ndata: lost\n\n"
        + event(chunk_object({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "f"}}]}))
        + event(chunk_object({"tool_calls": [{"index": 1, "id": "call_2", "function": {"name": "g"}}]}))
        + event(chunk_object({}, "stop"), b"\r\n")
        + b"data: {bad json\n\ndata:\n\n"
        + b"data: "
        + b"w" * 150
        + b"\rdata: "
        + b"w" * 150
        + b"\r\r"
        + event({"choices": [], "usage": {"prompt_tokens": 10, "completion_tokens": 5}}, b"\r")
        + b"data: [DONE]\r\n\r\ndata: [DONE]\n\n"
    )


# max_event_bytes -> facts about the kitchen-sink stream read whole with it
_KITCHEN_SINK_FACTS: dict[int, dict[str, object]] = {
    DEFAULT: {"oversized_events": 0, "event_count": 15, "tool_call_ids": ["call_1", "call_2"]},
    # the three long events
    256: {"oversized_events": 3, "event_count": 12, "tool_call_ids": ["call_1", "call_2"]},
    # and the role, reasoning and both tool-call events; the first token comes from the "日本" event
    200: {"oversized_events": 7, "event_count": 8, "tool_call_ids": [], "first_token_seen": True},
    # all but the short events: no first token, but [DONE] (12 bytes) is read
    16: {"oversized_events": 11, "first_token_seen": False, "done": True, "event_count": 4},
}


@pytest.mark.parametrize("bound", list(_KITCHEN_SINK_FACTS), ids=lambda b: f"bound={b}")
def test_every_two_part_split_gives_the_same_result(bound: int) -> None:
    stream = _kitchen_sink_stream()
    whole = {name: state(scan(cls, [stream], max_event_bytes=bound)[0]) for name, cls in TWINS.items()}
    expected = whole["py"]
    assert expected | _KITCHEN_SINK_FACTS[bound] == expected
    assert expected["done"]
    for name, cls in TWINS.items():
        assert whole[name] == expected
        for cut in range(len(stream) + 1):
            scanner, firsts = scan(cls, [stream[:cut], stream[cut:]], max_event_bytes=bound)
            assert state(scanner) == expected, (name, cut)
            assert len(firsts) == int(bool(expected["first_token_seen"])), (name, cut)


@pytest.mark.parametrize("bound", list(_KITCHEN_SINK_FACTS), ids=lambda b: f"bound={b}")
def test_one_byte_at_a_time_gives_the_same_result(bound: int) -> None:
    stream = _kitchen_sink_stream()
    expected = state(scan(_sse_py.SSEScanner, [stream], max_event_bytes=bound)[0])
    for cls in TWINS.values():
        scanner, _ = scan(cls, [stream[i : i + 1] for i in range(len(stream))], max_event_bytes=bound)
        assert state(scanner) == expected


_texts = st.text(st.characters(codec="utf-8"), max_size=12) | st.sampled_from(
    [
        *['"usage": null', '"finish_reason": "stop"', "tool_calls", "\\u0041", "\n", ""],
        *['"error": {"message": "x"}', '"object": "error"', "error", '"error": null'],
    ]
)
_call_ids = st.none() | st.sampled_from(["", "call_1", "call_2", "call_3"])
_tool_calls = st.lists(
    st.fixed_dictionaries(
        {"index": st.integers(0, 2)}, optional={"id": _call_ids, "function": st.just({"arguments": "{}"})}
    ),
    max_size=2,
)
_deltas = st.fixed_dictionaries(
    {},
    optional={
        "role": st.just("assistant"),
        "content": st.none() | _texts,
        "reasoning_content": st.none() | _texts,
        "reasoning": _texts,
        "tool_calls": st.none() | _tool_calls,
    },
)
_choices = st.lists(
    st.fixed_dictionaries(
        {"index": st.integers(0, 1), "delta": _deltas},
        optional={"finish_reason": st.none() | st.sampled_from(["stop", "length", "tool_calls", ""])},
    ),
    max_size=2,
)
_usage = st.none() | st.fixed_dictionaries(
    {}, optional={"prompt_tokens": st.integers(-2, 500), "completion_tokens": st.integers(-2, 500)}
)
_messages = _texts | st.none() | st.integers(0, 3) | st.just("m" * 600)
_errors = (
    st.none()
    | _messages
    | st.booleans()
    | st.fixed_dictionaries(
        {}, optional={"message": _messages, "object": st.just("error"), "code": st.sampled_from([400, 500])}
    )
)
_objects = st.fixed_dictionaries(
    {"choices": _choices},
    optional={
        "usage": _usage,
        "id": st.just("chatcmpl-1"),
        "object": st.sampled_from(["chat.completion.chunk", "error", "errors"]),
        # an error beside the chunk's fields, or a null one, which is no error
        "error": _errors,
        "message": _messages,
    },
)
# error events shaped as vLLM and SGLang send them
_error_events = st.fixed_dictionaries(
    {"error": _errors}, optional={"object": st.just("error"), "message": _messages}
) | st.fixed_dictionaries(
    {"object": st.just("error")}, optional={"message": _messages, "code": st.sampled_from([400, 500])}
)


@st.composite
def _payloads(draw: st.DrawFn) -> bytes:
    kind = draw(st.sampled_from(["object", "object", "object", "error", "done", "garbage"]))
    if kind == "done":
        return b"[DONE]"
    if kind == "garbage":
        return draw(st.binary(max_size=20).filter(lambda b: b"\n" not in b and b"\r" not in b))
    obj = draw(_error_events if kind == "error" else _objects)
    style = draw(st.sampled_from(["orjson", "ascii", "spaced", "escaped keys"]))
    if style == "orjson":
        return orjson.dumps(obj)
    # json escapes non-ASCII as \uXXXX; "spaced" puts blanks around colons
    separators = (", ", " : ") if style == "spaced" else (",", ":")
    payload = json.dumps(obj, ensure_ascii=True, separators=separators).encode()
    if style == "escaped keys":  # the same keys, spelled with \u escapes
        # ("error" also as the value of "object", which decodes to "error" all the same)
        for key in (b"usage", b"tool_calls", b"finish_reason", b"content", b"error", b"object"):
            payload = payload.replace(b'"%s"' % key, b'"\\u%04x%s"' % (key[0], key[1:]))
    return payload


@st.composite
def _streams(draw: st.DrawFn) -> bytes:
    parts: list[bytes] = []
    if draw(st.booleans()):  # the first token first, so what follows meets the compiled twin's shortcut
        parts.append(event(chunk_object({"content": "x"})))
    for _ in range(draw(st.integers(0, 8))):
        eol = draw(st.sampled_from([b"\n", b"\r", b"\r\n"]))
        for _ in range(draw(st.integers(0, 2))):
            parts.append(
                draw(st.sampled_from([b": keep-alive", b"event: delta", b"id: 3", b"retry: 10"])) + eol
            )
        payload = draw(_payloads())
        # now and then a long line, for small bounds to drop its event
        if not draw(st.integers(0, 5)):
            head = draw(st.sampled_from([b"data: ", b"data:", b": ", b"event: "]))
            parts.append(head + b"y" * draw(st.integers(0, 600)) + eol)
        # split the payload over several data lines, sometimes inside a JSON string (then invalid)
        cuts = sorted(draw(st.lists(st.integers(0, len(payload)), max_size=2)))
        for line in split_at(payload, cuts):
            prefix = draw(st.sampled_from([b"data: ", b"data:"]))
            parts.append(prefix + line + eol)
        # now and then an event runs on into the next one, its blank line missing
        if draw(st.integers(0, 9)):
            parts.append(eol)
    return b"".join(parts)


@pytest.mark.skipif(NO_EXTENSIONS, reason="LUFTPAUSE_NO_EXTENSIONS is set: only the pure twin is used")
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=_streams(), data=st.data())
def test_twins_agree_on_random_streams_cut_anywhere(stream: bytes, data: st.DataObject) -> None:
    # the default bound, or (twice as often) one small enough to drop some events of the stream
    small = data.draw(st.integers(1, 700), label="small bound")
    bound = data.draw(st.sampled_from([DEFAULT, small, small]), label="max_event_bytes")
    cuts = data.draw(st.lists(st.integers(0, len(stream)), max_size=6), label="cuts")
    after_cr = [i + 1 for i, byte in enumerate(stream) if byte == 0x0D]
    if after_cr:  # reads that end between the CR and LF of a CRLF
        cuts += data.draw(st.lists(st.sampled_from(after_cr), max_size=3), label="cuts after CR")
    reads = split_at(stream, cuts)
    reference, reference_firsts = scan(_sse_py.SSEScanner, [stream], max_event_bytes=bound)
    py, py_firsts = scan(TWINS["py"], reads, max_event_bytes=bound)
    c, c_firsts = scan(TWINS["c"], reads, max_event_bytes=bound)
    assert state(py) == state(reference)
    assert state(c) == state(py)
    assert c_firsts == py_firsts
    assert len(py_firsts) == int(reference.first_token_seen) == len(reference_firsts)


# --- which twin is loaded ------------------------------------------------------------------------


@pytest.mark.skipif(NO_EXTENSIONS, reason="LUFTPAUSE_NO_EXTENSIONS is set: the pure twin is expected")
def test_compiled_twin_is_loaded_in_a_normal_install() -> None:
    assert sse.USING_EXTENSION, "luftpause.dataplane._sse_c did not load: build it with pip install -e ."
    assert sse.SSEScanner.__module__ == "luftpause.dataplane._sse_c"


def test_no_extensions_variable_selects_the_pure_twin() -> None:
    code = "from luftpause.dataplane import sse; print(sse.USING_EXTENSION, sse.SSEScanner.__module__)"
    env = {**os.environ, "LUFTPAUSE_NO_EXTENSIONS": "1"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "luftpause.dataplane._sse_py"]


# --- the checklist of issue 4, case by case ----------------------------------------------------------


def test_parallel_tool_calls_sharing_an_index_keep_both_ids(scanner_cls: ScannerClass) -> None:
    """Some engines send parallel calls all at index 0: each id is a call of its own."""
    reads = [
        event(chunk_object({"tool_calls": [{"index": 0, "id": "call_0", "function": {"name": "a"}}]})),
        event(chunk_object({"tool_calls": [{"index": 0, "id": "", "function": {"arguments": "{}"}}]})),
        event(chunk_object({"tool_calls": [{"index": 0, "id": "call_1", "function": {"name": "b"}}]})),
        event(chunk_object({"tool_calls": [{"index": 0, "function": {"arguments": "{}"}}]})),
        event(chunk_object({}, "tool_calls")),
    ]
    scanner, firsts = scan(scanner_cls, reads)
    assert scanner.tool_call_ids == ["call_0", "call_1"]
    assert firsts == [0]
    assert scanner.finish_reason == "tool_calls"


def test_parallel_tool_calls_in_one_delta_keep_both_ids(scanner_cls: ScannerClass) -> None:
    calls = [
        {"index": 0, "id": "call_a", "function": {"name": "a", "arguments": "{}"}},
        {"index": 0, "id": "call_b", "function": {"name": "b", "arguments": "{}"}},
    ]
    scanner, _ = scan(scanner_cls, [event(chunk_object({"tool_calls": calls}, "stop"))])
    assert scanner.tool_call_ids == ["call_a", "call_b"]
    assert scanner.finish_reason == "tool_calls"  # the engine said "stop" in the same chunk


def test_an_empty_read_between_cr_and_lf_changes_nothing(scanner_cls: ScannerClass) -> None:
    scanner, _ = scan(scanner_cls, [b"data: a\r", b"", b"\n", b"", b"\r", b"", b"\ndata: [DONE]\r\n\r\n"])
    assert scanner.events == [b"a", b"[DONE]"]
    assert scanner.done


def test_role_chunk_carrying_usage_is_not_the_first_token(scanner_cls: ScannerClass) -> None:
    """vLLM with continuous usage stats puts usage on every chunk, the role chunk too."""
    usage = {"prompt_tokens": 5, "completion_tokens": 0, "total_tokens": 5}
    reads = [
        event(chunk_object({"role": "assistant", "content": ""}, usage=usage)),
        event(chunk_object({"content": "x"}, usage={**usage, "completion_tokens": 1})),
    ]
    scanner, firsts = scan(scanner_cls, reads)
    assert firsts == [1]
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (5, 1)


@pytest.mark.parametrize(
    "delta", [{"reasoning": ""}, {"reasoning": None}, {"reasoning_content": None}, {"content": 0}]
)
def test_first_token_not_triggered_by_empty_reasoning_or_odd_content(
    scanner_cls: ScannerClass, delta: dict[str, Any]
) -> None:
    scanner, firsts = scan(
        scanner_cls, [event(chunk_object({"role": "assistant"})), event(chunk_object(delta))]
    )
    assert firsts == []
    assert not scanner.first_token_seen


def test_hundreds_of_kb_of_multibyte_arguments_cut_at_odd_offsets(scanner_cls: ScannerClass) -> None:
    """A long line whose reads split UTF-8 characters and whose line ends are CRLF."""
    arguments = json.dumps({"text": "Grüße, 世界 🎉 " * 20_000}, ensure_ascii=False)
    assert len(arguments.encode()) > 400_000
    first = event(chunk_object({"tool_calls": [{"index": 0, "id": "call_long", "function": {"name": "w"}}]}))
    long_event = event(
        chunk_object({"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]}), b"\r\n"
    )
    stream = first + long_event + event(chunk_object({}, "stop"), b"\r\n") + b"data: [DONE]\r\n\r\n"
    for step in (4093, 65_537):
        scanner, firsts = scan(scanner_cls, split_at(stream, range(step, len(stream), step)))
        assert firsts == [0]
        assert scanner.tool_call_ids == ["call_long"]
        assert scanner.finish_reason == "tool_calls"
        assert scanner.done
        parsed = orjson.loads(scanner.events[1])
        assert parsed["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"] == arguments


def test_stream_of_only_done(scanner_cls: ScannerClass) -> None:
    scanner, firsts = scan(scanner_cls, [b"data: [DONE]\n\n"])
    assert firsts == []
    assert scanner.done and scanner.finish_reason is None and not scanner.first_token_seen


def test_usage_only_final_chunk_then_no_done(scanner_cls: ScannerClass) -> None:
    """The engine closed after its usage chunk without [DONE]: finish reason and usage still read."""
    events = openai_stream()[:-1]
    scanner, _ = scan(scanner_cls, [b"".join(events)[:-1], b"\n"])
    assert not scanner.done
    assert scanner.finish_reason == "stop"
    assert (scanner.prompt_tokens, scanner.completion_tokens) == (31, 4)
