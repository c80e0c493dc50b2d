"""TLS and mutual TLS on every listener and link (opt-in, for deployments across hosts), with a
throwaway CA made here (``tests/tls_helpers.py``): the ``openai`` client, the MCP client, the
scheduler's status and the gRPC link all over mutual TLS on one stack, whose runtime reaches its
dataplane and whose dataplane reaches its scheduler the same way; a client without a certificate
of the CA is refused at the handshake by each; a missing PEM file stops a process at start."""

from __future__ import annotations

import asyncio
import socket
import ssl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import openai
import pytest
from grpc_helpers import connect_once
from mcp import Client
from tls_helpers import Pki, make_pki

from luftpause.testkit.launch.procs import ChildProcess, free_port
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

TOKEN = "tls-token"


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def mutual(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[Stack]:
    stack = Stack.start(
        tmp_path_factory.mktemp("mtls"), env={"LUFTPAUSE_TOKEN": TOKEN}, tls=pki.stack_tls(mutual=True)
    )
    try:
        stack.wait_connected()
        yield stack
    finally:
        stack.stop()


def _port(url: str) -> int:
    return int(url.split(":")[2].split("/")[0])


def test_the_openai_client_streams_over_mutual_tls(mutual: Stack) -> None:
    assert mutual.dataplane_url.startswith("https://")
    with (
        httpx.Client(verify=mutual.ssl_context) as http,
        openai.OpenAI(
            base_url=f"{mutual.dataplane_url}/v1", api_key=TOKEN, http_client=http, max_retries=0
        ) as client,
    ):
        stream = client.chat.completions.create(
            model=mutual.model, messages=[{"role": "user", "content": "hi"}], max_tokens=8, stream=True
        )
        text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text


def test_an_mcp_run_goes_runtime_to_dataplane_to_scheduler_over_mutual_tls(mutual: Stack) -> None:
    """The sub-agent's turns go from the runtime to the dataplane (https, its client certificate)
    and are admitted over the gRPC link (TLS, its client certificate): the run completes."""

    async def go() -> dict[str, Any]:
        import httpx2
        from mcp.client.streamable_http import streamable_http_client

        context = mutual.ssl_context
        assert context is not None
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient(
            headers=headers, verify=context, timeout=httpx2.Timeout(30, read=120)
        ) as http:
            async with Client(streamable_http_client(mutual.runtime_url, http_client=http)) as client:
                spawned = await client.call_tool("spawn", {"task": "look it up", "maxTokens": 8})
                handle = spawned.structured_content["handle"]
                done = await client.call_tool("await", {"handles": [handle], "timeout": 120})
                run: dict[str, Any] = done.structured_content["runs"][0]
                return run

    run = asyncio.run(go())
    assert run["state"] == "completed", run
    assert mutual.status()["counters"]["finished"] >= 1


def test_the_scheduler_status_is_served_over_mutual_tls(mutual: Stack) -> None:
    assert mutual.status_url.startswith("https://")
    assert "replicas" in mutual.status()


def _handshake(port: int, context: ssl.SSLContext) -> bytes:
    """Connect with ``context``, send a request for ``/health``, return what came back (a failed
    handshake raises ``ssl.SSLError`` or ``OSError``, or comes back empty)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as raw:
        with context.wrap_socket(raw, server_hostname="127.0.0.1") as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
            return answer


@pytest.mark.parametrize("listener", ["dataplane", "runtime", "scheduler"])
def test_a_client_without_a_certificate_of_the_ca_is_refused_by_every_listener(
    mutual: Stack, pki: Pki, listener: str
) -> None:
    port = _port(
        {"dataplane": mutual.dataplane_url, "runtime": mutual.runtime_url, "scheduler": mutual.status_url}[
            listener
        ]
    )
    good = ssl.create_default_context(cafile=str(pki.ca))
    good.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    assert _handshake(port, good).startswith(b"HTTP/1.1 200")
    no_certificate = ssl.create_default_context(cafile=str(pki.ca))
    stranger = ssl.create_default_context(cafile=str(pki.ca))
    stranger.load_cert_chain(str(pki.stranger_cert), str(pki.stranger_key))
    for context in (no_certificate, stranger):
        try:
            answer = _handshake(port, context)
        except (ssl.SSLError, OSError):
            continue  # refused at the handshake (TLS 1.3 may report it at the first read)
        assert not answer.startswith(b"HTTP"), answer[:80]
    # And plain HTTP to a TLS port gets no HTTP answer.
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        try:
            answer = sock.recv(65536)
        except OSError:
            answer = b""
    assert not answer.startswith(b"HTTP/1.1 200")


def test_the_grpc_link_takes_only_clients_with_a_certificate_of_the_ca(mutual: Stack, pki: Pki) -> None:
    ca = pki.ca.read_bytes()
    with_certificate = grpc.ssl_channel_credentials(
        ca, pki.client_key.read_bytes(), pki.client_cert.read_bytes()
    )
    bearer = (("authorization", f"Bearer {TOKEN}"),)
    assert connect_once(mutual.scheduler_grpc, bearer, "tls-probe", with_certificate) == "resynced"
    without = grpc.ssl_channel_credentials(ca)
    stranger = grpc.ssl_channel_credentials(ca, pki.stranger_key.read_bytes(), pki.stranger_cert.read_bytes())
    for credentials in (without, stranger, None):
        assert connect_once(mutual.scheduler_grpc, bearer, "tls-probe", credentials) == "UNAVAILABLE"


@pytest.mark.parametrize(
    ("command", "table", "expected"),
    [
        ("dataplane", "[dataplane.tls]", "dataplane.tls.cert: cannot read"),
        ("runtime", "[runtime.tls]", "runtime.tls.cert: cannot read"),
        ("scheduler", "[scheduler.tls]", "scheduler.tls.cert: cannot read"),
    ],
)
def test_a_missing_pem_file_stops_the_process_at_start_naming_the_key(
    tmp_path: Path, pki: Pki, command: str, table: str, expected: str
) -> None:
    config = tmp_path / "luftpause.toml"
    config.write_text(
        f'[scheduler]\ngrpc = "127.0.0.1:{free_port()}"\nhttp = "127.0.0.1:{free_port()}"\n'
        f'[dataplane]\nlisten = "127.0.0.1:{free_port()}"\n'
        f'[runtime]\nlisten = "127.0.0.1:{free_port()}"\nstate_dir = "{tmp_path / "state"}"\n'
        f'{table}\ncert = "{tmp_path / "missing.pem"}"\nkey = "{pki.server_key}"\n'
        f'[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:{free_port()}"\nmodels = ["m"]\n'
    )
    child = ChildProcess(command, [command, "--config", str(config)], tmp_path / f"{command}.log")
    child.start()
    assert child.proc is not None
    assert child.proc.wait(timeout=120) == 2
    assert expected in child.log_tail() and "missing.pem" in child.log_tail()
