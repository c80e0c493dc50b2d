"""The SSE scanner counts the choices of an answer (``SSEScanner(choices=n)``): ``choices_finished``
once every index below ``n`` said its finish reason, both twins alike.

With one finish reason per answer, choice 0's made an ``n = 2`` answer look whole, and an engine
that ended its body then, before choice 1 finished and without ``[DONE]``, had the client's stream
ended cleanly (``tests/dataplane/test_a_stream_of_n_choices_is_whole_when_every_choice_finished.py``
runs that through the dataplane). The Hypothesis test checks both twins against a model of the rule
on random streams of several choices, cut anywhere.
"""

from __future__ import annotations

import importlib
import itertools
import sys
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.dataplane import _sse_py
from luftpause.dataplane.sse import NO_EXTENSIONS

TWINS: dict[str, Any] = {"py": _sse_py.SSEScanner}
if not NO_EXTENSIONS:
    # An ImportError here is a failure, not a skip: a normal install must have built the twin.
    TWINS["c"] = importlib.import_module("luftpause.dataplane._sse_c").SSEScanner

FACTS = ("choices_finished", "finish_reason", "done", "first_token_seen", "event_count", "choices")


@pytest.fixture(params=["py", "c"])
def scanner_cls(request: pytest.FixtureRequest) -> Any:
    if request.param not in TWINS:
        pytest.skip("LUFTPAUSE_NO_EXTENSIONS is set: the compiled twin is not used")
    return TWINS[request.param]


def choice(
    index: object = 0, content: str = "x", finish: str | None = None, **extra: object
) -> dict[str, Any]:
    """One entry of a chunk's ``choices``; ``index=...`` (Ellipsis) leaves the key out."""
    entry: dict[str, Any] = {"delta": {"content": content}, "finish_reason": finish, **extra}
    if index is not ...:
        entry["index"] = index
    return entry


def event(*choices: dict[str, Any]) -> bytes:
    obj = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "choices": list(choices)}
    return b"data: " + orjson.dumps(obj) + b"\n\n"


def scanned(cls: Any, reads: list[bytes], choices: int = 1) -> Any:
    scanner = cls(choices=choices)
    for read in reads:
        scanner.feed(read)
    return scanner


def test_one_choice_is_asked_for_unless_told(scanner_cls: Any) -> None:
    scanner = scanner_cls()
    assert (scanner.choices, scanner.choices_finished) == (1, False)
    scanner.feed(event(choice(0, "a")) + event(choice(0, "", "stop")))
    assert scanner.choices_finished


def test_two_choices_are_finished_only_when_both_said_so(scanner_cls: Any) -> None:
    scanner = scanner_cls(choices=2)
    scanner.feed(event(choice(0, "a")) + event(choice(1, "b")) + event(choice(0, "", "stop")))
    assert (scanner.finish_reason, scanner.choices_finished) == ("stop", False)
    scanner.feed(event(choice(1, "", "length")))
    assert (scanner.finish_reason, scanner.choices_finished) == ("length", True)


def test_a_choice_finishing_twice_counts_once(scanner_cls: Any) -> None:
    scanner = scanned(scanner_cls, [event(choice(0, "a", "stop")), event(choice(0, "", "stop"))], choices=2)
    assert not scanner.choices_finished


def test_choices_finishing_in_one_chunk_count_each(scanner_cls: Any) -> None:
    scanner = scanned(scanner_cls, [event(choice(1, "", "stop"), choice(0, "", "stop"))], choices=2)
    assert scanner.choices_finished


@pytest.mark.parametrize("index", [2, -1, "1", True, 1.0, 2**64 - 1, [1], {"i": 1}])
def test_an_index_not_asked_for_counts_for_nothing(scanner_cls: Any, index: object) -> None:
    scanner = scanned(
        scanner_cls, [event(choice(0, "a", "stop")), event(choice(index, "", "stop"))], choices=2
    )
    assert (scanner.finish_reason, scanner.choices_finished) == ("stop", False)


