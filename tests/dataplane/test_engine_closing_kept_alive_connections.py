"""Turns through the real dataplane when engines close kept-alive connections as they are reused
(bench/README.md, REAL ENGINE: 11 % of luftpause's runs on llama-server failed ``502 ... Server
disconnected`` before the dataplane re-sent such a request).

* A simulated engine (``fake-engine --idle-close-ms 200``) drops every ``POST`` that arrives on a
  connection idle 200 ms or more, resetting it: each turn after the first, 0.5 s later, meets its
  connection so closed; all succeed through the ``openai`` client (its own retries off), and the
  dataplane's log says it sent them again.
* Engines on raw sockets (``raw_engine_helpers``) fail exactly where the failure contract draws
  its lines: reset after part of a streamed answer (the client's stream is aborted, the request
  never sent again); reset with nothing answered and then no longer listening (502, the new
  connection refused); a new connection closed with nothing answered (502, never sent again); a
  kept-alive connection closed with nothing answered 1 s after the request, past
  ``RESEND_WINDOW_S`` (an engine that crashed into a generation: 502, never sent again).
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from dataplane_procs import MODEL, SchedulerAndDataplane, fake_engine, scheduler_and_dataplane
from raw_engine_helpers import (
    STREAM_HEAD,
    RawEngine,
    RawRequest,
    answer_json,
    answer_stream,
    chunk,
    chunked,
    close,
    completion,
    reset,
)

pytestmark = pytest.mark.integration

RESENT = "sending the request again on a new one"
"""What the dataplane logs when it sends a request again (``luftpause.dataplane.relay.upstream``)."""
MESSAGES: list[openai.types.chat.ChatCompletionMessageParam] = [{"role": "user", "content": "hi"}]


def _client(dataplane_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{dataplane_url}/v1", api_key="x", max_retries=0, timeout=60)


def _resent(log: str, replica: str) -> int:
    return sum(1 for line in log.splitlines() if RESENT in line and f"engine {replica}:" in line)


def test_turns_on_connections_the_engine_closes_as_they_are_reused_all_succeed(tmp_path: Path) -> None:
    with (
        fake_engine(tmp_path, args=("--model", MODEL, "--idle-close-ms", "200")) as engine_url,
        scheduler_and_dataplane(tmp_path, [engine_url]) as pair,
    ):
        client = _client(pair.dataplane_url)
        finishes = []
        for turn in range(4):
            if turn:
                time.sleep(0.5)  # past the engine's 200 ms, well within the dataplane's 3 s
            if turn % 2:
                stream = client.chat.completions.create(
                    model=MODEL, messages=MESSAGES, max_tokens=4, stream=True
                )
                finishes.append([c.choices[0].finish_reason for c in stream if c.choices][-1])
            else:
                reply = client.chat.completions.create(model=MODEL, messages=MESSAGES, max_tokens=4)
                finishes.append(reply.choices[0].finish_reason)
        log = pair.children["dataplane"].log_tail(200)
    assert finishes == ["length"] * 4
    assert _resent(log, "sim-0") >= 1, log


# -- engines on raw sockets ---------------------------------------------------------------------------


def _cut_on_reuse(request: RawRequest) -> None:
    """Streams a whole answer on a connection's first request; on its second, the head and one
    event, then a reset."""
    if request.nth == 0:
        answer_stream(request.sock, [chunk("hel", "cut"), chunk("lo", "cut", finish="stop")])
    else:
        request.sock.sendall(STREAM_HEAD + chunked(chunk("par", "cut")))
        reset(request.sock)


def _reset_on_reuse(request: RawRequest) -> None:
    if request.nth == 0:
        answer_json(request.sock, completion(model="gone"))
    else:
        reset(request.sock)


def _close_unanswered(request: RawRequest) -> None:
    close(request.sock)


def _close_late_on_reuse(request: RawRequest) -> None:
    if request.nth == 0:
        answer_json(request.sock, completion(model="late-close"))
    else:
        time.sleep(1.0)  # into a generation: past RESEND_WINDOW_S
        close(request.sock)


@pytest.fixture(scope="module")
def raw_engines() -> Iterator[dict[str, RawEngine]]:
    engines = {
        "cut": RawEngine(_cut_on_reuse),
        "gone": RawEngine(_reset_on_reuse),
        "fresh-close": RawEngine(_close_unanswered),
        "late-close": RawEngine(_close_late_on_reuse),
    }
    for engine in engines.values():
        engine.start()
    try:
        yield engines
    finally:
        for engine in engines.values():
            engine.stop()


@pytest.fixture(scope="module")
def dataplane(
    tmp_path_factory: pytest.TempPathFactory, raw_engines: dict[str, RawEngine]
) -> Iterator[SchedulerAndDataplane]:
    """One replica per raw engine, serving the model of its name, with no health probe (the raw
    engines answer only POST)."""
    replicas = "".join(
        f'\n[[replicas]]\nname = "{name}"\nurl = "{engine.url}"\nmodels = ["{name}"]\nhealth_path = ""\n'
        for name, engine in raw_engines.items()
    )
    with scheduler_and_dataplane(tmp_path_factory.mktemp("engine-keepalive"), [], replicas=replicas) as pair:
        yield pair


def test_an_engine_reset_after_part_of_a_streamed_answer_aborts_the_clients_stream_and_is_never_resent(
    dataplane: SchedulerAndDataplane, raw_engines: dict[str, RawEngine]
) -> None:
    client = _client(dataplane.dataplane_url)
    first = client.chat.completions.create(model="cut", messages=MESSAGES, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in first if c.choices) == "hello"
    received = []
    with pytest.raises(openai.APIConnectionError):
        for piece in client.chat.completions.create(model="cut", messages=MESSAGES, stream=True):
            received.append(piece.choices[0].delta.content)
    assert received == ["par"]  # the part sent, then the stream broken
    posts = raw_engines["cut"].posts
    assert [p.nth for p in posts] == [0, 1] and posts[0].connection == posts[1].connection  # reused, once
    assert _resent(dataplane.children["dataplane"].log_tail(200), "cut") == 0


def test_an_engine_that_reset_a_kept_alive_connection_and_no_longer_listens_is_answered_502(
    dataplane: SchedulerAndDataplane, raw_engines: dict[str, RawEngine]
) -> None:
    client = _client(dataplane.dataplane_url)
    assert client.chat.completions.create(model="gone", messages=MESSAGES).choices[0].message.content
    raw_engines["gone"].stop_listening()
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="gone", messages=MESSAGES)
    assert caught.value.status_code == 502
    assert caught.value.response.json()["error"]["message"].startswith("engine gone: cannot connect")
    assert len(raw_engines["gone"].posts) == 2  # the second one, reset, then refused a new connection
    assert _resent(dataplane.children["dataplane"].log_tail(200), "gone") == 1


def test_an_engine_closing_a_new_connection_unanswered_is_answered_502_and_never_resent(
    dataplane: SchedulerAndDataplane, raw_engines: dict[str, RawEngine]
) -> None:
    with pytest.raises(openai.APIStatusError) as caught:
        _client(dataplane.dataplane_url).chat.completions.create(model="fresh-close", messages=MESSAGES)
    assert caught.value.status_code == 502
    message = caught.value.response.json()["error"]["message"]
    assert message.startswith("engine fresh-close: the engine closed the connection before answering"), (
        message
    )
    assert len(raw_engines["fresh-close"].posts) == 1
    assert _resent(dataplane.children["dataplane"].log_tail(200), "fresh-close") == 0


def test_an_engine_closing_a_reused_connection_unanswered_1_s_into_a_turn_is_answered_502_and_never_resent(
    dataplane: SchedulerAndDataplane, raw_engines: dict[str, RawEngine]
) -> None:
    client = _client(dataplane.dataplane_url)
    assert client.chat.completions.create(model="late-close", messages=MESSAGES).choices[0].message.content
    with pytest.raises(openai.APIStatusError) as caught:
        client.chat.completions.create(model="late-close", messages=MESSAGES)
    assert caught.value.status_code == 502
    message = caught.value.response.json()["error"]["message"]
    assert message.startswith("engine late-close: the engine closed the connection before answering"), message
    posts = raw_engines["late-close"].posts
    assert [p.nth for p in posts] == [0, 1] and posts[0].connection == posts[1].connection  # reached it once
    log = dataplane.children["dataplane"].log_tail(200)
    assert _resent(log, "late-close") == 0
    assert "not sent again" in log, log
