"""llama.cpp's ``llama-server`` as a real replica: the proxy path, a sub-agent over MCP, and the
scheduler reading the engine's load, with the real ``openai`` and ``mcp`` clients.

Runs when a built ``llama-server`` and the SmolLM2-135M GGUF are present
(:func:`luftpause.testkit.launch.llama_server.find`: ``LUFTPAUSE_LLAMA_SERVER`` / ``LUFTPAUSE_LLAMA_MODEL``,
else the cache folder that ``bench/engines/llama_server.sh build`` and ``model`` fill) and skips,
saying how to build them, when they are not. Nothing here builds anything.

One replica with 2 slots (``--parallel 2``, 1 thread), the fake MCP server, the scheduler, the
dataplane and the runtime, as real processes on free loopback ports. Replies are kept short: a turn
decodes about 60 tokens/s on this machine.
"""

from __future__ import annotations

import asyncio
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import openai
import orjson
import pytest
from mcp import Client
from mcp.types import CallToolResult

from luftpause.testkit.launch import llama_server
from luftpause.testkit.launch.procs import ChildProcess, free_port

INSTALLED = llama_server.find()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(INSTALLED is None, reason=llama_server.missing()),
]

MODEL = llama_server.MODEL_NAME
SLOTS = 2
WAIT_S = 60.0  # a fail-safe for polling, never a measured bound


@dataclass
class LlamaStack:
    engine_url: str
    dataplane_url: str
    status_url: str
    runtime_url: str
    children: list[ChildProcess]

    def status(self) -> dict[str, Any]:
        with urllib.request.urlopen(self.status_url, timeout=10) as response:
            result: dict[str, Any] = orjson.loads(response.read())
            return result

    def replica(self) -> dict[str, Any]:
        (replica,) = self.status()["replicas"]
        return replica  # type: ignore[no-any-return]

    def until(self, check: Any) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT_S
        replica = self.replica()
        while not check(replica):
            assert time.monotonic() < deadline, f"never matched: {replica}\n{self.logs()}"
            time.sleep(0.1)
            replica = self.replica()
        return replica

    def logs(self) -> str:
        return "\n".join(f"--- {c.name}\n{c.log_tail(15)}" for c in self.children)

    def openai(self, run_id: str) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.dataplane_url}/v1",
            api_key="unused",
            default_headers={"x-luftpause-run-id": run_id},
            max_retries=0,
            timeout=120,
        )


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaStack]:
    assert INSTALLED is not None
    workdir = tmp_path_factory.mktemp("llama")
    engine_port, mcp_port, grpc_port, status_port, dp_port, rt_port = (free_port() for _ in range(6))
    config = workdir / "luftpause.toml"
    config.write_text(
        f"""
[scheduler]
grpc = "127.0.0.1:{grpc_port}"
http = "127.0.0.1:{status_port}"

[dataplane]
listen = "127.0.0.1:{dp_port}"
scheduler = "127.0.0.1:{grpc_port}"

[runtime]
listen = "127.0.0.1:{rt_port}"
dataplane = "http://127.0.0.1:{dp_port}"
state_dir = "{workdir / "state"}"

[[replicas]]
name = "llama0"
url = "http://127.0.0.1:{engine_port}"
models = ["{MODEL}"]

[[mcp_servers]]
name = "fake"
url = "http://127.0.0.1:{mcp_port}/mcp"
"""
    )
    conf = ["--config", str(config)]
    options = llama_server.ReplicaOptions(parallel=SLOTS, ctx_per_slot=2048, threads=1)

    def luftpause(name: str, port: int) -> ChildProcess:
        return ChildProcess(
            name, [name, *conf], workdir / f"{name}.log", ready_url=f"http://127.0.0.1:{port}/health"
        )

    mcp = ["fake-mcp", "--port", str(mcp_port)]
    children = [
        llama_server.replica(INSTALLED, "llama0", engine_port, workdir / "llama0.log", options),
        ChildProcess("mcp", mcp, workdir / "mcp.log", ready_port=("127.0.0.1", mcp_port)),
        luftpause("scheduler", status_port),
        luftpause("dataplane", dp_port),
        luftpause("runtime", rt_port),
    ]
    running = LlamaStack(
        engine_url=f"http://127.0.0.1:{engine_port}",
        dataplane_url=f"http://127.0.0.1:{dp_port}",
        status_url=f"http://127.0.0.1:{status_port}/status",
        runtime_url=f"http://127.0.0.1:{rt_port}/mcp",
        children=[],
    )
    try:
        for child in children:
            running.children.append(child.start())
            child.wait_ready(120)
        yield running
    finally:
        for child in reversed(running.children):
            child.stop()


SYSTEM = "You are a careful research assistant. Answer in one short sentence."


def test_a_streamed_turn_is_relayed_with_its_usage_and_its_prefix_reused(stack: LlamaStack) -> None:
    with stack.openai("llama-stream") as client:
        usages = _two_turns(client)
    details = usages[1].prompt_tokens_details
    assert details is not None and details.cached_tokens, usages[1]  # served from its prompt cache


