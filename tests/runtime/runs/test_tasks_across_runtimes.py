"""MCP Tasks (``io.modelcontextprotocol/tasks``, 2026-07-28) with several runtime processes on one
PostgreSQL store, through the real ``mcp`` client: a task created on one runtime is read
(``tasks/get``), answered (``tasks/update``) and cancelled (``tasks/cancel``) through another,
which forwards each request to the runtime serving the task (the one holding its run); another
tenant's task id is unknown from every runtime; and a runtime SIGKILLed with tasks open has them
adopted with its runs by the runtime that takes the runs over, which serves them to their end
(``elicits`` kept: an approval asked again is ``input_required`` there too); while a runtime
restarted before any other took its runs fails the tasks it served, as on the file store.

Each runtime runs over its own scripted engine (tests/pods_helpers.py), beside one fake MCP
server whose ``delete_note`` waits for a person's approval, with the caller keys of two tenants.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx2
import pytest
from caller_keys_helpers import TEAM_A, TEAM_B, TEAMS, keys_file
from mcp import Client, MCPError
from mcp.client.context import ClientRequestContext
from mcp.client.streamable_http import streamable_http_client
from mcp.types import ElicitRequestParams, ElicitResult
from mcp_types import INTERNAL_ERROR, INVALID_PARAMS
from pods_helpers import Pod, call, script, start_pod, until
from postgres_helpers import PostgresServer
from runtime_helpers import destructive_tools
from tasks_client_helpers import (
    TERMINAL,
    CreatedTask,
    TasksDeclared,
    cancel_task,
    get_task,
    poll,
    update_task,
)

from luftpause.auth.callers import CALLER_KEYS_ENV
from luftpause.runtime.agent.approvals import Approvals
from luftpause.runtime.agent.upstream import UpstreamPool
from luftpause.runtime.mcp.routing import FORWARDED_HEADER, Router
from luftpause.runtime.mcp.spawn_tools import render_run_result
from luftpause.runtime.mcp.tasks import TaskRegistry
from luftpause.runtime.mcp.tasks_extension import (
    TaskIdParams,
    TasksExtension,
)
from luftpause.runtime.runs.custody import runtime_identity
from luftpause.runtime.runs.postgres import PostgresDatabase
from luftpause.runtime.runs.registry import RunRegistry

pytestmark = pytest.mark.integration

MODERN = "2026-07-28"
DELETE = {
    "task": script({"call": "delete_note", "args": {"title": "draft"}}, {"say": "deleted"}),
    "tools": ["delete_note"],
}
"""A run whose one tool call waits for approval, then answers ``deleted``."""


# The client side of the extension (the SDK has no request models for the 2026-07-28 extension).


async def decline(context: ClientRequestContext, params: ElicitRequestParams) -> ElicitResult:
    """Declares form elicitation; never called on the task path (questions travel in tasks/get)."""
    raise AssertionError(f"asked by elicitation, not in tasks/get: {params.message}")


@asynccontextmanager
async def tasks_client(pod: Pod, key: str, elicits: bool = True, **headers: str) -> AsyncIterator[Client]:
    """The real ``mcp`` client to ``pod`` on 2026-07-28, declaring the Tasks extension and (if
    ``elicits``) form elicitation, with the caller key ``key`` (and more ``headers``)."""
    sent = {"Authorization": f"Bearer {key}", **headers}
    async with httpx2.AsyncClient(headers=sent, timeout=httpx2.Timeout(30, read=120)) as http:
        transport = streamable_http_client(f"{pod.url}/mcp", http_client=http)
        async with Client(
            transport,
            mode=MODERN,
            extensions=[TasksDeclared()],
            elicitation_callback=decline if elicits else None,
        ) as client:
            yield client


async def start_task(client: Client, arguments: dict[str, Any]) -> tuple[str, str]:
    """A task of ``run(arguments)``: its id and its run's handle."""
    task = await client.session.call_tool("run", arguments, read_timeout_seconds=30, allow_claimed=True)
    assert isinstance(task, CreatedTask), task
    assert task.status == "working" and task.status_message is not None, task
    return task.task_id, task.status_message.split()[1]  # "run <handle> started"


