"""The dataplane's chat route and its neighbours with real processes: /metrics, /v1/decide, /v1/models,
headers. (The Messages and Responses routes, the other two front doors, are in ``front_doors/``.)

Besides the stack's two simulated engines, the module starts a simulated single-pass replica
(``fake-engine`` serving a classifier model) and an ad-hoc HTTP/1.1 engine written on raw sockets,
which answers with exactly the headers and encodings the simulator never sends: hop-by-hop headers,
headers named by ``Connection``, gzip bodies whole and streamed.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import openai
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from luftpause.dataplane.intake.checks import CALLER_MAX_BYTES, truncate_caller
from luftpause.dataplane.observe.metrics import CONTENT_TYPE
from luftpause.testkit.launch.procs import ChildProcess, free_port
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

RAW_MODEL = "raw-engine-model"
CLASSIFIER = "sim-classifier"
PLAIN_STREAM = (
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    b'data: {"id":"c1","object":"chat.completion.chunk","choices":[{"index":0,"delta":{},'
    b'"finish_reason":"stop"}]}\n\n'
    b"data: [DONE]\n\n"
)
PLAIN_COMPLETION = orjson.dumps(
    {
        "id": "c2",
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4},
    }
)


# --- an engine on raw sockets ----------------------------------------------------------------------


@dataclass
class RawEngine:
    """HTTP/1.1 on raw sockets, one request per connection, in its own thread and event loop.

    The request body's ``"adhoc"`` field picks the answer; ``received`` keeps each request's headers
    (lower-case names) under its ``"adhoc_id"``.
    """

    port: int
    received: dict[str, dict[str, str]] = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _server: asyncio.Server | None = None

    def start(self) -> RawEngine:
        ready = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            self._server = loop.run_until_complete(asyncio.start_server(self._handle, "127.0.0.1", self.port))
            ready.set()
            loop.run_forever()
            self._server.close()
            loop.run_until_complete(self._server.wait_closed())
            loop.close()

        self._thread = threading.Thread(target=serve, name="raw-engine", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("the raw engine did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            headers: dict[str, str] = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            request = orjson.loads(body) if body else {}
            self.received[str(request.get("adhoc_id", ""))] = headers
            writer.write(_raw_answer(str(request.get("adhoc", ""))))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()


OPAQUE_BODY = bytes(range(256)) * 4
"""Bytes no decoder reads: a body in an encoding the relay passes through untouched."""


def _raw_answer(kind: str) -> bytes:
    """The whole HTTP response for one ``kind`` of answer; the connection closes after it."""
    if kind == "gzip-whole":
        body = gzip.compress(PLAIN_COMPLETION)
        head = [
            "HTTP/1.1 200 OK",
            "content-type: application/json",
            "content-encoding: gzip",
            f"content-length: {len(body)}",
            "connection: close",
        ]
    elif kind == "gzip-stream":
        body = gzip.compress(PLAIN_STREAM)
        head = [
            "HTTP/1.1 200 OK",
            "content-type: text/event-stream",
            "content-encoding: gzip",
            "cache-control: no-store",  # the relay's own no-cache must replace it, not join it
            "connection: close",  # the body ends when the connection does
        ]
    elif kind.startswith("opaque-"):  # opaque-<coding>-whole|stream: encoded as the relay cannot decode
        coding, _, shape = kind.removeprefix("opaque-").rpartition("-")
        body = OPAQUE_BODY
        head = [
            "HTTP/1.1 200 OK",
            f"content-type: {'text/event-stream' if shape == 'stream' else 'application/json'}",
            f"content-encoding: {coding}",
            "connection: close",
        ]
    elif kind in ("call-0", "call-0-stream"):  # a tool call whose id other engines reuse too
        call = {"index": 0, "id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        if kind == "call-0":
            body = orjson.dumps(
                {
                    "id": "c3",
                    "object": "chat.completion",
                    "choices": [
                        {
                            "index": 0,
                            "message": {"role": "assistant", "content": None, "tool_calls": [call]},
                            "finish_reason": "tool_calls",
                        }
                    ],
                }
            )
            content_type = "application/json"
        else:
            chunk = {"id": "c4", "object": "chat.completion.chunk"}
            body = b"".join(
                b"data: " + orjson.dumps({**chunk, "choices": [choice]}) + b"\n\n"
                for choice in (
                    {"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}},
                    {"index": 0, "delta": {}, "finish_reason": "tool_calls"},
                )
            )
            body += b"data: [DONE]\n\n"
            content_type = "text/event-stream"
        head = [
            "HTTP/1.1 200 OK",
            f"content-type: {content_type}",
            f"content-length: {len(body)}",
            "connection: close",
        ]
    else:  # hop-by-hop headers, one of them named only by Connection
        body = PLAIN_COMPLETION
        head = [
            "HTTP/1.1 200 OK",
            "content-type: application/json",
            f"content-length: {len(body)}",
            "connection: close, x-private-hop",
            "x-private-hop: secret",
            "keep-alive: timeout=5",
            "proxy-connection: keep-alive",
            "te: trailers",
            "trailer: x-checksum",
            "x-end-to-end: kept",
        ]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


# --- the stack -------------------------------------------------------------------------------------


@dataclass
class FrontDoor:
    stack: Stack
    raw: RawEngine
    classifier_url: str


@pytest.fixture(scope="module")
def front(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FrontDoor]:
    workdir = tmp_path_factory.mktemp("front-door")
    raw = RawEngine(free_port()).start()
    classifier_port = free_port()
    classifier = ChildProcess(
        "classifier",
        ["fake-engine", "--port", str(classifier_port), "--model", CLASSIFIER],
        workdir / "classifier.log",
        ready_url=f"http://127.0.0.1:{classifier_port}/health",
    )
    extra = f"""
