"""Several runtime processes on one PostgreSQL store, with the real ``mcp`` client: a runtime
SIGKILLed under load (runs mid-turn, runs waiting for a person's approval, a pod whose children
hold delegated scopes, a caller's events not yet given) has every one of its runs resumed by the
other, from its last completed tool round, none lost and none driven by two runtimes (checked from
the store's own rows: each record says which runtime and lease generation wrote it); a database
restart in the middle of runs is ridden out; and every MCP call about a run works from the runtime
that does not hold it (forwarded to its owner, luftpause/runtime/mcp/routing.py), under the
caller's own key, and waits out the takeover of a run whose owner is killed under it.

Each runtime runs over its own scripted engine (tests/pods_helpers.py), both on one workspace;
the runs' turns are held at their engine's gates, so the kill comes with exactly the rounds a test
means recorded, not when a poll happens to see them."""

from __future__ import annotations

import asyncio
import json
import re
import time
import urllib.request
from collections import defaultdict
from collections.abc import AsyncIterator, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager, ExitStack, asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx2
import pytest
from caller_keys_helpers import TEAM_A, TEAM_B, TEAMS, keys_file
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from pods_helpers import Pod, call, get_json, payload, script, start_pod, tool_text, until
from postgres_helpers import PostgresServer
from runtime_helpers import destructive_tools

from luftpause.auth.callers import CALLER_KEYS_ENV
from luftpause.runtime.errors import UnknownRun
from luftpause.runtime.mcp.callers import CALLER_HEADER
from luftpause.runtime.mcp.routing import FORWARDED_HEADER
from luftpause.runtime.runs.custody import runtime_identity

pytestmark = pytest.mark.integration

RUNS_EACH = 6
APPROVALS = 4


def _steps(workspace: Path) -> str:
    listing = {"call": "list_directory", "args": {"path": str(workspace)}}
    return script(listing, {"hold": "second", **listing}, {"say": "done"})


@contextmanager
def _two_runtimes(
    tmp_path: Path,
    url: str,
    *,
    runtime_toml: str = "",
    extra_toml: str = "",
    env: dict[str, str] | None = None,
) -> Iterator[tuple[Pod, Pod]]:
    """Runtimes ``a`` and ``b`` (each over its own scripted engine, in ``tmp_path/a`` and
    ``tmp_path/b``) on the database at ``url``, both with the same ``[runtime]`` keys
    (``runtime_toml``), more tables (``extra_toml``) and environment (``env``)."""
    with ExitStack() as stack:
        pods = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            pods.append(
                stack.enter_context(
                    start_pod(
                        tmp_path / name,
                        workspace=None,
                        runtime_toml=runtime_toml,
                        extra_toml=extra_toml,
                        env=env,
                        store=url,
                    )
                )
            )
        yield pods[0], pods[1]


@contextmanager
def _fake_tools(tmp_path: Path) -> Iterator[int]:
    """The fake MCP server with ``delete_note`` (:func:`runtime_helpers.destructive_tools`), on a
    free port (given)."""
    with destructive_tools(tmp_path) as url:
        port = urlsplit(url).port
        assert port is not None
        yield port


def _tools_toml(port: int) -> str:
    return f'\n[[mcp_servers]]\nname = "tools"\nurl = "http://127.0.0.1:{port}/mcp"\n'


@pytest.fixture()
def two(tmp_path: Path, postgres: PostgresServer) -> Iterator[tuple[Pod, Pod, str, Path]]:
    """Two runtimes (their own engines, one workspace) on one fresh database."""
    url = postgres.database()
    workspace = tmp_path / "ws"
    workspace.mkdir()
    with _two_runtimes(tmp_path, url, runtime_toml=f'workspace = "{workspace}"\n') as (a, b):
        yield a, b, url, workspace


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


