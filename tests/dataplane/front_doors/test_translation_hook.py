"""The relay's loop (``relay/loop.py``) with a front door's translation (``Turn.translation``,
the Anthropic Messages translator of ``luftpause.dataplane.apis``): the client gets what the
translator makes of the engine's answer, while every fact (first token, finish reason, usage,
tool-call ids) is still read from the engine's own Chat Completions answer and reported through
the loop's one report function to the run table, the tool-call table, the metrics and the link.

The loop runs in the test's loop against an engine on asyncio sockets; its client is a stand-in
for granian's ASGI ``send``. The machine's rules on any split are ``test_relay_machine``'s.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson
import pytest

from luftpause.config import ReplicaConfig
from luftpause.dataplane.apis.errors import engine_refusal_body
from luftpause.dataplane.apis.messages_stream import MessagesStream, completion_to_message
from luftpause.dataplane.asgi import Exchange, StreamBroken
from luftpause.dataplane.link.admission import SchedulerLink
from luftpause.dataplane.observe.metrics import DataplaneMetrics
from luftpause.dataplane.relay.loop import Relay
from luftpause.dataplane.relay.upstream import Upstream
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.turn import Admitted, Translation, Turn
from luftpause.testkit.launch.procs import free_port
from luftpause.tool_calls import ToolCallTable
from luftpause.v1 import scheduler_pb2 as pb

CALL = {"index": 0, "id": "call_hook_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
STREAM = (
    b"".join(
        b"data: " + orjson.dumps(chunk) + b"\n\n"
        for chunk in (
            {"choices": [{"index": 0, "delta": {"role": "assistant", "tool_calls": [CALL]}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
            {"choices": [], "usage": {"prompt_tokens": 7, "completion_tokens": 3}},
        )
    )
    + b"data: [DONE]\n\n"
)
WHOLE = orjson.dumps(
    {
        "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": 5, "completion_tokens": 1},
    }
)


def _messages() -> Translation:
    """The Anthropic Messages translation of a turn, as a route would build it."""
    return Translation(
        stream=lambda: MessagesStream("claude-like", "msg_hook"),
        whole=lambda body: orjson.dumps(completion_to_message(orjson.loads(body), "claude-like", "msg_hook")),
        refusal=lambda status, body: engine_refusal_body("messages", status, body),
    )


def _events(body: bytes) -> list[dict[str, Any]]:
    """The ``data`` of every event of an Anthropic SSE body."""
    return [orjson.loads(line[6:]) for line in body.split(b"\n") if line.startswith(b"data: ")]


async def _engine(port: int) -> asyncio.Server:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
        request = orjson.loads(await reader.readexactly(length))
        if request.get("refuse"):
            body = b'{"error":{"message":"busy"}}'
            writer.write(
                b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body)
            )
        elif request.get("stream"):
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
            )
            for event in STREAM.split(b"\n\n")[: 1 if request.get("cut") else -1]:
                piece = event + b"\n\n"
                writer.write(b"%x\r\n%s\r\n" % (len(piece), piece))
                await writer.drain()
            writer.write(b"0\r\n\r\n")
        else:
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n"
                % len(WHOLE)
            )
            writer.write(WHOLE)
        await writer.drain()
        writer.close()

    return await asyncio.start_server(answer, "127.0.0.1", port)


def _turn(body: dict[str, Any], translation: Translation) -> Turn:
    return Turn(
        turn_id=Turn.new_id(),
        run_id="run-hook",
        model="m",
        service_class=pb.INTERACTIVE,
        caller="",
        body=orjson.dumps(body),
        traceparent=None,
        upstream_path="/v1/chat/completions",
        translation=translation,
    )


async def _relay(body: dict[str, Any]) -> tuple[list[dict[str, Any]], ToolCallTable, RunTable, RunningTotals]:
    port = free_port()
    server = await _engine(port)
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(dict(message))

    async def receive() -> Any:
        await asyncio.Event().wait()

    runs, tool_calls = RunTable(), ToolCallTable()
    upstream = Upstream(30.0)
    metrics = DataplaneMetrics()
    relay = Relay(upstream, SchedulerLink("127.0.0.1:1", runs), runs, metrics, tool_calls)
    replica = ReplicaConfig(name="e", url=f"http://127.0.0.1:{port}", models=("m",))
    exchange = Exchange({"method": "POST", "path": "/v1/messages", "headers": []}, receive, send)
    try:
        await relay.forward(Admitted(_turn(body, _messages()), replica), exchange)
    except StreamBroken as exc:  # granian then aborts the client's connection
        sent.append({"type": "aborted", "reason": str(exc)})
    finally:
        await upstream.close()
        server.close()
    exposition = metrics.exposition().decode()
    return sent, tool_calls, runs, RunningTotals(exposition)


class RunningTotals:
    """What the dataplane's metrics counted, read from their exposition."""

    def __init__(self, exposition: str) -> None:
        self.text = exposition

    def has(self, sample: str) -> bool:
        return any(line.startswith(sample) for line in self.text.splitlines())