[[replicas]]
name = "raw"
url = "http://127.0.0.1:{raw.port}"
models = ["{RAW_MODEL}"]
health_path = ""  # not probed: it answers nothing but chat completions

[[replicas]]
name = "classifier"
url = "http://127.0.0.1:{classifier_port}"
models = ["{CLASSIFIER}"]
kind = "single_pass"
"""
    try:
        classifier.start().wait_ready()
        stack = Stack.start(workdir, extra_config=extra)
        try:
            stack.wait_connected()
            yield FrontDoor(stack, raw, f"http://127.0.0.1:{classifier_port}")
        finally:
            stack.stop()
    finally:
        classifier.stop()
        raw.stop()


def request(
    stack: Stack,
    method: str,
    path: str,
    body: dict[str, Any] | bytes | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, http.client.HTTPMessage, bytes]:
    """One request with http.client, which sends exactly the headers given (no Connection or
    Accept-Encoding of its own) and never decodes a content encoding."""
    host, _, port = stack.dataplane_url.removeprefix("http://").partition(":")
    connection = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        data = body if isinstance(body, bytes) or body is None else orjson.dumps(body)
        connection.putrequest(method, path, skip_accept_encoding=True)
        all_headers = {"content-type": "application/json", **(headers or {})}
        if data is not None:
            all_headers["content-length"] = str(len(data))
        for name, value in all_headers.items():
            connection.putheader(name, value)
        connection.endheaders(data)
        response = connection.getresponse()
        return response.status, response.headers, response.read()
    finally:
        connection.close()


def chat(model: str, *, stream: bool = False, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": "hello"}],
        "max_tokens": 8,
        "stream": stream,
        **extra,
    }


# --- hop-by-hop headers and content encoding --------------------------------------------------------


def test_hop_by_hop_headers_are_not_forwarded_either_way(front: FrontDoor) -> None:
    status, headers, body = request(
        front.stack,
        "POST",
        "/v1/chat/completions",
        chat(RAW_MODEL, adhoc="hop", adhoc_id="hop-1"),
        {
            "connection": "close, x-client-hop",
            "x-client-hop": "private to the first hop",
            "keep-alive": "timeout=30",
            "proxy-connection": "keep-alive",
            "te": "trailers",
            "upgrade": "h2c",
        },
    )
    assert status == 200
    assert body == PLAIN_COMPLETION
    received = front.raw.received["hop-1"]
    for name in ("x-client-hop", "keep-alive", "proxy-connection", "te", "upgrade"):
        assert name not in received, name
    assert received.get("connection", "") in ("", "keep-alive", "close")  # aiohttp's own, not ours
    answered = {name.lower() for name in headers}
    for name in ("x-private-hop", "keep-alive", "proxy-connection", "te", "trailer"):
        assert name not in answered, name
    assert headers["x-end-to-end"] == "kept"
    assert headers["x-luftpause-run-id"].startswith("run-")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_gzip_answer_reaches_the_client_decoded_and_without_its_encoding_header(
    front: FrontDoor, stream: bool
) -> None:
    kind = "gzip-stream" if stream else "gzip-whole"
    status, headers, body = request(
        front.stack, "POST", "/v1/chat/completions", chat(RAW_MODEL, stream=stream, adhoc=kind)
    )
    assert status == 200
    # The body and its header agree: decoded bytes, no content-encoding.
    assert "content-encoding" not in {name.lower() for name in headers}
    assert body == (PLAIN_STREAM if stream else PLAIN_COMPLETION)
    if stream:
        assert headers.get_all("cache-control") == ["no-cache"]
        assert headers.get_all("x-accel-buffering") == ["no"]


@pytest.mark.parametrize("coding", ["x-foo", "compress", "br", "zstd"])
@pytest.mark.parametrize("shape", ["whole", "stream"])
def test_an_encoding_the_relay_does_not_decode_passes_with_its_header_untouched(
    front: FrontDoor, coding: str, shape: str
) -> None:
    status, headers, body = request(
        front.stack,
        "POST",
        "/v1/chat/completions",
        chat(RAW_MODEL, stream=shape == "stream", adhoc=f"opaque-{coding}-{shape}"),
    )
    assert status == 200  # br and zstd were a 502 when aiohttp tried to decode them
    assert headers.get_all("content-encoding") == [coding]
    assert body == OPAQUE_BODY


# --- an encoded request body ------------------------------------------------------------------------


def _body_of(route: str, model: str) -> dict[str, Any]:
    return chat(model) if route == "/v1/chat/completions" else {"model": CLASSIFIER, "input": "hi"}


@pytest.mark.anyio
@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/decide"])
async def test_a_gzip_request_body_is_refused_415_naming_the_encoding(front: FrontDoor, route: str) -> None:
    # It was a 400 "request body is not valid JSON: str is not valid UTF-8: surrogates not allowed".
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            front.stack.dataplane_url + route, json=_body_of(route, front.stack.model), compress="gzip"
        ) as resp,
    ):
        assert resp.request_info.headers["Content-Encoding"] == "gzip"
        status, body = resp.status, await resp.read()
    assert status == 415
    assert list(orjson.loads(body)) == ["error"] and list(orjson.loads(body)["error"]) == ["message"]
    message = orjson.loads(body)["error"]["message"]
    assert message.startswith("request body has Content-Encoding: gzip;")
    assert "send the body unencoded (Content-Encoding: identity, or no Content-Encoding header)" in message


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/decide"])
@pytest.mark.parametrize("coding", ["deflate", "br", "identity, gzip"])
def test_any_coding_but_identity_is_refused_415(front: FrontDoor, route: str, coding: str) -> None:
    status, _, body = request(
        front.stack, "POST", route, _body_of(route, front.stack.model), {"content-encoding": coding}
    )
    assert status == 415
    assert f"Content-Encoding: {coding};" in orjson.loads(body)["error"]["message"]


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/decide"])
@pytest.mark.parametrize("coding", ["identity", "Identity"])
def test_an_identity_content_encoding_is_served(front: FrontDoor, route: str, coding: str) -> None:
    status, _, body = request(
        front.stack, "POST", route, _body_of(route, front.stack.model), {"content-encoding": coding}
    )
    assert status == 200, body


def test_a_stream_says_no_cache_and_no_proxy_buffering(front: FrontDoor) -> None:
    status, headers, body = request(
        front.stack, "POST", "/v1/chat/completions", chat(front.stack.model, stream=True)
    )
    assert status == 200
    assert headers.get_all("cache-control") == ["no-cache"]
    assert headers.get_all("x-accel-buffering") == ["no"]
    assert body.rstrip().endswith(b"data: [DONE]")


# --- x-luftpause-run-id on every path ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("payload", "extra_headers", "code"),
    [
        (chat("llama-3.2-1b"), {}, 200),
        (chat("llama-3.2-1b", stream=True), {}, 200),
        (chat("llama-3.2-1b", luftpause_fault={"kind": "status", "status": 429, "retry_after": 3}), {}, 429),
        (chat("no-such-model"), {}, 404),
        (chat("llama-3.2-1b"), {"x-luftpause-class": "urgent"}, 400),
        (b"{not json", {}, 400),
    ],
    ids=["whole", "streamed", "engine-429", "unknown-model", "bad-class", "bad-json"],
)
def test_every_chat_answer_carries_the_run_id(
    front: FrontDoor, payload: dict[str, Any] | bytes, extra_headers: dict[str, str], code: int
) -> None:
    given = {"x-luftpause-run-id": "run-on-every-path", **extra_headers}
    status, headers, _ = request(front.stack, "POST", "/v1/chat/completions", payload, given)
    assert status == code
    assert headers["x-luftpause-run-id"] == "run-on-every-path"
    if not isinstance(payload, bytes) and status != 400:  # a turn: a new run when none is given
        status, headers, _ = request(front.stack, "POST", "/v1/chat/completions", payload, extra_headers)
        assert status == code
        assert headers["x-luftpause-run-id"].startswith("run-")


def test_unknown_service_class_names_the_allowed_values(front: FrontDoor) -> None:
    status, _, body = request(
        front.stack, "POST", "/v1/chat/completions", chat(front.stack.model), {"x-luftpause-class": "bulk"}
    )
    assert status == 400
    assert orjson.loads(body) == {
        "error": {"message": "x-luftpause-class must be 'interactive' or 'batch', not 'bulk'"}
    }


@pytest.mark.parametrize(
    ("caller", "expected"),
    [
        ("a" * 128, "a" * 128),
        ("a" * 129, "a" * 128),
        ("é" * 64, "é" * 64),  # 128 bytes exactly
        ("a" + "é" * 64, "a" + "é" * 63),  # never half of a two-byte character
        ("€" * 50, "€" * 42),  # 126 bytes: a third of a character would not fit
        ("", ""),
    ],
)
def test_caller_is_truncated_to_128_bytes_of_whole_characters(caller: str, expected: str) -> None:
    assert truncate_caller(caller) == expected
    assert len(truncate_caller(caller).encode()) <= CALLER_MAX_BYTES


# --- /v1/models -------------------------------------------------------------------------------------


def test_models_are_the_union_of_every_replicas_including_single_pass(front: FrontDoor) -> None:
    status, _, body = request(front.stack, "GET", "/v1/models")
    assert status == 200
    assert [m["id"] for m in orjson.loads(body)["data"]] == [front.stack.model, RAW_MODEL, CLASSIFIER]


# --- /v1/decide -------------------------------------------------------------------------------------


def test_decide_with_an_unknown_model_is_404_with_the_json_error_and_no_run_id(front: FrontDoor) -> None:
    status, headers, body = request(
        front.stack,
        "POST",
        "/v1/decide",
        {"model": "no-such-classifier", "input": "hi"},
        {"x-luftpause-run-id": "run-ignored"},
    )
    assert status == 404
    assert list(orjson.loads(body)) == ["error"]
    assert "no-such-classifier" in orjson.loads(body)["error"]["message"]
    assert "x-luftpause-run-id" not in headers


@pytest.mark.parametrize(
    "payload",
    [
        b"{nope",
        {"input": "hi"},
        {"model": CLASSIFIER},
        {"model": CLASSIFIER, "input": []},
        {"model": CLASSIFIER, "input": [1, 2]},
        {"model": CLASSIFIER, "input": {"text": "hi"}},
    ],
)
def test_decide_refuses_a_malformed_request_with_400_and_no_run_id(
    front: FrontDoor, payload: dict[str, Any] | bytes
) -> None:
    status, headers, body = request(
        front.stack, "POST", "/v1/decide", payload, {"x-luftpause-run-id": "run-ignored"}
    )
    assert status == 400
    assert list(orjson.loads(body)["error"]) == ["message"]
    assert "x-luftpause-run-id" not in headers


def test_decide_only_takes_post(front: FrontDoor) -> None:
    status, headers, _ = request(front.stack, "GET", "/v1/decide")
    assert status == 405
    assert headers["allow"] == "POST"


@pytest.mark.parametrize("given", ["Is this spam?", ["first text", "second, longer text"]])
def test_decide_relays_the_classifiers_answer_unchanged(front: FrontDoor, given: str | list[str]) -> None:
    payload = {"model": CLASSIFIER, "input": given}
    status, headers, body = request(front.stack, "POST", "/v1/decide", payload)
    assert status == 200, body
    assert "x-luftpause-run-id" not in headers
    # The same request sent to the replica directly gives the same answer, but for its id and clock.
    host, _, port = front.classifier_url.removeprefix("http://").partition(":")
    direct = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        direct.request("POST", "/classify", orjson.dumps(payload), {"content-type": "application/json"})
        expected = orjson.loads(direct.getresponse().read())
    finally:
        direct.close()
    answer = orjson.loads(body)
    for volatile in ("id", "created"):
        answer.pop(volatile, None)
        expected.pop(volatile, None)
    assert answer == expected
    assert len(answer["data"]) == (1 if isinstance(given, str) else 2)
    assert headers["x-luftpause-simulated"] == "1"  # the engine's own headers come through


# --- /metrics ---------------------------------------------------------------------------------------


def scrape(stack: Stack) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the dataplane's /metrics, by name and sorted labels."""
    status, headers, body = request(stack, "GET", "/metrics")
    assert status == 200
    assert headers["content-type"] == CONTENT_TYPE
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
    }


