"""Pods end to end (issue 6): the real runtime process, driven through the real ``mcp`` client,
with a scripted engine as its dataplane and a temporary workspace (the harness, and the steps a
script may take, are in :mod:`pods_helpers`). A three-level network (A spawns B, B spawns D) does
real file work through the runtime's built-in tools, exactly as scripted.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from mcp import Client
from pods_helpers import Pod, call, get_json, script, start_pod, tool_text, until
from runtime_helpers import Parts, make_run, parts_over

from luftpause.config import DEFAULT_MODEL
from luftpause.runtime.errors import PodRefused, SpawnRefused, UnknownModel
from luftpause.runtime.pods.actors import Actor
from luftpause.runtime.pods.scope import Rule, Scope
from luftpause.runtime.pods.scopes import SpawnPlan
from luftpause.runtime.runs.record import Run
from luftpause.runtime.runs.spec import SpawnArguments
from luftpause.runtime.spawn.spawner import child_arguments

pytestmark = pytest.mark.integration


@pytest.fixture()
def pod(tmp_path: Path, store: str) -> Iterator[Pod]:
    """The runtime process over the scripted engine, on each store (the file journal, PostgreSQL:
    the scope ledger and the notifications are records of the same store)."""
    with start_pod(tmp_path, store=store) as running:
        yield running


def _tool_results(pod: Pod, handle: str) -> list[str]:
    conversation = get_json(f"{pod.url}/monitor/runs/{handle}")
    return [m["content"] for m in conversation["messages"] if m["role"] == "tool"]


def test_three_level_network_does_file_work_within_delegated_scopes(pod: Pod) -> None:
    ws = pod.workspace
    assert ws is not None  # start_pod's default: a workspace with b/d in it
    d_task = script(
        {"call": "spawn", "args": {"task": script({"say": "x"}), "name": "too-deep"}},
        {"call": "write_file", "args": {"path": str(ws / "b" / "d" / "d.txt"), "content": "from d"}},
        {"call": "write_file", "args": {"path": str(ws / "outside.txt"), "content": "escape"}},
        {"call": "write_file", "args": {"path": "b/d/../../b/escape.txt", "content": "dotdot"}},
        {"hold": "d", "say": "D done"},
    )
    b_task = script(
        {
            "call": "spawn",
            "args": {
                "task": d_task,
                "name": "d",
                "orchestrate": True,
                "scope": [{"effect": "allow", "access": ["read", "write"], "path": str(ws / "b" / "d")}],
            },
        },
        {"call": "write_file", "args": {"path": str(ws / "b" / "b.txt"), "content": "from b"}},
        {"call": "write_file", "args": {"path": str(ws / "b" / "d" / "x.txt"), "content": "b into d"}},
        {"say": "B done"},
    )
    a_task = script(
        {
            "call": "spawn",
            "args": {
                "task": b_task,
                "name": "b",
                "orchestrate": True,
                "scope": [{"effect": "allow", "access": ["read", "write"], "path": "b"}],
            },
        },
        {"call": "write_file", "args": {"path": "b/a.txt", "content": "a into b"}},
        {"call": "write_file", "args": {"path": "a.txt", "content": "from a"}},
        {"say": "A done"},
        {"echo": "new-system"},
        {"echo": "new-system"},
    )

    async def go() -> None:
        async with Client(f"{pod.url}/mcp") as client:
            a = (
                await call(
                    client,
                    "spawn",
                    task=a_task,
                    name="a",
                    orchestrate=True,
                    scope=[{"effect": "allow", "access": ["read", "write"], "path": str(ws)}],
                )
            )["handle"]

            async def network_settled() -> Any:
                # A and B answered (idle); D is busy in a turn the engine holds.
                runs = (await call(client, "list", handle=a))["runs"]
                if len(runs) != 1 or runs[0]["state"] != "idle":
                    return None
                b_children = (await call(client, "list", handle=runs[0]["handle"]))["runs"]
                if len(b_children) != 1 or not pod.engine.holding(b_children[0]["handle"]):
                    return None
                top = await call(client, "read", handle=a)
                return (runs[0], b_children[0]) if top["state"] == "idle" else None

            b_item, d_item = await until(network_settled, "A and B idle, D in a held turn")
            b, d = b_item["handle"], d_item["handle"]
            assert b_item["name"] == "b" and d_item["name"] == "d"
            assert b_item["lastAnswer"] == "B done" and d_item["state"] == "running"

            # The file work that was in scope happened; the rest was refused with the rule.
            assert (ws / "b" / "d" / "d.txt").read_text() == "from d"
            assert (ws / "b" / "b.txt").read_text() == "from b"
            assert (ws / "a.txt").read_text() == "from a"
            for absent in ("outside.txt", "b/escape.txt", "b/d/x.txt", "b/a.txt"):
                assert not (ws / absent).exists(), absent
            d_results = _tool_results(pod, d)
            assert "depth limit" in d_results[0] and "max_depth = 3" in d_results[0]
            assert d_results[1].startswith("wrote")
            assert "denied" in d_results[2] and str(ws / "outside.txt") in d_results[2]
            assert "denied" in d_results[3] and "b/d/../../b/escape.txt" in d_results[3]
            b_results = _tool_results(pod, b)
            assert json.loads(b_results[0])["name"] == "d"
            assert b_results[1].startswith("wrote")
            assert "denied by rule deny write" in b_results[2] and "held by child 'd'" in b_results[2]
            a_results = _tool_results(pod, a)
            assert "held by child 'b'" in a_results[1]

            # An idle run holds no scope: A and B answered, so theirs came back; D (busy) keeps its
            # part, which B had handed on.
            monitor = {r["handle"]: r for r in get_json(f"{pod.url}/monitor/runs")["runs"]}
            assert monitor[a]["scope"] is None and monitor[b]["scope"] is None
            assert monitor[d]["scope"]["granted"][0]["path"] == str(ws / "b" / "d")

            # Read with cursors.
            first = await call(client, "read", handle=b)
            assert first["entries"] == ["B done"] and first["cursor"] == 1 and first["state"] == "idle"
            again = await call(client, "read", handle=b, since=first["cursor"])
            assert again["entries"] == [] and again["cursor"] == 1

            # B ends for good before D. It gave its scope back when it went idle; the part it
            # handed on stays with D, which is still running, and stop says both.
            stopped = await call(client, "stop", handle=b)
            assert stopped["state"] == "stopped"
            d_rule = {"effect": "allow", "access": ["read", "write"], "path": str(ws / "b" / "d")}
            assert stopped["scope"] == {
                "returns": [{"effect": "allow", "access": ["read", "write"], "path": str(ws / "b")}],
                "to": None,
                "when": "already: it went idle",
                "staysWith": [{"handle": d, "name": "d", "scope": [d_rule]}],
            }

        # A restart in the middle of the chain keeps it so.
        assert pod.runtime is not None
        pod.runtime.kill()
        pod.start_runtime()
        async with Client(f"{pod.url}/mcp") as client:
            listed = (await call(client, "list", handle=a))["runs"]
            assert [(r["name"], r["state"]) for r in listed] == [("b", "stopped")]
            a_scope = (await call(client, "status", handle=a))["run"]
            assert a_scope["podState"] == "idle"
            monitor = {r["handle"]: r for r in get_json(f"{pod.url}/monitor/runs")["runs"]}
            assert monitor[a]["scope"] is None and monitor[b]["scope"] is None
            assert monitor[d]["state"] == "running" and monitor[d]["scope"] is not None

            # Sent more work, A gets its scope again, less what its grandchild D still holds.
            await call(client, "send", handle=a, message="report")
            report = await until(lambda: _idle_read(client, a, 1), "A's report")
            (text,) = report["entries"]
            assert f"stopped: child 'b' ({b})" in text and "stopped by MCP caller" in text
            # Each event reached A once, over all its turns (b may have answered while A ran).
            a_convo = get_json(f"{pod.url}/monitor/runs/{a}")["messages"]
            told = "\n".join(m["content"] for m in a_convo if m["role"] == "system")
            assert told.count(f"answered: child 'b' ({b})") == 1
            assert told.count(f"stopped: child 'b' ({b})") == 1
            assert "child 'd'" not in told
            regrants = [r for r in pod.journal() if r["type"] == "scopeGrant" and r["handle"] == a]
            assert len(regrants) == 2
            # D, still holding its part, is A's (ledger) child again: the part returns to A when D ends.
            assert regrants[1]["adopt"] == [d] and regrants[1]["scope"] == regrants[0]["scope"]

            # D answers: its part returns, and with every run idle nothing is held.
            pod.engine.release("d")
            await until(lambda: _state(client, d, "idle"), "D's answer")
            monitor = {r["handle"]: r for r in get_json(f"{pod.url}/monitor/runs")["runs"]}
            assert all(run["scope"] is None for run in monitor.values())

    asyncio.run(go())
    kinds = [r["type"] for r in pod.journal()]
    assert kinds.count("scopeGrant") == kinds.count("scopeEnd") == 4  # a, b, d, then a again
    assert kinds.count("scopeReturned") == 4  # a (twice), b and d went idle


async def _idle_read(client: Client, handle: str, at_least: int) -> dict[str, Any] | None:
    """``read`` of ``handle`` after cursor 0 of its newest entries, once it is idle with more than
    its first answers (``at_least`` answers after the first)."""
    result = await call(client, "read", handle=handle)
    if result["state"] != "idle":
        return None
    fresh = result["entries"][-at_least:]
    return {**result, "entries": fresh[-1:]} if len(result["entries"]) >= 1 + at_least else None


def test_send_busy_and_idle_graceful_stop_and_caller_events(pod: Pod) -> None:
    ws = pod.workspace
    assert ws is not None  # start_pod's default: a workspace with b/d in it
    # Busy at a gate, not for a second: on a loaded machine the send could come after a sleep.
    slow = script(
        {"hold": "slow", "call": "list_directory", "args": {"path": str(ws)}},
        {"say": "first answer"},
        {"echo": "new-system"},
    )

    async def go() -> None:
        async with Client(f"{pod.url}/mcp") as client:
            h = (await call(client, "spawn", task=slow, name="slow"))["handle"]
            # A busy run takes the message at its next turn, not now.
            sent = await call(client, "send", handle="slow", message="and then")
            assert sent["delivered"] == "next turn"
            pod.engine.release("slow")
            await until(lambda: _state(client, h, "idle"), "slow idle")
            convo = get_json(f"{pod.url}/monitor/runs/{h}")["messages"]
            users = [m["content"] for m in convo if m["role"] == "user"]
            assert users[-1].endswith("and then")
            cursor = (await call(client, "read", handle=h))["cursor"]
            # An idle run continues its conversation with a new user turn.
            assert (await call(client, "send", handle=h, message="more"))["delivered"] == "now"
            await until(lambda: _state(client, h, "idle"), "slow idle again")
            newer = await call(client, "read", handle=h, since=cursor)
            assert len(newer["entries"]) == 1
            # The caller's events: each run end once, in status.
            events = (await call(client, "status")).get("events", [])
            assert [e["kind"] for e in events].count("answered") >= 1
            assert all(e["handle"] == h for e in events)
            assert (await call(client, "status")).get("events") is None

            # Graceful stop: the turn in flight finishes (its tool round too), no new one starts.
            # Its first turn is held at the engine until the stop was asked (a 1.5 s sleep there
            # let a slow test ask after the turn had ended and the next one started).
            first_turn = {"hold": "sleeper", "call": "list_directory", "args": {"path": str(ws)}}
            sleeper = script(first_turn, {"say": "never"})
            s = (await call(client, "spawn", task=sleeper))["handle"]
            await until(lambda: _engine_holds(pod, s), "the sleeper's first turn")
            stopping = await call(client, "stop", handle=s)
            assert stopping["state"] == "running"
            # What it holds (the workspace, to read: spawned without a scope) goes back once its
            # turn ends; nothing of it is below it.
            read_ws = {"effect": "allow", "access": ["read"], "path": str(ws)}
            assert stopping["scope"] == {
                "returns": [read_ws],
                "to": "workspace",
                "when": "when its current turn ends",
                "staysWith": [],
            }
            pod.engine.release("sleeper")
            await until(lambda: _state(client, s, "stopped"), "the sleeper stopped")
            assert len(pod.engine.requests[s]) == 1
            convo = get_json(f"{pod.url}/monitor/runs/{s}")["messages"]
            assert convo[-1]["role"] == "tool" and "b/" in convo[-1]["content"]
            status = (await call(client, "status", handle=s))["run"]
            assert status["state"] == "cancelled" and status["error"].startswith("stopped by MCP caller")
            refused = await client.call_tool("send", {"handle": s, "message": "hello?"})
            assert refused.is_error and "stopped" in tool_text(refused)

    asyncio.run(go())


async def _state(client: Client, handle: str, state: str) -> bool:
    return bool((await call(client, "read", handle=handle))["state"] == state)


def test_a_send_while_the_finished_loop_is_still_ending_the_run_reopens_it_once(pod: Pod) -> None:
    """The run's loop has recorded its answer but is still ending the run at the dataplane (held
    there) when ``send`` re-opens it: one loop at a time, the run is not failed, a second send goes
    to the one loop's inbox, and the ending comes before the new turns."""
    pod.engine.hold_run_ends = True
    task = script({"say": "first"}, {"say": "second"}, {"say": "third"})

    async def go() -> None:
        async with Client(f"{pod.url}/mcp") as client:
            h = (await call(client, "spawn", task=task))["handle"]
            done = await call(client, "await", handles=[h], timeout=30)
            assert done["runs"][0]["state"] == "completed"
            await until(lambda: _engine_holds(pod, f"end:{h}"), "the run ending, held")
            assert (await call(client, "send", handle=h, message="go on"))["delivered"] == "now"
            assert (await call(client, "send", handle=h, message="and more"))["delivered"] == "next turn"
            status = (await call(client, "status", handle=h))["run"]
            assert status["state"] == "running" and "error" not in status
            pod.engine.release("ends")
            await until(lambda: _state(client, h, "idle"), "the run idle again")
            status = (await call(client, "status", handle=h))["run"]
            # One loop took both messages into its first turn (the second waited in its inbox).
            assert status["state"] == "completed" and status["answer"] == "second", status
            assert len(pod.engine.requests[h]) == 2
            users = [m["content"] for m in pod.engine.requests[h][1]["messages"] if m["role"] == "user"]
            assert users[1:] == ["go on", "and more"]
            # The first ending reached the dataplane before the turn of the re-opened run.
            assert [n for handle, n in pod.engine.ends if handle == h] == [1, 2]

    asyncio.run(go())