@pytest.fixture()
def loaded(tmp_path: Path, postgres: PostgresServer) -> Iterator[tuple[Pod, Pod, str, Path, int]]:
    """Two runtimes on one fresh database, one workspace (``pod/c1`` and ``pod/c2`` in it), and
    the fake MCP server whose ``delete_note`` waits for a person's approval (its port given)."""
    url = postgres.database()
    workspace = (tmp_path / "ws").resolve()
    for folder in ("pod/c1", "pod/c2"):
        (workspace / folder).mkdir(parents=True)
    with _fake_tools(tmp_path) as port:
        toml = f'workspace = "{workspace}"\n'
        with _two_runtimes(tmp_path, url, runtime_toml=toml, extra_toml=_tools_toml(port)) as (a, b):
            yield a, b, url, workspace, port


@asynccontextmanager
async def _client(pod: Pod, **headers: str) -> AsyncIterator[Client]:
    """The real ``mcp`` client to ``pod``, sending ``headers`` with every request."""
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30, read=120)) as http:
        async with Client(streamable_http_client(f"{pod.url}/mcp", http_client=http)) as client:
            yield client


async def _alices_status(pod: Pod) -> dict[str, Any]:
    """``status`` without a handle, as the caller ``alice``: her runs ``pod`` holds, and the
    events of hers it has not given yet (taken)."""
    async with _client(pod, **{CALLER_HEADER: "alice"}) as client:
        return await call(client, "status")


def _rw(path: str) -> list[dict[str, Any]]:
    return [{"effect": "allow", "access": ["read", "write"], "path": path}]


def _pod_tasks() -> dict[str, str]:
    """The pod: ``lead`` (holding ``pod``) spawns ``c1`` (``pod/c1``) and ``c2`` (``pod/c2``,
    which may spawn), then answers at the gate ``lead``; re-opened, it echoes the notifications
    that reached it since. ``c1`` answers at its gate; ``c2``, at its gate, writes in its scope,
    then tries to hand on more than it holds, then to write in ``c1``'s part."""
    c1 = script({"hold": "c1", "say": "c1 done"})
    c2 = script(
        {"hold": "c2", "call": "write_file", "args": {"path": "pod/c2/mine.txt", "content": "from c2"}},
        {"call": "spawn", "args": {"task": script({"say": "wide"}), "name": "wider", "scope": _rw("pod")}},
        {"call": "write_file", "args": {"path": "pod/c1/theirs.txt", "content": "escape"}},
        {"say": "c2 done"},
    )
    lead = script(
        {"call": "spawn", "args": {"task": c1, "name": "c1", "scope": _rw("pod/c1")}},
        {"call": "spawn", "args": {"task": c2, "name": "c2", "orchestrate": True, "scope": _rw("pod/c2")}},
        {"hold": "lead", "say": "spawned"},
        {"echo": "new-system"},
    )
    return {"lead": lead, "c1": c1, "c2": c2}


async def _state(pod: Pod, handle: str) -> dict[str, Any]:
    async with Client(f"{pod.url}/mcp") as client:
        return dict((await call(client, "status", handle=handle))["run"])


def _scope(pod: Pod, handle: str) -> Any:
    """``handle``'s scope as ``pod``'s monitor shows it (``None``: it holds none)."""
    runs = get_json(f"{pod.url}/monitor/runs")["runs"]
    return next(run for run in runs if run["handle"] == handle)["scope"]


def _conversation(pod: Pod, handle: str, role: str) -> list[str]:
    messages = get_json(f"{pod.url}/monitor/runs/{handle}")["messages"]
    return [str(m["content"]) for m in messages if m["role"] == role]


