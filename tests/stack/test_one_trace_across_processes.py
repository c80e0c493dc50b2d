"""One sub-agent run, one trace across the three processes, seen at a real OTLP receiver, over
OTLP/HTTP and over OTLP/gRPC.

The receiver (``luftpause.testkit.fakes.otlp_receiver``, protobuf decoded with ``opentelemetry-proto``,
gRPC served by ``grpcio`` with its service stubs) runs as its own process on an HTTP and a gRPC
port; one stack is started with ``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at its HTTP port, another
with ``OTEL_EXPORTER_OTLP_PROTOCOL=grpc`` and its gRPC port, each with a 100 ms batch-export delay.
A run is spawned with the real ``mcp`` client whose HTTP requests carry a ``traceparent``; every
span of that run must be in the caller's trace, with the parent links invoke_agent -> turn ->
dataplane chat -> admit and dataplane chat -> the engine request's client span (whose context
is what the engine receives), invoke_agent -> execute_tool; two spans typed as an LLM call per
turn (the dataplane's ``chat``, kind SERVER, and its engine request's, kind CLIENT), with the
request's parameters and the answer's id, model, usage and finish reasons; and the ``await`` span
linked to the run's ``invoke_agent``.
"""

from __future__ import annotations

import asyncio
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from tracing_helpers import llm_typed

from luftpause.testkit.launch.procs import ChildProcess, free_port
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CALLER_SPAN_ID = "b7ad6b7169203331"
TRACEPARENT = f"00-{TRACE_ID}-{CALLER_SPAN_ID}-01"


@pytest.fixture(scope="module")
def receiver_ports() -> tuple[int, int]:
    """The receiver's HTTP and gRPC ports."""
    return free_port(), free_port()


@pytest.fixture(scope="module")
def receiver(tmp_path_factory: pytest.TempPathFactory, receiver_ports: tuple[int, int]) -> Iterator[str]:
    """The OTLP receiver process (HTTP and gRPC); its HTTP base URL."""
    port, grpc_port = receiver_ports
    workdir = tmp_path_factory.mktemp("otlp")
    child = ChildProcess(
        "otlp-receiver",
        ["--port", str(port), "--grpc-port", str(grpc_port)],
        workdir / "otlp.log",
        ready_url=f"http://127.0.0.1:{port}/health",
        program=(sys.executable, "-m", "luftpause.testkit.fakes.otlp_receiver"),
    )
    child.start()
    try:
        child.wait_ready()
        yield f"http://127.0.0.1:{port}"
    finally:
        child.stop()


@pytest.fixture(scope="module")
def traced_stack(tmp_path_factory: pytest.TempPathFactory, receiver: str) -> Iterator[Stack]:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver, "OTEL_BSP_SCHEDULE_DELAY": "100"}
    stack = Stack.start(Path(tmp_path_factory.mktemp("traced")), tool_rounds=1, env=env)
    try:
        yield stack
    finally:
        stack.stop()


@pytest.fixture(scope="module")
def grpc_traced_stack(
    tmp_path_factory: pytest.TempPathFactory, receiver: str, receiver_ports: tuple[int, int]
) -> Iterator[Stack]:
    """A stack that exports over OTLP/gRPC (``http://`` in the endpoint: plaintext)."""
    env = {
        "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver_ports[1]}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
    }
    stack = Stack.start(Path(tmp_path_factory.mktemp("traced-grpc")), tool_rounds=1, env=env)
    try:
        yield stack
    finally:
        stack.stop()


SPAN_KIND_SERVER = 2
SPAN_KIND_CLIENT = 3
"""OTLP's ``Span.SpanKind`` values (opentelemetry-proto ``trace.proto``)."""