async def _engine_holds(pod: Pod, what: str) -> bool:
    return pod.engine.holding(what)


# --- Pods in-process: the rules one call at a time ----------------------------------------------


def _parts(tmp_path: Path) -> Parts:
    from luftpause.config import load_config

    (tmp_path / "ws").mkdir()
    path = tmp_path / "pods.toml"
    path.write_text(
        f'[runtime]\nworkspace = "{tmp_path / "ws"}"\nmax_depth = 2\n\n'
        f'[[replicas]]\nname = "r"\nurl = "http://127.0.0.1:1"\nmodels = ["{DEFAULT_MODEL}", "small"]\n'
    )
    return parts_over(load_config(path))


def _run(parts: Parts, handle: str, parent: str | None = None, **fields: Any) -> Run:
    run = make_run(
        handle, **{"caller": "c", "service_class": "interactive", "messages": [], "parent": parent, **fields}
    )
    parts.registry.add(run)
    return run


def test_a_sub_agents_child_inherits_and_may_only_narrow_its_limits(tmp_path: Path) -> None:
    parts = _parts(tmp_path)
    a = _run(
        parts,
        "run-a",
        allowed_tools=frozenset({"lookup", "delete_note"}),
        approve_tools=frozenset({"delete_note"}),
        max_tool_calls=5,
        max_tokens=99,
        parallel_tool_calls=True,
    )

    def child_of(**arguments: Any) -> SpawnArguments:
        return child_arguments(a, SpawnArguments.model_validate({"task": "x", **arguments}), [a])

    child = child_of()
    assert child.tools == ["delete_note", "lookup"] and child.approve_tools == ["delete_note"]
    assert (child.max_tool_calls, child.max_tokens, child.parallel_tool_calls) == (5, 99, True)
    assert (child.model, child.service_class) == (DEFAULT_MODEL, "interactive")
    narrowed = child_of(tools=["lookup"], approveTools=["lookup"])
    assert narrowed.tools == ["lookup"] and narrowed.approve_tools == ["delete_note", "lookup"]
    with pytest.raises(SpawnRefused, match="count_items not among the tools you may use"):
        child_of(tools=["lookup", "count_items"])
    with pytest.raises(SpawnRefused, match="more than your own"):
        child_of(maxToolCalls=6)


