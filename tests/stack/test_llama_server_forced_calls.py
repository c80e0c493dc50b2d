"""Forced tool calls on llama.cpp's ``llama-server`` (:mod:`luftpause.testkit.load.agents`,
``forced_calls``): SmolLM2-135M, rendered with the Qwen2.5 ChatML tools template, calls the tool on
every turn that offers it, and a run through luftpause really pauses on its tool (the scheduler
counts it ``tool_paused`` while the agent waits its tool time).

Runs when a built ``llama-server``, the SmolLM2-135M GGUF and the tools template are present
(:func:`luftpause.testkit.launch.llama_server.find` and
:func:`~luftpause.testkit.launch.llama_server.tools_template`) and skips, saying how to get
them, when they are not. One replica with 2 slots, the scheduler and the dataplane, as real
processes on free loopback ports.
"""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import aiohttp
import orjson
import pytest

from luftpause.testkit.launch import llama_server
from luftpause.testkit.launch.procs import ChildProcess, free_port
from luftpause.testkit.load.agents import AgentGroup, AgentSettings, RunOutcome, run_once

INSTALLED = llama_server.find()
TEMPLATE = llama_server.tools_template()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(INSTALLED is None, reason=llama_server.missing()),
    pytest.mark.skipif(TEMPLATE is None, reason=llama_server.missing_template()),
]

WAIT_S = 120.0  # a fail-safe for polling, never a measured bound
TOOL_SECONDS = 4.0


@pytest.fixture(scope="module")
def urls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    assert INSTALLED is not None and TEMPLATE is not None
    workdir = tmp_path_factory.mktemp("llama-forced")
    engine_port, grpc_port, status_port, dp_port = (free_port() for _ in range(4))
    config = workdir / "luftpause.toml"
    config.write_text(
        f'[scheduler]\ngrpc = "127.0.0.1:{grpc_port}"\nhttp = "127.0.0.1:{status_port}"\n\n'
        f'[dataplane]\nlisten = "127.0.0.1:{dp_port}"\nscheduler = "127.0.0.1:{grpc_port}"\n\n'
        f'[[replicas]]\nname = "llama0"\nurl = "http://127.0.0.1:{engine_port}"\n'
        f'models = ["{llama_server.MODEL_NAME}"]\n'
    )
    options = llama_server.ReplicaOptions(parallel=2, threads=1, chat_template=TEMPLATE)
    children = [
        llama_server.replica(INSTALLED, "llama0", engine_port, workdir / "llama0.log", options),
        *(
            ChildProcess(
                name,
                [name, "--config", str(config)],
                workdir / f"{name}.log",
                ready_url=f"http://127.0.0.1:{port}/health",
            )
            for name, port in (("scheduler", status_port), ("dataplane", dp_port))
        ),
    ]
    started: list[ChildProcess] = []
    try:
        for child in children:
            started.append(child.start())
            child.wait_ready(120)
        yield {
            "engine": f"http://127.0.0.1:{engine_port}",
            "dataplane": f"http://127.0.0.1:{dp_port}",
            "status": f"http://127.0.0.1:{status_port}/status",
        }
    finally:
        for child in reversed(started):
            child.stop()


def _one_run(proxy: str, tool_rounds: int, tool_seconds: float) -> RunOutcome:
    settings = AgentSettings(
        proxy=proxy,
        model=llama_server.MODEL_NAME,
        task="Look up when the first transatlantic telegraph cable went live, then answer.",
        tool_rounds=tool_rounds,
        context_tokens=60,
        tool_seconds=tool_seconds,
        max_tokens=48,
        forced_calls=True,
        tool_choice="required",
    )
    outcome = RunOutcome(group=0, service_class="batch", caller="forced")

    async def go() -> None:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=WAIT_S)) as session:
            await run_once(session, settings, AgentGroup(1, "batch", "forced"), outcome)

    asyncio.run(go())
    return outcome


def test_every_forced_turn_comes_back_as_one_lookup_call(urls: dict[str, str]) -> None:
    outcome = _one_run(urls["engine"], tool_rounds=3, tool_seconds=0.0)
    assert outcome.state == "completed", outcome.error
    # three forced turns, each a call the server parsed, then the answer
    assert (outcome.turns, outcome.tool_rounds, outcome.tool_calls, outcome.unforced) == (4, 3, 3, 0)


def _status(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as response:
        status: dict[str, Any] = orjson.loads(response.read())
        return status


def test_a_run_through_luftpause_pauses_on_its_tool(urls: dict[str, str]) -> None:
    seen: list[dict[str, int]] = []
    done = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + WAIT_S
        while not done.is_set() and time.monotonic() < deadline:
            seen.append(_status(urls["status"])["runs"])
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        outcome = _one_run(urls["dataplane"], tool_rounds=1, tool_seconds=TOOL_SECONDS)
    finally:
        done.set()
        watcher.join()
    assert outcome.state == "completed", outcome.error
    assert (outcome.tool_rounds, outcome.unforced) == (1, 0)
    # the proxy saw the call in the streamed reply: the run waited its tool as tool_paused
    assert any(runs["tool_paused"] == 1 for runs in seen), seen
