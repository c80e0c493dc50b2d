"""The relay's hook for front doors other than Chat Completions (``Turn.translation``): the client
gets what the translation makes of the engine's answer, while every fact (first token, finish
reason, usage, tool-call ids) is still read from the engine's own Chat Completions answer.

The relay runs in the test's loop against an engine on raw sockets; its client is a stand-in for
granian's ASGI ``send``. No front door uses the hook yet: this is its contract.
"""

from __future__ import annotations

import asyncio
from typing import Any

import orjson

from luftpause.config import ReplicaConfig
from luftpause.dataplane.admission import SchedulerLink
from luftpause.dataplane.asgi import Exchange
from luftpause.dataplane.metrics import DataplaneMetrics
from luftpause.dataplane.relay import Relay
from luftpause.dataplane.runs import RunTable
from luftpause.dataplane.tool_calls import ToolCallTable
from luftpause.dataplane.turn import Turn
from luftpause.dataplane.upstream import Upstream
from luftpause.testkit.procs import free_port
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


class Tagging:
    """A translation that marks what it was given: b"<" + piece + b">" and an end of its own."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []

    def stream(self, piece: bytes) -> bytes:
        self.pieces.append(piece)
        return b"<" + piece + b">"

    def stream_end(self) -> bytes:
        return b"event: message_stop\n\n"

    def whole(self, body: bytes) -> bytes:
        return b'{"translated":' + body + b"}"

    def refusal(self, status: int, body: bytes) -> bytes:
        return b'{"type":"error","status":%d}' % status


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
            for event in STREAM.split(b"\n\n")[:-1]:
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


def _turn(body: dict[str, Any], translation: Tagging) -> Turn:
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


async def _relay(body: dict[str, Any]) -> tuple[list[dict[str, Any]], Tagging, ToolCallTable, RunTable]:
    port = free_port()
    server = await _engine(port)
    sent: list[dict[str, Any]] = []

    async def send(message: Any) -> None:
        sent.append(dict(message))

    async def receive() -> Any:
        await asyncio.Event().wait()

    runs, tool_calls = RunTable(), ToolCallTable()
    upstream = Upstream(30.0)
    relay = Relay(upstream, SchedulerLink("127.0.0.1:1", runs), runs, DataplaneMetrics(int, int), tool_calls)
    replica = ReplicaConfig(name="e", url=f"http://127.0.0.1:{port}", models=("m",))
    exchange = Exchange({"method": "POST", "path": "/v1/messages", "headers": []}, receive, send)
    translation = Tagging()
    try:
        await relay.forward(_turn(body, translation), replica, exchange)
    except Exception as exc:  # the refusal is answered, not raised; anything else is a failure
        raise AssertionError(f"the relay raised {exc!r}") from exc
    finally:
        await upstream.close()
        server.close()
    return sent, translation, tool_calls, runs


def test_a_stream_reaches_the_client_translated_and_its_facts_come_from_the_engine() -> None:
    sent, translation, tool_calls, runs = asyncio.run(_relay({"model": "m", "stream": True}))
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    body = b"".join(m.get("body", b"") for m in sent[1:])
    assert b"".join(translation.pieces) == STREAM  # the translation saw the engine's bytes, whole
    assert body == b"".join(b"<" + piece + b">" for piece in translation.pieces) + b"event: message_stop\n\n"
    assert sent[-1]["more_body"] is False
    assert tool_calls.lookup(["call_hook_1"], 0.0) == "run-hook"  # read from the engine's stream
    assert runs.runs["run-hook"].phase == pb.TOOL_PAUSED  # its finish reason: tool_calls


def test_a_whole_answer_and_a_refusal_reach_the_client_translated() -> None:
    sent, _, _, runs = asyncio.run(_relay({"model": "m"}))
    assert sent[-1]["body"] == b'{"translated":' + WHOLE + b"}"
    assert runs.runs["run-hook"].phase == pb.IDLE
    sent, _, _, _ = asyncio.run(_relay({"model": "m", "refuse": True}))
    assert sent[0]["status"] == 429
    assert sent[-1]["body"] == b'{"type":"error","status":429}'
