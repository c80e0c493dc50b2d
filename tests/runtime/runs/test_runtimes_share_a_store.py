"""Several runtime processes on one PostgreSQL store, with the real ``mcp`` client: a runtime
SIGKILLed with runs in flight has every one of them resumed by the other, from its last
completed tool round, none lost and none driven by two runtimes (checked from the store's own
rows: each record says which runtime and lease generation wrote it); and a database restart in
the middle of runs is ridden out.

Each runtime runs over its own scripted engine (tests/pods_helpers.py), both on one workspace;
every run lists it once, then its second turn is held at its engine's gate, so the kill comes
with exactly one round recorded per run, not when a poll happens to see one.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pods_helpers import Pod, call, payload, script, start_pod, until
from postgres_helpers import PostgresServer

from luftpause.runtime.errors import UnknownRun

pytestmark = pytest.mark.integration

RUNS_EACH = 6


def _steps(workspace: Path) -> str:
    listing = {"call": "list_directory", "args": {"path": str(workspace)}}
    return script(listing, {"hold": "second", **listing}, {"say": "done"})


@pytest.fixture()
def two(tmp_path: Path, postgres: PostgresServer) -> Iterator[tuple[Pod, Pod, str, Path]]:
    """Two runtimes (their own engines, one workspace) on one fresh database."""
    url = postgres.database()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with ExitStack() as stack:
        pods = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            pods.append(
                stack.enter_context(
                    start_pod(
                        tmp_path / name,
                        workspace=None,
                        runtime_toml=f'workspace = "{workspace}"\n',
                        store=url,
                    )
                )
            )
        yield pods[0], pods[1], url, workspace


async def _spawn(pod: Pod, task: str, count: int) -> list[str]:
    async with Client(f"{pod.url}/mcp") as client:
        return [(await call(client, "spawn", task=task))["handle"] for _ in range(count)]


async def _knows(pod: Pod, handles: list[str]) -> bool:
    async with Client(f"{pod.url}/mcp") as client:
        for handle in handles:
            try:
                await call(client, "status", handle=handle)
            except (AssertionError, UnknownRun):
                return False
    return True


async def _await(pod: Pod, handles: list[str]) -> dict[str, Any]:
    async with Client(f"{pod.url}/mcp") as client:
        arguments = {"handles": handles, "timeout": 120}
        return payload(await client.call_tool("await", arguments, read_timeout_seconds=180))


def _rows(postgres: PostgresServer, url: str) -> list[tuple[Any, ...]]:
    return postgres.query(
        url,
        "SELECT handle, kind, owner, generation FROM luftpause_records WHERE stream = 'runs' ORDER BY seq",
    )


def test_a_killed_runtimes_runs_are_resumed_by_the_other_none_lost_none_driven_twice(
    two: tuple[Pod, Pod, str, Path], postgres: PostgresServer
) -> None:
    a, b, url, workspace = two
    task = _steps(workspace)
    on_a = asyncio.run(_spawn(a, task, RUNS_EACH))
    on_b = asyncio.run(_spawn(b, task, RUNS_EACH))

    async def all_held() -> bool:
        return all(a.engine.holding(h) for h in on_a) and all(b.engine.holding(h) for h in on_b)

    asyncio.run(until(all_held, "every run's second turn held at its engine", seconds=60))
    assert not asyncio.run(_knows(b, on_a[:1])), "b sees a's runs while a holds them"
    assert a.runtime is not None
    a.runtime.kill()
    b.engine.release("second")

    async def taken_over() -> bool:
        return await _knows(b, on_a)

    asyncio.run(until(taken_over, "b took over a's runs once their leases expired", seconds=90))
    result = asyncio.run(_await(b, on_a + on_b))
    assert result["timedOut"] is False, result
    for run in result["runs"]:
        assert run["state"] == "completed" and run["answer"] == "done", run
        assert run["toolCalls"] == 2, run

    # Resumed from the round a recorded: b's engine was asked a's runs' second turn with the
    # first round in the conversation, never the first turn again.
    for handle in on_a:
        asked = [
            sum(m["role"] == "assistant" for m in body["messages"]) for body in b.engine.requests[handle]
        ]
        assert asked == [1, 2], (handle, asked)

    rows = _rows(postgres, url)
    by_run: dict[str, list[tuple[str, str, int]]] = defaultdict(list)
    for handle, kind, owner, generation in rows:
        by_run[handle].append((kind, owner, generation))
    owners = {owner for _, _, owner, _ in rows}
    assert len(owners) == 2, owners
    b_owner = next(owner for kind, owner, _ in by_run[on_b[0]] if kind == "start")
    for handle in on_a + on_b:
        records = by_run[handle]
        kinds = [kind for kind, _, _ in records]
        assert kinds.count("end") == 1 and kinds.count("round") == 2, (handle, kinds)  # none lost
        generations = [generation for _, _, generation in records]
        # Fencing: a record of one generation never follows one of the next; each generation was
        # written by one runtime alone.
        assert generations == sorted(generations), (handle, records)
        for generation in set(generations):
            assert len({owner for _, owner, g in records if g == generation}) == 1, (handle, records)
        assert records[-1][1] == b_owner, (handle, records)  # ended by b
    for handle in on_a:
        assert {g for _, _, g in by_run[handle]} == {1, 2}, by_run[handle]  # a, then b after taking it
    leases = postgres.query(url, "SELECT DISTINCT owner FROM luftpause_leases")
    assert leases == [(b_owner,)]


def test_a_database_restart_in_the_middle_of_runs_is_ridden_out(
    two: tuple[Pod, Pod, str, Path], postgres: PostgresServer
) -> None:
    a, _, url, workspace = two
    handles = asyncio.run(_spawn(a, _steps(workspace), RUNS_EACH))

    async def all_held() -> bool:
        return all(a.engine.holding(h) for h in handles)

    asyncio.run(until(all_held, "every run's second turn held", seconds=60))
    postgres.restart()  # every connection of both runtimes is closed under them
    a.engine.release("second")
    result = asyncio.run(_await(a, handles))
    assert result["timedOut"] is False, result
    assert [run["state"] for run in result["runs"]] == ["completed"] * RUNS_EACH, result
    kinds = [(handle, kind) for handle, kind, _, _ in _rows(postgres, url) if handle in handles]
    for handle in handles:
        assert [k for h, k in kinds if h == handle].count("round") == 2
        assert [k for h, k in kinds if h == handle].count("end") == 1
    assert a.runtime is not None and "trying again" in a.runtime_log()