def turns(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], outcome: str, cls: str) -> float:
    """Turns ended with ``outcome`` in class ``cls``, summed over the replicas they went to."""
    return sum(
        value
        for (name, labels), value in samples.items()
        if name == "luftpause_dataplane_turns_total"
        and dict(labels).get("outcome") == outcome
        and dict(labels).get("service_class") == cls
    )


def by_class(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, cls: str) -> float:
    """``name``'s samples of class ``cls``, summed over their other labels (replicas)."""
    return sum(
        value
        for (sample, labels), value in samples.items()
        if sample == name and ("service_class", cls) in labels
    )


def test_metrics_count_the_turns_made(front: FrontDoor) -> None:
    stack = front.stack
    before = scrape(stack)
    deadline = time.monotonic() + 30  # the turns of earlier tests have all ended
    while before[("luftpause_dataplane_turns_in_flight", ())] and time.monotonic() < deadline:
        time.sleep(0.05)
        before = scrape(stack)
    # else one of them ending during this test would be counted as one of its turns
    assert before[("luftpause_dataplane_turns_in_flight", ())] == 0, "earlier turns never ended"
    leased_before = orjson.loads(request(stack, "GET", "/health")[2])["leased_turns_total"]
    client = openai.OpenAI(base_url=f"{stack.dataplane_url}/v1", api_key="unused", max_retries=0)
    relayed = 0
    # finished: one streamed, one whole (interactive), one whole (batch)
    with client.chat.completions.with_streaming_response.create(
        model=stack.model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},  # an inter-token latency needs the token count
    ) as response:
        relayed += len(b"".join(response.iter_bytes()))
    raw = client.chat.completions.with_raw_response.create(
        model=stack.model, messages=[{"role": "user", "content": "hi"}], max_tokens=8
    )
    relayed += len(raw.http_response.content)
    raw = client.chat.completions.with_raw_response.create(
        model=stack.model,
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=8,
        extra_headers={"x-luftpause-class": "batch"},
    )
    relayed += len(raw.http_response.content)
    # failed: the engine answers 500
    status, _, body = request(
        stack,
        "POST",
        "/v1/chat/completions",
        chat(stack.model, luftpause_fault={"kind": "status", "status": 500}),
    )
    assert status == 500
    relayed += len(body)
    # refused: no replica serves the model
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=[{"role": "user", "content": "hi"}])

    expected = {("finished", "interactive"): 2, ("finished", "batch"): 1, ("failed", "interactive"): 1}
    expected[("refused", "interactive")] = 1
    # A turn is counted when the relay has ended it, which may be just after the client read its end
    # (a generous deadline for a loaded machine; the poll is fast).
    deadline = time.monotonic() + 30
    after = scrape(stack)
    while time.monotonic() < deadline and any(
        turns(after, o, c) - turns(before, o, c) < n for (o, c), n in expected.items()
    ):
        time.sleep(0.05)
        after = scrape(stack)
    for outcome in ("finished", "failed", "abandoned", "refused"):
        for cls in ("interactive", "batch"):
            assert turns(after, outcome, cls) - turns(before, outcome, cls) == expected.get(
                (outcome, cls), 0
            ), (
                outcome,
                cls,
            )

    def delta(name: str, labels: tuple[tuple[str, str], ...] = ()) -> float:
        return after.get((name, labels), 0.0) - before.get((name, labels), 0.0)

    interactive = (("service_class", "interactive"),)
    batch = (("service_class", "batch"),)
    # time to first token: the three finished turns; held time: those of the four placed turns
    # that waited for the scheduler's decision (a turn placed under a lease is not observed)
    ttft = "luftpause_dataplane_time_to_first_token_seconds_count"
    assert by_class(after, ttft, "interactive") - by_class(before, ttft, "interactive") == 2
    assert by_class(after, ttft, "batch") - by_class(before, ttft, "batch") == 1
    held = "luftpause_dataplane_held_seconds_count"
    leased = orjson.loads(request(stack, "GET", "/health")[2])["leased_turns_total"] - leased_before
    assert delta(held, interactive) <= 3 and delta(held, batch) <= 1
    assert delta(held, interactive) + delta(held, batch) + leased == 4
    assert delta("luftpause_dataplane_relayed_bytes_total") == relayed
    assert after[("luftpause_dataplane_turns_in_flight", ())] == 0
    assert after[("luftpause_dataplane_turns_held", ())] == 0
    # the GenAI families: each finished turn end to end, its first token and inter-token latency
    # when it streamed (one turn, max_tokens 8: 7 tokens after the first), its tokens; the answers
    # by status code (2 whole 200s and the stream, the engine's 500, the 404 of the unknown model)
    duration = "gen_ai_server_request_duration_seconds_count"
    assert by_class(after, duration, "interactive") - by_class(before, duration, "interactive") == 2
    assert by_class(after, duration, "batch") - by_class(before, duration, "batch") == 1
    streamed_ttft = "gen_ai_server_time_to_first_token_seconds_count"
    assert by_class(after, streamed_ttft, "interactive") - by_class(before, streamed_ttft, "interactive") == 1
    tpot = "gen_ai_server_time_per_output_token_seconds_count"
    assert by_class(after, tpot, "interactive") - by_class(before, tpot, "interactive") == 1
    output = sum(
        value - before.get((name, labels), 0.0)
        for (name, labels), value in after.items()
        if name == "luftpause_dataplane_tokens_total" and ("type", "completion") in labels
    )
    assert 3 <= output <= 3 * 8  # the engine's usage of the three finished turns
    for code, count in (("200", 3), ("500", 1), ("404", 1)):
        assert delta("luftpause_dataplane_turn_responses_total", (("code", code),)) == count, code
    # no label can grow without bound: no run ids, and a caller only by a configured root name
    label_names = {
        name
        for (sample, labels) in after
        if sample.startswith(("luftpause_", "gen_ai_"))
        for name, _ in labels
    }
    bounded = {"outcome", "service_class", "replica", "le", "process", "version", "model", "type", "code"}
    # reason: the failovers' two values (FAILOVER_REASONS)
    bounded |= {"reason"}
    assert label_names <= bounded | {"caller", "gen_ai_token_type"}
    callers = {value for (sample, labels) in after for name, value in labels if name == "caller"}
    assert callers <= {"anonymous", "other"}  # this stack configures no caller


