"""The peers modelled in virtual time: ThunderAgent's ``tr`` scheduler (pause at tool boundaries,
smallest-first resume packed into the room left), Continuum's TTL pins and program order behind
the router, SGLang Model Gateway's slot pool set for the load, and engines whose settings every
arrangement shares."""

from __future__ import annotations

import dataclasses

import pytest

from luftpause.testkit.engine.model import EngineModel, profile
from luftpause.testkit.sim.clock import VirtualClock
from luftpause.testkit.sim.engines import CLASS_PRIORITY, EnginePool
from luftpause.testkit.sim.flood import FloodSpec, by_class, simulate
from luftpause.testkit.sim.thunderagent import BUFFER_PER_PROGRAM, Program, ThunderAgent
from luftpause.testkit.sim.workload import AgentGroup, ToolTime, published_shape

PROFILE = "sglang-llama-3.2-1b-fp8-8gb"


def _thunderagent(pool_tokens: int, replicas: int = 2) -> ThunderAgent:
    clock = VirtualClock()
    engine = dataclasses.replace(profile(PROFILE), pool_tokens=pool_tokens)
    pool = EnginePool(
        clock, [EngineModel(engine) for _ in range(replicas)], [f"e{i}" for i in range(replicas)]
    )
    return ThunderAgent(clock, pool)


def _paused(scheduler: ThunderAgent, name: str, tokens: int, step: int, reasoning: bool) -> Program:
    program = Program(name, total_tokens=tokens, paused_tokens=tokens, step_count=step, reasoning=reasoning)
    program.paused = True
    scheduler.programs[name] = program
    scheduler.paused[name] = program
    return program


def test_thunderagent_resumes_waiting_turns_first_then_new_programs_then_acting_ones_smallest_first() -> None:
    # two backends of 2,500 tokens: room for 5,000 tokens of programs and their buffers in all
    scheduler = _thunderagent(2_500)
    _paused(scheduler, "acting-small", 500, step=3, reasoning=False)
    _paused(scheduler, "new-big", 1_900, step=1, reasoning=True)
    _paused(scheduler, "waiting-big", 2_000, step=2, reasoning=True)
    _paused(scheduler, "waiting-small", 900, step=4, reasoning=True)
    scheduler._resume()
    resumed = {name for name, p in scheduler.programs.items() if not p.paused}
    # in priority order 900 + 2,000 + 1,900 (+ 100 each) = 5,100 > 5,000: the new program does not
    # fit the room summed, the acting one (500 + 100) does
    assert resumed == {"waiting-small", "waiting-big", "acting-small"}
    # best fit decreasing: the largest first, each on the backend with the most room left then
    placed = {name: scheduler.programs[name].backend for name in resumed}
    assert placed["waiting-big"] != placed["waiting-small"]
    for backend in range(2):
        assert scheduler.remaining(backend) >= 0


def test_thunderagent_pauses_acting_programs_smallest_first_then_marks_every_reasoning_one() -> None:
    scheduler = _thunderagent(3_000, replicas=1)
    for name, tokens, reasoning in [
        ("a", 1_200, False),
        ("b", 800, False),
        ("c", 1_000, True),
        ("d", 900, True),
    ]:
        program = Program(name, total_tokens=tokens, step_count=2, reasoning=reasoning)
        scheduler.programs[name] = program
        scheduler._register(program, 0)
    assert scheduler.remaining(0) == 3_000 - 3_900 - 4 * BUFFER_PER_PROGRAM
    scheduler._scheduled_check()
    # b (the smaller acting one) then a are paused; 1,900 + 200 fit then, so c and d stay unmarked
    assert [p.program_id for p in scheduler.paused.values()] == ["b", "a"]
    assert not scheduler.programs["c"].marked and not scheduler.programs["d"].marked
    scheduler.programs["c"].total_tokens = 2_500  # a reasoning program grew past the room
    scheduler._scheduled_check()
    # no acting program is left to pause; marking changes no room, so both reasoning ones are marked
    assert scheduler.programs["c"].marked and scheduler.programs["d"].marked