def test_a_stream_reaches_the_client_translated_and_its_facts_come_from_the_engine() -> None:
    sent, tool_calls, runs, totals = asyncio.run(_relay({"model": "m", "stream": True}))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert sent[-1]["more_body"] is False
    events = _events(b"".join(m.get("body", b"") for m in sent[1:]))
    kinds = [event["type"] for event in events]
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    tool_use = next(e for e in events if e["type"] == "content_block_start")["content_block"]
    assert tool_use == {"type": "tool_use", "id": "call_hook_1", "name": "f", "input": {}}
    assert next(e for e in events if e["type"] == "message_delta")["delta"]["stop_reason"] == "tool_use"
    assert b"[DONE]" not in b"".join(m.get("body", b"") for m in sent[1:])  # nothing of chat's left
    # The facts, read from the engine's Chat Completions stream:
    assert tool_calls.lookup(["call_hook_1"], 0.0) == "run-hook"  # the run's next turn finds it
    assert runs.runs["run-hook"].phase == pb.TOOL_PAUSED  # its finish reason: tool_calls
    assert totals.has(
        'luftpause_dataplane_time_to_first_token_seconds_count{replica="e",service_class="interactive"} 1.0'
    )
    assert totals.has(
        'luftpause_dataplane_turns_total{outcome="finished",replica="e",service_class="interactive"} 1.0'
    )


def test_a_whole_answer_and_a_refusal_reach_the_client_translated() -> None:
    sent, _, runs, _ = asyncio.run(_relay({"model": "m"}))
    message = orjson.loads(sent[-1]["body"])
    assert message["type"] == "message" and message["content"] == [{"type": "text", "text": "hi"}]
    assert message["stop_reason"] == "end_turn"
    assert runs.runs["run-hook"].phase == pb.IDLE
    sent, _, _, totals = asyncio.run(_relay({"model": "m", "refuse": True}))
    assert sent[0]["status"] == 429
    refusal = orjson.loads(sent[-1]["body"])
    assert refusal["type"] == "error" and refusal["error"]["message"] == "busy"
    assert totals.has(
        'luftpause_dataplane_turns_total{outcome="failed",replica="e",service_class="interactive"} 1.0'
    )


def test_a_translated_stream_that_ends_before_it_finished_is_aborted() -> None:
    sent, _, runs, totals = asyncio.run(_relay({"model": "m", "stream": True, "cut": True}))
    # Cut after a tool call's first delta, with no finish reason and no [DONE]: the answer never
    # ended, which the relay sees before the translator is asked to close it.
    assert sent[-1]["type"] == "aborted"
    assert sent[-1]["reason"] == "engine closed the stream before it finished"
    assert all(m.get("more_body", True) for m in sent[1:-1])  # never a clean end
    assert b"message_stop" not in b"".join(m.get("body", b"") for m in sent[1:-1])
    assert runs.runs["run-hook"].phase == pb.IDLE
    assert totals.has(
        'luftpause_dataplane_turns_total{outcome="failed",replica="e",service_class="interactive"} 1.0'
    )


@pytest.mark.parametrize(("stream", "reported"), [(True, True), (False, False)])
def test_the_scheduler_is_told_of_a_first_token_for_a_stream_only(
    monkeypatch: pytest.MonkeyPatch, stream: bool, reported: bool
) -> None:
    """A whole answer has no first token of its own (its time holds the whole decode): the scheduler,
    which learns a run's cold prefill rate from first tokens, is told of none; the dataplane's
    histogram counts both, as before."""
    events: list[pb.TurnEvent] = []
    monkeypatch.setattr(SchedulerLink, "report", lambda self, event, replica=None: events.append(event))
    _, _, _, totals = asyncio.run(_relay({"model": "m", "stream": stream}))
    (finished,) = [event for event in events if event.kind == pb.TurnEvent.FINISHED]
    assert finished.HasField("first_token_ago_s") is reported
    assert totals.has(
        'luftpause_dataplane_time_to_first_token_seconds_count{replica="e",service_class="interactive"} 1.0'
    )