async def refused(request: Any) -> MCPError:
    with pytest.raises(MCPError) as raised:
        await request
    return raised.value


# Two runtimes on one database.


@contextmanager
def runtimes(
    tmp_path: Path, postgres: PostgresServer, names: tuple[str, ...]
) -> Iterator[tuple[list[Pod], str]]:
    """Runtimes (one per name) on one fresh database, with the caller keys of ``TEAM_A`` and
    ``TEAM_B`` and a fake MCP server whose ``delete_note`` waits for a person's approval; and
    the database's URL."""
    url = postgres.database()
    keys = tmp_path / "callers.toml"
    keys.write_text(keys_file(*TEAMS))
    with destructive_tools(tmp_path) as tools_url, ExitStack() as stack:
        extra = (
            f'\n[[mcp_servers]]\nname = "tools"\nurl = "{tools_url}"\n\n[dataplane]\ncaller_keys = "{keys}"\n'
        )
        pods = []
        for name in names:
            (tmp_path / name).mkdir()
            pod = start_pod(
                tmp_path / name, workspace=None, extra_toml=extra, env={CALLER_KEYS_ENV: ""}, store=url
            )
            pods.append(stack.enter_context(pod))
        yield pods, url


@pytest.fixture()
def two(tmp_path: Path, postgres: PostgresServer) -> Iterator[tuple[Pod, Pod, str]]:
    """Two runtimes on one database (:func:`runtimes`), and its URL."""
    with runtimes(tmp_path, postgres, ("a", "b")) as (pods, url):
        yield pods[0], pods[1], url


def _task_rows(postgres: PostgresServer, url: str) -> list[tuple[str, str, str]]:
    """The tasks' records in the store: ``(taskId, type, owner)`` in order."""
    sql = "SELECT body, owner FROM luftpause_records WHERE stream = 'tasks' ORDER BY seq"
    rows = postgres.query(url, sql)
    return [(json.loads(body)["taskId"], json.loads(body)["type"], owner) for body, owner in rows]


def test_a_task_created_on_one_runtime_is_read_answered_and_cancelled_through_the_other(
    two: tuple[Pod, Pod, str],
) -> None:
    a, b, _ = two

    async def scenario() -> None:
        async with tasks_client(a, TEAM_A) as on_a, tasks_client(b, TEAM_A) as on_b:
            asking, asking_run = await start_task(on_a, DELETE)
            held, held_run = await start_task(on_a, {"task": script({"hold": "never", "say": "late"})})

            # tasks/get through b: the approval a's run waits on, as input_required.
            waiting = await poll(on_b.session, asking, lambda s: s["status"] != "working")
            assert waiting["status"] == "input_required" and waiting["resultType"] == "complete", waiting
            [(key, question)] = waiting["inputRequests"].items()
            assert key.startswith("approve:") and "delete_note" in question["params"]["message"]
            direct = await get_task(on_a.session, asking)  # the same answer as from a itself
            assert waiting == direct | {"lastUpdatedAt": waiting["lastUpdatedAt"]}

            # tasks/update through b answers it at a: the call goes ahead, the run ends there.
            allow = {"action": "accept", "content": {"allow": True}}
            ack = await update_task(on_b.session, asking, {key: allow})
            assert ack["resultType"] == "complete", ack
            done = await poll(on_b.session, asking, lambda s: s["status"] in TERMINAL)
            assert done["status"] == "completed", done
            [run] = done["result"]["structuredContent"]["runs"]
            assert (run["handle"], run["answer"], run["failedToolCalls"]) == (asking_run, "deleted", 0), run

            # tasks/cancel through b cancels a's run.
            assert (await cancel_task(on_b.session, held))["resultType"] == "complete"
            cancelled = await poll(on_b.session, held, lambda s: s["status"] in TERMINAL)
            assert cancelled["status"] == "cancelled", cancelled
            assert "tasks/cancel" in cancelled["statusMessage"], cancelled
            assert (await call(on_a, "status", handle=held_run))["run"]["state"] == "cancelled"

            # A task id no runtime recorded: unknown from b, as from a.
            missing = "task-" + "0" * 32
            for session in (on_b.session, on_a.session):
                assert (await refused(get_task(session, missing))).error.code == INVALID_PARAMS

        # Another tenant's key: both tasks are unknown from either runtime, as ids never made.
        async with tasks_client(b, TEAM_B) as other_on_b, tasks_client(a, TEAM_B) as other_on_a:
            for session in (other_on_b.session, other_on_a.session):
                for request in (get_task(session, asking), cancel_task(session, held)):
                    error = await refused(request)
                    assert error.error.code == INVALID_PARAMS and "no task" in error.error.message, error
                answer = {"approve:x": {"action": "accept", "content": {"allow": True}}}
                assert (await refused(update_task(session, asking, answer))).error.code == INVALID_PARAMS

        # A request already forwarded is answered where it lands, never forwarded again.
        async with tasks_client(b, TEAM_A, **{FORWARDED_HEADER: "elsewhere"}) as relayed:
            assert (await refused(get_task(relayed.session, asking))).error.code == INVALID_PARAMS

    asyncio.run(scenario())
    assert "forwarding tasks/get" in b.runtime_log() and "forwarding tasks/" not in a.runtime_log()