def test_metrics_need_no_token_and_take_only_get(front: FrontDoor) -> None:
    status, headers, _ = request(front.stack, "POST", "/metrics", b"")
    assert status == 405
    assert headers["allow"] == "GET, HEAD"


# --- run identity by tool_call_id --------------------------------------------------------------------

WEATHER_TOOL: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def engine_that_served(stack: Stack, completion_id: str) -> str:
    """The URL of the simulated engine that answered ``completion_id``."""
    for url in stack.engine_urls:
        host, _, port = url.removeprefix("http://").partition(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            connection.request("GET", f"/testkit/received/{completion_id}")
            if connection.getresponse().status == 200:
                return url
        finally:
            connection.close()
    raise AssertionError(f"no engine served {completion_id}")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_turn_answering_a_tool_call_without_the_header_joins_its_run(
    front: FrontDoor, stream: bool
) -> None:
    stack = front.stack
    client = openai.OpenAI(base_url=f"{stack.dataplane_url}/v1", api_key="unused", max_retries=0)
    messages: list[Any] = [{"role": "user", "content": "What is the weather in Lisbon?"}]
    if stream:
        with client.chat.completions.with_streaming_response.create(
            model=stack.model, messages=messages, tools=[WEATHER_TOOL], max_tokens=16, stream=True
        ) as response:
            run_id = response.headers["x-luftpause-run-id"]
            chunks = [
                orjson.loads(line.removeprefix("data: "))
                for line in response.iter_lines()
                if line.startswith("data: {")
            ]
        first_id = chunks[0]["id"]
        calls = [
            c
            for chunk in chunks
            for choice in chunk["choices"]
            for c in choice["delta"].get("tool_calls") or []
        ]
        call_id = next(c["id"] for c in calls if c.get("id"))
        name = next(c["function"]["name"] for c in calls if c.get("function", {}).get("name"))
        assistant: dict[str, Any] = {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": "{}"}}
            ],
        }
    else:
        raw = client.chat.completions.with_raw_response.create(
            model=stack.model, messages=messages, tools=[WEATHER_TOOL], max_tokens=16
        )
        run_id = raw.headers["x-luftpause-run-id"]
        completion = raw.parse()
        first_id = completion.id
        assert completion.choices[0].message.tool_calls
        call_id = completion.choices[0].message.tool_calls[0].id
        assistant = completion.choices[0].message.model_dump(exclude_none=True)
    assert run_id.startswith("run-")
    messages += [assistant, {"role": "tool", "tool_call_id": call_id, "content": "Sunny, 24 °C."}]
    # the same run's next turn, sent without x-luftpause-run-id
    raw = client.chat.completions.with_raw_response.create(
        model=stack.model, messages=messages, tools=[WEATHER_TOOL], max_tokens=16
    )
    assert raw.headers["x-luftpause-run-id"] == run_id
    # the scheduler kept the run on its replica (strict affinity while the run is paused on a tool)
    assert engine_that_served(stack, raw.parse().id) == engine_that_served(stack, first_id)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_reused_tool_call_id_resolves_to_the_run_that_emitted_it_last(
    front: FrontDoor, stream: bool
) -> None:
    kind = "call-0-stream" if stream else "call-0"
    runs = []
    for _ in range(2):  # two runs whose engine both emit call_0
        status, headers, _ = request(
            front.stack, "POST", "/v1/chat/completions", chat(RAW_MODEL, stream=stream, adhoc=kind)
        )
        assert status == 200
        runs.append(headers["x-luftpause-run-id"])
    assert runs[0] != runs[1]
    answer: dict[str, Any] = chat(RAW_MODEL, adhoc="hop")
    answer["messages"] += [
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "done"},
    ]
    # The second run's ending is recorded when its relay ends, maybe just after the client read it.
    deadline = time.monotonic() + 30
    while True:
        status, headers, _ = request(front.stack, "POST", "/v1/chat/completions", answer)
        assert status == 200
        if headers["x-luftpause-run-id"] == runs[1] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert headers["x-luftpause-run-id"] == runs[1]


