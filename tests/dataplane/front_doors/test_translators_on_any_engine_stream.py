"""Property tests of the answer translators (Hypothesis): any engine stream of text, reasoning and
tool calls, in every pattern of ids and indices engines use, cut anywhere, reads back through the
official SDKs' own stream accumulators (``anthropic``'s ``MessageStream.get_final_message``,
``openai``'s ``ResponseStream.get_final_response``) as exactly what the engine meant, in an event
order the APIs themselves keep (``api_helpers.check_*_order``).

The translators are fed directly (no sockets); the end-to-end tests through real processes are in
``test_messages_and_responses_routes``, ``test_input_tokens_through_the_dataplane`` and
``tests/stack/harnesses/test_parallel_tool_calls_through_luftpause.py`` (the real harnesses).
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import Any

from api_helpers import DONE, USAGE, check_messages_order, check_responses_order, chunk
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_messages_translation import final_message
from test_responses_translation import final_response

from luftpause.dataplane.apis.messages_stream import MessagesStream
from luftpause.dataplane.apis.responses_stream import ResponsesStream

PATTERNS = ("distinct indices", "one index, distinct ids", "ids on every fragment", "no ids")
"""How engines number parallel tool calls: an index each with the id on the first fragment (the
OpenAI way); one index for all, told apart by distinct ids on their first fragments; the id
repeated on every fragment (under one index or several); no ids at all (distinct indices)."""


@dataclass(frozen=True)
class Meant:
    """What the engine meant: parts in order, ``("text" | "reasoning", text)`` or
    ``("call", id, name, arguments)``."""

    parts: list[tuple[Any, ...]]
    chat: list[bytes]  # the engine's stream, one event per item


_text = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12)
_value = st.one_of(
    st.integers(-5, 10**6), _text, st.booleans(), st.none(), st.lists(st.integers(0, 9), max_size=3)
)
_arguments = st.dictionaries(st.text("abcxyz_", min_size=1, max_size=5), _value, max_size=4)


def _pieces(draw: st.DrawFn, text: str) -> list[str]:
    """``text`` split at random points (every piece non-empty)."""
    cuts = (
        sorted(set(draw(st.lists(st.integers(1, max(1, len(text) - 1)), max_size=4))))
        if len(text) > 1
        else []
    )
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds) if text[a:b]]


def _call_fragment(
    index: int, call_id: str | None, name: str | None, arguments: str | None
) -> dict[str, Any]:
    call: dict[str, Any] = {"index": index}
    if call_id is not None:
        call["id"] = call_id
        call["type"] = "function"
    function: dict[str, Any] = {}
    if name is not None:
        function["name"] = name
    if arguments is not None:
        function["arguments"] = arguments
    call["function"] = function
    return call


@st.composite
def engine_streams(draw: st.DrawFn) -> Meant:
    pattern = draw(st.sampled_from(PATTERNS))
    parts: list[tuple[Any, ...]] = []
    chat: list[bytes] = [chunk({"role": "assistant", "content": ""})]
    calls_made = 0
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["text", "reasoning", "calls"]))
        if kind != "calls":
            text = draw(_text)
            if parts and parts[-1][0] == kind:
                parts[-1] = (kind, parts[-1][1] + text)
            else:
                parts.append((kind, text))
            key = "content" if kind == "text" else "reasoning_content"
            chat.extend(chunk({key: piece}) for piece in _pieces(draw, text))
            continue
        # a batch of parallel calls, their fragments in any order the pattern allows
        batch: list[list[dict[str, Any]]] = []
        for _ in range(draw(st.integers(1, 3))):
            n = calls_made
            calls_made += 1
            call_id = None if pattern == "no ids" else f"call_{n}"
            name = draw(st.sampled_from(["read", "grep", "mcp__fake__count_items"]))
            arguments = json.dumps(draw(_arguments), ensure_ascii=draw(st.booleans()))
            parts.append(("call", call_id, name, arguments))
            index = 0 if pattern == "one index, distinct ids" else n
            if pattern == "ids on every fragment" and draw(st.booleans()):
                index = 0
            pieces = _pieces(draw, arguments)
            late_name = draw(st.booleans()) and len(pieces) > 1
            fragments = [_call_fragment(index, call_id, None if late_name else name, pieces[0])]
            if late_name:
                fragments.append(
                    _call_fragment(index, call_id if pattern == "ids on every fragment" else None, name, None)
                )
            for piece in pieces[1:]:
                repeat = call_id if pattern == "ids on every fragment" else None
                fragments.append(_call_fragment(index, repeat, None, piece))
            batch.append(fragments)
        # Calls begin in order (engines begin call n+1 after call n); once begun, their fragments
        # interleave in any order, except under one index without repeated ids, where only one
        # after another can be meant.
        interleave = pattern != "one index, distinct ids"
        left = [len(fragments) for fragments in batch]
        order: list[int] = []
        begun = 0
        while any(left):
            choices = [i for i in range(begun) if left[i]] if interleave else []
            if not choices or (begun < len(batch) and draw(st.booleans())):
                if begun < len(batch) and (interleave or not any(left[:begun])):
                    begun += 1
                    choices = [begun - 1]
                elif not choices:
                    choices = [next(i for i in range(len(batch)) if left[i])]
            i = draw(st.sampled_from(choices))
            order.append(i)
            left[i] -= 1
        # a call's fragments keep their own order, and its first comes before any other of it
        taken = [0] * len(batch)
        pending: list[dict[str, Any]] = []
        for i in order:
            pending.append(batch[i][taken[i]])
            taken[i] += 1
            if draw(st.booleans()):  # several fragments in one chunk, as some engines send them
                chat.append(chunk({"tool_calls": pending}))
                pending = []
        if pending:
            chat.append(chunk({"tool_calls": pending}))
    finish = "tool_calls" if calls_made else "stop"
    chat.append(chunk({}, finish))
    chat.append(chunk(usage=USAGE))
    chat.append(DONE)
    return Meant(parts, chat)


def _reads(draw: st.DrawFn, stream: bytes) -> list[bytes]:
    cuts = sorted(set(draw(st.lists(st.integers(1, len(stream) - 1), max_size=8))))
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)]


def _expected(meant: Meant, fresh_id: str) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    n = 0
    for part in meant.parts:
        if part[0] == "call":
            _, call_id, name, arguments = part
            out.append(("call", call_id or fresh_id.format(n=n), name, json.loads(arguments)))
            n += 1
        else:
            out.append(part)
    return out


PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(engine_streams(), st.data())
def test_the_anthropic_sdk_reads_what_the_engine_meant(meant: Meant, data: st.DataObject) -> None:
    translator = MessagesStream("m", "msg_1")
    reads = _reads(data.draw, b"".join(meant.chat))
    body = b"".join(translator.feed(read) for read in reads) + translator.finish()
    check_messages_order(body)
    message = final_message(body)
    got: list[tuple[Any, ...]] = []
    for block in message.content:
        if block.type == "tool_use":
            got.append(("call", block.id, block.name, block.input))
        elif block.type == "thinking":
            got.append(("reasoning", block.thinking))
        elif block.type == "text":
            got.append(("text", block.text))
    calls = [p for p in meant.parts if p[0] == "call"]
    assert got == _expected(meant, "toolu_msg_1_{n}")
    assert message.stop_reason == ("tool_use" if calls else "end_turn")
    assert translator.tool_call_ids == [c[1] for c in got if c[0] == "call"]


@PROPERTY
@given(engine_streams(), st.data())
def test_the_openai_sdk_reads_what_the_engine_meant(meant: Meant, data: st.DataObject) -> None:
    translator = ResponsesStream("resp_1", "m", 1700000000)
    reads = _reads(data.draw, b"".join(meant.chat))
    body = b"".join(translator.feed(read) for read in reads) + translator.finish()
    check_responses_order(body)
    _, response = final_response(body)
    got: list[tuple[Any, ...]] = []
    for item in response.output:
        if item.type == "function_call":
            got.append(("call", item.call_id, item.name, json.loads(item.arguments)))
        elif item.type == "reasoning":
            got.append(("reasoning", "".join(c.text for c in item.content or [])))
        elif item.type == "message":
            got.append(("text", "".join(c.text for c in item.content if c.type == "output_text")))
    assert response.status == "completed"
    # where the engine gave no id, a Responses call's id is numbered by its output item
    expected = [
        ("call", part[1] or f"call_1_{position}", part[2], json.loads(part[3])) if part[0] == "call" else part
        for position, part in enumerate(meant.parts)
    ]
    assert got == expected
    assert translator.tool_call_ids == [c[1] for c in got if c[0] == "call"]
