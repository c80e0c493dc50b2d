"""A stream whose answer is whole before the engine's HTTP body ends (review.md N1): the engine
writes its events and ``data: [DONE]`` and the chunked body's
terminating ``0\\r\\n\\r\\n`` later. The client, done at ``[DONE]``, may close at once; the turn is
finished all the same, and the client's response ends at ``[DONE]`` without waiting for the
engine's end.

Before the fix the dataplane relayed ``[DONE]`` with more to come and waited for the engine's end;
the ``openai`` client, done, closed, and the turn was counted ``failed: client disconnected``.

Engines on raw sockets (``raw_engine_helpers``) in threads of the test; the scheduler and the
dataplane real processes; the official clients where what they do at the end is the point. That a
translated or natively served stream is whole at its own last event is the relay machine's rule,
tested on any split of any stream in ``test_relay_machine`` (no sockets).
"""

from __future__ import annotations

import socket
import threading
import time
import urllib.request
from collections.abc import Iterator

import httpx2
import openai
import pytest
from dataplane_procs import SchedulerAndDataplane, scheduler_and_dataplane, wait_until
from prometheus_client.parser import text_string_to_metric_families
from raw_engine_helpers import STREAM_HEAD, RawEngine, RawRequest, chunk, chunked

pytestmark = pytest.mark.integration

LATE = "late-end"
"""The body's end 1 s after ``[DONE]``: the reviewer's reproduction."""
ON_SIGNAL = "end-on-signal"
"""The body's end only once the test says (``END_NOW``), at most 30 s after ``[DONE]``: a client
that reads to the end of its body gets there only if the relay ended it without the engine (the
test sets ``END_NOW`` after the client's read, and the client's timeout is 20 s)."""
TWO_CHOICES = "two-choices"
"""``n = 2``: choice 0 finishes at once, choice 1 goes on for seconds, one event every 0.1 s; what
the engine managed to send before it saw the client's close is in ``TWO_CHOICES_SENT``."""
TWO_CHOICES_SENT: list[int] = []
END_NOW = threading.Event()
TERMINATOR = b"0\r\n\r\n"
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def _late_end(request: RawRequest) -> None:
    sock: socket.socket = request.sock
    model = str(request.json["model"])
    if model == TWO_CHOICES:
        first = chunk("a", model, finish="stop")
        sock.sendall(STREAM_HEAD + chunked(first))
        sent = 0
        try:
            for _ in range(50):
                time.sleep(0.1)
                sock.sendall(chunked(chunk("b", model).replace(b'"index":0', b'"index":1')))
                sent += 1
            sock.sendall(chunked(b"data: [DONE]\n\n") + TERMINATOR)
        except OSError:
            pass  # the dataplane closed the request: the client left
        TWO_CHOICES_SENT.append(sent)
        return
    events = [
        chunk("hel", model),
        chunk("lo", model, finish="stop"),
        b'data: {"id":"chatcmpl-raw","object":"chat.completion.chunk","created":0,"model":"m","choices":[],'
        b'"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}\n\n',
        b"data: [DONE]\n\n",
    ]
    sock.sendall(STREAM_HEAD + b"".join(chunked(e) for e in events))
    if model == ON_SIGNAL:
        END_NOW.wait(30)
    else:
        time.sleep(1.0)  # the reviewer's second
    sock.sendall(TERMINATOR)


@pytest.fixture(scope="module")
def engines() -> Iterator[dict[str, RawEngine]]:
    running = {"late": RawEngine(_late_end).start()}
    try:
        yield running
    finally:
        END_NOW.set()
        for engine in running.values():
            engine.stop()


@pytest.fixture(scope="module")
def pair(
    tmp_path_factory: pytest.TempPathFactory, engines: dict[str, RawEngine]
) -> Iterator[SchedulerAndDataplane]:
    replicas = (
        f'\n[[replicas]]\nname = "late"\nurl = "{engines["late"].url}"\n'
        f'models = ["{LATE}", "{ON_SIGNAL}", "{TWO_CHOICES}"]\nhealth_path = ""\n'
    )
    with scheduler_and_dataplane(tmp_path_factory.mktemp("late-end"), [], replicas=replicas) as running:
        yield running


def _turns(pair: SchedulerAndDataplane, replica: str) -> dict[str, float]:
    """``luftpause_dataplane_turns_total`` on ``replica``, by outcome."""
    with urllib.request.urlopen(f"{pair.dataplane_url}/metrics", timeout=10) as response:
        text = response.read().decode()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "luftpause_dataplane_turns_total" and sample.labels.get("replica") == replica:
                outcome = sample.labels["outcome"]
                counts[outcome] = counts.get(outcome, 0.0) + sample.value
    return counts


