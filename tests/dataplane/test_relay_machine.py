"""The relay's state machine (``luftpause.dataplane.relay.machine``) fed directly, no sockets: any
engine stream, cut anywhere, with both twins of the chat scanner. What it must hold is the end of
an answer (docs/architecture.md "Failure contract"): whole at ``[DONE]`` or once every choice it
asked for finished, cut short (a broken client stream, a failed turn) otherwise; an error event
ends it failed but cleanly; facts (first token once, usage, finish reason, tool-call ids) are the
engine's however its bytes were split; and every front door's translation runs through it.

These replace the socket-level tests that checked the same through real processes (n > 1 choices
cut at each point, a translated or native stream's last event, a cut tool call); the ends that
need real sockets (granian aborting the connection, the engine's body ending late) stay in
``test_a_stream_of_n_choices_is_whole_when_every_choice_finished`` and
``test_answer_whole_before_the_engines_body_end``.
"""

from __future__ import annotations

import gzip
import importlib
import itertools
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import pytest
from api_helpers import DONE, USAGE, chunk, tool_delta
from hypothesis import given, settings
from hypothesis import strategies as st

from luftpause.dataplane import sse
from luftpause.dataplane.apis.facts import MessagesScanner, message_facts
from luftpause.dataplane.apis.messages_stream import MessagesStream, completion_to_message
from luftpause.dataplane.apis.responses_stream import ResponsesStream
from luftpause.dataplane.relay.machine import (
    AnswerStream,
    Fact,
    Failed,
    Finished,
    FirstToken,
    decoder_for,
    whole_answer,
)
from luftpause.dataplane.turn import Translation

TWINS: dict[str, Any] = {"pure": importlib.import_module("luftpause.dataplane._sse_py").SSEScanner}
if sse.USING_EXTENSION:
    TWINS["c"] = importlib.import_module("luftpause.dataplane._sse_c").SSEScanner

CUT_SHORT = Failed("engine closed the stream before it finished")


def choice_chunk(index: int, content: str, finish: str | None = None) -> bytes:
    """One ``chat.completion.chunk`` event carrying choice ``index``."""
    choice = {"index": index, "delta": {"content": content}, "finish_reason": finish}
    doc = {"object": "chat.completion.chunk", "choices": [choice]}
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def split(data: bytes, cuts: Sequence[int]) -> list[bytes]:
    """``data`` cut at ``cuts`` (positions, any order, repeats allowed): empty pieces too."""
    bounds = [0, *sorted(min(c, len(data)) for c in cuts), len(data)]
    return [data[a:b] for a, b in itertools.pairwise(bounds)]


class Run:
    """What one machine gave for one feeding: the client's bytes, the facts, the outcome."""

    def __init__(self, machine: AnswerStream) -> None:
        self.machine = machine
        self.sent = b""
        self.facts: list[Fact] = []

    def feed(self, pieces: Sequence[bytes], ended: bool = True) -> Run:
        for i, piece in enumerate(pieces):
            self.machine.receive(piece, ended and i == len(pieces) - 1)
            self.take()
        if ended and not pieces:
            self.machine.receive(b"", True)
            self.take()
        return self

    def take(self) -> None:
        self.sent += self.machine.data_to_send()
        self.facts += self.machine.facts()

    @property
    def outcome(self) -> Finished | Failed | None:
        return self.machine.outcome


def relay(
    pieces: Sequence[bytes], ended: bool = True, twin: str = "pure", choices: int = 1, **machine: Any
) -> Run:
    if "translation" not in machine and "scanner" not in machine:
        machine["scanner"] = lambda: TWINS[twin](choices=choices)
    return Run(AnswerStream(choices, **machine)).feed(pieces, ended)


# --- strategies ----------------------------------------------------------------------------------

_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8)


@st.composite
def chat_streams(draw: st.DrawFn) -> tuple[list[bytes], list[str]]:
    """A one-choice Chat Completions stream, one event per item (role chunk, text, tool calls,
    finish, usage; no ``[DONE]``), and the tool-call ids it emits."""
    events = [chunk({"role": "assistant", "content": ""})]
    ids: list[str] = []
    for n in range(draw(st.integers(0, 4))):
        if draw(st.booleans()):
            events.append(chunk({"content": draw(_text)}))
        else:
            ids.append(f"call_{n}")
            events.append(tool_delta(n, f"call_{n}", "read", "{"))
            events.append(tool_delta(n, None, None, "}"))
    events.append(chunk({}, finish="tool_calls" if ids else draw(st.sampled_from(["stop", "length"]))))
    events.append(chunk(usage=USAGE))
    return events, ids


_cuts = st.lists(st.integers(0, 4096), max_size=12)
_twins = st.sampled_from(sorted(TWINS))