def test_thunderagent_counts_acting_tokens_by_its_acting_token_weight() -> None:
    # ``--acting-token-weight``: reasoning tokens count whole, acting ones by the weight, truncated
    for weight, counted in [(1.0, 1_000 + 601), (0.5, 1_000 + 300), (0.0, 1_000)]:
        scheduler = _thunderagent(5_000, replicas=1)
        scheduler.acting_token_weight = weight
        for name, tokens, reasoning in [("r", 1_000, True), ("a", 601, False)]:
            program = Program(name, total_tokens=tokens, step_count=2, reasoning=reasoning)
            scheduler.programs[name] = program
            scheduler._register(program, 0)
        room = scheduler.remaining(0)
        assert room == 5_000 - counted - 2 * BUFFER_PER_PROGRAM
        assert isinstance(room, int)


def test_thunderagent_queues_new_programs_under_kv_pressure_and_completes_runs() -> None:
    spec = FloodSpec(published_shape(duration_s=60.0), PROFILE, slots=8)
    report = simulate(spec, "thunderagent")
    counters = report["arrangementCounters"]
    assert counters["paused"] + counters["queuedNew"] > 0 and counters["resumed"] > 0
    assert (by_class(report, "batch", "runsPerMinute") or 0) > 0
    assert (by_class(report, "interactive", "runsPerMinute") or 0) > 0
    # with a pool large enough for every program nothing is ever paused
    roomy = simulate(dataclasses.replace(spec, pool_scale=4.0), "thunderagent")["arrangementCounters"]
    assert roomy["paused"] == roomy["queuedNew"] == roomy["marked"] == 0


def _one_tool_shape(tool: ToolTime) -> object:
    groups = (
        AgentGroup(4, "interactive", "ide", tool_seconds=tool),
        AgentGroup(24, "batch", "bulk", tool_seconds=tool),
    )
    return dataclasses.replace(published_shape(duration_s=60.0), groups=groups)


def test_continuum_pins_short_tool_calls_and_not_long_ones() -> None:
    short = simulate(
        FloodSpec(_one_tool_shape(ToolTime("constant", seconds=0.5)), PROFILE, slots=8), "continuum"
    )
    assert short["arrangementCounters"]["pinned"] > 0
    assert short["arrangementCounters"]["notPinned"] == 0
    # every tool takes 5 s: pinned until the moving average knows better, then no more, and each
    # pin that was made ran out (TTL 2 s) before its tool returned
    long = simulate(
        FloodSpec(_one_tool_shape(ToolTime("constant", seconds=5.0)), PROFILE, slots=8), "continuum"
    )
    counters = long["arrangementCounters"]
    assert counters["notPinned"] > counters["pinned"] > 0
    assert counters["expired"] == counters["pinned"]


def test_continuum_serves_programs_first_come_first_served_and_keeps_prefixes() -> None:
    spec = FloodSpec(published_shape(duration_s=60.0), PROFILE, slots=8)
    router, continuum = simulate(spec, "router"), simulate(spec, "continuum")
    cached = {
        name: by_class(report, "batch", "cacheHitRate") or 0.0
        for name, report in (("router", router), ("continuum", continuum))
    }
    assert cached["continuum"] > cached["router"] + 0.2


def test_smg_at_its_best_sizes_its_slot_pool_for_the_load() -> None:
    spec = FloodSpec(published_shape(duration_s=30.0), PROFILE, slots=None, smg_capacity="load")
    report = simulate(spec, "smg")
    # 2 x (59,125 // (2,650 + 161 + 3 x (22 + 18) + 256)) = 2 x 18
    assert report["arrangementCounters"]["capacity"] == 36
    reported = simulate(dataclasses.replace(spec, smg_capacity="reported"), "smg")
    assert reported["arrangementCounters"]["capacity"] == 2 * 2048


@pytest.mark.parametrize(("style_profile", "sign"), [(PROFILE, 1), ("vllm-llama-3.2-1b-fp8-8gb", -1)])
def test_priority_engines_serve_interactive_turns_first_under_every_arrangement(
    style_profile: str, sign: int
) -> None:
    spec = FloodSpec(published_shape(duration_s=60.0), style_profile, slots=8, queue="priority")
    fcfs = simulate(dataclasses.replace(spec, queue="fcfs"), "router")
    prioritized = simulate(spec, "router")
    assert (by_class(prioritized, "interactive", "runsPerMinute") or 0) > (
        by_class(fcfs, "interactive", "runsPerMinute") or 0
    )
    assert CLASS_PRIORITY["interactive"] * sign != CLASS_PRIORITY["batch"] * sign
