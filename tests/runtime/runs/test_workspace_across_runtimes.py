"""Two runtime processes sharing one PostgreSQL store and one ``[runtime] workspace``, with the real
``mcp`` client: a path one runtime's run holds for writing is refused to a run of the other,
with the reason (held by a run on another runtime), until that run's scope ends; and after a
SIGKILL the taking runtime keeps the dead one's grant: it refuses that path to its own new runs,
and the run it took over still writes there (luftpause/runtime/pods/shared_roots.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pods_helpers import Pod, call, script, start_pod, tool_text, until
from postgres_helpers import PostgresServer

from luftpause.runtime.runs.custody import runtime_identity

pytestmark = pytest.mark.integration


@pytest.fixture()
def two(tmp_path: Path, postgres: PostgresServer) -> Iterator[tuple[Pod, Pod, str, Path]]:
    """Runtimes ``a`` and ``b`` (each over its own scripted engine) on one fresh database and one
    workspace holding ``src/x`` and ``docs``."""
    url = postgres.database()
    workspace = (tmp_path / "ws").resolve()
    for folder in ("src/x", "docs"):
        (workspace / folder).mkdir(parents=True)
    with ExitStack() as stack:
        pods = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            toml = f'workspace = "{workspace}"\n'
            pods.append(
                stack.enter_context(start_pod(tmp_path / name, workspace=None, runtime_toml=toml, store=url))
            )
        yield pods[0], pods[1], url, workspace


def _rw(path: str) -> list[dict[str, Any]]:
    return [{"effect": "allow", "access": ["read", "write"], "path": path}]


async def _spawn(pod: Pod, task: str, path: str, **more: Any) -> dict[str, Any]:
    async with Client(f"{pod.url}/mcp") as client:
        return await call(client, "spawn", task=task, scope=_rw(path), **more)


async def _refused(pod: Pod, task: str, path: str) -> str:
    async with Client(f"{pod.url}/mcp") as client:
        result = await client.call_tool("spawn", {"task": task, "scope": _rw(path)}, read_timeout_seconds=60)
    assert result.is_error, result
    return tool_text(result)


async def _await(pod: Pod, handle: str) -> dict[str, Any]:
    async with Client(f"{pod.url}/mcp") as client:
        return await call(client, "await", handles=[handle], timeout=120)


def _grants(postgres: PostgresServer, url: str) -> list[str]:
    return [
        str(h) for (h,) in postgres.query(url, "SELECT handle FROM luftpause_root_grants ORDER BY handle")
    ]


def test_a_write_held_on_one_runtime_is_refused_on_the_other_until_its_run_is_idle(
    two: tuple[Pod, Pod, str, Path], postgres: PostgresServer
) -> None:
    a, b, url, workspace = two
    first = script({"hold": "a", "say": "done"}, {"hold": "again", "say": "twice"})
    held = asyncio.run(_spawn(a, first, "src"))["handle"]
    assert _grants(postgres, url) == [held]

    refusal = asyncio.run(_refused(b, script({"say": "never"}), "src/x"))
    assert "write" in refusal and f"{workspace}/src" in refusal, refusal
    assert f"held by run {held!r} on another runtime" in refusal, refusal
    assert _grants(postgres, url) == [held]  # the refused spawn left nothing behind
    # A part nobody writes is given at once; reads are shared.
    other = asyncio.run(_spawn(b, script({"say": "docs"}), "docs"))["handle"]
    assert asyncio.run(_await(b, other))["runs"][0]["answer"] == "docs"

    a.engine.release("a")
    assert asyncio.run(_await(a, held))["runs"][0]["answer"] == "done"
    assert _grants(postgres, url) == []  # idle: its scope went back, and its row with it
    task = script(
        {"hold": "b", "call": "write_file", "args": {"path": "src/x/b.txt", "content": "from b"}},
        {"say": "ok"},
    )
    taken = asyncio.run(_spawn(b, task, "src/x"))["handle"]

    # a's idle run, sent more work, would need src again: refused while b's run writes src/x.
    async def send(handle: str) -> Any:
        async with Client(f"{a.url}/mcp") as client:
            return await client.call_tool(
                "send", {"handle": handle, "message": "again"}, read_timeout_seconds=60
            )

    again = asyncio.run(send(held))
    assert again.is_error, again
    assert f"held by run {taken!r} on another runtime" in tool_text(again), tool_text(again)

    b.engine.release("b")
    assert asyncio.run(_await(b, taken))["runs"][0]["answer"] == "ok"
    assert (workspace / "src/x/b.txt").read_text() == "from b"
    assert _grants(postgres, url) == []
    resent = asyncio.run(send(held))  # free again: it gets src back and goes on
    assert not resent.is_error, tool_text(resent)
    assert _grants(postgres, url) == [held]  # its second turn is held at a's engine
    a.engine.release("again")
    assert asyncio.run(_await(a, held))["runs"][0]["answer"] == "twice"
    assert _grants(postgres, url) == []


def test_the_runtime_taking_over_a_killed_ones_run_keeps_its_grant(
    two: tuple[Pod, Pod, str, Path], postgres: PostgresServer
) -> None:
    a, b, url, workspace = two
    task = script(
        {"hold": "mid", "call": "write_file", "args": {"path": "src/after.txt", "content": "kept"}},
        {"say": "wrote"},
    )
    handle = asyncio.run(_spawn(a, task, "src"))["handle"]

    async def holding() -> bool:
        return a.engine.holding(handle)

    asyncio.run(until(holding, "the run's turn held at a's engine", seconds=60))
    assert a.runtime is not None
    a.runtime.kill()
    # Dead, its run not taken over yet: what it held is still held (the takeover would find the
    # run's grant overlapping one b gave meanwhile).
    meanwhile = asyncio.run(_refused(b, script({"say": "never"}), "src/x"))
    assert "write" in meanwhile and f"{workspace}/src" in meanwhile, meanwhile
    b_owner = runtime_identity(f"127.0.0.1:{b.port}")

    async def taken_over() -> bool:
        leases = postgres.query(url, "SELECT owner FROM luftpause_leases WHERE handle = %s", handle)
        return [str(owner) for (owner,) in leases] == [b_owner] and b.engine.holding(handle)

    asyncio.run(until(taken_over, "b took a's run over and asked its turn again", seconds=90))
    assert _grants(postgres, url) == [handle]
    refusal = asyncio.run(_refused(b, script({"say": "never"}), "src/x"))
    assert "write" in refusal and f"{workspace}/src" in refusal, refusal

    b.engine.release("mid")
    assert asyncio.run(_await(b, handle))["runs"][0]["answer"] == "wrote"
    assert (workspace / "src/after.txt").read_text() == "kept"  # it still held its scope at b
    assert _grants(postgres, url) == []


def test_a_child_outliving_its_spawner_keeps_its_part_held_across_runtimes(
    two: tuple[Pod, Pod, str, Path], postgres: PostgresServer
) -> None:
    """a's run holding ``src`` hands ``src/x`` to a child, then answers: its grant ends, the
    child's part stays held (the child is a root now), so b may not write ``src/x`` nor ``src``
    until the child ends."""
    a, b, url, _ = two
    child = script({"hold": "child", "say": "child done"})
    lead = script(
        {"call": "spawn", "args": {"task": child, "name": "c", "scope": _rw("src/x")}},
        {"say": "lead done"},
    )
    spawner = asyncio.run(_spawn(a, lead, "src", orchestrate=True))["handle"]
    assert asyncio.run(_await(a, spawner))["runs"][0]["answer"] == "lead done"

    async def child_handle() -> str | None:
        async with Client(f"{a.url}/mcp") as client:
            runs = (await call(client, "list", handle=spawner))["runs"]
        return runs[0]["handle"] if runs else None

    held = asyncio.run(until(child_handle, "the child listed at a"))
    assert _grants(postgres, url) == [held]
    for path in ("src/x", "src"):
        refusal = asyncio.run(_refused(b, script({"say": "never"}), path))
        assert f"held by run {held!r} on another runtime" in refusal, refusal
    a.engine.release("child")
    assert asyncio.run(_await(a, held))["runs"][0]["answer"] == "child done"
    assert _grants(postgres, url) == []
    free = asyncio.run(_spawn(b, script({"say": "mine"}), "src"))["handle"]
    assert asyncio.run(_await(b, free))["runs"][0]["answer"] == "mine"
