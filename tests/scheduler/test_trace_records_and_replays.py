"""The scheduler's trace end to end: a real stack records what its scheduler saw while own-loop
agents ran (``[scheduler] trace``), and the trace replays in virtual time under other arrangements."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson

from luftpause.config import DEFAULT_MODEL
from luftpause.testkit.launch.stack import Stack
from luftpause.testkit.load.agents import AgentGroup, AgentSettings, closed_loop
from luftpause.testkit.sim.flood import FloodSpec, simulate
from luftpause.testkit.sim.replay import load_trace


def test_a_real_stack_records_its_trace_and_the_trace_replays(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    groups = [AgentGroup(2, "interactive", "ide"), AgentGroup(4, "batch", "bulk")]
    with Stack.start(tmp_path / "stack", tool_rounds=2, scheduler_config=f'trace = "{trace}"') as stack:
        stack.wait_connected()
        settings = AgentSettings(
            proxy=stack.dataplane_url, model=DEFAULT_MODEL, task="look it up", tool_rounds=2, tool_seconds=0.2
        )
        outcomes = asyncio.run(closed_loop(settings, groups, 4.0))
    completed = [o for o in outcomes if o.state == "completed"]
    assert completed, [o.error for o in outcomes]

    lines = [orjson.loads(line) for line in trace.read_bytes().splitlines()]
    assert lines[0]["trace"] == "luftpause-scheduler" and lines[0]["version"] == 1
    kinds = {line.get("e") for line in lines[1:]}
    assert {"arrived", "finished", "run_ended"} <= kinds
    assert all(line["t"] >= 0 for line in lines[1:])
    arrived = {line["run"] for line in lines if line.get("e") == "arrived"}
    assert {o.run_id for o in completed} <= arrived
    paused = [line for line in lines if line.get("e") == "finished" and line["tools"]]
    assert paused and all(line["prompt"] > 0 and line["completion"] > 0 for line in paused)

    replayed = load_trace(trace)
    by_id = {run.run_id: run for run in replayed.runs}
    for outcome in completed:  # each completed run: its turns, two tool pauses, ended
        run = by_id[outcome.run_id]
        assert len(run.turns) == 3 and [t.tools for t in run.turns] == [True, True, False]
        # The scheduler dates a turn's end when the dataplane's report reaches it, and reports are
        # coalesced for up to 20 ms (luftpause/dataplane/link/admission.py), on a loaded machine longer:
        # the recorded pause is the 0.2 s tool time give or take that, so only its presence and sign
        # are facts here, not its size.
        assert all(t.pause_after is not None and t.pause_after > 0 for t in run.turns[:2])
        assert run.ended_after is not None
    assert {(g.service_class, g.caller) for g in replayed.groups} == {
        ("interactive", "ide"),
        ("batch", "bulk"),
    }
    for arrangement in ("router", "luftpause"):
        report = simulate(FloodSpec(replayed, "sglang-llama-3.2-1b-fp8-8gb", slots=4), arrangement)
        rows = report["groups"]
        started = sum(r["completed"] + r["failed"] + r["cutOff"] + r["unfinished"] for r in rows)
        assert started == len(replayed.runs), arrangement  # every traced run was replayed
        assert sum(r["completed"] for r in rows) > 0 and sum(r["turns"] for r in rows) > len(replayed.runs)