def test_a_sub_agents_child_may_take_another_model_shorter_replies_batch_and_tighter_budgets(
    tmp_path: Path,
) -> None:
    # The seed ticket's per-child overlay: a small model for research, the full one for code.
    parts = _parts(tmp_path)
    a = _run(parts, "run-a", max_tokens=200, budget_tokens=1000, budget_seconds=60.0)
    b = _run(parts, "run-b", parent="run-a", service_class="batch", max_tokens=0)

    def child(spawner: Run, chain: list[Run], **arguments: Any) -> SpawnArguments:
        return child_arguments(spawner, SpawnArguments.model_validate({"task": "x", **arguments}), chain)

    small = child(a, [a], model="small", maxTokens=64, serviceClass="batch", budgetTokens=500)
    assert (small.model, small.max_tokens, small.service_class, small.budget_tokens) == (
        "small",
        64,
        "batch",
        500,
    )
    with pytest.raises(SpawnRefused, match="maxTokens: 201 is more than your own \\(200\\)"):
        child(a, [a], maxTokens=201)
    with pytest.raises(SpawnRefused, match="maxTokens: 0 \\(the engine's default\\) is more than your own"):
        child(a, [a], maxTokens=0)
    with pytest.raises(SpawnRefused, match="budgetTokens: 2000 is more than your own \\(1000\\)"):
        child(a, [a], budgetTokens=2000)
    # A grandchild is bounded by every budget on its way up, and a batch spawner's child is batch.
    with pytest.raises(SpawnRefused, match="budgetSeconds: 90 is more than run run-a's \\(60\\)"):
        child(b, [b, a], budgetSeconds=90)
    with pytest.raises(SpawnRefused, match="a batch run's child is batch too"):
        child(b, [b, a], serviceClass="interactive")
    assert child(b, [b, a], maxTokens=5000).max_tokens == 5000  # b's replies are the engine's: unbounded
    # Through the spawner: a model the pool does not serve is refused, naming those it does.
    with pytest.raises(UnknownModel, match=re.escape("models served: 'llama-3.2-1b', 'small'")):
        parts.spawner.spawn(SpawnArguments(task="x", model="huge"), Actor.of_run(a))


