"""The Messages and Responses routes in front of a real engine: llama.cpp's ``llama-server``, which
serves ``/v1/messages`` itself (REFERENCES.md, "Engines") and not ``/v1/responses``.

One llama-server process behind two replica entries: ``llama-native`` declares ``apis = ["chat",
"messages"]`` (a Messages turn is relayed to the engine's own ``/v1/messages``), ``llama-chat``
declares only chat for another model name (the same turn is translated to Chat Completions). A
Responses turn is always translated. The official ``anthropic`` and ``openai`` clients read the
answers; the scheduler counts each turn finished. Skips, saying how to build them, where the
binary and the model are absent (:func:`luftpause.testkit.launch.llama_server.find`).
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import anthropic
import openai
import orjson
import pytest

from luftpause.testkit.launch import llama_server
from luftpause.testkit.launch.procs import ChildProcess, free_port

INSTALLED = llama_server.find()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(INSTALLED is None, reason=llama_server.missing()),
]

NATIVE = llama_server.MODEL_NAME
TRANSLATED = f"{NATIVE}-via-chat"
"""The same engine under another name, on a replica that declares only Chat Completions."""


@dataclass
class LlamaFrontDoors:
    dataplane_url: str
    status_url: str

    def counters(self) -> dict[str, int]:
        with urllib.request.urlopen(self.status_url, timeout=10) as response:
            result: dict[str, int] = orjson.loads(response.read())["counters"]
            return result

    def finished_since(self, before: dict[str, int], turns: int = 1) -> dict[str, int]:
        """The counters once ``turns`` more than ``before`` have ended (60 s at most, polled)."""
        deadline = time.monotonic() + 60
        now = self.counters()
        while now["finished"] + now["failed"] < before["finished"] + before["failed"] + turns:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
            now = self.counters()
        return now


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaFrontDoors]:
    assert INSTALLED is not None
    workdir = tmp_path_factory.mktemp("llama-front-doors")
    engine_port, grpc_port, status_port, dp_port = (free_port() for _ in range(4))
    config = workdir / "luftpause.toml"
    config.write_text(
        f"""
[scheduler]
grpc = "127.0.0.1:{grpc_port}"
http = "127.0.0.1:{status_port}"

[dataplane]
listen = "127.0.0.1:{dp_port}"
scheduler = "127.0.0.1:{grpc_port}"

[[replicas]]
name = "llama-native"
url = "http://127.0.0.1:{engine_port}"
models = ["{NATIVE}"]
apis = ["chat", "messages"]

[[replicas]]
name = "llama-chat"
url = "http://127.0.0.1:{engine_port}"
models = ["{TRANSLATED}"]
health_path = ""
"""
    )
    conf = ["--config", str(config)]
    options = llama_server.ReplicaOptions(parallel=2, ctx_per_slot=2048, threads=1)
    children = [
        llama_server.replica(INSTALLED, "llama0", engine_port, workdir / "llama0.log", options),
        ChildProcess(
            "scheduler",
            ["scheduler", *conf],
            workdir / "scheduler.log",
            ready_url=f"http://127.0.0.1:{status_port}/health",
        ),
        ChildProcess(
            "dataplane",
            ["dataplane", *conf],
            workdir / "dataplane.log",
            ready_url=f"http://127.0.0.1:{dp_port}/health",
        ),
    ]
    started: list[ChildProcess] = []
    try:
        for child in children:
            started.append(child.start())
            child.wait_ready(120)
        yield LlamaFrontDoors(f"http://127.0.0.1:{dp_port}", f"http://127.0.0.1:{status_port}/status")
    finally:
        for child in reversed(started):
            child.stop()


PROMPT: Any = [{"role": "user", "content": "Name one colour."}]


@pytest.mark.parametrize("model", [NATIVE, TRANSLATED], ids=["native", "translated"])
def test_a_messages_turn_on_llama_server_streamed_and_whole(stack: LlamaFrontDoors, model: str) -> None:
    before = stack.counters()
    with anthropic.Anthropic(base_url=stack.dataplane_url, api_key="unused", max_retries=0) as client:
        with client.messages.stream(model=model, max_tokens=12, messages=PROMPT) as stream:
            kinds = [event.type for event in stream]
            message = stream.get_final_message()
        assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
        assert message.stop_reason in ("end_turn", "max_tokens")
        assert message.content and message.content[0].type == "text" and message.content[0].text.strip()
        assert 0 < message.usage.output_tokens <= 12
        # llama.cpp names its own Messages "chatcmpl-...": relayed unchanged; translated, luftpause's msg_
        assert message.id.startswith("msg_") == (model == TRANSLATED), message.id
        after = stack.finished_since(before)
        assert (after["finished"], after["failed"]) == (before["finished"] + 1, before["failed"])
        whole = client.messages.create(model=model, max_tokens=8, messages=PROMPT)
        assert whole.type == "message" and whole.content[0].type == "text"
    after = stack.finished_since(before, turns=2)
    assert (after["finished"], after["failed"]) == (before["finished"] + 2, before["failed"])


def test_a_responses_turn_on_llama_server_is_translated(stack: LlamaFrontDoors) -> None:
    before = stack.counters()
    with openai.OpenAI(base_url=f"{stack.dataplane_url}/v1", api_key="unused", max_retries=0) as client:
        events = list(
            client.responses.create(model=NATIVE, input="Name one colour.", max_output_tokens=12, stream=True)
        )
        assert events[0].type == "response.created"
        last = events[-1]
        assert last.type in ("response.completed", "response.incomplete")
        assert last.response.output_text.strip()
        assert last.response.usage is not None and 0 < last.response.usage.output_tokens <= 12
    after = stack.finished_since(before)
    assert (after["finished"], after["failed"]) == (before["finished"] + 1, before["failed"])