# --- splits anywhere ----------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(stream=chat_streams(), done=st.booleans(), cuts=_cuts, twin=_twins)
def test_any_split_of_a_chat_stream_reaches_the_client_unchanged_with_the_engines_facts(
    stream: tuple[list[bytes], list[str]], done: bool, cuts: list[int], twin: str
) -> None:
    events, ids = stream
    body = b"".join(events) + (DONE if done else b"")
    run = relay(split(body, cuts), twin=twin)
    assert run.sent == body
    has_token = any(b'"content": "' in e and b'"content": ""' not in e for e in events) or bool(ids)
    assert run.facts.count(FirstToken()) == (1 if has_token else 0)
    assert run.facts[-1] == run.outcome  # the outcome is the last fact, once
    assert run.outcome == Finished(
        "tool_calls" if ids else run.machine.scanner.finish_reason or "",
        bool(ids),
        USAGE["prompt_tokens"],
        USAGE["completion_tokens"],
        tuple(ids),
        16,
        "chatcmpl-1",
        "m",
    )


@settings(max_examples=100, deadline=None)
@given(stream=chat_streams(), cuts=_cuts, gzipped=st.booleans())
def test_a_compressed_stream_is_read_as_its_decoded_bytes_in_any_split(
    stream: tuple[list[bytes], list[str]], cuts: list[int], gzipped: bool
) -> None:
    """gzip and deflate are decoded (the client gets the decoded bytes, its header dropped by the
    loop); the facts are the same as the plain stream's."""
    body = b"".join(stream[0]) + DONE
    encoded = gzip.compress(body) if gzipped else __import__("zlib").compress(body)
    coding = b"gzip" if gzipped else b"deflate"
    run = relay(split(encoded, cuts), decoder=decoder_for(coding))
    assert run.sent == body
    assert run.outcome == relay([body]).outcome


def test_a_body_in_an_encoding_not_decoded_is_relayed_unread_and_finished_when_it_ends() -> None:
    data = b"\x00br-bytes\xff"
    run = relay([data[:3], data[3:]], decoder=decoder_for(b"br"))
    assert (run.sent, run.facts) == (data, [Finished()])
    assert not run.machine.answered  # unread: its connection is released only at the body's end


def test_a_body_that_fails_to_decode_breaks_the_stream() -> None:
    run = relay([b"not gzip at all"], ended=False, decoder=decoder_for(b"gzip"))
    assert isinstance(run.outcome, Failed) and run.outcome.broken
    assert run.outcome.error.startswith("engine failed mid-stream: ")
    assert run.sent == b""


# --- n > 1 choices -----------------------------------------------------------------------------


@st.composite
def choice_streams(draw: st.DrawFn) -> tuple[int, list[bytes], set[int]]:
    """``n`` choices' chunks interleaved; some choices say their finish reason (the rest never do)."""
    n = draw(st.integers(1, 4))
    finishing = set(draw(st.lists(st.integers(0, n - 1), unique=True)))
    per_choice = [
        [choice_chunk(i, draw(_text)) for _ in range(draw(st.integers(0, 2)))]
        + ([choice_chunk(i, "", draw(st.sampled_from(["stop", "length"])))] if i in finishing else [])
        for i in range(n)
    ]
    events: list[bytes] = []
    while any(per_choice):
        i = draw(st.sampled_from([i for i, left in enumerate(per_choice) if left]))
        events.append(per_choice[i].pop(0))
    return n, events, finishing


@settings(max_examples=150, deadline=None)
@given(stream=choice_streams(), cuts=_cuts, twin=_twins)
def test_a_stream_of_n_choices_that_ends_without_done_is_whole_only_when_every_choice_finished(
    stream: tuple[int, list[bytes], set[int]], cuts: list[int], twin: str
) -> None:
    n, events, finishing = stream
    body = b"".join(events)
    run = relay(split(body, cuts), twin=twin, choices=n)
    assert run.sent == body  # every event the engine sent went out, unchanged
    if finishing == set(range(n)):
        assert isinstance(run.outcome, Finished)
    else:
        assert run.outcome == CUT_SHORT  # the first finish reason was not the end


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_the_first_of_two_choices_finishing_is_not_the_end(twin: str) -> None:
    """A client leaving after choice 0 finished fails the turn (the engine must stop at once)."""
    run = relay([choice_chunk(0, "a", "stop"), choice_chunk(1, "b")], ended=False, twin=twin, choices=2)
    assert run.outcome is None and not run.machine.answered and not run.machine.finishing
    run.machine.client_left()
    run.take()
    assert run.outcome == Failed("client disconnected")
    # the second choice finishing makes the answer over: its body's end is all that may come
    run = relay(
        [choice_chunk(0, "a", "stop"), choice_chunk(1, "b", "stop")], ended=False, twin=twin, choices=2
    )
    assert run.outcome is None and run.machine.finishing
    run.feed([b""])
    assert isinstance(run.outcome, Finished) and run.outcome.finish_reason == "stop"


