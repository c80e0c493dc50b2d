"""Pods, four faults found by trying them (issue 25, item 9), each through the real runtime process
and the real ``mcp`` client over the scripted engine (:mod:`pods_helpers`):

* a chain return lost a scope: A gives ``src`` to B, B gives ``src/core`` to D, B ends; A, re-opened
  by ``send`` while D still held ``src/core``, never got it back, even after D ended;
* ``send``/``read``/``stop`` by name found only the caller's own runs, not a descendant's;
* a run asked to stop showed no mark of it while its turn finished;
* ``spawn(parent=...)`` took a budget larger than its parent's without saying so.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pods_helpers import Pod, call, get_json, script, start_pod, tool_text, until

from luftpause.runtime.pods.scope import Rule, Scope, ScopeLedger

pytestmark = pytest.mark.integration


@pytest.fixture()
def pod(tmp_path: Path, store: str) -> Iterator[Pod]:
    """The runtime process over the scripted engine, on each store."""
    with start_pod(tmp_path, workspace=("src/core",), store=store) as running:
        yield running


def _rw(path: Path | str) -> dict[str, Any]:
    return {"effect": "allow", "access": ["read", "write"], "path": str(path)}


async def _pod_state(client: Client, handle: str, state: str) -> bool:
    return bool((await call(client, "read", handle=handle))["state"] == state)


def _tool_results(pod: Pod, handle: str) -> list[str]:
    conversation = get_json(f"{pod.url}/monitor/runs/{handle}")
    return [m["content"] for m in conversation["messages"] if m["role"] == "tool"]


def test_a_run_reopened_while_its_grandchild_holds_a_part_gets_it_back_when_the_grandchild_ends(
    pod: Pod,
) -> None:
    ws = pod.workspace
    assert ws is not None
    d_task = script({"hold": "d", "say": "D done"})
    b_task = script(
        {"call": "spawn", "args": {"task": d_task, "name": "d", "scope": [_rw(ws / "src" / "core")]}},
        {"say": "B done"},
    )
    a_task = script(
        {
            "call": "spawn",
            "args": {"task": b_task, "name": "b", "orchestrate": True, "scope": [_rw(ws / "src")]},
        },
        {"say": "A gave src to b"},
        {"say": "A again, while d holds src/core"},
        {"call": "write_file", "args": {"path": str(ws / "src" / "core" / "a.txt"), "content": "A"}},
        {"say": "A wrote into src/core"},
    )

    async def go() -> None:
        async with Client(f"{pod.url}/mcp") as client:
            a = (await call(client, "spawn", task=a_task, name="a", orchestrate=True, scope=[_rw(ws)]))[
                "handle"
            ]

            async def settled() -> Any:
                (b,) = (await call(client, "list", handle=a))["runs"] or [None]
                if b is None or b["state"] != "idle" or not await _pod_state(client, a, "idle"):
                    return None
                kids = (await call(client, "list", handle=b["handle"]))["runs"]
                return kids[0]["handle"] if kids and pod.engine.holding(kids[0]["handle"]) else None

            d = await until(settled, "A and B idle, D in a held turn")
            # A, re-opened while D holds src/core, may not write it (D does) ...
            await call(client, "send", handle=a, message="go on")
            await until(lambda: _answered(client, a, "A again, while d holds src/core"), "A's second answer")
            # ... and once D ends, src/core is A's again.
            pod.engine.release("d")
            await until(lambda: _pod_state(client, d, "idle"), "D's answer")
            await call(client, "send", handle=a, message="now write")
            await until(lambda: _answered(client, a, "A wrote into src/core"), "A's third answer")
            written = _tool_results(pod, a)[-1]
            assert written.startswith("wrote"), written
            assert (ws / "src" / "core" / "a.txt").read_text() == "A"

    asyncio.run(go())


async def _answered(client: Client, handle: str, answer: str) -> bool:
    run = (await call(client, "status", handle=handle))["run"]
    return bool(run["podState"] == "idle" and run.get("answer") == answer)


def test_a_ledger_holder_adopts_its_descendant_and_gets_its_part_back_when_it_ends() -> None:
    ledger = ScopeLedger()
    ledger.grant("ws", Scope.of(Rule.make("allow", "read,write", "/ws")), parent=None)
    ledger.grant("a", Scope.of(Rule.make("allow", "read,write", "/ws")), parent="ws")
    ledger.grant("b", Scope.of(Rule.make("allow", "read,write", "/ws/src")), parent="a")
    ledger.grant("d", Scope.of(Rule.make("allow", "read,write", "/ws/src/core")), parent="b")
    ledger.end("b")
    ledger.end("a")  # d is the workspace's now
    record = ledger.grant("a", Scope.of(Rule.make("allow", "read,write", "/ws")), parent="ws", adopt=["d"])
    assert record["adopt"] == ["d"] and ledger.parent("d") == "a"
    held = ledger.check("a", "/ws/src/core/x", "write")
    assert not held.allowed and "held by 'd' (a descendant)" in str(held)
    # Replayed from the records, or from a compacted journal, it is the same ledger.
    replayed = ScopeLedger()
    replayed.grant("ws", Scope.of(Rule.make("allow", "read,write", "/ws")), parent=None)
    compacted = ScopeLedger()  # to_records holds the workspace too
    for again, records in ((replayed, [*_history(), record]), (compacted, ledger.to_records())):
        for one in records:
            again.apply(one)
        assert again.live() == ledger.live() and again.parent("d") == "a"
        assert not again.check("a", "/ws/src/core/x", "write").allowed
    ledger.end("d")
    assert ledger.check("a", "/ws/src/core/x", "write").allowed


def _history() -> list[dict[str, Any]]:
    ledger = ScopeLedger()
    ledger.grant("ws", Scope.of(Rule.make("allow", "read,write", "/ws")), parent=None)
    return [
        ledger.grant("a", Scope.of(Rule.make("allow", "read,write", "/ws")), parent="ws"),
        ledger.grant("b", Scope.of(Rule.make("allow", "read,write", "/ws/src")), parent="a"),
        ledger.grant("d", Scope.of(Rule.make("allow", "read,write", "/ws/src/core")), parent="b"),
        ledger.end("b"),
        ledger.end("a"),
    ]


async def _held_kid(pod: Pod, client: Client) -> tuple[str, str]:
    """A (orchestrating) spawns ``kid``, whose first turn the engine holds: (A, kid)."""
    kid_task = script({"hold": "kid", "say": "kid answer"})
    a_task = script({"call": "spawn", "args": {"task": kid_task, "name": "kid"}}, {"say": "A done"})
    a = (await call(client, "spawn", task=a_task, name="a", orchestrate=True))["handle"]

    async def kid_held() -> Any:
        kids = (await call(client, "list", handle=a))["runs"]
        return kids[0]["handle"] if kids and pod.engine.holding(kids[0]["handle"]) else None

    return a, await until(kid_held, "the kid's held turn")


def test_send_read_and_stop_find_a_descendant_by_name(pod: Pod) -> None:
    async def go() -> None:
        async with Client(f"{pod.url}/mcp") as client:
            _, kid = await _held_kid(pod, client)
            # By name, from the MCP caller two levels up: send, read and stop find it.
            sent = await call(client, "send", handle="kid", message="hello")
            assert sent["handle"] == kid and sent["delivered"] == "next turn"
            assert (await call(client, "read", handle="kid"))["handle"] == kid
            assert (await call(client, "stop", handle="kid"))["handle"] == kid
            pod.engine.release("kid")

    asyncio.run(go())


def test_a_stopping_run_says_so_in_status_list_and_the_monitor_until_its_turn_ends(pod: Pod) -> None:
    async def go() -> None:
        async with Client(f"{pod.url}/mcp") as client:
            a, kid = await _held_kid(pod, client)
            stopping = await call(client, "stop", handle=kid)
            assert stopping["handle"] == kid and stopping["state"] == "running"
            mark = {"by": stopping["stopping"]["by"]}
            assert "MCP caller" in mark["by"]
            # While its turn finishes, every view shows it is stopping.
            assert (await call(client, "status", handle=kid))["run"]["stopping"] == mark
            (listed,) = (await call(client, "list", handle=a))["runs"]
            assert listed["stopping"] == mark
            monitor = {r["handle"]: r for r in get_json(f"{pod.url}/monitor/runs")["runs"]}
            assert monitor[kid]["stopping"] == mark and "stopping" not in monitor[a]
            pod.engine.release("kid")
            await until(lambda: _pod_state(client, kid, "stopped"), "the kid stopped")
            assert "stopping" not in (await call(client, "status", handle=kid))["run"]
            monitor = {r["handle"]: r for r in get_json(f"{pod.url}/monitor/runs")["runs"]}
            assert "stopping" not in monitor[kid]

    asyncio.run(go())


def test_spawn_under_a_parent_refuses_a_budget_larger_than_the_parents(pod: Pod) -> None:
    async def go() -> None:
        async with Client(f"{pod.url}/mcp") as client:
            held = script({"hold": "parent", "say": "p"})
            parent = (await call(client, "spawn", task=held, budgetTokens=1000, budgetSeconds=600))["handle"]
            refused = await client.call_tool(
                "spawn", {"task": script({"say": "c"}), "parent": parent, "budgetTokens": 5000}
            )
            assert refused.is_error
            text = tool_text(refused)
            assert f"budgetTokens: 5000 is more than the parent run '{parent}''s (1000)" in text, text
            # Within the parent's budgets it is taken.
            child = await call(
                client, "spawn", task=script({"say": "c"}), parent=parent, budgetTokens=500, budgetSeconds=60
            )
            assert child["handle"]
            pod.engine.release("parent")

    asyncio.run(go())
