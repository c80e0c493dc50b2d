"""Every kind of bad input to every route of each process gets a JSON error in its route's shape
(issue 25, item 5; docs/failover.md "Errors"): Chat Completions and luftpause's own routes
``{"error": {"message"}}``, Anthropic Messages ``{"type": "error", "error": {"type", "message"}}``,
JSON-RPC 2.0 on ``/mcp`` (``{"jsonrpc": "2.0", "id": null, "error": {"code", "message"}}``), and
never a traceback.

What broke: a malformed chunked body got the dataplane's plain-text 500 "Internal server error"
(granian's own, for an application that answered nothing: granian reports the bad chunk as
``http.disconnect``) and ``/mcp`` a 500; ``/mcp`` answered a wrong content type 400 in plain text
and ``Host: 127.0.0.1`` (no port) 421 in plain text while ``/status`` took it.

Sent raw over a socket, as no HTTP client sends a malformed chunk. Errors produced beneath
luftpause (hyper's 414 and 431 under granian) are documented, not tested here
(``test_too_many_headers.py`` keeps the 431 in view).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

BAD_CHUNK = b"zz\r\n{}\r\n0\r\n\r\n"  # "zz" is no chunk size
OVERSIZE = 64 * 1024 * 1024 + 1  # over the dataplane's 32 MiB, the SDK's 4 MiB and aiohttp's 1 MiB


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack.start(tmp_path_factory.mktemp("bad-input"), env={"LUFTPAUSE_TOKEN": ""}) as started:
        yield started


def port_of(url: str) -> int:
    return int(url.split("//")[1].split("/")[0].rsplit(":", 1)[1])


def exchange(port: int, head: bytes, body: bytes = b"") -> tuple[int, bytes, bytes]:
    """Send ``head`` (lines without the blank line) and ``body``; the status, head and body of the
    answer (read until its ``Content-Length`` or the connection's end: the request closes it)."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(head + b"Connection: close\r\n\r\n")
        try:
            sock.sendall(body)
        except OSError:
            pass  # refused before the whole body (413): the answer is still there to read
        answer = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
            if _whole(answer):
                break  # a server may linger before it closes (aiohttp reads what is still sent, 10 s)
    head_in, _, body_in = answer.partition(b"\r\n\r\n")
    if b"transfer-encoding: chunked" in head_in.lower():
        body_in = dechunk(body_in)
    return int(head_in.split(b" ", 2)[1]), head_in, body_in


def _whole(answer: bytes) -> bool:
    """Whether ``answer`` holds a whole answer with a ``Content-Length``."""
    head, sep, body = answer.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":", 1)[1])
    return False


def dechunk(data: bytes) -> bytes:
    out = b""
    while data:
        size, _, rest = data.partition(b"\r\n")
        length = int(size, 16)
        if length == 0:
            break
        out, data = out + rest[:length], rest[length + 2 :]
    return out


def request(method: str, path: str, host: bytes, headers: dict[str, str]) -> bytes:
    lines = b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
    return f"{method} {path} HTTP/1.1\r\n".encode() + b"Host: " + host + b"\r\n" + lines


MCP_HEADERS = {"accept": "application/json, text/event-stream"}


def kinds(host: bytes, post: bool) -> dict[str, tuple[bytes, bytes]]:
    """Each kind of bad input: (head, body)."""
    json_ct = {"content-type": "application/json"}
    method = "POST" if post else "GET"
    out = {
        "bad host": (
            request(method, "{path}", b"evil.example", {**json_ct, **MCP_HEADERS, "content-length": "2"}),
            b"{}",
        ),
        "malformed chunked": (
            request("POST", "{path}", host, {**json_ct, **MCP_HEADERS, "transfer-encoding": "chunked"}),
            BAD_CHUNK,
        ),
    }
    if post:
        out |= {
            "bad json": (
                request("POST", "{path}", host, {**json_ct, **MCP_HEADERS, "content-length": "9"}),
                b"{not json",
            ),
            "wrong content-type": (
                request(
                    "POST",
                    "{path}",
                    host,
                    {"content-type": "text/plain", **MCP_HEADERS, "content-length": "2"},
                ),
                b"{}",
            ),
            "oversize": (
                request("POST", "{path}", host, {**json_ct, **MCP_HEADERS, "content-length": str(OVERSIZE)}),
                b"x" * 65536,
            ),
        }
    return out


def shape_of(route: str) -> str:
    if route == "/mcp":
        return "jsonrpc"
    if route == "/v1/messages":
        return "messages"
    return "error"