# --- broken streams ------------------------------------------------------------------------------


@settings(max_examples=150, deadline=None)
@given(stream=chat_streams(), at=st.integers(0, 10_000), cuts=_cuts, twin=_twins)
def test_a_stream_whose_body_ends_early_is_cut_short_unless_its_answer_was_over(
    stream: tuple[list[bytes], list[str]], at: int, cuts: list[int], twin: str
) -> None:
    """The body ending cleanly at any byte: what came reaches the client, and the turn finished only
    if the finish reason had come by then (one choice); else the stream is broken."""
    events, _ = stream
    body = b"".join(events) + DONE
    cut = body[: at % (len(body) + 1)]
    run = relay(split(cut, cuts), twin=twin)
    assert run.sent == cut
    scanner = TWINS[twin]()
    scanner.feed(cut)
    if scanner.done or scanner.finish_reason is not None:
        assert isinstance(run.outcome, Finished)
    else:
        assert run.outcome == CUT_SHORT


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_a_tool_calls_first_delta_then_a_clean_end_is_cut_short(twin: str) -> None:
    """A tool-call delta alone never ends the answer: the call's arguments may be unfinished."""
    run = relay([tool_delta(0, "call_1", "read", '{"pa')], twin=twin)
    assert run.outcome == CUT_SHORT and FirstToken() in run.facts


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_the_engine_failing_mid_stream_breaks_it_and_nothing_after_counts(twin: str) -> None:
    run = relay([chunk({"content": "a"})], ended=False, twin=twin)
    run.machine.engine_failed("read timed out")
    run.feed([DONE])
    assert run.outcome == Failed("engine failed mid-stream: read timed out")
    assert run.facts == [FirstToken(), run.outcome]
    assert run.sent == chunk({"content": "a"})


@pytest.mark.parametrize("twin", sorted(TWINS))
def test_an_error_event_fails_the_turn_but_ends_the_clients_stream_cleanly(twin: str) -> None:
    error = b'data: {"object":"error","message":"out of memory"}\n\n'
    run = relay([chunk({"content": "a"}), error, DONE], twin=twin)
    assert run.outcome == Failed("engine error mid-stream: out of memory", broken=False)
    assert run.sent == chunk({"content": "a"}) + error + DONE


# --- the end-of-answer rule ------------------------------------------------------------------------


@settings(max_examples=100, deadline=None)
@given(stream=chat_streams(), cuts=_cuts, twin=_twins, after=st.binary(max_size=20))
def test_done_ends_the_answer_before_the_engines_body_ends(
    stream: tuple[list[bytes], list[str]], cuts: list[int], twin: str, after: bytes
) -> None:
    events, _ = stream
    body = b"".join(events) + DONE
    run = relay(split(body, cuts), ended=False, twin=twin)
    assert isinstance(run.outcome, Finished) and run.machine.answered
    assert run.sent == body
    outcome = run.outcome
    run.feed([after])  # whatever follows (its body's end, or stray bytes) changes nothing
    run.machine.client_left()
    run.take()
    assert (run.outcome, run.sent, run.facts.count(outcome)) == (outcome, body, 1)


def test_a_client_leaving_before_any_answer_fails_the_turn_once() -> None:
    run = relay([], ended=False)
    run.machine.client_left()
    run.machine.client_left()
    run.take()
    assert run.facts == [Failed("client disconnected")]


# --- translation ----------------------------------------------------------------------------------


def _messages() -> MessagesStream:
    return MessagesStream("claude-like", "msg_1")


def _responses() -> ResponsesStream:
    return ResponsesStream("resp_1", "gpt-like", 0)


@settings(max_examples=100, deadline=None)
@given(
    stream=chat_streams(),
    cuts=_cuts,
    make=st.sampled_from([_messages, _responses]),
    done=st.booleans(),
)
def test_a_translated_stream_is_the_same_in_any_split_and_its_facts_are_the_engines(
    stream: tuple[list[bytes], list[str]],
    cuts: list[int],
    make: Callable[[], MessagesStream | ResponsesStream],
    done: bool,
) -> None:
    events, ids = stream
    body = b"".join(events) + (DONE if done else b"")
    whole = relay([body], translation=make())
    run = relay(split(body, cuts), translation=make())
    assert run.sent == whole.sent
    assert b"[DONE]" not in run.sent and b"chat.completion.chunk" not in run.sent
    closing = [b"message_stop"] if make is _messages else [b"response.completed", b"response.incomplete"]
    assert any(b"event: " + event in run.sent for event in closing)
    chat = relay([body])  # the same engine stream relayed untranslated
    assert isinstance(run.outcome, Finished) and isinstance(chat.outcome, Finished)
    assert run.outcome.tool_call_ids[: len(ids)] == tuple(ids)
    assert (run.outcome.finish_reason, run.outcome.prompt_tokens, run.outcome.completion_tokens) == (
        chat.outcome.finish_reason,
        chat.outcome.prompt_tokens,
        chat.outcome.completion_tokens,
    )
    assert run.facts.count(FirstToken()) == chat.facts.count(FirstToken())


