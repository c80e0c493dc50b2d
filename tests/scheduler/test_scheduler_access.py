"""The scheduler is no longer open (the issue's item 1): with ``LUFTPAUSE_TOKEN`` set, its HTTP
``/status`` needs the token and every route but ``/health`` answers only for a known ``Host`` (a
DNS-rebinding page cannot read it), and its gRPC link refuses a stream without the token
(``UNAUTHENTICATED``, before the service sees a message). Real processes, a real ``grpc``
client."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest
from grpc_helpers import connect_once

from luftpause.auth.hosts import HostAllowList, host_name
from luftpause.testkit.launch.procs import ChildProcess, free_port
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

TOKEN = "scheduler-access-token"
REFUSED = {"error": {"message": "missing or wrong bearer token (Authorization: Bearer <LUFTPAUSE_TOKEN>)"}}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    stack = Stack.start(
        tmp_path_factory.mktemp("scheduler-access"),
        env={"LUFTPAUSE_TOKEN": TOKEN},
        sections={"scheduler": 'allowed_hosts = ["status.example"]\n'},
    )
    try:
        stack.wait_connected()
        yield stack
    finally:
        stack.stop()


def _base(stack: Stack) -> str:
    return stack.status_url.removesuffix("/status")


def test_status_needs_the_token(guarded: Stack) -> None:
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": TOKEN}):
        refused = httpx.get(guarded.status_url, headers=headers)
        assert (refused.status_code, refused.json()) == (401, REFUSED)
        assert refused.headers["www-authenticate"] == 'Bearer realm="luftpause"'
    answered = httpx.get(guarded.status_url, headers={"authorization": f"bearer {TOKEN}"})
    assert answered.status_code == 200 and "replicas" in answered.json()
    # Unknown paths too: nothing is learned about the routes without the token.
    assert httpx.get(f"{_base(guarded)}/nope").status_code == 401


def test_the_page_and_health_stay_open(guarded: Stack) -> None:
    page = httpx.get(f"{_base(guarded)}/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert httpx.get(f"{_base(guarded)}/health").json() == {"status": "ok"}


def test_an_unknown_host_is_refused_421_even_with_the_token(guarded: Stack) -> None:
    auth = {"authorization": f"Bearer {TOKEN}"}
    for path in ("/", "/status"):
        for host in ("evil.example", "evil.example:5001", "127.0.0.1.evil.example", "localhost.evil.example"):
            refused = httpx.get(f"{_base(guarded)}{path}", headers={**auth, "host": host})
            assert refused.status_code == 421, (path, host)
            assert "is not served here (DNS rebinding protection)" in refused.json()["error"]["message"]
    port = guarded.status_url.split(":")[2].split("/")[0]
    for host in (
        f"127.0.0.1:{port}",
        f"localhost:{port}",
        "[::1]",
        "10.1.2.3:80",
        "status.example",
        "STATUS.example.",
    ):
        assert httpx.get(guarded.status_url, headers={**auth, "host": host}).status_code == 200, host
    # /health answers a probe under any name (a Kubernetes probe names the pod by its address).
    assert httpx.get(f"{_base(guarded)}/health", headers={"host": "evil.example"}).status_code == 200


def test_a_request_without_host_is_refused(guarded: Stack) -> None:
    port = int(guarded.status_url.split(":")[2].split("/")[0])
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"GET /status HTTP/1.0\r\nAuthorization: Bearer {TOKEN}\r\n\r\n".encode())
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    assert answer.startswith(b"HTTP/1.0 421") or answer.startswith(b"HTTP/1.1 421"), answer[:100]


def test_the_grpc_link_refuses_a_stream_without_the_token(guarded: Stack) -> None:
    target = guarded.scheduler_grpc
    refused = f"stranger-{os.getpid()}"
    for metadata in (None, (("authorization", "Bearer wrong"),), (("authorization", TOKEN),)):
        assert connect_once(target, metadata, refused) == "UNAUTHENTICATED", metadata
    assert (
        connect_once(target, (("authorization", f"Bearer {TOKEN}"),), f"friend-{os.getpid()}") == "resynced"
    )
    # The refused streams reached nothing: the friend's resync shows up (lost, once it left), the
    # stranger's never.
    lost = guarded.wait_status(lambda s: f"friend-{os.getpid()}" in s["lost_dataplanes"])["lost_dataplanes"]
    assert f"friend-{os.getpid()}" in lost and refused not in lost


def test_a_dataplane_with_the_wrong_token_gets_its_turns_refused_503(guarded: Stack, tmp_path: Path) -> None:
    port = free_port()
    config = guarded.config_path.read_text().replace(
        guarded.dataplane_url.removeprefix("http://"), f"127.0.0.1:{port}", 1
    )
    path = tmp_path / "wrong.toml"
    path.write_text(config)
    wrong = ChildProcess(
        "dataplane-wrong-token",
        ["dataplane", "--config", str(path)],
        tmp_path / "dp.log",
        env={"LUFTPAUSE_TOKEN": "wrong"},
        ready_url=f"http://127.0.0.1:{port}/health",
    )
    try:
        wrong.start().wait_ready()
        with (
            openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="wrong", max_retries=0) as client,
            pytest.raises(openai.InternalServerError) as caught,
        ):
            client.chat.completions.create(
                model=guarded.model, messages=[{"role": "user", "content": "hi"}], max_tokens=4
            )
        assert caught.value.status_code == 503
        assert caught.value.response.json()["error"]["message"].startswith(
            "scheduler failed: UNAUTHENTICATED"
        )
        assert "UNAUTHENTICATED" in wrong.log_tail()
    finally:
        wrong.stop()


@pytest.mark.parametrize(
    ("host", "name"),
    [
        ("a.example:5001", "a.example"),
        ("[::1]:5001", "::1"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("A.Example.", "a.example"),
        ("127.0.0.1", "127.0.0.1"),
    ],
)
def test_host_names_are_read_without_port_case_or_trailing_dot(host: str, name: str) -> None:
    assert host_name(host) == name


def test_the_allow_list_takes_addresses_local_names_and_configured_ones() -> None:
    hosts = HostAllowList("scheduler.internal", ["status.example"])
    for allowed in (
        "127.0.0.1:1",
        "[::1]:2",
        "10.0.0.1",
        "localhost",
        socket.gethostname(),
        "scheduler.internal:5001",
    ):
        assert hosts.allows(allowed), allowed
    for refused in (None, "", "evil.example", "status.example.evil", "xlocalhost"):
        assert not hosts.allows(refused), refused
    assert HostAllowList("0.0.0.0", ["*"]).allows("evil.example")
