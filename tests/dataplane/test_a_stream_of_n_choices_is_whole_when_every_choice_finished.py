"""A streamed answer with ``n`` choices is whole only when every choice it asked for said its finish
reason (or ``data: [DONE]`` came): an engine whose body ends cleanly after choice 0 finished and
before choice 1 did, with no ``[DONE]``, cut the answer short (docs/architecture.md "Failure
contract": the client sees a broken stream, the scheduler a failed turn).

Before the fix the scanner kept one finish reason for the whole answer: choice 0's ended the
client's stream cleanly and the turn was reported finished, choice 1 half written.

Engines on raw sockets (``raw_engine_helpers``) in threads of the test, one script per model; the
scheduler and the dataplane real processes; the ``openai`` client with ``n=2``: what the client
sees of a cut answer, and a body that ends at the engine's close. The rule itself (any ``n``, any
choices finished, any split, both twins of the scanner) is the relay machine's, tested without
sockets in ``test_relay_machine``.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator

import httpx2
import openai
import orjson
import pytest
from dataplane_procs import SchedulerAndDataplane, scheduler_and_dataplane, wait_until
from raw_engine_helpers import STREAM_HEAD, RawEngine, RawRequest, chunked

from luftpause.dataplane.intake.turns import requested_choices

pytestmark = pytest.mark.integration

CUT_CHUNKED = "cut-after-choice-0"
"""Choice 0 finishes, choice 1 has begun; then the chunked body's clean end (``0\\r\\n\\r\\n``)."""
CUT_AT_CLOSE = "cut-after-choice-0-at-close"
"""The same answer in a body that ends when the engine closes the connection (no length, not
chunked: RFC 9112 section 6.3, rule 8), so the close is the body's clean end."""
BOTH_FINISHED = "both-choices-finished"
"""Both choices finish, then the chunked body's end, and no ``[DONE]``: a whole answer."""
TERMINATOR = b"0\r\n\r\n"
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def choice_chunk(index: int, content: str, finish: str | None = None) -> bytes:
    """One ``chat.completion.chunk`` event carrying choice ``index``."""
    obj = {
        "id": "chatcmpl-raw",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "m",
        "choices": [{"index": index, "delta": {"content": content}, "finish_reason": finish}],
    }
    return b"data: " + orjson.dumps(obj) + b"\n\n"


ANSWERS = {
    CUT_CHUNKED: [
        choice_chunk(0, "a"),
        choice_chunk(1, "b"),
        choice_chunk(0, "!", "stop"),
        choice_chunk(1, "c"),
    ],
    CUT_AT_CLOSE: [
        choice_chunk(0, "a"),
        choice_chunk(1, "b"),
        choice_chunk(0, "!", "stop"),
        choice_chunk(1, "c"),
    ],
    BOTH_FINISHED: [
        choice_chunk(0, "a"),
        choice_chunk(1, "b"),
        choice_chunk(0, "!", "stop"),
        choice_chunk(1, "?", "length"),
    ],
}


def _answer(request: RawRequest) -> None:
    sock: socket.socket = request.sock
    model = str(request.json["model"])
    events = ANSWERS[model]
    if model == CUT_AT_CLOSE:
        sock.sendall(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n"
            + b"".join(events)
        )
        sock.shutdown(socket.SHUT_RDWR)
        return
    sock.sendall(STREAM_HEAD + b"".join(chunked(e) for e in events) + TERMINATOR)


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchedulerAndDataplane]:
    engine = RawEngine(_answer).start()
    models = ", ".join(f'"{model}"' for model in ANSWERS)
    replicas = f'\n[[replicas]]\nname = "raw"\nurl = "{engine.url}"\nmodels = [{models}]\nhealth_path = ""\n'
    try:
        with scheduler_and_dataplane(tmp_path_factory.mktemp("n-choices"), [], replicas=replicas) as running:
            yield running
    finally:
        engine.stop()


@pytest.fixture
def client(pair: SchedulerAndDataplane) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=f"{pair.dataplane_url}/v1", api_key="x", max_retries=0, timeout=20) as made:
        yield made


def _reported(pair: SchedulerAndDataplane, before: dict[str, int]) -> tuple[int, int]:
    """(finished, failed) turns the scheduler was told of since ``before``, once one was (30 s at
    most) and none is in flight on the dataplane."""
    wait_until(
        lambda: (
            sum(pair.counters()[k] - before[k] for k in ("finished", "failed")) >= 1
            and pair.health()["in_flight"] == 0
        ),
        30,
    )
    after = pair.counters()
    return after["finished"] - before["finished"], after["failed"] - before["failed"]


@pytest.mark.parametrize(
    ("model", "n"),
    [(CUT_CHUNKED, 2), (CUT_AT_CLOSE, 2), (CUT_CHUNKED, "2")],
    ids=["cut-chunked", "cut-at-close", "n-as-a-string"],
)
def test_an_engine_ending_its_body_before_every_choice_finished_breaks_the_clients_stream(
    pair: SchedulerAndDataplane, client: openai.OpenAI, model: str, n: object
) -> None:
    """``n`` written as a string or a float is two choices all the same: an engine that coerces
    its fields (vLLM's pydantic models) serves two."""
    before = pair.counters()
    received: list[openai.types.chat.ChatCompletionChunk] = []
    stream = client.chat.completions.create(model=model, messages=MESSAGES, stream=True, extra_body={"n": n})
    # The client's library sees the stream broken (no clean end of a cut answer).
    with pytest.raises(openai.APIConnectionError) as broken:
        for piece in stream:
            received.append(piece)
    assert isinstance(broken.value.__cause__, httpx2.RemoteProtocolError)
    assert "incomplete chunked read" in str(broken.value.__cause__)
    assert len(received) == len(ANSWERS[model])  # every event the engine sent came, unchanged
    assert _reported(pair, before) == (0, 1), pair.logs()


def test_an_answer_whose_every_choice_finished_is_whole_without_done(
    pair: SchedulerAndDataplane, client: openai.OpenAI
) -> None:
    before = pair.counters()
    texts = ["", ""]
    reasons: list[str | None] = [None, None]
    for piece in client.chat.completions.create(model=BOTH_FINISHED, messages=MESSAGES, stream=True, n=2):
        for choice in piece.choices:
            texts[choice.index] += choice.delta.content or ""
            reasons[choice.index] = choice.finish_reason or reasons[choice.index]
    assert (texts, reasons) == (["a!", "b?"], ["stop", "length"])
    assert _reported(pair, before) == (1, 0), pair.logs()


@pytest.mark.parametrize(
    ("n", "choices"),
    [
        (..., 1),
        (None, 1),
        (1, 1),
        (3, 3),
        ("3", 3),
        (" 3 ", 3),
        (3.0, 3),
        (2.5, 1),
        ("two", 1),
        (0, 1),
        (-2, 1),
        (True, 1),
        ([2], 1),
        (10**30, sys.maxsize),
        (float("inf"), 1),
    ],
)
def test_the_choices_a_request_asks_for(n: object, choices: int) -> None:
    """What the dataplane counts (``intake.turns.requested_choices``): ``n`` as an engine reads it,
    else 1; never more than a scanner can count."""
    payload = {} if n is ... else {"n": n}
    assert requested_choices(payload) == choices
