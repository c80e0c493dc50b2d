"""Several runtime processes on one PostgreSQL store, with the real ``mcp`` client: a runtime
SIGKILLed with runs in flight has every one of them resumed by the other, from its last
completed tool round, none lost and none driven by two runtimes (checked from the store's own
rows: each record says which runtime and lease generation wrote it); a database restart in
the middle of runs is ridden out; and every MCP call about a run works from the runtime that does
not hold it (forwarded to its owner, luftpause/runtime/mcp/routing.py), under the caller's own
key, and waits out the takeover of a run whose owner is killed under it.

Each runtime runs over its own scripted engine (tests/pods_helpers.py), both on one workspace;
every run lists it once, then its second turn is held at its engine's gate, so the kill comes
with exactly one round recorded per run, not when a poll happens to see one.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from caller_keys_helpers import TEAM_A, TEAM_B, TEAMS, keys_file
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from pods_helpers import Pod, call, payload, script, start_pod, tool_text, until
from postgres_helpers import PostgresServer

from luftpause.auth.callers import CALLER_KEYS_ENV
from luftpause.runtime.errors import UnknownRun
from luftpause.runtime.mcp.routing import FORWARDED_HEADER
from luftpause.runtime.runs.custody import runtime_identity
from luftpause.testkit.launch.procs import ChildProcess, free_port

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


def _holders(postgres: PostgresServer, url: str, handles: list[str]) -> set[str]:
    """The runtimes whose leases hold ``handles``."""
    rows = postgres.query(url, "SELECT owner FROM luftpause_leases WHERE handle = ANY(%s)", handles)
    return {str(owner) for (owner,) in rows}


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
    assert asyncio.run(_knows(b, on_a[:1])), "b answers for a's runs (forwarded to a)"
    assert a.runtime is not None
    a.runtime.kill()
    b.engine.release("second")

    async def taken_over() -> bool:
        return _holders(postgres, url, on_a) == {runtime_identity(f"127.0.0.1:{b.port}")}

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


@pytest.fixture()
def keyed(tmp_path: Path, postgres: PostgresServer) -> Iterator[tuple[Pod, Pod]]:
    """Two runtimes on one fresh database, with the caller keys of two tenants (``TEAM_A``,
    ``TEAM_B``) and a fake MCP server whose ``delete_note`` waits for a person's approval."""
    url = postgres.database()
    keys = tmp_path / "callers.toml"
    keys.write_text(keys_file(*TEAMS))
    port = free_port()
    tools = ChildProcess(
        "fake-mcp",
        ["fake-mcp", "--port", str(port), "--destructive"],
        tmp_path / "fake-mcp.log",
        ready_port=("127.0.0.1", port),
    )
    tools.start().wait_ready()
    extra = (
        f'\n[[mcp_servers]]\nname = "tools"\nurl = "http://127.0.0.1:{port}/mcp"\n'
        f'\n[dataplane]\ncaller_keys = "{keys}"\n'
    )
    try:
        with ExitStack() as stack:
            pods = []
            for name in ("a", "b"):
                (tmp_path / name).mkdir()
                pods.append(
                    stack.enter_context(
                        start_pod(
                            tmp_path / name,
                            workspace=None,
                            extra_toml=extra,
                            env={CALLER_KEYS_ENV: ""},
                            store=url,
                        )
                    )
                )
            yield pods[0], pods[1]
    finally:
        tools.stop()


@asynccontextmanager
async def _keyed_client(pod: Pod, key: str, **headers: str) -> AsyncIterator[Client]:
    """The real ``mcp`` client to ``pod`` with the caller key ``key`` (and more ``headers``)."""
    sent = {"Authorization": f"Bearer {key}", **headers}
    async with httpx2.AsyncClient(headers=sent, timeout=httpx2.Timeout(30, read=120)) as http:
        async with Client(streamable_http_client(f"{pod.url}/mcp", http_client=http)) as client:
            yield client


def _user_messages(pod: Pod, handle: str) -> list[str]:
    """The user messages of the last turn ``pod``'s engine was asked for ``handle``."""
    asked = pod.engine.requests[handle][-1]["messages"]
    return [m["content"] for m in asked if m["role"] == "user"]


async def _refused(client: Client, tool: str, **arguments: Any) -> str:
    result = await client.call_tool(tool, arguments, read_timeout_seconds=60)
    assert result.is_error, (tool, result)
    return tool_text(result)


