"""OpenTelemetry spans of each process, in-process, caught by the SDK's in-memory exporter.

``luftpause.observe.tracing.install`` puts a ``TracerProvider`` with a ``SimpleSpanProcessor`` into an
``InMemorySpanExporter`` in place of the OTLP export; every test takes it off again. The spans of
the three real processes at a real OTLP receiver are ``test_tracing_stack.py``'s.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import httpx2
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from runtime_helpers import make_run
from tracing_helpers import llm_typed

from luftpause.config import parse_config
from luftpause.observe import tracing
from luftpause.runtime.agent import spans as run_spans
from luftpause.runtime.agent.upstream import _traceparent_header
from luftpause.scheduler.grpc_service import SchedulerService
from luftpause.scheduler.host import SchedulerHost
from luftpause.testkit.launch.procs import free_port
from luftpause.v1 import scheduler_pb2 as pb
from luftpause.v1 import scheduler_pb2_grpc as pb_grpc

ONE_SLOT = parse_config(
    '[[replicas]]\nname = "solo"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\nmax_inflight = 1\n',
    "tracing.toml",
)


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    """Spans of this process, kept in memory while the test runs."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing.install(provider)
    try:
        yield exporter
    finally:
        tracing.shutdown()


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [span for span in exporter.get_finished_spans() if span.name == name]


async def until_spans(exporter: InMemorySpanExporter, name: str, count: int) -> list[ReadableSpan]:
    """The finished spans called ``name`` once there are ``count`` of them (10 s at most)."""
    for _ in range(1000):  # the exporter has nothing to wait on: polled every 10 ms
        if len(found := named(exporter, name)) >= count:
            return found
        await asyncio.sleep(0.01)
    raise AssertionError(f"{len(named(exporter, name))} {name!r} spans, not {count}")


# --- the shared module ------------------------------------------------------------------------------


def test_unset_endpoint_installs_nothing_and_the_sdk_is_never_imported() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    code = (
        "import sys\n"
        "from luftpause.observe import tracing\n"
        "import luftpause.dataplane.server.app, luftpause.scheduler.server, luftpause.runtime.server\n"
        "assert tracing.setup(tracing.DATAPLANE_SERVICE) is False\n"
        "assert tracing.active is False\n"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry.sdk')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_setup_with_an_endpoint_installs_the_otlp_exporter_under_the_service_name() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{free_port()}"
    code = (
        "from opentelemetry import trace\n"
        "from luftpause.observe import tracing\n"
        "assert tracing.setup(tracing.RUNTIME_SERVICE) is True\n"
        "assert tracing.active is True\n"
        "provider = trace.get_tracer_provider()\n"
        "print(provider.resource.attributes['service.name'])\n"
        "print(type(provider._active_span_processor._span_processors[0]._batch_processor._exporter).__name__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["luftpause-runtime", "OTLPSpanExporter"]


def test_traceparent_round_trips_through_inject_and_extract(spans: InMemorySpanExporter) -> None:
    with tracing.tracer().start_as_current_span("outer") as outer:
        value = tracing.traceparent_of(outer)
    assert value is not None
    context = outer.get_span_context()
    assert value == f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    assert tracing.trace_id_of(value) == f"{context.trace_id:032x}"
    child = tracing.tracer().start_span("child", context=tracing.parent(value))
    child.end()
    (done,) = named(spans, "child")
    assert done.parent is not None and done.parent.span_id == context.span_id
    assert done.context.trace_id == context.trace_id


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "garbage",
        "01-abc",
        "00-" + "g" * 32 + "-" + "1" * 16 + "-01",
        "00-" + "0" * 32 + "-" + "1" * 16 + "-01",  # all-zero trace id: invalid (W3C 3.2.2.3)
        "00-" + "a" * 32 + "-" + "0" * 16 + "-01",  # all-zero parent id
        "ff-" + "a" * 32 + "-" + "1" * 16 + "-01",  # version ff is forbidden
        "00-" + "A" * 32 + "-" + "1" * 16 + "-01",  # upper case is not allowed
    ],
)
def test_trace_id_of_an_invalid_traceparent_is_empty(value: str | None) -> None:
    assert tracing.trace_id_of(value) == ""