def check_shape(shape: str, status: int, head: bytes, body: bytes) -> None:
    where = f"{status}: {head.decode(errors='replace')}\n{body[:300]!r}"
    assert b"content-type: application/json" in head.lower(), where
    assert b"Traceback" not in body, where
    doc: Any = orjson.loads(body)
    if shape == "jsonrpc":
        assert doc["jsonrpc"] == "2.0" and doc["id"] is None, where
        assert isinstance(doc["error"]["code"], int) and isinstance(doc["error"]["message"], str), where
    elif shape == "messages":
        assert doc["type"] == "error" and isinstance(doc["error"]["type"], str), where
        assert isinstance(doc["error"]["message"], str), where
    else:
        assert isinstance(doc["error"]["message"], str) and doc["error"]["message"], where


def routes(stack: Stack) -> list[tuple[str, int, str, bool]]:
    """(process, port, path, takes a POST) for every route of each process."""
    dp, rt, sched = port_of(stack.dataplane_url), port_of(stack.runtime_url), port_of(stack.status_url)
    return [
        *[
            ("dataplane", dp, path, True)
            for path in ("/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/decide")
        ],
        *[
            ("dataplane", dp, path, False)
            for path in ("/v1/models", "/v1/models/x", "/health", "/livez", "/readyz", "/nowhere")
        ],
        ("dataplane", dp, "/v1/runs/x", False),
        ("runtime", rt, "/mcp", True),
        ("runtime", rt, "/monitor/runs/x/send", True),
        ("runtime", rt, "/monitor/runs/x/stop", True),
        *[
            ("runtime", rt, path, False)
            for path in (
                "/status",
                "/monitor/runs",
                "/monitor/series",
                "/health",
                "/livez",
                "/readyz",
                "/nowhere",
            )
        ],
        ("scheduler", sched, "/admin/replicas", True),
        ("scheduler", sched, "/admin/replicas/x/drain", True),
        *[
            ("scheduler", sched, path, False)
            for path in ("/status", "/series", "/admin/replicas", "/health", "/livez", "/readyz", "/nowhere")
        ],
    ]


def test_every_route_answers_every_kind_of_bad_input_with_a_json_error_in_its_shape(stack: Stack) -> None:
    failures = []
    answered = 0
    for process, port, path, post in routes(stack):
        host = b"127.0.0.1:%d" % port
        for kind, (head, body) in kinds(host, post).items():
            status, got_head, got_body = exchange(port, head.replace(b"{path}", path.encode()), body)
            if status < 400:
                continue  # the route took it (a GET's Host it serves anyway, say): nothing to shape
            if kind == "oversize" and status == 408:
                # the runtime's monitor routes waited 30 s for a body a refused client never sends
                failures.append(f"{process} {path} {kind}: 408 after the body deadline, not 413 at once")
                continue
            answered += 1
            try:
                check_shape(shape_of(path), status, got_head, got_body)
            except (AssertionError, orjson.JSONDecodeError, KeyError, TypeError) as exc:
                failures.append(f"{process} {path} {kind}: {exc}")
    assert not failures, "\n".join(failures)
    assert answered > 40  # most of them are errors: the test sees what it means to


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/messages", "/v1/responses", "/v1/decide"])
def test_a_malformed_chunked_body_is_400_on_the_dataplane(stack: Stack, path: str) -> None:
    port = port_of(stack.dataplane_url)
    head = request(
        "POST", path, b"127.0.0.1", {"content-type": "application/json", "transfer-encoding": "chunked"}
    )
    status, got_head, body = exchange(port, head, BAD_CHUNK)
    assert status == 400, (got_head, body)
    check_shape(shape_of(path), status, got_head, body)
    assert "chunked encoding is malformed" in body.decode()


def test_a_malformed_chunked_body_is_400_on_mcp_as_a_json_rpc_parse_error(stack: Stack) -> None:
    port = port_of(stack.runtime_url)
    head = request(
        "POST",
        "/mcp",
        b"127.0.0.1:%d" % port,
        {"content-type": "application/json", "transfer-encoding": "chunked", **MCP_HEADERS},
    )
    status, got_head, body = exchange(port, head, BAD_CHUNK)
    assert status == 400, (got_head, body)
    assert orjson.loads(body)["error"]["code"] == -32700


@pytest.mark.parametrize("route", ["/mcp", "/status"])
def test_the_runtime_takes_a_loopback_host_without_a_port_on_mcp_as_on_status(
    stack: Stack, route: str
) -> None:
    port = port_of(stack.runtime_url)
    if route == "/mcp":
        init = orjson.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-06-18",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "1"},
                },
            }
        )
        head = request(
            "POST",
            route,
            b"127.0.0.1",
            {"content-type": "application/json", "content-length": str(len(init)), **MCP_HEADERS},
        )
        status, got_head, body = exchange(port, head, init)
    else:
        status, got_head, body = exchange(port, request("GET", route, b"127.0.0.1", {}))
    assert status == 200, (got_head, body)