def test_a_killed_runtimes_runs_are_resumed_by_the_other_none_lost_none_driven_twice(
    loaded: tuple[Pod, Pod, str, Path, int], postgres: PostgresServer
) -> None:
    """a is SIGKILLed holding plain runs mid-turn, runs waiting for a person's approval of
    ``delete_note`` and a pod (a spawner whose two children hold narrowed scopes: one answered,
    its event not yet taken, one mid-turn); b, under its own load, takes them all over. Through b:
    the approvals are answered and their calls made once; the pod's child keeps its scope (it
    cannot hand on more, nor write its sibling's part) and the spawner hears of each child once.
    The store's rows show each generation of each run written by one runtime, generations only
    rising, and no tool round recorded twice. The takeover time is printed."""
    a, b, url, workspace, tools_port = loaded
    task = _steps(workspace)
    plain_a = asyncio.run(_spawn(a, task, RUNS_EACH))
    plain_b = asyncio.run(_spawn(b, task, RUNS_EACH))
    pod = _pod_tasks()

    async def spawn_on_a() -> tuple[list[str], str]:
        async with Client(f"{a.url}/mcp") as client:
            asking = []
            for number in range(APPROVALS):
                deleting = script(
                    {"call": "delete_note", "args": {"title": f"note {number}"}}, {"say": "deleted"}
                )
                asking.append((await call(client, "spawn", task=deleting, tools=["delete_note"]))["handle"])
            lead = await call(
                client, "spawn", task=pod["lead"], name="lead", orchestrate=True, scope=_rw("pod")
            )
            return asking, str(lead["handle"])

    asking, lead = asyncio.run(spawn_on_a())

    async def alices_runs_at_a() -> tuple[str, str]:  # the first's event taken at a, the second's not
        async with _client(a, **{CALLER_HEADER: "alice"}) as client:
            first = (await call(client, "spawn", task=script({"say": "quick"})))["handle"]
            taken: list[dict[str, Any]] = []

            async def given() -> bool:
                taken.extend((await _alices_status(a)).get("events", []))
                return bool(taken)

            await until(given, "alice's first run's event, given at a", seconds=60)
            assert [event["handle"] for event in taken] == [first], taken
            second = (await call(client, "spawn", task=script({"say": "quick"})))["handle"]
            await until(lambda: _idle(a, second), "alice's second run answered", seconds=60)
        return first, second

    quick = asyncio.run(alices_runs_at_a())

    async def loaded_at_a() -> bool:
        for handle in asking:
            if (await _state(a, handle))["state"] != "AwaitingApproval":
                return False
        if len((await _state(a, lead))["children"]) != 2:
            return False
        return all(a.engine.holding(h) for h in [*plain_a, lead]) and all(
            b.engine.holding(h) for h in plain_b
        )

    asyncio.run(until(loaded_at_a, "a's runs held mid-turn or waiting for approval", seconds=60))
    c1, c2 = asyncio.run(_state(a, lead))["children"]

    async def children_held() -> bool:
        return a.engine.holding(c1) and a.engine.holding(c2)

    asyncio.run(until(children_held, "the pod's children mid-turn at a", seconds=60))
    a.engine.release("c1")

    async def c1_answered() -> bool:
        return (await _state(a, c1))["podState"] == "idle"

    asyncio.run(until(c1_answered, "c1 answered at a (its event waits for lead's next turn)", seconds=60))
    c2_scope = _scope(a, c2)
    assert c2_scope["granted"] == _rw(str(workspace / "pod" / "c2")), c2_scope
    assert asyncio.run(_knows(b, [lead, *asking])), "b answers for a's runs (forwarded to a)"
    # Spawned just before the kill, after a's last renewal of its leases: its lease expires up to
    # 2 s after the others', and is taken over with them, in one round.
    late = asyncio.run(_spawn(a, task, 1))
    # One approval is answered at a and its call is in flight (held at the tool server) at the kill.
    early, *waiting, in_flight = asking
    call_id = f"{in_flight}:1:0"
    _tool_server(tools_port, "delete_note/hold")
    asyncio.run(_approve(a, in_flight))

    async def started() -> bool:
        return call_id in get_json(f"http://127.0.0.1:{tools_port}/testkit/call-ids")

    asyncio.run(until(started, "the approved call in flight at the tool server", seconds=60))

    assert a.runtime is not None
    a.runtime.kill()
    killed = time.monotonic()
    _tool_server(tools_port, "delete_note/release")
    b.engine.release("second")  # b's own runs go on while a's leases run out
    unfinished = [*plain_a, *late, *asking, lead, c2]
    # A person answers one approval through b at once: the call waits out the takeover, then is
    # answered by b once the run, resumed there, has asked its question again.
    later = [*waiting, in_flight]
    answering = ThreadPoolExecutor(1).submit(asyncio.run, _approve(b, early))
    b_owner = runtime_identity(f"127.0.0.1:{b.port}")

    async def taken_over() -> bool:
        return _holders(postgres, url, [*unfinished, c1]) == {b_owner}

    asyncio.run(until(taken_over, "b took over a's runs once their leases expired", seconds=90))
    taken = time.monotonic() - killed

    async def resumed() -> bool:  # each asked its turn again at b's engine, or its approval at b
        if not all(b.engine.requests.get(h) for h in [*plain_a, *late, lead, c2]):
            return False
        states = [(await _state(b, h))["state"] for h in later]
        return states == ["AwaitingApproval"] * len(later)

    asyncio.run(until(resumed, "b resumed a's runs", seconds=60))
    back = time.monotonic() - killed
    print(f"\ntakeover: a's leases at b {taken:.1f} s, its runs resumed at b {back:.1f} s after the SIGKILL")

    assert answering.result(timeout=120)["tool"] == "delete_note"  # the early approval, answered at b
    # The call in flight at the kill is asked again, saying it may have run: never repeated unasked.
    (question,) = asyncio.run(_state(b, in_flight))["pendingApprovals"]
    assert question.get("repeat") is True, question

    # alice's event not given at a is given by b, once; the one a gave is not given again.
    alices = asyncio.run(_alices_status(b))
    assert sorted(run["handle"] for run in alices["runs"]) == sorted(quick), alices
    assert [event["handle"] for event in alices.get("events", [])] == [quick[1]], alices
    assert asyncio.run(_alices_status(b)).get("events") is None

    # The pod at b: c2 keeps its scope; lead's resumed turn (held at b) told it of c1 alone.
    assert _scope(b, c2) == c2_scope
    b.engine.release("c2")

    async def c2_answered() -> bool:
        return (await _state(b, c2))["podState"] == "idle"

    asyncio.run(until(c2_answered, "c2 answered at b", seconds=60))
    b.engine.release("lead")

    async def approve_and_report() -> dict[str, Any]:
        async with Client(f"{b.url}/mcp") as client:
            for handle in later:
                approved = await call(client, "approve", handle=handle, allow=True)
                assert approved["tool"] == "delete_note", approved
            await until(lambda: _idle(b, lead), "lead answered at b", seconds=60)
            sent = await call(client, "send", handle=lead, message="report")
            assert sent["delivered"] == "now", sent
        return await _await(b, [*plain_a, *late, *plain_b, *asking, lead, c1, c2])

    result = asyncio.run(approve_and_report())
    assert result["timedOut"] is False, result
    runs = {run["handle"]: run for run in result["runs"]}
    unfinished_runs = [run for run in runs.values() if run["state"] != "completed"]
    assert unfinished_runs == [], unfinished_runs  # none lost
    for handle in plain_a + late + plain_b:
        assert runs[handle]["answer"] == "done" and runs[handle]["toolCalls"] == 2, runs[handle]
    for handle in plain_a:  # resumed from the round a recorded, never the first turn again
        asked = [
            sum(m["role"] == "assistant" for m in body["messages"]) for body in b.engine.requests[handle]
        ]
        assert asked == [1, 2], (handle, asked)
    for handle in asking:
        assert runs[handle]["answer"] == "deleted", runs[handle]
        assert not b.engine.requests.get(handle, [])[:-1], "its reply was not asked for again"

    # Each approved call made once, under its id (the server counts them).
    made = get_json(f"http://127.0.0.1:{tools_port}/testkit/call-ids")
    expected = {f"{handle}:1:0": 1 for handle in [early, *waiting]} | {call_id: 2}  # approved twice
    assert expected.items() <= made.items(), made

    # The pod: c2 wrote in its part, could not hand on more nor write c1's; lead heard of each once.
    c2_results = _conversation(b, c2, "tool")
    assert c2_results[0].startswith("wrote"), c2_results
    assert "scope exceeds the spawner's" in c2_results[1], c2_results
    assert "denied" in c2_results[2] and "pod/c1/theirs.txt" in c2_results[2], c2_results
    assert (workspace / "pod" / "c2" / "mine.txt").read_text() == "from c2"
    assert not (workspace / "pod" / "c1" / "theirs.txt").exists()
    told = "\n".join(_conversation(b, lead, "system"))
    assert told.count(f"answered: child 'c1' ({c1})") == 1, told
    assert told.count(f"answered: child 'c2' ({c2})") == 1, told
    assert f"answered: child 'c2' ({c2})" in runs[lead]["answer"], runs[lead]  # after the send
    monitor = get_json(f"{b.url}/monitor/runs")["runs"]
    assert all(run["scope"] is None for run in monitor), monitor  # every part returned

    rounds = re.findall(r"took over (\d+) runs \(", b.runtime_log())
    assert rounds == [str(len(unfinished) + 3)], rounds  # a's runs (c1 and alice's two too) at once
    _check_records(postgres, url, b_owner, resumed=[*unfinished, *plain_b], finished_at_a=[c1, *quick])