def test_a_killed_runtimes_open_tasks_are_served_by_the_runtime_that_takes_their_runs_over(
    two: tuple[Pod, Pod, str], postgres: PostgresServer
) -> None:
    """a serves two open tasks (one run held at a's engine, one waiting for approval) and is
    SIGKILLed; b, polling the tasks throughout, takes their runs over once their leases expire
    and serves the tasks: the first reaches ``completed`` with its run's result, the second asks
    its approval again as ``input_required`` (its creator declared elicitation) and completes
    once answered through b. The tasks' records are b's alone after."""
    a, b, url = two
    b.engine.release("first")  # b's engine answers at once; a's holds the turn

    async def created() -> tuple[str, str, str, str]:
        async with tasks_client(a, TEAM_A) as on_a:
            running, running_run = await start_task(on_a, {"task": script({"hold": "first", "say": "done"})})
            asking, asking_run = await start_task(on_a, DELETE)
            await poll(on_a.session, asking, lambda s: s["status"] == "input_required")
        return running, running_run, asking, asking_run

    running, running_run, asking, asking_run = asyncio.run(created())

    async def held() -> bool:
        return a.engine.holding(running_run)

    asyncio.run(until(held, "the running task's turn held at a's engine", seconds=60))

    async def scenario() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        async with tasks_client(b, TEAM_A) as on_b:
            before = await get_task(on_b.session, running)  # forwarded to a
            assert before["status"] == "working", before
            assert a.runtime is not None
            a.runtime.kill()
            # Each poll waits out the takeover, then is answered by b.
            done = await poll(on_b.session, running, lambda s: s["status"] in TERMINAL)
            asked = await poll(on_b.session, asking, lambda s: s["status"] == "input_required")
            [key] = asked["inputRequests"]
            await update_task(on_b.session, asking, {key: {"action": "accept", "content": {"allow": True}}})
            answered = await poll(on_b.session, asking, lambda s: s["status"] in TERMINAL)
        async with tasks_client(b, TEAM_B) as other_on_b:  # adopted, still not another tenant's
            assert (await refused(get_task(other_on_b.session, running))).error.code == INVALID_PARAMS
        return done, asked, answered

    done, asked, answered = asyncio.run(scenario())
    assert done["status"] == "completed", done
    [run] = done["result"]["structuredContent"]["runs"]
    assert (run["handle"], run["state"], run["answer"]) == (running_run, "completed", "done"), run
    assert asked["status"] == "input_required", asked
    assert answered["status"] == "completed", answered
    [run] = answered["result"]["structuredContent"]["runs"]
    assert (run["handle"], run["answer"], run["failedToolCalls"]) == (asking_run, "deleted", 0), run

    b_owner = runtime_identity(f"127.0.0.1:{b.port}")
    rows = _task_rows(postgres, url)
    assert {owner for _, _, owner in rows} == {b_owner}, rows  # a's records of them were removed
    for task_id in (running, asking):
        assert [kind for tid, kind, _ in rows if tid == task_id] == ["task", "end"], rows
    # Adopted once each (the two leases may expire, and be taken over, in separate rounds).
    adopted = re.findall(r"adopted (\d+) tasks", b.runtime_log())
    assert sum(int(n) for n in adopted) == 2, adopted