def test_names_are_checked_and_depth_is_kept_from_spawn(tmp_path: Path) -> None:
    parts = _parts(tmp_path)
    tree = parts.tree
    for bad in ("run-0123456789abcdef", "a\ud800", "x" * 65, "tab\there", " padded"):
        with pytest.raises(PodRefused, match="name"):
            tree.check_spawn(None, bad, [])
    top = _run(parts, "run-top")
    tree.record(top, tree.check_spawn(None, "top", []))
    mid = _run(parts, "run-mid", parent="run-top")
    tree.record(mid, tree.check_spawn(top, "mid", []))
    # The depth is the one fixed at spawn, whatever the ancestors that may have left: level 2,
    # and it spawns nothing deeper.
    with pytest.raises(PodRefused, match="depth limit: the new run would be at level 3"):
        tree.check_spawn(mid, None, [])


def test_builtin_tools_never_raise_and_path_arguments_go_upstream_real(tmp_path: Path) -> None:
    parts = _parts(tmp_path)
    scopes = parts.scopes
    ws = tmp_path.resolve() / "ws"
    run = _run(parts, "run-w")
    rules = Scope.of(Rule.make("allow", ("read", "write"), str(ws)))
    scopes.grant(run, SpawnPlan("workspace", rules))
    (ws / "sub").mkdir()
    (ws / "link").symlink_to(ws / "sub")
    text, failed = asyncio.run(parts.builtins.call(run, "write_file", {"path": "f", "content": "a\ud800"}))
    assert failed and "lone surrogate" in text
    # a directory given to read_file is a failed call, not a failed run
    text, failed = asyncio.run(parts.builtins.call(run, "read_file", {"path": str(ws / "sub"), "offset": 1}))
    assert failed and text.startswith("Error:")
    scopes.path_arguments["write_note"] = {"path": "write"}
    arguments = {"path": "link/../link/n.txt", "title": "t"}
    assert scopes.upstream_refusal(run, "write_note", arguments) is None
    assert arguments == {"path": f"{ws}/sub/n.txt", "title": "t"}
    refusal = scopes.upstream_refusal(run, "write_note", {"path": "file:///etc/passwd"})
    assert refusal is not None and "URI" in refusal