def _two_turns(client: openai.OpenAI) -> list[Any]:
    messages: list[Any] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "When did the first transatlantic telegraph cable go live?"},
    ]
    usages = []
    for _ in range(2):  # the second turn of the run extends the first: llama.cpp reuses its prefix
        stream = client.chat.completions.create(
            model=MODEL, messages=messages, max_tokens=16, stream=True, stream_options={"include_usage": True}
        )
        text, usage, finish = [], None, None
        for chunk in stream:
            usage = chunk.usage or usage
            for choice in chunk.choices:
                text.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        assert "".join(text).strip() and finish in ("stop", "length")
        assert usage is not None and usage.prompt_tokens > 0 and usage.completion_tokens > 0
        usages.append(usage)
        messages += [{"role": "assistant", "content": "".join(text)}, {"role": "user", "content": "Why?"}]
    return usages


def test_a_tool_round_conversation_is_answered_not_streamed(stack: LlamaStack) -> None:
    # the shape --tool-rounds-by agent sends: a reply recorded as a lookup call, then its result
    call = {
        "id": "call-1",
        "type": "function",
        "function": {"name": "lookup", "arguments": '{"query": "cable"}'},
    }
    tool = {"type": "function", "function": {"name": "lookup", "description": "Look a fact up.",
            "parameters": {"type": "object", "properties": {"query": {"type": "string"}}}}}  # fmt: skip
    with stack.openai("llama-tools") as client:
        reply = client.chat.completions.create(
            model=MODEL,
            messages=[
                {"role": "system", "content": SYSTEM},
                {"role": "user", "content": "When did the first transatlantic cable go live?"},
                {"role": "assistant", "content": "Let me look it up.", "tool_calls": [call]},  # type: ignore[list-item]
                {"role": "tool", "tool_call_id": "call-1", "content": "August 1858; it failed within weeks."},
            ],
            tools=[tool],  # type: ignore[list-item]
            max_tokens=16,
        )
    (choice,) = reply.choices
    assert choice.message.content and choice.finish_reason in ("stop", "length")
    assert reply.usage is not None and reply.usage.prompt_tokens > 0


def test_the_engines_refusal_is_relayed_unchanged_and_frees_the_slot(stack: LlamaStack) -> None:
    with stack.openai("llama-too-long") as client:
        with pytest.raises(openai.BadRequestError) as refused:  # past the slot's 2048 tokens
            client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "word " * 5000}], max_tokens=8
            )
        with pytest.raises(openai.NotFoundError) as unknown:
            client.chat.completions.create(
                model="no-such-model", messages=[{"role": "user", "content": "hi"}]
            )
    assert refused.value.status_code == 400
    assert "context" in str(refused.value.body)  # llama.cpp's own error, not a rewrite of ours
    assert "no Generative replica serves model 'no-such-model'" in str(unknown.value.body)
    stack.until(lambda r: r["inflight"] == 0)


def _payload(result: CallToolResult) -> dict[str, Any]:
    assert not result.is_error, result.content
    assert isinstance(result.structured_content, dict)
    return result.structured_content


def test_a_sub_agent_run_over_mcp_completes_on_llama_server(stack: LlamaStack) -> None:
    async def scenario() -> dict[str, Any]:
        async with Client(stack.runtime_url) as client:
            spawned = _payload(
                await client.call_tool(
                    "spawn", {"task": "Name one use of a telegraph.", "model": MODEL, "maxTokens": 24}
                )
            )
            return _payload(
                await client.call_tool(
                    "await", {"handles": [spawned["handle"]], "timeout": 120}, read_timeout_seconds=150
                )
            )

    (run,) = asyncio.run(scenario())["runs"]
    assert run["state"] == "completed", run
    assert run["answer"].strip()
    assert run["usage"]["promptTokens"] > 0 and run["usage"]["completionTokens"] > 0


def test_the_scheduler_reads_the_engines_load_and_learns_its_slots(stack: LlamaStack) -> None:
    idle = stack.until(lambda r: r["probed_s_ago"] is not None and r["load_metrics"] is not None)
    assert (idle["load_metrics"], idle["load_unknown"]) == ("llama.cpp", None)
    assert idle["running"] is not None and idle["waiting"] is not None
    assert idle["batch_capacity"] is None  # no queue seen yet: capped by max_inflight (32) only

    async def flood() -> dict[str, Any]:
        url = f"{stack.dataplane_url}/v1"
        async with openai.AsyncOpenAI(base_url=url, api_key="unused", max_retries=0, timeout=300) as client:
            return await _flood(client)

    async def _flood(client: openai.AsyncOpenAI) -> dict[str, Any]:
        # ignore_eos: each turn decodes exactly max_tokens, so the slots stay busy long enough
        # for a probe (every 2 s) to see the engine defer what the first placements sent past them
        turns = [
            client.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": f"Tell story number {i}."}],
                max_tokens=200,
                extra_body={"ignore_eos": True},
                extra_headers={"x-luftpause-run-id": f"llama-flood-{i}"},
            )
            for i in range(4 * SLOTS)
        ]
        done = asyncio.gather(*turns)
        try:
            return await asyncio.to_thread(stack.until, lambda r: r["batch_capacity"] == SLOTS)
        finally:
            await done

    # read while the flood runs: once it is over, a probe that shows the engine below its slots
    # with nothing held forgets them (the load fell off the bound)
    learned = asyncio.run(flood())
    assert learned["batch_capacity"] == SLOTS, learned  # the engine's slots, learned from its queue
    assert learned["effective_capacity"] == SLOTS