def _check_records(
    postgres: PostgresServer, url: str, b_owner: str, resumed: list[str], finished_at_a: list[str]
) -> None:
    """From the store's rows: every run ended, each generation written by one runtime,
    generations only rising (a's runs at 1, then 2 at b), no tool round recorded twice; the runs
    ``resumed`` (a's that were unfinished, and b's own) ended by b."""
    rows = postgres.query(
        url,
        "SELECT handle, kind, owner, generation, body FROM luftpause_records "
        "WHERE stream = 'runs' ORDER BY seq",
    )
    by_run: dict[str, list[tuple[str, str, int, Any]]] = defaultdict(list)
    for handle, kind, owner, generation, body in rows:
        by_run[handle].append((kind, owner, generation, body if isinstance(body, dict) else json.loads(body)))
    assert len({owner for _, _, owner, _, _ in rows}) == 2
    for handle in resumed + finished_at_a:
        records = by_run[handle]
        kinds = [kind for kind, _, _, _ in records]
        assert kinds.count("start") == 1 and "end" in kinds, (handle, kinds)  # none lost
        generations = [generation for _, _, generation, _ in records]
        # Fencing: a record of one generation never follows one of the next; each generation was
        # written by one runtime alone.
        assert generations == sorted(generations), (handle, records)
        for generation in set(generations):
            assert len({owner for _, owner, g, _ in records if g == generation}) == 1, (handle, records)
        # No tool round recorded twice: each reply's calls (their ids) are in one round only.
        rounds = [
            call["id"]
            for kind, _, _, body in records
            if kind == "round"
            for message in body["messages"]
            for call in message.get("tool_calls") or ()
        ]
        assert len(rounds) == len(set(rounds)), (handle, rounds)
        assert set(generations) <= {1, 2}, (handle, records)
        if handle in resumed:
            assert [owner for kind, owner, _, _ in records if kind == "end"][-1] == b_owner, (handle, records)
    leases = postgres.query(url, "SELECT DISTINCT owner FROM luftpause_leases")
    assert leases == [(b_owner,)]


