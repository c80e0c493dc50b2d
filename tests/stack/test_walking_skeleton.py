"""The walking skeleton end to end: real processes on loopback, the real openai and mcp clients."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from typing import Any

import openai
import orjson
import pytest
from mcp import Client

from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration


def _client(stack: Stack, **headers: str) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"{stack.dataplane_url}/v1", api_key="unused", default_headers=headers, max_retries=0
    )


def _http(
    method: str, url: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers.items()), response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers.items()), exc.read()


def _sent_by_engine(stack: Stack, completion_id: str) -> bytes:
    """The exact bytes one of the simulated engines sent for the completion ``completion_id``."""
    for url in stack.engine_urls:
        status, _, body = _http("GET", f"{url}/testkit/sent/{completion_id}")
        if status == 200:
            return body
    raise AssertionError(f"no engine recorded {completion_id}")


def _status(stack: Stack) -> dict[str, Any]:
    status, _, body = _http("GET", stack.status_url)
    assert status == 200
    result: dict[str, Any] = orjson.loads(body)
    return result


MESSAGES: list[Any] = [{"role": "user", "content": "Say something about lighthouses."}]


def test_streamed_completion_reaches_the_client_byte_identical(stack: Stack) -> None:
    client = _client(stack)
    with client.chat.completions.with_streaming_response.create(
        model=stack.model, messages=MESSAGES, stream=True, max_tokens=24
    ) as response:
        received = b"".join(response.iter_bytes())
        assert response.headers["x-luftpause-run-id"].startswith("run-")
        assert response.headers["content-type"].startswith("text/event-stream")
    first = json.loads(received.split(b"\n", 1)[0].removeprefix(b"data: "))
    assert received == _sent_by_engine(stack, first["id"])
    assert received.rstrip().endswith(b"data: [DONE]")


def test_openai_client_streams_a_completion_and_sees_the_run_id(stack: Stack) -> None:
    client = _client(stack, **{"x-luftpause-run-id": "run-given-by-client"})
    stream = client.chat.completions.create(model=stack.model, messages=MESSAGES, stream=True, max_tokens=16)
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text.strip()
    assert stream.response.headers["x-luftpause-run-id"] == "run-given-by-client"


def test_non_streamed_completion_reaches_the_client_byte_identical(stack: Stack) -> None:
    client = _client(stack)
    raw = client.chat.completions.with_raw_response.create(
        model=stack.model, messages=MESSAGES, max_tokens=16
    )
    completion = raw.parse()
    assert completion.choices[0].message.content
    assert raw.http_response.content == _sent_by_engine(stack, completion.id)
    assert raw.headers["x-luftpause-run-id"].startswith("run-")


def test_the_engine_gets_the_replica_key_and_the_trace_never_the_clients_authorization(
    stack: Stack, engine_key: str
) -> None:
    client = openai.OpenAI(
        base_url=f"{stack.dataplane_url}/v1",
        api_key="the-clients-own-secret",
        default_headers={"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
        max_retries=0,
    )
    completion = client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=4)
    received: dict[str, str] = {}
    for url in stack.engine_urls:
        status, _, body = _http("GET", f"{url}/testkit/received/{completion.id}")
        if status == 200:
            received = orjson.loads(body)
    assert received["authorization"] == f"Bearer {engine_key}"
    assert "the-clients-own-secret" not in json.dumps(received)
    assert received["traceparent"] == "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert not any(name.startswith("x-luftpause-") for name in received)


def test_unknown_model_is_answered_404_with_the_json_error_body(stack: Stack) -> None:
    client = _client(stack)
    with pytest.raises(openai.NotFoundError) as caught:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES)
    assert caught.value.status_code == 404
    assert caught.value.response.json() == {
        "error": {"message": "no Generative replica serves model 'no-such-model'"}
    }


@pytest.mark.parametrize(
    ("body", "message_part"),
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"messages": []}', "'model'"),
        (b'{"model": "m", "messages": "hi"}', "'messages'"),
        (b"", "not valid JSON"),
    ],
)
def test_malformed_body_is_answered_400_with_the_json_error_body(
    stack: Stack, body: bytes, message_part: str
) -> None:
    status, headers, answer = _http(
        "POST", f"{stack.dataplane_url}/v1/chat/completions", body, {"content-type": "application/json"}
    )
    assert status == 400
    assert headers["content-type"] == "application/json"
    error = orjson.loads(answer)
    assert list(error) == ["error"] and list(error["error"]) == ["message"]
    assert message_part in error["error"]["message"]


def test_unknown_service_class_is_answered_400_naming_the_allowed_values(stack: Stack) -> None:
    client = _client(stack, **{"x-luftpause-class": "urgent"})
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=stack.model, messages=MESSAGES)
    message = caught.value.response.json()["error"]["message"]
    assert "'interactive' or 'batch'" in message and "'urgent'" in message


def test_models_lists_what_the_replicas_serve(stack: Stack) -> None:
    models = _client(stack).models.list()
    assert [m.id for m in models.data] == [stack.model]


def _quiet(status: dict[str, Any]) -> bool:
    """Nothing placed, held or generating: no turn of an earlier test still to be counted."""
    inflight = sum(r["inflight"] for r in status["replicas"])
    return inflight == 0 and status["held"]["count"] == 0 and status["runs"]["generating"] == 0


def test_scheduler_status_counts_the_turns(stack: Stack) -> None:
    before = stack.wait_status(_quiet)
    assert _quiet(before), before
    client = _client(stack, **{"x-luftpause-run-id": "run-counted"})
    for _ in range(3):
        client.chat.completions.create(model=stack.model, messages=MESSAGES, max_tokens=4)

    # Reports travel on their own stream: a turn placed under a lease is counted admitted only
    # when its report arrives, and every turn's finish after its answer. Wait for all of them.
    def counted(status: dict[str, Any]) -> bool:
        admitted = status["counters"]["admitted"] - before["counters"]["admitted"]
        finished = status["counters"]["finished"] - before["counters"]["finished"]
        return admitted >= 3 and finished >= 3 and _quiet(status)

    after = stack.wait_status(counted, timeout=30)
    assert after["counters"]["admitted"] - before["counters"]["admitted"] == 3
    assert after["counters"]["finished"] - before["counters"]["finished"] == 3
    assert sum(r["inflight"] for r in after["replicas"]) == 0


def test_ending_a_run_is_answered_204(stack: Stack) -> None:
    status, headers, _ = _http("DELETE", f"{stack.dataplane_url}/v1/runs/run-finished")
    assert status == 204
    assert headers["x-luftpause-run-id"] == "run-finished"


def test_unknown_route_is_answered_404_with_the_json_error_body(stack: Stack) -> None:
    status, _, body = _http("GET", f"{stack.dataplane_url}/v1/nothing-here")
    assert status == 404
    assert "no route" in orjson.loads(body)["error"]["message"]


def test_three_sub_agents_are_spawned_and_awaited_each_having_called_a_tool(stack: Stack) -> None:
    async def scenario() -> list[dict[str, Any]]:
        async with Client(stack.runtime_url) as client:
            handles = []
            for topic in ("tides", "glaciers", "volcanoes"):
                result = await client.call_tool("spawn", {"task": f"Find two facts about {topic}."})
                assert not result.is_error, result
                handles.append(result.structured_content["handle"])  # type: ignore[index]
            awaited = await client.call_tool("await", {"handles": handles, "timeout": 120})
            assert not awaited.is_error, awaited
            runs: list[dict[str, Any]] = awaited.structured_content["runs"]  # type: ignore[index]
            return runs

    runs = asyncio.run(scenario())
    assert len(runs) == 3
    for run in runs:
        assert run["state"] == "completed", run
        assert run["toolCalls"] >= 1
        assert run["answer"]


@pytest.mark.parametrize("command", ["scheduler", "dataplane", "runtime"])
def test_a_second_process_on_a_taken_port_refuses_to_start(stack: Stack, command: str) -> None:
    # granian binds with SO_REUSEPORT: without the check, both would serve and split connections.
    second = subprocess.Popen(
        [sys.executable, "-m", "luftpause", command, "--config", str(stack.config_path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # on a regression, its granian worker is ended with it below
    )
    try:
        _, stderr = second.communicate(timeout=60)
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
            second.communicate()
    assert second.returncode == 1
    assert b"already in use" in stderr
