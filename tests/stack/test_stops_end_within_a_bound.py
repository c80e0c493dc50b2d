"""SIGTERM finishes within a bound and says what it waited for (the issue's item 4: runtimes were
alive 4 s after SIGTERM; the dataplane, under three long streams, took 106 s here, because granian
waits for every connection before the application hears of the stop).

Each listener's ``stop_timeout_s`` is 2 here: the open requests get that long, then are cut off
(:meth:`luftpause.serving.listeners.ListenerGuard.drain`), and the log names them. Every wait below is a
fail-safe far above the bound (2 s, plus 2 s to unwind and 5 s for the application's shutdown),
and far below what the open requests would have taken (a stream of 100,000 tokens at 20 ms each;
an ``await`` of 600 s).
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from luftpause.testkit.launch.procs import ChildProcess
from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

FAIL_SAFE_S = 60.0
SECTIONS = {name: f"[{name}.limits]\nstop_timeout_s = 2\n" for name in ("dataplane", "runtime")}
PROGRESS_EVERY = {"LUFTPAUSE_PROGRESS_INTERVAL_SECONDS": "0.2"}
"""A waiting ``await`` tells its client so (MCP progress) this often: proof that it is open."""


def _sigterm_and_wait(child: ChildProcess) -> None:
    assert child.proc is not None
    os.kill(child.proc.pid, signal.SIGTERM)  # the main process, as a supervisor stops it
    deadline = time.monotonic() + FAIL_SAFE_S
    while child.group_pids():
        assert time.monotonic() < deadline, f"{child.name} still running:\n{child.log_tail()}"
        time.sleep(0.05)


def test_a_dataplane_stops_under_long_streams_and_names_them(tmp_path: Path) -> None:
    with Stack.start(tmp_path, decode_ms=20, env={"LUFTPAUSE_TOKEN": ""}, sections=SECTIONS) as stack:
        stack.wait_connected()
        clients = stack.stream_clients(3, max_tokens=100_000)
        try:
            stack.wait_status(lambda s: sum(r["inflight"] for r in s["replicas"]) == 3)
            _sigterm_and_wait(stack.children["dataplane"])
            for client in clients:
                assert client.wait(FAIL_SAFE_S) != 0  # broken, never a clean end
        finally:
            for client in clients:
                client.kill()
                client.wait()
        log = stack.children["dataplane"].log_tail(40)
    assert "dataplane: stopping; 3 requests open: 3 POST /v1/chat/completions" in log, log
    assert "waiting up to 2 s for them" in log
    assert "dataplane: cutting off what is still open after 2 s" in log
    assert "dataplane: stopped in" in log
    assert "refused to gracefully stop" not in log  # granian's kill, never needed


def test_a_runtime_stops_with_an_await_open_and_names_it(tmp_path: Path) -> None:
    env = {"LUFTPAUSE_TOKEN": "", **PROGRESS_EVERY}
    with Stack.start(tmp_path, decode_ms=20, env=env, sections=SECTIONS) as stack:
        stack.wait_connected()
        outcome: list[BaseException | dict[str, Any]] = []
        waiting = threading.Event()

        async def progressed(progress: float, total: float | None, message: str | None) -> None:
            waiting.set()  # the await is open at the runtime

        async def spawn_and_await() -> None:
            async with Client(stack.runtime_url) as client:
                spawned = await client.call_tool("spawn", {"task": "a long answer", "maxTokens": 100_000})
                done = await client.call_tool(
                    "await",
                    {"handles": [spawned.structured_content["handle"]], "timeout": 600},
                    progress_callback=progressed,
                )
                outcome.append(done.structured_content)

        def run() -> None:
            try:
                asyncio.run(spawn_and_await())
            except BaseException as exc:
                outcome.append(exc)
            waiting.set()

        caller = threading.Thread(target=run, daemon=True)
        caller.start()
        assert waiting.wait(FAIL_SAFE_S)
        stack.wait_status(lambda s: sum(r["inflight"] for r in s["replicas"]) == 1)
        _sigterm_and_wait(stack.children["runtime"])
        caller.join(FAIL_SAFE_S)
        assert not caller.is_alive()
        log = stack.children["runtime"].log_tail(40)
    assert outcome and isinstance(outcome[0], BaseException), outcome  # its await was cut off
    assert "runtime: stopping; 1 request open: 1 POST /mcp" in log, log
    assert "runtime: cutting off what is still open after 2 s" in log
    assert "runtime: stopped in" in log