def test_a_turn_with_an_unknown_tool_call_id_starts_a_new_run(front: FrontDoor) -> None:
    answer: dict[str, Any] = chat(front.stack.model)
    answer["messages"] += [{"role": "tool", "tool_call_id": "call_never_emitted", "content": "x"}]
    ids = set()
    for _ in range(2):
        status, headers, _ = request(front.stack, "POST", "/v1/chat/completions", answer)
        assert status == 200
        ids.add(headers["x-luftpause-run-id"])
    assert len(ids) == 2


# --- the run table ----------------------------------------------------------------------------------


def test_a_turn_refused_for_an_unknown_model_leaves_no_run_recorded(front: FrontDoor) -> None:
    def runs() -> int:
        _, _, body = request(front.stack, "GET", "/health")
        count: int = orjson.loads(body)["runs"]
        return count

    before = runs()
    for _ in range(20):
        status, headers, _ = request(front.stack, "POST", "/v1/chat/completions", chat("no-such-model"))
        assert status == 404
        assert headers["x-luftpause-run-id"].startswith("run-")
    assert runs() == before
    status, _, _ = request(front.stack, "POST", "/v1/chat/completions", chat(front.stack.model))
    assert status == 200
    assert runs() == before + 1  # an admitted turn's new run is recorded