@pytest.mark.parametrize("make", [_messages, _responses])
def test_a_translated_stream_cut_short_is_broken_and_never_closed(
    make: Callable[[], MessagesStream | ResponsesStream],
) -> None:
    run = relay(
        [chunk({"role": "assistant", "content": ""}), tool_delta(0, "call_1", "read", '{"a')],
        translation=make(),
    )
    assert run.outcome == CUT_SHORT
    assert b"message_stop" not in run.sent and b"response.completed" not in run.sent


def test_a_translation_that_cannot_go_on_breaks_the_stream() -> None:
    """More arguments after a call's complete object cannot be translated faithfully."""
    deltas = [
        tool_delta(0, "call_a", "read", '{"path": "a.txt"}'),
        tool_delta(1, "call_b", "read", '{"path": "b.txt"}'),
        tool_delta(0, arguments='{"again": 1}'),
    ]
    run = relay(deltas, ended=False, translation=_messages())
    assert isinstance(run.outcome, Failed) and run.outcome.broken
    assert run.outcome.error.startswith("the answer could not be translated: ")


def test_a_translation_of_an_encoding_not_decoded_is_refused_before_anything_is_sent() -> None:
    from luftpause.dataplane.relay.upstream import EngineError

    with pytest.raises(EngineError):
        AnswerStream(translation=_messages(), decoder=decoder_for(b"br"))


def test_a_native_stream_is_whole_at_its_own_last_event() -> None:
    start = {"id": "m", "model": "x", "usage": {"input_tokens": 3, "output_tokens": 0}}
    events = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_delta",
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hi"}},
        ),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 2}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    body = b"".join(b"event: %s\ndata: %s\n\n" % (name.encode(), orjson.dumps(doc)) for name, doc in events)
    for cut in range(len(body) + 1):
        run = relay([body[:cut], body[cut:]], ended=False, scanner=MessagesScanner)
        assert run.sent == body and run.machine.answered, cut
        assert isinstance(run.outcome, Finished) and run.outcome.completion_tokens == 2, cut
        assert run.facts.count(FirstToken()) == 1


# --- whole answers ---------------------------------------------------------------------------------

COMPLETION = {
    "id": "chatcmpl-9",
    "model": "m",
    "object": "chat.completion",
    "choices": [
        {
            "index": 0,
            "finish_reason": "stop",  # some engines say stop after tool calls
            "message": {"role": "assistant", "tool_calls": [{"id": "call_7", "function": {"name": "f"}}]},
        }
    ],
    "usage": USAGE,
}


def test_a_whole_answer_gives_its_facts_and_its_translation() -> None:
    body = orjson.dumps(COMPLETION)
    answer = whole_answer(body)
    assert answer.body == body and answer.timed
    assert answer.outcome == Finished("tool_calls", True, 21, 9, ("call_7",), 16, "chatcmpl-9", "m")
    translation = Translation(
        stream=_messages,
        whole=lambda raw: orjson.dumps(completion_to_message(orjson.loads(raw), "claude-like", "msg_1")),
        refusal=lambda status, raw: raw,
    )
    translated = whole_answer(gzip.compress(body), decoder_for(b"gzip"), translation)
    assert orjson.loads(translated.body)["stop_reason"] == "tool_use"
    assert translated.outcome == answer.outcome  # the facts are the engine's


def test_whole_answers_natively_served_single_pass_or_unread() -> None:
    usage = {"input_tokens": 4, "output_tokens": 1}
    message = {"type": "message", "content": [], "stop_reason": "end_turn", "usage": usage}
    native = whole_answer(orjson.dumps(message), native=message_facts)
    assert (native.outcome.prompt_tokens, native.outcome.completion_tokens) == (4, 1)
    single = whole_answer(b'{"data":[],"usage":{"prompt_tokens":5}}', single_pass=True)
    assert (single.outcome, single.timed) == (Finished(prompt_tokens=5), False)
    unread = whole_answer(b"\x00", decoder_for(b"zstd"))
    assert (unread.body, unread.outcome, unread.timed) == (b"\x00", Finished(), False)
    assert whole_answer(b"[1]").outcome == Finished()  # not an object: blanks