def test_every_call_about_a_run_works_from_the_runtime_that_does_not_hold_it(
    keyed: tuple[Pod, Pod],
) -> None:
    a, b = keyed

    async def scenario() -> None:
        async with _keyed_client(a, TEAM_A) as on_a, _keyed_client(b, TEAM_A) as on_b:
            said = (await call(on_a, "spawn", task=script({"say": "first"}, {"say": "second"})))["handle"]
            held = (await call(on_a, "spawn", task=script({"hold": "never", "say": "late"})))["handle"]
            stopped = (await call(on_a, "spawn", task=script({"hold": "never", "say": "late"})))["handle"]
            asking = await call(
                on_a,
                "spawn",
                task=script({"call": "delete_note", "args": {"title": "draft"}}, {"say": "deleted"}),
                tools=["delete_note"],
            )

            # status and await from b: the run a drives, its answer.
            status = await call(on_b, "status", handle=said)
            assert status["run"]["handle"] == said and status["run"]["task"].startswith("script:"), status
            done = await call(on_b, "await", handles=[said], timeout=60)
            assert done["timedOut"] is False and done["runs"][0]["answer"] == "first", done
            read = await call(on_b, "read", handle=said)
            assert read["handle"] == said, read

            # send from b re-opens the idle run at a: a's engine is asked with b's message.
            sent = await call(on_b, "send", handle=said, message="from b")
            assert sent["delivered"] == "now", sent
            again = await call(on_b, "await", handles=[said], timeout=60)
            assert again["runs"][0]["answer"] == "second", again
            asked = a.engine.requests[said][-1]["messages"]
            assert [m["content"] for m in asked if m["role"] == "user"][-1].endswith("from b"), asked

            # cancel and stop from b end runs a drives; a says so.
            cancelled = await call(on_b, "cancel", handle=held)
            assert held in cancelled["cancelled"], cancelled
            assert (await call(on_a, "status", handle=held))["run"]["state"] == "cancelled"
            stopping = await call(on_b, "stop", handle=stopped)  # busy: stops once its turn ends
            assert stopping["stopping"]["by"].startswith("MCP caller team-a/"), (
                stopping
            )  # b's caller, a's tenant
            assert (await call(on_b, "stop", handle=said))["state"] == "stopped"  # idle: at once
            assert (await call(on_a, "status", handle=said))["run"]["podState"] == "stopped"

            # approve from b: the call a's run waits on goes ahead.
            waiting = await call(on_b, "await", handles=[asking["handle"]], timeout=60)
            assert waiting["runs"][0]["state"] == "AwaitingApproval", waiting
            approved = await call(on_b, "approve", handle=asking["handle"], allow=True)
            assert approved["tool"] == "delete_note", approved
            finished = await call(on_b, "await", handles=[asking["handle"]], timeout=60)
            assert finished["runs"][0]["answer"] == "deleted", finished

            # A handle of a's and one of b's in one await: refused with the reason.
            own = (await call(on_b, "spawn", task=script({"say": "b's"})))["handle"]
            mixed = await _refused(on_b, "await", handles=[said, own], timeout=5)
            assert "held by different runtimes" in mixed, mixed

        # Another tenant's key: "not found", from either runtime, as a handle that does not exist.
        async with _keyed_client(b, TEAM_B) as other_on_b, _keyed_client(a, TEAM_B) as other_on_a:
            for client in (other_on_b, other_on_a):
                assert "unknown run handle" in await _refused(client, "status", handle=said)
                assert "unknown run handle" in await _refused(client, "await", handles=[said], timeout=5)
                assert "unknown run handle" in await _refused(client, "cancel", handle=asking["handle"])

        # A call already forwarded is answered where it lands, never forwarded again.
        async with _keyed_client(b, TEAM_A, **{FORWARDED_HEADER: "elsewhere"}) as relayed:
            assert "unknown run handle" in await _refused(relayed, "status", handle=said)

    asyncio.run(scenario())
    assert "forwarding" in b.runtime_log() and "forwarding" not in a.runtime_log()


def test_an_await_on_the_other_runtime_ends_with_the_result_when_the_owner_is_killed(
    two: tuple[Pod, Pod, str, Path], postgres: PostgresServer
) -> None:
    """b awaits a run of a's (forwarded to a); a is SIGKILLed; b takes the run over once its lease
    expires, resumes it, and the same await call answers with the run's result. A ``send`` to
    another of a's runs, made from b after the kill, waits for the takeover and is delivered."""
    a, b, url, workspace = two
    handle = asyncio.run(_spawn(a, script({"hold": "first", "say": "done"}), 1))[0]
    b.engine.release("first")  # b's engine answers it at once; a's holds its turn
    # The other run is held at either engine's gate "other" until b has sent it the message: it is
    # running throughout, so the message is taken at its next turn, after the tool round.
    listing = {"call": "list_directory", "args": {"path": str(workspace)}}
    other = asyncio.run(_spawn(a, script({"hold": "other", **listing}, {"say": "listed"}), 1))[0]

    async def held() -> bool:
        return a.engine.holding(handle) and a.engine.holding(other)

    asyncio.run(until(held, "the run's turn held at a's engine", seconds=60))

    async def scenario() -> dict[str, Any]:
        waiting = asyncio.create_task(_await(b, [handle]))

        async def forwarded() -> bool:
            return "forwarding await" in b.runtime_log()

        await until(forwarded, "b forwarded the await to a", seconds=60)
        assert a.runtime is not None
        a.runtime.kill()
        async with Client(f"{b.url}/mcp") as client:
            sent = await call(client, "send", handle=other, message="after the kill")
        assert sent["delivered"] == "next turn", sent
        b.engine.release("other")
        answered = await waiting
        after = await _await(b, [other])  # its turn with the message sent
        assert after["runs"][0]["state"] == "completed", after
        return answered

    result = asyncio.run(scenario())
    assert result["timedOut"] is False, result
    assert [(run["state"], run["answer"]) for run in result["runs"]] == [("completed", "done")], result
    assert _user_messages(b, other)[-1].endswith("after the kill")
    assert _holders(postgres, url, [handle, other]) == {runtime_identity(f"127.0.0.1:{b.port}")}