def test_after_delete_a_tool_call_id_of_the_ended_run_no_longer_joins_it(front: FrontDoor) -> None:
    status, headers, _ = request(front.stack, "POST", "/v1/chat/completions", chat(RAW_MODEL, adhoc="call-0"))
    assert status == 200
    ended = headers["x-luftpause-run-id"]  # the run that emitted call_0 last
    status, _, _ = request(front.stack, "DELETE", f"/v1/runs/{ended}")
    assert status == 204
    answer: dict[str, Any] = chat(RAW_MODEL, adhoc="hop")
    answer["messages"] += [
        {
            "role": "assistant",
            "tool_calls": [
                {"id": "call_0", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "call_0", "content": "done"},
    ]
    status, headers, _ = request(front.stack, "POST", "/v1/chat/completions", answer)
    assert status == 200
    assert headers["x-luftpause-run-id"] != ended


@pytest.mark.parametrize(
    ("method", "path", "body", "headers", "message_part"),
    [
        (
            "POST",
            "/v1/chat/completions",
            chat("llama-3.2-1b"),
            {"x-luftpause-class": ""},
            "'interactive' or 'batch'",
        ),
        ("DELETE", "/v1/runs/" + "r" * 20_000, None, {}, "at most 256 bytes"),
    ],
    ids=["empty-class", "delete-long-run-id"],
)
def test_empty_class_and_overlong_run_ids_in_a_delete_are_refused_400(
    front: FrontDoor,
    method: str,
    path: str,
    body: dict[str, Any] | None,
    headers: dict[str, str],
    message_part: str,
) -> None:
    status, _, answer = request(front.stack, method, path, body, headers)
    assert status == 400
    assert message_part in orjson.loads(answer)["error"]["message"]