def test_a_sub_agent_runs_its_child_on_another_model_with_shorter_replies_as_batch(
    tmp_path: Path, store: str
) -> None:
    # The seed ticket's per-child provider overlay, end to end: the research child on the pool's
    # small model, replies of 64 tokens, batch; a child asking for more than its spawner has is
    # refused as the spawn's tool result, and nothing of it runs.
    small = '\n[[replicas]]\nname = "small"\nurl = "{engine_url}"\nmodels = ["small"]\n'
    child = script({"say": "found it"})
    spawner = script(
        {
            "call": "spawn",
            "args": {
                "task": child,
                "name": "research",
                "model": "small",
                "maxTokens": 64,
                "serviceClass": "batch",
                "budgetTokens": 500,
            },
        },
        {"call": "spawn", "args": {"task": child, "name": "greedy", "maxTokens": 4096}},
        {"call": "spawn", "args": {"task": child, "name": "elsewhere", "model": "huge"}},
        {"say": "delegated"},
    )
    with start_pod(tmp_path, workspace=None, extra_toml=small, store=store) as pod:

        async def go() -> tuple[dict[str, Any], list[str]]:
            async with Client(f"{pod.url}/mcp") as client:
                handle = (await call(client, "spawn", task=spawner, orchestrate=True, maxTokens=256))[
                    "handle"
                ]
                await call(client, "await", handles=[handle], timeout=60)

                async def research() -> dict[str, Any] | None:
                    runs = (await call(client, "list", handle=handle))["runs"]
                    return runs[0] if len(runs) == 1 and runs[0]["state"] == "idle" else None

                item = await until(research, "the research child to answer")
                status = (await call(client, "status", handle=item["handle"]))["run"]
                return status, _tool_results(pod, handle)

        status, results = asyncio.run(go())
    assert (status["model"], status["serviceClass"], status["maxTokens"]) == ("small", "batch", 64)
    assert status["limits"] == {"tokens": 500}
    (turn,) = pod.engine.requests[status["handle"]]
    assert (turn["model"], turn["max_tokens"]) == ("small", 64)
    assert json.loads(results[0])["name"] == "research"
    assert "maxTokens: 4096 is more than your own (256)" in results[1]
    # its schema names the models served (an enum): the call is refused before the spawner, saying so
    assert f"'huge' is not one of ['{DEFAULT_MODEL}', 'small'] at arguments.model" in results[2], results[2]