def _tool_server(port: int, action: str) -> None:
    """POST ``/testkit/<action>`` to the fake MCP server (``delete_note/hold``, ``.../release``)."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}/testkit/{action}", data=b"", method="POST")
    with urllib.request.urlopen(request, timeout=10):
        pass


async def _approve(pod: Pod, handle: str) -> dict[str, Any]:
    async with Client(f"{pod.url}/mcp") as client:
        return payload(
            await client.call_tool("approve", {"handle": handle, "allow": True}, read_timeout_seconds=120)
        )


async def _idle(pod: Pod, handle: str) -> bool:
    return (await _state(pod, handle))["podState"] == "idle"


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
    keys = tmp_path / "callers.toml"
    keys.write_text(keys_file(*TEAMS))
    with _fake_tools(tmp_path) as port:
        extra = _tools_toml(port) + f'\n[dataplane]\ncaller_keys = "{keys}"\n'
        env = {CALLER_KEYS_ENV: ""}
        with _two_runtimes(tmp_path, postgres.database(), extra_toml=extra, env=env) as pods:
            yield pods


def _keyed_client(pod: Pod, key: str, **headers: str) -> AbstractAsyncContextManager[Client]:
    """The real ``mcp`` client to ``pod`` with the caller key ``key`` (and more ``headers``)."""
    return _client(pod, Authorization=f"Bearer {key}", **headers)


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
