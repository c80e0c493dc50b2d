"""A tool that changes a run answers only once the change is durable: a kill right after the answer
does not undo it (CI's input: ``stop`` answered ``stopped``, the runtime was killed at once, and
after the restart the run was ``idle`` again; its ``stop`` record was still queued for the journal).

In-process: the runtime as ``luftpause up`` builds it, on each store (the ``store`` fixture: its
journal in a temporary state directory, or a PostgreSQL database), the real ``mcp`` client over
the SDK's in-memory transport, and the journal's fsync (PostgreSQL: its commit) held by a gate the
test opens. Each changing tool (``stop``, ``send``, ``cancel``) must still be waiting while the
gate is shut, and must answer once it opens; ``list`` changes nothing and answers at once.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from mcp import Client
from mcp.types import CallToolResult, Implementation
from runtime_helpers import MINIMAL_CONFIG, make_run, stored, with_store
from starlette.applications import Starlette

from luftpause.runtime.runs import journal as journal_module
from luftpause.runtime.runs.postgres import PostgresJournal
from luftpause.runtime.web.monitor import monitor_routes
from luftpause.runtime.wiring import build_runtime

CALLER = "durable-caller"


@pytest.fixture
def fsync_gate(monkeypatch: pytest.MonkeyPatch, store: str) -> Iterator[threading.Event]:
    """The journal's fsync (PostgreSQL: its commit) waits until the returned event is set (set:
    as usual)."""
    gate = threading.Event()
    gate.set()
    if store == "file":
        real_fsync = os.fsync

        def gated(fd: int) -> None:
            gate.wait(30)
            real_fsync(fd)

        monkeypatch.setattr(journal_module.os, "fsync", gated)
    else:
        real_commit = PostgresJournal._commit

        def gated_commit(
            self: PostgresJournal, rows: list[tuple[Any, ...]], *, replace: bool = False
        ) -> set[Any]:
            gate.wait(30)
            return real_commit(self, rows, replace=replace)

        monkeypatch.setattr(PostgresJournal, "_commit", gated_commit)
    yield gate
    gate.set()


async def _answered_only_after_the_gate(
    gate: threading.Event, call: asyncio.Task[CallToolResult]
) -> CallToolResult:
    await asyncio.sleep(0.3)  # ample for an in-memory tool call that does not wait
    assert not call.done(), "answered before its journal record was durable"
    gate.set()
    result = await asyncio.wait_for(call, 10)
    assert not result.is_error, result
    return result


def test_stop_send_and_cancel_answer_once_their_records_are_durable(
    tmp_path: Path, store: str, fsync_gate: threading.Event
) -> None:
    runtime = build_runtime(with_store(MINIMAL_CONFIG, store, tmp_path))
    registry = runtime.registry

    async def idle(run: Any) -> None:  # a re-opened run's drive: this test sends no turns
        await asyncio.Event().wait()

    async def scenario() -> None:
        async with registry.serving(idle):
            for handle in ("run-stop", "run-send", "run-cancel"):
                run = registry.add(make_run(handle, caller=CALLER))
                registry.finish(run, "completed", answer="done")
            await registry.durable()
            async with Client(runtime.mcp, client_info=Implementation(name=CALLER, version="1")) as client:

                async def gated(tool: str, arguments: dict[str, Any]) -> CallToolResult:
                    fsync_gate.clear()
                    call = asyncio.ensure_future(client.call_tool(tool, arguments))
                    return await _answered_only_after_the_gate(fsync_gate, call)

                await gated("stop", {"handle": "run-stop"})
                await gated("cancel", {"handle": "run-cancel"})
                await gated("send", {"handle": "run-send", "message": "once more"})

                fsync_gate.clear()
                listed = await asyncio.wait_for(client.call_tool("list", {"caller": CALLER}), 5)
                assert not listed.is_error
                fsync_gate.set()

    asyncio.run(scenario())
    kinds = {(r["type"], r.get("handle")) for r in stored(store, tmp_path)}
    assert {("stop", "run-stop"), ("stop", "run-cancel"), ("message", "run-send")} <= kinds, kinds


def test_a_wait_for_the_journal_that_is_cancelled_leaves_the_journal_writing(
    tmp_path: Path, store: str, fsync_gate: threading.Event
) -> None:
    """The input the fresh-clone suite hung on: sub-agents over MCP were cancelled at a deadline
    while their ``cancel`` answers waited for the journal. Cancelling such a wait cancelled the
    journal's own future through ``asyncio.wrap_future``; the writer's ``set_result`` on it raised
    and ended the writer thread, and every later ``cancel`` hung. A cancelled wait must cost
    nothing: the record is written, and so is every later one."""
    runtime = build_runtime(with_store(MINIMAL_CONFIG, store, tmp_path))
    registry = runtime.registry

    async def scenario() -> None:
        async with registry:
            fsync_gate.clear()
            first = registry.add(make_run("run-first", caller=CALLER))
            waiting = asyncio.ensure_future(registry.durable())
            await asyncio.sleep(0.05)
            waiting.cancel()  # the client went away while its answer waited
            with pytest.raises(asyncio.CancelledError):
                await waiting
            fsync_gate.set()
            registry.finish(first, "completed", answer="done")
            later = registry.add(make_run("run-later", caller=CALLER))
            await asyncio.wait_for(registry.durable(), 10)  # hung: the writer thread had ended
            assert later.durability.error is None

    asyncio.run(scenario())
    records = [(r["type"], r.get("handle")) for r in stored(store, tmp_path)]
    runs = [record for record in records if record[0] in ("start", "end")]  # not the pods' events
    assert runs == [("start", "run-first"), ("end", "run-first"), ("start", "run-later")], records


def test_the_monitors_stop_and_send_answer_once_their_records_are_durable(
    tmp_path: Path, store: str, fsync_gate: threading.Event
) -> None:
    """The monitor page's ``stop`` and ``send`` routes wait as the MCP tools do (the same input:
    a kill right after the answer must not bring the run back or lose the message)."""
    runtime = build_runtime(with_store(MINIMAL_CONFIG, store, tmp_path))
    registry = runtime.registry
    app = Starlette(routes=monitor_routes(runtime.pods, listen_host="127.0.0.1"))

    async def idle(run: Any) -> None:
        await asyncio.Event().wait()

    async def scenario() -> None:
        async with registry.serving(idle):
            for handle in ("run-stop", "run-send"):
                registry.finish(registry.add(make_run(handle, caller=CALLER)), "completed", answer="done")
            await registry.durable()
            headers = {"content-type": "application/json", "origin": "http://127.0.0.1"}
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1") as client:
                for path, body in (("run-stop/stop", b"{}"), ("run-send/send", b'{"message": "more"}')):
                    fsync_gate.clear()
                    call = asyncio.ensure_future(
                        client.post(f"/monitor/runs/{path}", content=body, headers=headers)
                    )
                    await asyncio.sleep(0.3)
                    assert not call.done(), f"{path} answered before its journal record was durable"
                    fsync_gate.set()
                    answer = await asyncio.wait_for(call, 10)
                    assert answer.status_code == 200, answer.text

    asyncio.run(scenario())
    kinds = {(r["type"], r.get("handle")) for r in stored(store, tmp_path)}
    assert {("stop", "run-stop"), ("message", "run-send")} <= kinds, kinds