def test_tracestate_is_kept_with_the_traceparent(spans: InMemorySpanExporter) -> None:
    value = "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"
    child = tracing.tracer().start_span("child", context=tracing.parent(value, "vendor=opaque,other=1"))
    assert tracing.headers_of(child)["tracestate"] == "vendor=opaque,other=1"
    child.end()
    (done,) = named(spans, "child")
    assert done.context.trace_state.to_header() == "vendor=opaque,other=1"


@pytest.mark.parametrize(
    ("env", "exporter"),
    [
        ({"OTEL_TRACES_EXPORTER": "none"}, None),
        ({}, "opentelemetry.exporter.otlp.proto.http.trace_exporter"),
        (
            {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            "opentelemetry.exporter.otlp.proto.http.trace_exporter",
        ),
        ({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "opentelemetry.exporter.otlp.proto.grpc.trace_exporter"),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": " grpc "},
            "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        ),
        (  # the signal-specific variable wins
            {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "opentelemetry.exporter.otlp.proto.http.trace_exporter",
        ),
        (
            {"OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"},
            "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        ),
    ],
)
def test_exporter_and_protocol_variables_are_honoured(env: dict[str, str], exporter: str | None) -> None:
    code = (
        "from opentelemetry import trace\n"
        "from luftpause.observe import tracing\n"
        "if tracing.setup('x'):\n"
        "    processor = trace.get_tracer_provider()._active_span_processor._span_processors[0]\n"
        "    print(type(processor._batch_processor._exporter).__module__)\n"
        "else:\n"
        "    print(None)\n"
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", code],
        env={**base, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(exporter)]


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),  # the Python SDK exports no OTLP/JSON
        ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "gRPC"),  # the values are lower case
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "thrift"),
    ],
)
def test_an_unknown_protocol_is_refused_naming_the_variable(
    variable: str, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in [n for n in os.environ if n.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv(variable, value)
    expected = (
        f"{variable}={value} is not supported: luftpause exports OTLP traces over http/protobuf or grpc"
    )
    for call in (tracing.require_sdk, lambda: tracing.setup("x")):
        with pytest.raises(tracing.UnsupportedProtocol) as refused:
            call()
        assert str(refused.value).startswith(expected)
    assert tracing.active is False
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT")
    tracing.require_sdk()  # not exporting: the protocol is never read


def test_a_command_with_an_unknown_protocol_ends_with_one_line_and_exit_2(tmp_path: Any) -> None:
    config = tmp_path / "luftpause.toml"
    config.write_text(
        f'[scheduler]\ngrpc = "127.0.0.1:{free_port()}"\nhttp = "127.0.0.1:{free_port()}"\n\n'
        '[[replicas]]\nname = "solo"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\n'
    )
    base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env = {
        **base,
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json",
    }
    done = subprocess.run(
        [sys.executable, "-m", "luftpause", "scheduler", "--config", str(config)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("luftpause scheduler: OTEL_EXPORTER_OTLP_PROTOCOL=http/json is not supported"), (
        line
    )


def test_usage_attributes_leave_out_what_the_engine_did_not_report() -> None:
    assert tracing.usage_attributes(None, None, []) == {}
    assert tracing.usage_attributes(3, True, ["stop"]) == {
        "gen_ai.usage.input_tokens": 3,
        "gen_ai.response.finish_reasons": ["stop"],
    }


def test_a_malformed_traceparent_starts_a_new_trace(spans: InMemorySpanExporter) -> None:
    tracing.tracer().start_span("root", context=tracing.parent("not-a-traceparent")).end()
    (done,) = named(spans, "root")
    assert done.parent is None


# --- the scheduler: admit spans -------------------------------------------------------------------


class SchedulerStream:
    """One ``Connect`` stream to an in-process scheduler, answers collected by turn id."""

    def __init__(self, stub: pb_grpc.SchedulerStub) -> None:
        self.call = stub.Connect()
        self.answers: dict[str, asyncio.Future[pb.AdmitReply]] = {}
        self.reader: asyncio.Task[None] | None = None

    async def open(self) -> None:
        resync = pb.ResyncRequest(dataplane_id="dp-test")
        await self.call.write(pb.DataplaneMessage(items=[pb.DataplaneItem(resync=resync)]))
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while isinstance(message := await self.call.read(), pb.SchedulerMessage):
            for item in message.items:
                if item.WhichOneof("item") == "admitted":
                    self._future(item.admitted.turn_id).set_result(item.admitted)

    def _future(self, turn_id: str) -> asyncio.Future[pb.AdmitReply]:
        return self.answers.setdefault(turn_id, asyncio.get_running_loop().create_future())

    async def send(self, **item: Any) -> None:
        await self.call.write(pb.DataplaneMessage(items=[pb.DataplaneItem(**item)]))

    async def answer(self, turn_id: str) -> pb.AdmitReply:
        return await asyncio.wait_for(self._future(turn_id), 10)

    async def close(self) -> None:
        self.call.cancel()
        if self.reader is not None:
            self.reader.cancel()
            await asyncio.gather(self.reader, return_exceptions=True)


@pytest.fixture
async def scheduler() -> AsyncIterator[SchedulerStream]:
    """An in-process scheduler (one replica ``solo`` of model ``m``, one slot) and a stream to it."""
    port = free_port()
    server = grpc.aio.server()
    pb_grpc.add_SchedulerServicer_to_server(SchedulerService(SchedulerHost(ONE_SLOT)), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    stream = SchedulerStream(pb_grpc.SchedulerStub(channel))
    try:
        await stream.open()
        yield stream
    finally:
        await stream.close()
        await channel.close()
        await server.stop(None)


def admit_request(turn_id: str, run_id: str, traceparent: str = "") -> pb.AdmitRequest:
    return pb.AdmitRequest(
        turn_id=turn_id,
        run_id=run_id,
        model="m",
        caller="ann",
        dataplane_id="dp-test",
        traceparent=traceparent,
    )


@pytest.mark.anyio
async def test_admit_span_is_a_child_of_the_admit_traceparent_with_replica_and_held_ms(
    spans: InMemorySpanExporter, scheduler: SchedulerStream
) -> None:
    parent = tracing.tracer().start_span("dataplane turn")
    traceparent = tracing.traceparent_of(parent) or ""
    await scheduler.send(admit=admit_request("t1", "r1", traceparent))
    assert (await scheduler.answer("t1")).placed.replica == "solo"
    (admit,) = await until_spans(spans, "admit", 1)
    assert admit.kind is SpanKind.SERVER
    assert admit.context.trace_id == parent.get_span_context().trace_id
    assert admit.parent is not None and admit.parent.span_id == parent.get_span_context().span_id
    attributes = admit.attributes or {}
    assert attributes["luftpause.replica"] == "solo"
    assert attributes["luftpause.held_ms"] >= 0.0
    assert attributes["luftpause.turn_id"] == "t1"
    assert attributes["luftpause.run_id"] == "r1"
    assert attributes["luftpause.caller"] == "ann"
    # Not an LLM call: no gen_ai.* (Phoenix types a span with gen_ai.request.model as one).
    assert attributes["luftpause.model"] == "m"
    assert [key for key in attributes if key.startswith("gen_ai.")] == []


@pytest.mark.anyio
async def test_a_held_admit_span_lasts_until_its_placement_and_counts_the_wait(
    spans: InMemorySpanExporter, scheduler: SchedulerStream
) -> None:
    await scheduler.send(admit=admit_request("t1", "r1"))
    await scheduler.answer("t1")
    await scheduler.send(admit=admit_request("t2", "r2"))  # the one slot is taken: held
    await asyncio.sleep(0.05)
    assert len(named(spans, "admit")) == 1  # t2's span is still open while it is held
    # The finished event carries the trace id (ignored by this scheduler beyond its core event).
    finished = pb.TurnEvent(turn_id="t1", run_id="r1", kind=pb.TurnEvent.FINISHED, trace_id="ab" * 16)
    await scheduler.send(event=finished)
    assert (await scheduler.answer("t2")).placed.replica == "solo"
    admits = await until_spans(spans, "admit", 2)
    held = next(span for span in admits if (span.attributes or {})["luftpause.turn_id"] == "t2")
    assert (held.attributes or {})["luftpause.held_ms"] >= 50.0
    assert held.parent is None  # no traceparent came with it: a trace of its own


@pytest.mark.anyio
async def test_a_refused_admit_span_is_an_error(
    spans: InMemorySpanExporter, scheduler: SchedulerStream
) -> None:
    request = admit_request("t1", "r1")
    request.model = "no-such-model"
    await scheduler.send(admit=request)
    assert (await scheduler.answer("t1")).refused.http_status == 404
    (admit,) = await until_spans(spans, "admit", 1)
    assert admit.status.status_code is StatusCode.ERROR
    assert (admit.attributes or {})["luftpause.refused_status"] == 404


@pytest.mark.anyio
async def test_a_cancelled_held_admit_ends_its_span_as_abandoned(
    spans: InMemorySpanExporter, scheduler: SchedulerStream
) -> None:
    await scheduler.send(admit=admit_request("t1", "r1"))
    await scheduler.answer("t1")
    await scheduler.send(admit=admit_request("t2", "r2"))
    await scheduler.send(cancel=pb.CancelAdmit(turn_id="t2"))
    admits = await until_spans(spans, "admit", 2)
    abandoned = next(span for span in admits if (span.attributes or {})["luftpause.turn_id"] == "t2")
    assert (abandoned.attributes or {})["luftpause.abandoned"] is True
    assert "luftpause.replica" not in (abandoned.attributes or {})


@pytest.mark.anyio
async def test_a_leased_turn_gets_an_admit_span_when_the_scheduler_learns_of_it(
    spans: InMemorySpanExporter, scheduler: SchedulerStream
) -> None:
    parent = tracing.tracer().start_span("dataplane turn")
    leased = pb.LeasedTurn(
        turn_id="t9",
        run_id="r9",
        model="m",
        caller="bob",
        replica="solo",
        epoch=1,
        traceparent=tracing.traceparent_of(parent) or "",
    )
    await scheduler.send(leased=leased)
    (admit,) = await until_spans(spans, "admit", 1)
    attributes = admit.attributes or {}
    assert attributes["luftpause.leased"] is True
    assert attributes["luftpause.held_ms"] == 0.0
    assert attributes["luftpause.replica"] == "solo"
    assert admit.parent is not None and admit.parent.span_id == parent.get_span_context().span_id


@pytest.mark.anyio
async def test_no_admit_span_while_tracing_is_off(scheduler: SchedulerStream) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    # Installed nowhere: the scheduler's tracer is the no-op one, and nothing reaches this exporter.
    assert tracing.active is False
    await scheduler.send(admit=admit_request("t1", "r1", "00-" + "1" * 32 + "-" + "2" * 16 + "-01"))
    await scheduler.answer("t1")
    assert exporter.get_finished_spans() == ()
    provider.shutdown()


# --- the runtime: run, turn and tool-call spans ---------------------------------------------------


def test_a_child_runs_invoke_agent_span_is_a_child_of_its_parent_runs(spans: InMemorySpanExporter) -> None:
    parent = make_run("run-parent", name="planner")
    child = make_run("run-child", parent="run-parent")
    with run_spans.invoke_agent(parent):
        run_spans.spawned(child, None)  # spawned by the parent run (no MCP request)
    with run_spans.invoke_agent(child):
        pass
    (outer,) = named(spans, "invoke_agent planner")
    (inner,) = named(spans, "invoke_agent sub-agent")
    assert inner.parent is not None and inner.parent.span_id == outer.context.span_id
    assert inner.context.trace_id == outer.context.trace_id
    attributes = inner.attributes or {}
    assert attributes["gen_ai.agent.id"] == "run-child"
    assert attributes["gen_ai.conversation.id"] == "run-child"
    assert attributes["gen_ai.operation.name"] == "invoke_agent"
    assert attributes["luftpause.parent_run"] == "run-parent"


def test_a_reopened_runs_drive_is_a_child_of_the_send_request_and_links_its_earlier_drive(
    spans: InMemorySpanExporter,
) -> None:
    from types import SimpleNamespace

    run = make_run("run-reopened", name="worker")
    with run_spans.invoke_agent(run):
        pass
    send_traceparent = "00-" + "c" * 32 + "-" + "d" * 16 + "-01"
    # an MCP send request that carried its trace context as the HTTP header (no _meta)
    ctx = SimpleNamespace(
        request_context=SimpleNamespace(meta=None),
        headers={"traceparent": send_traceparent, "tracestate": "k=v"},
    )
    run_spans.reopened(run.handle, ctx)
    with run_spans.invoke_agent(run):
        pass
    first, second = named(spans, "invoke_agent worker")
    assert second.parent is not None
    assert (f"{second.context.trace_id:032x}", f"{second.parent.span_id:016x}") == ("c" * 32, "d" * 16)
    assert second.context.trace_state.get("k") == "v"
    (link,) = second.links
    assert link.context == first.context
    assert (link.attributes or {})["luftpause.link"] == "previous_drive"
    assert not first.links


def test_turn_and_execute_tool_spans_are_children_of_invoke_agent(spans: InMemorySpanExporter) -> None:
    run = make_run("run-1")
    reply = {
        "id": "chatcmpl-1",
        "model": "m-served",
        "choices": [{"finish_reason": "tool_calls", "message": {}}],
        "usage": {"prompt_tokens": 12, "completion_tokens": 5},
    }
    call = {"id": "call_7", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
    with run_spans.invoke_agent(run):
        with run_spans.turn(run) as turn_span:
            headers = run_spans.traceparent_headers()
            run_spans.turn_reply(turn_span, reply)
        with run_spans.execute_tool(call) as tool_span:
            meta = run_spans.current_meta()
            run_spans.tool_outcome(tool_span, True, "Error: no such page")
    (agent,) = named(spans, "invoke_agent sub-agent")
    (turn,) = named(spans, f"turn {run.spec.model}")
    (tool,) = named(spans, "execute_tool lookup")
    assert turn.kind is SpanKind.CLIENT
    for span in (turn, tool):
        assert span.parent is not None and span.parent.span_id == agent.context.span_id
    context = turn.context
    assert (
        headers["traceparent"]
        == f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
    )
    assert meta is not None and tracing.trace_id_of(meta["traceparent"]) == f"{tool.context.trace_id:032x}"
    assert dict(turn.attributes or {}) == {
        "luftpause.run_id": "run-1",
        "luftpause.model": run.spec.model,
        "luftpause.max_tokens": run.spec.max_tokens,
        "luftpause.finish_reasons": ("tool_calls",),
        "luftpause.prompt_tokens": 12,
        "luftpause.completion_tokens": 5,
    }
    tool_attributes = tool.attributes or {}
    assert tool_attributes["gen_ai.tool.name"] == "lookup"
    assert tool_attributes["gen_ai.tool.call.id"] == "call_7"
    assert tool_attributes["gen_ai.tool.type"] == "extension"  # run agent-side, by the runtime
    assert (agent.attributes or {})["gen_ai.provider.name"] == tracing.PROVIDER
    assert tool.status.status_code is StatusCode.ERROR


def test_the_runtimes_turn_span_is_not_an_llm_call_and_the_dataplanes_is(
    spans: InMemorySpanExporter,
) -> None:
    from luftpause.dataplane.relay import turn_spans

    run = make_run("run-typed")
    with run_spans.invoke_agent(run), run_spans.turn(run) as turn_span:
        run_spans.turn_reply(turn_span, {"choices": [{"finish_reason": "stop"}]})
        dataplane_span = turn_spans.start(_dataplane_turn())
        dataplane_span.end()
    typed = {span.name: llm_typed(span.attributes or {}) for span in spans.get_finished_spans()}
    assert typed == {f"turn {run.spec.model}": False, "chat m": True, "invoke_agent sub-agent": False}


def test_a_reply_without_usage_records_no_token_counts(spans: InMemorySpanExporter) -> None:
    run = make_run("run-2")
    with run_spans.invoke_agent(run), run_spans.turn(run) as turn_span:
        run_spans.turn_reply(
            turn_span, {"choices": [{"finish_reason": "stop"}], "usage": {"prompt_tokens": "3"}}
        )
    (turn,) = named(spans, f"turn {run.spec.model}")
    attributes = turn.attributes or {}
    assert "luftpause.prompt_tokens" not in attributes and "luftpause.completion_tokens" not in attributes
    assert attributes["luftpause.finish_reasons"] == ("stop",)


def _mcp_request(traceparent: str) -> Any:
    """An MCP request's SDK ``Context`` as :mod:`luftpause.runtime.agent.spans` reads it: one that
    carried its trace context as the HTTP header (no ``_meta``)."""
    from types import SimpleNamespace

    return SimpleNamespace(request_context=SimpleNamespace(meta=None), headers={"traceparent": traceparent})


def test_an_await_span_is_in_its_requests_trace_and_links_every_run_it_waits_on(
    spans: InMemorySpanExporter,
) -> None:
    finished, running, unknown = make_run("run-done"), make_run("run-live"), "run-never-traced"
    with run_spans.invoke_agent(finished):
        pass
    request = "00-" + "a1" * 16 + "-" + "b2" * 8 + "-01"
    with run_spans.invoke_agent(running):
        with run_spans.touching(
            "await", [finished.handle, running.handle, unknown, running.handle], _mcp_request(request)
        ):
            pass
    (await_span,) = named(spans, "await")
    (done_drive,) = named(spans, "invoke_agent sub-agent")[:1]
    live_drive = next(
        s
        for s in named(spans, "invoke_agent sub-agent")
        if (s.attributes or {})["gen_ai.agent.id"] == "run-live"
    )
    assert await_span.parent is not None
    assert (f"{await_span.context.trace_id:032x}", f"{await_span.parent.span_id:016x}") == (
        "a1" * 16,
        "b2" * 8,
    )
    assert await_span.kind is SpanKind.INTERNAL
    assert (await_span.attributes or {})["luftpause.run_ids"] == ("run-done", "run-live", unknown)
    linked = [(link.context, dict(link.attributes or {})) for link in await_span.links]
    assert linked == [
        (done_drive.context, {"luftpause.link": "awaits", "luftpause.run_id": "run-done"}),
        (live_drive.context, {"luftpause.link": "awaits", "luftpause.run_id": "run-live"}),
    ]  # the ended drive, the open one; none for a run the runtime has no span of
    assert not llm_typed(await_span.attributes or {})


def test_a_read_span_links_the_run_it_reads(spans: InMemorySpanExporter) -> None:
    run = make_run("run-read")
    with run_spans.invoke_agent(run):
        pass
    with run_spans.touching("read", [run.handle], _mcp_request("00-" + "c3" * 16 + "-" + "d4" * 8 + "-01")):
        pass
    (read,) = named(spans, "read")
    (drive,) = named(spans, "invoke_agent sub-agent")
    ((link_context, attributes),) = [(link.context, dict(link.attributes or {})) for link in read.links]
    assert link_context == drive.context and attributes["luftpause.link"] == "reads"


def test_a_run_not_driven_yet_is_linked_where_its_drive_will_start(spans: InMemorySpanExporter) -> None:
    spawn_request = "00-" + "e5" * 16 + "-" + "f6" * 8 + "-01"
    run = make_run("run-pending")
    run_spans.spawned(run, _mcp_request(spawn_request))
    with run_spans.touching("await", [run.handle], _mcp_request("00-" + "17" * 16 + "-" + "28" * 8 + "-01")):
        pass
    (await_span,) = named(spans, "await")
    (link,) = await_span.links
    assert (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") == ("e5" * 16, "f6" * 8)
    with run_spans.invoke_agent(run):  # its drive then starts there: the link named its trace
        pass
    (drive,) = named(spans, "invoke_agent sub-agent")
    assert f"{drive.context.trace_id:032x}" == "e5" * 16


def _dataplane_turn(traceparent: str = "", tracestate: str = "") -> Any:
    from types import SimpleNamespace

    return SimpleNamespace(
        single_pass=False,
        model="m",
        turn_id="t-1",
        run_id="r-1",
        service_class=pb.INTERACTIVE,
        caller="c",
        traceparent=traceparent,
        tracestate=tracestate,
        body=b'{"model": "m", "max_tokens": 8, "temperature": 0.5, "stop": "END", "n": 2, "seed": true}',
    )


def test_the_engine_requests_span_is_a_client_child_of_the_turns_with_the_requests_parameters(
    spans: InMemorySpanExporter,
) -> None:
    from luftpause.dataplane.relay import turn_spans

    turn = _dataplane_turn()
    turn_span = turn_spans.start(turn, ("127.0.0.1", 8080))
    engine_span = turn_spans.engine_start(turn, "sim-0", "https://engine.example:8443", turn_span)
    turn_spans.answered((turn_span, engine_span), 6, "chatcmpl-9", "m-served")
    for span in (engine_span, turn_span):
        turn_spans.ended(span, pb.TurnEvent.FINISHED, {"finish_reason": "stop", "prompt_tokens": 9})
        span.end()
    served, called = sorted(named(spans, "chat m"), key=lambda s: s.kind.value)
    assert (served.kind, called.kind) == (SpanKind.SERVER, SpanKind.CLIENT)
    assert called.parent is not None and called.parent.span_id == served.context.span_id
    shared = {
        "gen_ai.request.max_tokens": 8,
        "gen_ai.request.temperature": 0.5,
        "gen_ai.request.stop_sequences": ("END",),
        "gen_ai.request.choice.count": 2,
        "gen_ai.response.id": "chatcmpl-9",
        "gen_ai.response.model": "m-served",
        "gen_ai.usage.cache_read.input_tokens": 6,
        "gen_ai.usage.input_tokens": 9,
        "gen_ai.response.finish_reasons": ("stop",),
    }
    for span in (served, called):
        attributes = dict(span.attributes or {})
        assert {key: attributes.get(key) for key in shared} == shared
        assert "gen_ai.request.seed" not in attributes  # a boolean is no seed
    assert (called.attributes or {})["server.address"] == "engine.example"
    assert (called.attributes or {})["server.port"] == 8443
    assert (served.attributes or {})["server.port"] == 8080


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"finish_reason": "stop"}, {}),
        (
            {"finish_reason": "stop", "prompt_tokens": 0, "completion_tokens": 7},
            {"gen_ai.usage.input_tokens": 0, "gen_ai.usage.output_tokens": 7},
        ),
    ],
)
def test_the_dataplane_chat_span_names_its_provider_and_only_reported_usage(
    spans: InMemorySpanExporter, fields: dict[str, Any], expected: dict[str, int]
) -> None:
    from luftpause.dataplane.relay import turn_spans

    span = turn_spans.start(_dataplane_turn())
    turn_spans.ended(span, pb.TurnEvent.FINISHED, fields)
    span.end()
    (done,) = named(spans, "chat m")
    attributes = dict(done.attributes or {})
    assert attributes["gen_ai.provider.name"] == tracing.PROVIDER
    assert attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert {k: v for k, v in attributes.items() if k.startswith("gen_ai.usage.")} == expected


def test_no_runtime_spans_or_headers_while_tracing_is_off() -> None:
    run = make_run("run-off")
    with run_spans.invoke_agent(run), run_spans.turn(run) as span:
        assert span is None
        assert run_spans.traceparent_headers() == {}
        assert run_spans.current_meta() is None


@pytest.mark.anyio
async def test_an_http_tool_call_carries_its_meta_traceparent_as_the_header(
    spans: InMemorySpanExporter,
) -> None:
    value = "00-" + "a" * 32 + "-" + "b" * 16 + "-01"
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "x", "_meta": {"traceparent": value}},
    }
    request = httpx2.Request("POST", "http://127.0.0.1:1/mcp", content=json.dumps(body).encode())
    await _traceparent_header(request)
    assert request.headers["traceparent"] == value
    plain = httpx2.Request("POST", "http://127.0.0.1:1/mcp", content=b'{"jsonrpc": "2.0", "method": "ping"}')
    await _traceparent_header(plain)
    assert "traceparent" not in plain.headers


# --- the test kit's OTLP/HTTP receiver -------------------------------------------------------------


@pytest.fixture
async def otlp_receiver() -> AsyncIterator[str]:
    """The receiver's app served in this process on a free port; its base URL."""
    from aiohttp import web

    from luftpause.testkit.fakes.otlp_receiver import receiver_app

    runner = web.AppRunner(receiver_app())
    await runner.setup()
    port = free_port()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@pytest.mark.anyio
async def test_the_receiver_keeps_times_events_links_and_trace_state(
    spans: InMemorySpanExporter, otlp_receiver: str
) -> None:
    import gzip

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.trace import Link

    earlier = tracing.tracer().start_span("earlier")
    earlier.end()
    context = tracing.parent("00-" + "e" * 32 + "-" + "f" * 16 + "-01", "k=v")
    span = tracing.tracer().start_span(
        "later", context=context, links=[Link(earlier.get_span_context(), {"why": "before"})]
    )
    span.add_event("retried", {"attempt": 2})
    span.set_status(StatusCode.ERROR, "boom")
    span.end()
    (done,) = named(spans, "later")
    body = gzip.compress(encode_spans([done]).SerializeToString())
    async with httpx2.AsyncClient() as client:
        posted = await client.post(
            f"{otlp_receiver}/v1/traces",
            content=body,
            headers={"content-type": "application/x-protobuf", "content-encoding": "gzip"},
        )
        assert posted.status_code == 200
        (got,) = (await client.get(f"{otlp_receiver}/spans")).json()
    assert (got["trace_id"], got["parent_span_id"], got["trace_state"]) == ("e" * 32, "f" * 16, "k=v")
    assert (got["start_time_unix_nano"], got["end_time_unix_nano"]) == (done.start_time, done.end_time)
    assert got["end_time_unix_nano"] >= got["start_time_unix_nano"] > 0
    assert (got["status"], got["status_message"]) == (2, "boom")
    (event,) = got["events"]
    assert (event["name"], event["attributes"], event["time_unix_nano"]) == (
        "retried",
        {"attempt": 2},
        done.events[0].timestamp,
    )
    (link,) = got["links"]
    assert (link["trace_id"], link["span_id"]) == (
        f"{earlier.get_span_context().trace_id:032x}",
        f"{earlier.get_span_context().span_id:016x}",
    )
    assert link["attributes"] == {"why": "before"}


@pytest.mark.anyio
async def test_the_receiver_refuses_a_body_that_is_not_gzip_with_400(otlp_receiver: str) -> None:
    async with httpx2.AsyncClient() as client:
        posted = await client.post(
            f"{otlp_receiver}/v1/traces",
            content=b"not gzip at all",
            headers={"content-type": "application/x-protobuf", "content-encoding": "gzip"},
        )
        assert posted.status_code == 400, posted.text
        assert (await client.get(f"{otlp_receiver}/spans")).json() == []


@pytest.mark.anyio
async def test_the_grpc_receiver_takes_what_the_sdks_grpc_exporter_sends(spans: InMemorySpanExporter) -> None:
    """OTLP/gRPC's ``TraceService/Export`` as the SDK's own exporter calls it (gzip too), into the
    same list ``GET /spans`` answers from."""
    from aiohttp import web
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    from luftpause.testkit.fakes.otlp_receiver import receiver_app, start_grpc_receiver

    received: list[dict[str, Any]] = []
    grpc_port, http_port = free_port(), free_port()
    server = await start_grpc_receiver(received, "127.0.0.1", grpc_port)
    runner = web.AppRunner(receiver_app(received))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", http_port).start()
    try:
        span = tracing.tracer().start_span("over grpc", attributes={"k": "v"})
        span.end()
        (done,) = named(spans, "over grpc")
        for compression in (False, True):
            exporter = OTLPSpanExporter(
                endpoint=f"http://127.0.0.1:{grpc_port}",
                insecure=True,
                compression=grpc.Compression.Gzip if compression else grpc.Compression.NoCompression,
            )
            # the exporter's blocking call, off the loop that serves the receiver
            result = await asyncio.to_thread(exporter.export, [done])
            exporter.shutdown()
            assert result is SpanExportResult.SUCCESS
        async with httpx2.AsyncClient() as client:
            got = (await client.get(f"http://127.0.0.1:{http_port}/spans")).json()
        assert [(g["name"], g["protocol"], g["attributes"]) for g in got] == [
            ("over grpc", "grpc", {"k": "v"})
        ] * 2
        assert got[0]["span_id"] == f"{done.context.span_id:016x}"
    finally:
        await runner.cleanup()
        await server.stop(None)


def test_the_receivers_help_describes_its_options() -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "luftpause.testkit.fakes.otlp_receiver", "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    assert "address to listen on (default: 127.0.0.1)" in " ".join(shown.split())
    assert "TCP port to listen on" in shown
    assert "--grpc-port" in shown and "OTLP/gRPC" in shown


@pytest.mark.anyio
async def test_a_failed_turn_is_logged_at_the_scheduler_with_its_trace_id(
    scheduler: SchedulerStream, caplog: pytest.LogCaptureFixture
) -> None:
    await scheduler.send(admit=admit_request("t1", "r1"))
    await scheduler.answer("t1")
    trace_id = "ab" * 16
    failed = pb.TurnEvent(
        turn_id="t1", run_id="r1", kind=pb.TurnEvent.FAILED, error="engine said 500", trace_id=trace_id
    )
    with caplog.at_level("WARNING", logger="luftpause.scheduler"):
        await scheduler.send(event=failed)
        # the slot it frees takes the next admit: by then the event was applied (and logged)
        await scheduler.send(admit=admit_request("t2", "r2"))
        assert (await scheduler.answer("t2")).WhichOneof("outcome") == "placed"
    (record,) = [r for r in caplog.records if getattr(r, "trace_id", None) is not None]
    assert (record.trace_id, record.turn_id, record.run_id) == (trace_id, "t1", "r1")  # type: ignore[attr-defined]
    assert "engine said 500" in record.getMessage()