def test_a_runtime_restarted_on_the_shared_store_fails_the_tasks_it_served_as_on_the_file_store(
    tmp_path: Path, postgres: PostgresServer
) -> None:
    """The restart rule is the file store's: a runtime SIGKILLed and started again (the same
    name, before any other runtime took its runs) fails the task it served that was open, with
    the run to await named, while the run resumes and asks its approval again."""
    with runtimes(tmp_path, postgres, ("a",)) as ([a], _):

        async def created() -> tuple[str, str]:
            async with tasks_client(a, TEAM_A) as on_a:
                task_id, handle = await start_task(on_a, DELETE)
                await poll(on_a.session, task_id, lambda s: s["status"] == "input_required")
            return task_id, handle

        task_id, handle = asyncio.run(created())
        assert a.runtime is not None
        a.runtime.kill()
        a.start_runtime()

        async def after() -> tuple[dict[str, Any], dict[str, Any]]:
            async with tasks_client(a, TEAM_A, elicits=False) as on_a:
                failed = await get_task(on_a.session, task_id)
                waiting = await call(on_a, "await", handles=[handle], timeout=60)
            return failed, waiting

        failed, waiting = asyncio.run(after())
    assert failed["status"] == "failed", failed
    assert "restarted" in failed["error"]["message"] and handle in failed["error"]["message"], failed
    assert waiting["runs"][0]["state"] == "AwaitingApproval", waiting


def test_a_changing_tasks_request_whose_runtime_dies_under_it_is_answered_outcome_unknown_never_repeated(
    postgres: PostgresServer,
) -> None:
    """``tasks/cancel`` forwarded to the runtime serving the task, which takes the request and
    dies before answering (here a socket that reads it and closes: a real runtime cannot be
    killed at that instant on purpose): answered ``-32603`` saying the outcome is unknown, and
    sent once. In-process, on a real database whose lease names that runtime."""
    url = postgres.database()
    task_id = "task-" + "1" * 32
    received: list[bytes] = []

    async def dies(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.append(await reader.read(65536))
        writer.close()

    async def go() -> MCPError:
        server = await asyncio.start_server(dies, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        database = PostgresDatabase(url, owner="here/1")
        database.migrate()
        runtime = "INSERT INTO luftpause_runtimes (owner, url) VALUES ('gone/1', %s) RETURNING owner"
        postgres.query(url, runtime, f"http://127.0.0.1:{port}")
        lease = "INSERT INTO luftpause_leases VALUES ('run-1', 'gone/1', 1, now() + interval '1 hour')"
        lease += " RETURNING 1"
        postgres.query(url, lease)
        created = {"type": "task", "taskId": task_id, "handle": "run-1", "at": 1.0, "elicits": False}
        other = PostgresDatabase(url, owner="gone/1").journal("tasks")
        other.compact([created])
        runs = RunRegistry()
        records = database.journal("tasks")
        tasks = TaskRegistry(
            records, runs, Approvals(runs, UpstreamPool([])), render_run_result, shared=records
        )
        extension = TasksExtension(tasks, Router(runs, database))
        ctx: Any = SimpleNamespace(request=SimpleNamespace(headers={}))  # a request without headers
        try:
            return await refused(extension._routed("tasks/cancel", ctx, TaskIdParams(task_id=task_id)))
        finally:
            server.close()

    error = asyncio.run(go())
    assert error.error.code == INTERNAL_ERROR, error
    assert "stopped answering during tasks/cancel" in error.error.message, error
    assert "unknown" in error.error.message and task_id in error.error.message, error
    assert len(received) == 1 and b"tasks/cancel" in received[0], received