def _settled(pair: SchedulerAndDataplane, finished: int) -> dict[str, int]:
    """The scheduler's counters once ``finished`` turns have been reported there in all (30 s at
    most), and none in flight on the dataplane."""
    wait_until(lambda: pair.counters()["finished"] >= finished and pair.health()["in_flight"] == 0, 30)
    return pair.counters()


def test_an_openai_stream_whose_body_ends_1_s_after_done_is_a_finished_turn(
    pair: SchedulerAndDataplane, request: pytest.FixtureRequest
) -> None:
    before = pair.counters()
    client = openai.OpenAI(base_url=f"{pair.dataplane_url}/v1", api_key="x", max_retries=0, timeout=60)
    request.addfinalizer(client.close)
    stream = client.chat.completions.create(
        model=LATE, messages=MESSAGES, stream=True, stream_options={"include_usage": True}
    )
    pieces = list(stream)
    assert "".join(p.choices[0].delta.content or "" for p in pieces if p.choices) == "hello"
    assert [p.choices[0].finish_reason for p in pieces if p.choices][-1] == "stop"
    assert pieces[-1].usage is not None and pieces[-1].usage.completion_tokens == 2
    # The client closed at [DONE], before the engine's end: still finished, never failed.
    after = _settled(pair, before["finished"] + 1)
    assert (after["finished"] - before["finished"], after["failed"] - before["failed"]) == (1, 0), pair.logs()
    assert _turns(pair, "late").get("failed", 0.0) == 0.0
    assert "client disconnected" not in pair.children["scheduler"].log_tail(200)
    # And the replica serves the next turn (on its kept connection or a new one).
    again = client.chat.completions.create(model=LATE, messages=MESSAGES, stream=True)
    assert "".join(p.choices[0].delta.content or "" for p in again if p.choices) == "hello"
    assert _settled(pair, before["finished"] + 2)["failed"] == before["failed"]


def test_the_clients_response_ends_at_done_without_waiting_for_the_engines_end(
    pair: SchedulerAndDataplane,
) -> None:
    """The engine writes its end only once the client's body has ended (:data:`ON_SIGNAL`): a relay
    that waited for the engine's end would never end the client's body (the read would time out)."""
    END_NOW.clear()
    before = pair.counters()
    body = {"model": ON_SIGNAL, "messages": MESSAGES, "stream": True}
    try:
        with (
            httpx2.Client(timeout=20) as http,
            http.stream("POST", f"{pair.dataplane_url}/v1/chat/completions", json=body) as response,
        ):
            assert response.status_code == 200
            received = b"".join(response.iter_bytes())  # to the end of the chunked body
    finally:
        END_NOW.set()
    assert received.endswith(b"data: [DONE]\n\n")
    # reported before the next test counts (the dataplane holds a report up to 20 ms for company)
    after = _settled(pair, before["finished"] + 1)
    assert (after["finished"] - before["finished"], after["failed"] - before["failed"]) == (1, 0), pair.logs()
    assert _turns(pair, "late").get("failed", 0.0) == 0.0


def test_a_client_leaving_after_the_first_of_two_choices_finished_fails_the_turn_and_stops_the_engine(
    pair: SchedulerAndDataplane,
) -> None:
    """With ``n = 2`` the first finish reason is not the end of the answer (review2.md): a client that
    leaves then fails the turn, and the engine's request is closed at once, not kept for the body's
    end (it would go on generating choice 1 for the 0.5 s grace and more)."""
    before = pair.counters()
    body = {"model": TWO_CHOICES, "messages": MESSAGES, "stream": True, "n": 2}
    with (
        httpx2.Client(timeout=20) as http,
        http.stream("POST", f"{pair.dataplane_url}/v1/chat/completions", json=body) as response,
    ):
        for line in response.iter_lines():
            if '"finish_reason":"stop"' in line:
                break  # choice 0 is done: the client leaves
    after = wait_until(lambda: pair.counters()["failed"] > before["failed"], 30)
    assert after, pair.logs()
    counters = pair.counters()
    assert counters["finished"] == before["finished"]
    assert wait_until(lambda: bool(TWO_CHOICES_SENT), 10)
    assert TWO_CHOICES_SENT[-1] < 50  # it saw the close long before its 5 s of choice 1 were over