def received(receiver: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{receiver}/spans", timeout=10) as response:
        spans: list[dict[str, Any]] = orjson.loads(response.read())
        return spans


def spawn_and_await(stack: Stack, traceparent: str = TRACEPARENT) -> dict[str, Any]:
    """Spawn a run with the real ``mcp`` client whose requests carry ``traceparent``; the run as
    ``await`` reports it ended."""

    async def scenario() -> dict[str, Any]:
        http_client = create_mcp_http_client(headers={"traceparent": traceparent})
        async with (
            http_client,
            Client(streamable_http_client(stack.runtime_url, http_client=http_client)) as client,
        ):
            spawned = await client.call_tool("spawn", {"task": "Find two facts about tides."})
            assert not spawned.is_error, spawned
            handle = spawned.structured_content["handle"]  # type: ignore[index]
            awaited = await client.call_tool("await", {"handles": [handle], "timeout": 120})
            assert not awaited.is_error, awaited
            run: dict[str, Any] = awaited.structured_content["runs"][0]  # type: ignore[index]
            return run

    return asyncio.run(scenario())


SPAWN_TRACE_ID = "5c2e0b7e1f8a4d3b9a6c0d1e2f3a4b5c"
SEND_TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
SEND_SPAN_ID = "00f067aa0ba902b7"


def test_a_run_reopened_by_send_drives_in_the_send_requests_trace_linked_to_its_first(
    traced_stack: Stack, receiver: str
) -> None:
    # its own traces: the one-trace test counts every span of TRACE_ID
    first = spawn_and_await(traced_stack, f"00-{SPAWN_TRACE_ID}-{CALLER_SPAN_ID}-01")
    assert first["state"] == "completed", first
    handle = first["handle"]

    async def send_and_await() -> dict[str, Any]:
        headers = {"traceparent": f"00-{SEND_TRACE_ID}-{SEND_SPAN_ID}-01"}
        http_client = create_mcp_http_client(headers=headers)
        async with (
            http_client,
            Client(streamable_http_client(traced_stack.runtime_url, http_client=http_client)) as client,
        ):
            sent = await client.call_tool("send", {"handle": handle, "message": "One more fact, please."})
            assert not sent.is_error, sent
            assert sent.structured_content["delivered"] == "now"  # type: ignore[index]
            awaited = await client.call_tool("await", {"handles": [handle], "timeout": 120})
            assert not awaited.is_error, awaited
            read = await client.call_tool("read", {"handle": handle})
            assert not read.is_error, read
            run: dict[str, Any] = awaited.structured_content["runs"][0]  # type: ignore[index]
            return run

    assert asyncio.run(send_and_await())["state"] == "completed"

    def drives(spans: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            s
            for s in spans
            if s["name"].startswith("invoke_agent ") and s["attributes"].get("gen_ai.agent.id") == handle
        ]

    deadline = time.monotonic() + 30
    found = drives(received(receiver))
    while len(found) < 2 and time.monotonic() < deadline:
        time.sleep(0.2)
        found = drives(received(receiver))
    assert len(found) == 2, (found, traced_stack.logs())
    earlier, again = sorted(found, key=lambda s: s["start_time_unix_nano"])
    assert (earlier["trace_id"], earlier["parent_span_id"]) == (SPAWN_TRACE_ID, CALLER_SPAN_ID)
    assert (again["trace_id"], again["parent_span_id"]) == (SEND_TRACE_ID, SEND_SPAN_ID)
    assert [(link["trace_id"], link["span_id"]) for link in again["links"]] == [
        (earlier["trace_id"], earlier["span_id"])
    ]
    # the read after it: in the send request's trace, linked to the drive it read
    reads = [s for s in received(receiver) if s["name"] == "read" and s["trace_id"] == SEND_TRACE_ID]
    while not reads and time.monotonic() < deadline:
        time.sleep(0.2)
        reads = [s for s in received(receiver) if s["name"] == "read" and s["trace_id"] == SEND_TRACE_ID]
    (read,) = reads
    assert [(link["span_id"], link["attributes"]["luftpause.link"]) for link in read["links"]] == [
        (again["span_id"], "reads")
    ]


def check_one_trace(stack: Stack, receiver: str, trace_id: str, protocol: str) -> None:
    """Spawn and await a run in trace ``trace_id``; check its spans as the module docstring says,
    each received over ``protocol`` (``http`` or ``grpc``)."""
    run = spawn_and_await(stack, f"00-{trace_id}-{CALLER_SPAN_ID}-01")
    assert run["state"] == "completed", run
    assert run["toolCalls"] >= 1

    # every span of the run, counted: each process exports in its own batches, so the dataplane's
    # span of the last turn may arrive after the runtime's spans (CI saw 1 of 2)
    expected = {
        ("luftpause-runtime", "invoke_agent"): 1,
        ("luftpause-runtime", "turn"): run["turns"],
        ("luftpause-runtime", "execute_tool"): run["toolCalls"],
        ("luftpause-runtime", "await"): 1,
        ("luftpause-dataplane", "chat"): 2 * run["turns"],  # the turn's, and its engine request's
        ("luftpause-scheduler", "admit"): run["turns"],
    }

    def wanted(spans: list[dict[str, Any]]) -> bool:
        counts: dict[tuple[str, str], int] = {}
        for s in spans:
            if s["trace_id"] == trace_id:
                key = (s["service"], s["name"].split(" ")[0])
                counts[key] = counts.get(key, 0) + 1
        return all(counts.get(key, 0) >= n for key, n in expected.items())

    deadline = time.monotonic() + 30
    spans = received(receiver)
    while not wanted(spans) and time.monotonic() < deadline:
        time.sleep(0.2)
        spans = received(receiver)
    ours = [s for s in spans if s["trace_id"] == trace_id]
    assert wanted(spans), (ours, stack.logs())
    assert {s["protocol"] for s in ours} == {protocol}
    assert {s["service"] for s in ours} >= {"luftpause-runtime", "luftpause-dataplane", "luftpause-scheduler"}

    by_id = {s["span_id"]: s for s in ours}

    def of(service: str, operation: str) -> list[dict[str, Any]]:
        return [s for s in ours if s["service"] == service and s["name"].split(" ")[0] == operation]

    (agent,) = of("luftpause-runtime", "invoke_agent")
    assert agent["parent_span_id"] == CALLER_SPAN_ID  # the spawn request's traceparent
    assert agent["attributes"]["gen_ai.agent.id"] == run["handle"]
    assert agent["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert agent["attributes"]["luftpause.state"] == "completed"

    runtime_turns = of("luftpause-runtime", "turn")
    assert len(runtime_turns) == run["turns"] >= 2  # a tool round, then the answer
    for turn in runtime_turns:
        assert turn["parent_span_id"] == agent["span_id"]
        assert turn["name"] == f"turn {stack.model}"
        assert turn["attributes"]["luftpause.completion_tokens"] > 0
        assert turn["attributes"]["luftpause.finish_reasons"]

    tools = of("luftpause-runtime", "execute_tool")
    assert len(tools) == run["toolCalls"]
    for tool in tools:
        assert tool["parent_span_id"] == agent["span_id"]
        assert tool["attributes"]["gen_ai.tool.name"] == tool["name"].split(" ", 1)[1]
        assert tool["attributes"]["gen_ai.tool.call.id"]

    chats = [s for s in of("luftpause-dataplane", "chat") if s["kind"] == SPAN_KIND_SERVER]
    engine_calls = [s for s in of("luftpause-dataplane", "chat") if s["kind"] == SPAN_KIND_CLIENT]
    assert len(chats) == len(engine_calls) == len(runtime_turns)
    for chat in chats:
        assert by_id[chat["parent_span_id"]]["service"] == "luftpause-runtime"
        assert by_id[chat["parent_span_id"]]["name"].startswith("turn ")
        assert chat["attributes"]["luftpause.run_id"] == run["handle"]
        assert chat["attributes"]["luftpause.replica"] in ("sim-0", "sim-1")
        assert chat["attributes"]["gen_ai.usage.output_tokens"] > 0
        # completed with what the engine was asked and answered (the runtime asks 256 tokens)
        assert chat["attributes"]["gen_ai.request.max_tokens"] == 256
        assert chat["attributes"]["gen_ai.response.id"].startswith("chatcmpl-")
        assert chat["attributes"]["gen_ai.response.model"] == stack.model
        assert chat["attributes"]["gen_ai.response.finish_reasons"]
        assert chat["attributes"]["server.address"] == "127.0.0.1"
        assert chat["attributes"]["server.port"] == int(stack.dataplane_url.rsplit(":", 1)[1])
    engine_ports = {int(url.rsplit(":", 1)[1]) for url in stack.engine_urls}
    for call in engine_calls:
        chat = by_id[call["parent_span_id"]]  # a child of the turn's span, in the same trace
        assert chat in chats
        assert call["name"] == f"chat {stack.model}"
        assert call["attributes"]["server.address"] == "127.0.0.1"
        assert call["attributes"]["server.port"] in engine_ports
        for name in (
            "gen_ai.operation.name",
            "gen_ai.request.model",
            "gen_ai.request.max_tokens",
            "gen_ai.response.id",
            "gen_ai.response.model",
            "gen_ai.response.finish_reasons",
            "gen_ai.usage.input_tokens",
            "gen_ai.usage.output_tokens",
            "luftpause.turn_id",
            "luftpause.replica",
        ):
            assert call["attributes"][name] == chat["attributes"][name], name
        assert chat["start_time_unix_nano"] <= call["start_time_unix_nano"]
        assert call["end_time_unix_nano"] <= chat["end_time_unix_nano"]

    admits = of("luftpause-scheduler", "admit")
    assert len(admits) == len(chats)
    chat_ids = {t["span_id"] for t in chats}
    for admit in admits:
        assert admit["parent_span_id"] in chat_ids
        parent = by_id[admit["parent_span_id"]]
        assert admit["attributes"]["luftpause.replica"] == parent["attributes"]["luftpause.replica"]
        assert admit["attributes"]["luftpause.held_ms"] >= 0
        assert admit["attributes"]["luftpause.turn_id"] == parent["attributes"]["luftpause.turn_id"]
        assert admit["attributes"]["luftpause.model"] == stack.model

    # Typed as LLM calls: the dataplane's two per turn (the turn it served, the engine request it
    # made), never the runtime's turn or the scheduler's admit.
    typed = sorted((s["service"], s["kind"]) for s in ours if llm_typed(s["attributes"]))
    dataplane = [("luftpause-dataplane", SPAN_KIND_SERVER), ("luftpause-dataplane", SPAN_KIND_CLIENT)]
    assert typed == sorted(dataplane * run["turns"])

    # The await call: in its request's trace, linked to the run it waited on.
    (awaited,) = of("luftpause-runtime", "await")
    assert awaited["parent_span_id"] == CALLER_SPAN_ID
    assert awaited["attributes"]["luftpause.run_ids"] == [run["handle"]]
    assert [(link["trace_id"], link["span_id"], link["attributes"]) for link in awaited["links"]] == [
        (trace_id, agent["span_id"], {"luftpause.link": "awaits", "luftpause.run_id": run["handle"]})
    ]


def test_one_sub_agent_run_is_one_trace_across_the_three_processes(
    traced_stack: Stack, receiver: str
) -> None:
    check_one_trace(traced_stack, receiver, TRACE_ID, "http")


GRPC_TRACE_ID = "9d2b5f1c3e4a4b6d8f0a1b2c3d4e5f60"


def test_over_otlp_grpc_the_run_is_the_same_one_trace(grpc_traced_stack: Stack, receiver: str) -> None:
    check_one_trace(grpc_traced_stack, receiver, GRPC_TRACE_ID, "grpc")


TRACESTATE = "congo=t61rcWkgMzE,rojo=00f067aa0ba902b7"
TURN_TRACE_ID = "d4cda95b652f4a1592b449d5929fda1b"
TURN_TRACEPARENT = f"00-{TURN_TRACE_ID}-{CALLER_SPAN_ID}-01"
"""A lone turn's trace (not :data:`TRACE_ID`, whose spans the one-trace test counts)."""


def traced_turn(dataplane_url: str, engine_urls: list[str], model: str) -> dict[str, str]:
    """One chat turn through the dataplane sent with :data:`TURN_TRACEPARENT` and :data:`TRACESTATE`;
    the request headers the simulated engine received for it (lower-case names)."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    request = urllib.request.Request(
        f"{dataplane_url}/v1/chat/completions",
        data=orjson.dumps(body),
        headers={
            "content-type": "application/json",
            "traceparent": TURN_TRACEPARENT,
            "tracestate": TRACESTATE,
        },
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as response:
        completion_id = orjson.loads(response.read())["id"]
    for url in engine_urls:
        try:
            with urllib.request.urlopen(f"{url}/testkit/received/{completion_id}", timeout=10) as found:
                headers: dict[str, str] = orjson.loads(found.read())
                return headers
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise
    raise AssertionError(f"no engine served {completion_id}")


def test_the_dataplane_forwards_tracestate_with_its_engine_request_span_as_parent(
    traced_stack: Stack, receiver: str
) -> None:
    engine_saw = traced_turn(traced_stack.dataplane_url, traced_stack.engine_urls, traced_stack.model)
    version, trace_id, span_id, _ = engine_saw["traceparent"].split("-")
    assert (version, trace_id) == ("00", TURN_TRACE_ID)
    assert span_id != CALLER_SPAN_ID
    assert engine_saw["tracestate"] == TRACESTATE
    # the engine's parent is the engine request's client span, a child of the turn's span
    deadline = time.monotonic() + 30
    spans: dict[str, dict[str, Any]] = {}
    while span_id not in spans and time.monotonic() < deadline:
        time.sleep(0.2)
        spans = {s["span_id"]: s for s in received(receiver) if s["trace_id"] == TURN_TRACE_ID}
    call = spans[span_id]
    assert call["kind"] == SPAN_KIND_CLIENT and call["service"] == "luftpause-dataplane"
    assert call["attributes"]["gen_ai.request.max_tokens"] == 2
    turn = spans[call["parent_span_id"]]
    assert turn["kind"] == SPAN_KIND_SERVER and turn["parent_span_id"] == CALLER_SPAN_ID


def test_with_tracing_off_traceparent_and_tracestate_pass_through_unchanged(stack: Stack) -> None:
    received = traced_turn(stack.dataplane_url, stack.engine_urls, stack.model)
    assert received["traceparent"] == TURN_TRACEPARENT
    assert received["tracestate"] == TRACESTATE
