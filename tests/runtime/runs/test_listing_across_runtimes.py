"""Calls that name no run a runtime holds, on two runtime processes sharing one PostgreSQL store,
with the real ``mcp`` client: ``status`` and ``list`` without a handle list the caller's runs of
both runtimes, paged across them; ``spawn(parent=...)`` and ``list(handle=...)`` naming a run
the other runtime holds, and pod names (``send``, ``read``, ``stop``) of runs held there, work
from either runtime; another tenant's runs never appear; and a runtime SIGKILLed does not make
its runs vanish from the listing (it waits for their takeover).

Each runtime has its own scripted engine (tests/pods_helpers.py); the caller is named by
``x-luftpause-caller``, the tenants by their caller keys (tests/caller_keys_helpers.py).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from caller_keys_helpers import TEAM_A, TEAM_B, TEAMS, keys_file
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from pods_helpers import Pod, call, script, start_pod, tool_text
from postgres_helpers import PostgresServer

from luftpause.auth.callers import CALLER_KEYS_ENV
from luftpause.runtime.mcp.callers import CALLER_HEADER
from luftpause.runtime.runs.custody import runtime_identity

pytestmark = pytest.mark.integration

SAYS = script({"say": "first"}, {"say": "second"})


@pytest.fixture()
def keyed(tmp_path: Path, postgres: PostgresServer) -> Iterator[tuple[Pod, Pod, str]]:
    """Two runtimes on one fresh database with the caller keys of two tenants; and its URL."""
    url = postgres.database()
    keys = tmp_path / "callers.toml"
    keys.write_text(keys_file(*TEAMS))
    extra = f'\n[dataplane]\ncaller_keys = "{keys}"\n'
    with ExitStack() as stack:
        pods = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            pod = start_pod(
                tmp_path / name, workspace=None, extra_toml=extra, env={CALLER_KEYS_ENV: ""}, store=url
            )
            pods.append(stack.enter_context(pod))
        yield pods[0], pods[1], url


@asynccontextmanager
async def _client(pod: Pod, key: str, caller: str = "alice") -> AsyncIterator[Client]:
    """The real ``mcp`` client to ``pod`` under caller key ``key``, as caller ``caller``."""
    sent = {"Authorization": f"Bearer {key}", CALLER_HEADER: caller}
    async with httpx2.AsyncClient(headers=sent, timeout=httpx2.Timeout(30, read=120)) as http:
        async with Client(streamable_http_client(f"{pod.url}/mcp", http_client=http)) as client:
            yield client


async def _done(client: Client, *handles: str) -> None:
    result = await call(client, "await", handles=list(handles), timeout=60)
    assert result["timedOut"] is False, result


def _owner(postgres: PostgresServer, url: str, handle: str) -> str:
    rows = postgres.query(url, "SELECT owner FROM luftpause_leases WHERE handle = %s", handle)
    return str(rows[0][0])


def test_listings_children_and_names_reach_every_runtime_within_the_tenant(
    keyed: tuple[Pod, Pod, str], postgres: PostgresServer
) -> None:
    a, b, url = keyed
    on_b_owner = runtime_identity(f"127.0.0.1:{b.port}")

    async def scenario() -> None:
        async with _client(a, TEAM_A) as on_a, _client(b, TEAM_A) as on_b, _client(b, TEAM_B) as other:
            first = (await call(on_a, "spawn", task=SAYS))["handle"]
            reviewer = (await call(on_b, "spawn", task=SAYS, name="reviewer"))["handle"]
            third = (await call(on_a, "spawn", task=SAYS))["handle"]
            theirs = (await call(other, "spawn", task=SAYS))["handle"]  # team-b's "alice"
            await _done(on_a, first, third)
            await _done(on_b, reviewer)
            assert _owner(postgres, url, reviewer) == on_b_owner

            # status without a handle, from either runtime: the caller's runs of both, oldest first.
            for client in (on_a, on_b):
                listed = await call(client, "status")
                assert [run["handle"] for run in listed["runs"]] == [first, reviewer, third], listed
                assert listed["total"] == 3 and "nextOffset" not in listed, listed
                assert listed["caller"] == "team-a/alice", listed
                assert [run["answerChars"] for run in listed["runs"]] == [5, 5, 5], listed
            # Paged across the runtimes.
            page = await call(on_a, "status", limit=1, offset=1)
            assert [run["handle"] for run in page["runs"]] == [reviewer], page
            assert page["total"] == 3 and page["nextOffset"] == 2, page
            last = await call(on_b, "status", limit=2, offset=2)
            assert [run["handle"] for run in last["runs"]] == [third] and "nextOffset" not in last, last
            for bad in ({"limit": 0}, {"offset": -1}, {"limit": "many"}, {"limt": 5}):
                refused = await on_a.call_tool("status", bad, read_timeout_seconds=60)
                assert refused.is_error and next(iter(bad)) in tool_text(refused), (bad, tool_text(refused))
            refused = await on_a.call_tool("list", {"caller": 7}, read_timeout_seconds=60)
            assert refused.is_error and "caller" in tool_text(refused), tool_text(refused)

            # list(): the caller's top-level runs of both runtimes; list(caller=...) the same.
            for client in (on_a, on_b):
                tops = await call(client, "list")
                assert [run["handle"] for run in tops["runs"]] == [first, reviewer, third], tops
            named = await call(on_a, "list", caller="team-a/alice")
            assert [run["name"] for run in named["runs"]] == [None, "reviewer", None], named

            # Another tenant's runs never appear, from either runtime, even under the same caller name.
            async with _client(a, TEAM_B) as other_on_a:
                for client in (other, other_on_a):
                    listed = await call(client, "status")
                    assert [run["handle"] for run in listed["runs"]] == [theirs], listed
                    assert listed["total"] == 1, listed
                    tops = await call(client, "list")
                    assert [run["handle"] for run in tops["runs"]] == [theirs], tops
                    refused = await client.call_tool("read", {"handle": "reviewer"}, read_timeout_seconds=60)
                    assert refused.is_error and "unknown run handle" in tool_text(refused), refused

            # spawn(parent=<b's run>) from a: made at b, which holds the whole tree.
            child = await call(on_a, "spawn", task=script({"say": "helped"}), parent=reviewer, name="helper")
            assert _owner(postgres, url, child["handle"]) == on_b_owner
            await _done(on_a, child["handle"])
            children = await call(on_a, "list", handle=reviewer)
            assert [run["handle"] for run in children["runs"]] == [child["handle"]], children
            by_name = await call(on_a, "list", handle="reviewer")
            assert [run["handle"] for run in by_name["runs"]] == [child["handle"]], by_name

            # Pod names of b's runs, from a: the caller's level first, then the children's.
            read = await call(on_a, "read", handle="reviewer")
            assert read["handle"] == reviewer and read["entries"] == ["first"], read
            helper = await call(on_a, "read", handle="helper")
            assert helper["handle"] == child["handle"] and helper["entries"] == ["helped"], helper
            sent = await call(on_a, "send", handle="reviewer", message="again")
            assert sent["handle"] == reviewer and sent["delivered"] == "now", sent
            await _done(on_a, reviewer)
            asked = b.engine.requests[reviewer][-1]["messages"]
            assert [m["content"] for m in asked if m["role"] == "user"][-1] == "again", asked
            # A top-level name is the caller's across the runtimes: taken while b's reviewer lives.
            taken = await on_a.call_tool("spawn", {"task": SAYS, "name": "reviewer"}, read_timeout_seconds=60)
            assert taken.is_error and "name 'reviewer' is taken" in tool_text(taken), tool_text(taken)
            stopped = await call(on_a, "stop", handle="reviewer")
            assert stopped["handle"] == reviewer and stopped["state"] == "stopped", stopped
            # Once it is stopped the name is free; the live one is found before the stopped one.
            again = (await call(on_a, "spawn", task=SAYS, name="reviewer"))["handle"]
            await _done(on_a, again)
            for client in (on_a, on_b):
                assert (await call(client, "read", handle="reviewer"))["handle"] == again

            # A name held on neither runtime is refused as before.
            refused = await on_a.call_tool(
                "send", {"handle": "nobody", "message": "hi"}, read_timeout_seconds=60
            )
            assert refused.is_error and "unknown run handle" in tool_text(refused), refused

    asyncio.run(scenario())
    assert "forwarding" in a.runtime_log()


def test_a_killed_runtimes_runs_stay_listed_once_taken_over(
    keyed: tuple[Pod, Pod, str], postgres: PostgresServer
) -> None:
    a, b, url = keyed

    async def scenario() -> dict[str, Any]:
        async with _client(a, TEAM_A) as on_a:
            mine = (await call(on_a, "spawn", task=SAYS))["handle"]
            await _done(on_a, mine)
        async with _client(b, TEAM_A) as on_b:
            held = [(await call(on_b, "spawn", task=SAYS))["handle"] for _ in range(2)]
            await _done(on_b, *held)
        assert b.runtime is not None
        b.runtime.kill()
        async with _client(a, TEAM_A) as on_a:
            listed = await call(on_a, "status")  # waits for b's runs to be taken over
        assert [run["handle"] for run in listed["runs"]] == [mine, *held], listed
        assert [run["state"] for run in listed["runs"]] == ["completed"] * 3, listed
        assert {_owner(postgres, url, h) for h in held} == {runtime_identity(f"127.0.0.1:{a.port}")}
        return listed

    asyncio.run(scenario())
