"""A client leaving mid-stream stops generation at the engine (docs/architecture.md "Failure
contract": "client disconnects mid-stream: closes the engine request (generation stops)"), observed
at the engine.

A simulated engine at 20 ms per token asked for 2,000 tokens would stream for about 40 s; the client
reads the first few chunks through the dataplane and closes its connection. The engine then has no
request running (its ``/metrics`` running count back to 0), and it never finished the completion:
``/testkit/sent/{id}`` keeps only completions sent whole, and has none for this id, while
``/testkit/received/{id}`` shows the request did reach it.
"""

from __future__ import annotations

import socket
import urllib.error
import urllib.request
from pathlib import Path

import orjson
import pytest
from dataplane_procs import MODEL, fake_engine, scheduler_and_dataplane, wait_until

pytestmark = pytest.mark.integration

MAX_TOKENS = 2000
DECODE_MS = 20.0  # 2,000 tokens: about 40 s, far past the wait below


def _running_at(engine_url: str) -> float:
    with urllib.request.urlopen(f"{engine_url}/metrics", timeout=10) as response:
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in response.read().decode().splitlines()
            if line.startswith("sglang:num_running_reqs{")
        )


def _testkit_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _read_some_chunks_then_leave(dataplane_url: str, chunks: int) -> str:
    """Stream a long reply through the dataplane over a raw socket, read ``chunks`` data events
    (each whole), close the socket; the completion id the events carry."""
    host, port = dataplane_url.removeprefix("http://").split(":")
    body = orjson.dumps(
        {
            "model": MODEL,
            "messages": [{"role": "user", "content": "tell me a long story"}],
            "max_tokens": MAX_TOKENS,
            "stream": True,
        }
    )
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nhost: {host}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + body)
        received = b""
        events: list[bytes] = []
        while len(events) < chunks:
            data = sock.recv(65536)
            assert data, f"the stream ended after {len(events)} events: {received!r}"
            received += data
            events = [
                line[len(b"data: ") :]
                for line in received.split(b"\n")
                if line.startswith(b"data: {") and line.endswith(b"}")
            ]
        assert received.startswith(b"HTTP/1.1 200"), received[:200]
    # the socket is closed here: the client has left mid-stream
    completion_id: str = orjson.loads(events[0])["id"]
    return completion_id


def test_a_client_leaving_mid_stream_stops_generation_at_the_engine(tmp_path: Path) -> None:
    with (
        fake_engine(tmp_path, decode_ms=DECODE_MS) as engine_url,
        scheduler_and_dataplane(tmp_path, [engine_url]) as pair,
    ):
        completion_id = _read_some_chunks_then_leave(pair.dataplane_url, chunks=4)
        received = _testkit_status(f"{engine_url}/testkit/received/{completion_id}")
        assert received == 200, "the engine never saw this completion's request"
        # Generous, yet far shorter than the ~40 s the engine would go on generating for nobody.
        stopped = wait_until(lambda: _running_at(engine_url) == 0, 15)
        assert stopped, f"the engine is still generating after its client left\n{pair.logs()}"
        # Not sent whole: the engine stopped before the 2,000 tokens asked for.
        assert _testkit_status(f"{engine_url}/testkit/sent/{completion_id}") == 404