@pytest.mark.parametrize("index", [..., None], ids=["absent", "null"])
def test_a_choice_without_an_index_is_choice_0(scanner_cls: Any, index: object) -> None:
    assert scanned(scanner_cls, [event(choice(index, "a", "stop"))]).choices_finished
    two = scanned(scanner_cls, [event(choice(index, "a", "stop")), event(choice(1, "", "stop"))], choices=2)
    assert two.choices_finished


def test_done_is_not_a_finish_reason(scanner_cls: Any) -> None:
    scanner = scanned(scanner_cls, [event(choice(0, "a", "stop")), b"data: [DONE]\n\n"], choices=2)
    assert (scanner.done, scanner.choices_finished) == (True, False)


def test_an_empty_finish_reason_finishes_nothing(scanner_cls: Any) -> None:
    assert not scanned(scanner_cls, [event(choice(0, "a", ""))]).choices_finished


def test_a_finish_reason_after_the_first_token_is_read_in_a_chunk_like_the_others(scanner_cls: Any) -> None:
    """After the first token the compiled twin skips payloads that cannot matter: a later choice's
    finish reason is no such payload, whatever the chunk's spacing."""
    spaced = b'data: {"choices": [{"index" : 1, "delta": {}, "finish_reason" : "stop"}]}\n\n'
    scanner = scanned(scanner_cls, [event(choice(0, "a", "stop")), event(choice(1, "b")), spaced], choices=2)
    assert scanner.choices_finished


@pytest.mark.parametrize("bad", [0, -1, sys.maxsize + 1])
def test_choices_out_of_range_are_refused(scanner_cls: Any, bad: int) -> None:
    with pytest.raises(ValueError, match="choices"):
        scanner_cls(choices=bad)


@pytest.mark.parametrize("bad", [1.5, "2", None])
def test_choices_that_are_not_an_integer_are_refused(scanner_cls: Any, bad: object) -> None:
    with pytest.raises(TypeError):
        scanner_cls(choices=bad)


# --- both twins against the rule, on random streams cut anywhere -----------------------------------

_indexes = st.integers(-1, 3) | st.sampled_from([None, ..., "0", 1.0])
_entries = st.builds(
    choice,
    index=_indexes,
    content=st.sampled_from(["", "x", "日本"]),
    finish=st.none() | st.sampled_from(["stop", "length", "tool_calls", ""]),
)
_events = st.lists(_entries, min_size=0, max_size=3).map(lambda entries: event(*entries)) | st.just(
    b"data: [DONE]\n\n"
)


def _model(events: list[bytes], choices: int) -> bool:
    """The rule, from the chunks as JSON: every index below ``choices`` had a non-empty finish reason
    (absent or null index: 0)."""
    finished = set()
    for raw in events:
        payload = raw.removeprefix(b"data: ").strip()
        if payload == b"[DONE]":
            continue
        for entry in orjson.loads(payload)["choices"]:
            index = entry.get("index")
            index = 0 if index is None else index
            reason = entry.get("finish_reason")
            if type(index) is int and 0 <= index < choices and isinstance(reason, str) and reason:
                finished.add(index)
    return len(finished) == choices


@settings(max_examples=300, deadline=None)
@given(events=st.lists(_events, max_size=10), choices=st.integers(1, 3), data=st.data())
def test_twins_count_the_choices_as_the_rule_says_however_the_stream_is_cut(
    events: list[bytes], choices: int, data: st.DataObject
) -> None:
    stream = b"".join(events)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=5), label="cuts"))
    reads = [stream[a:b] for a, b in itertools.pairwise([0, *cuts, len(stream)])]
    expected = _model(events, choices)
    states = {}
    for name, cls in TWINS.items():
        scanner = scanned(cls, reads, choices)
        states[name] = {fact: getattr(scanner, fact) for fact in FACTS}
        assert scanner.choices_finished == expected, name
    assert all(state == states["py"] for state in states.values())
