"""One flood in virtual time: agents, an arrangement and engine models on one clock.

    result = simulate(FloodSpec(shape, profile="sglang-llama-3.2-1b-fp8-8gb", slots=8), "luftpause")

:func:`simulate` builds a :class:`~.clock.VirtualClock`, one engine model per replica
(:mod:`luftpause.testkit.engine.model`), the arrangement named (:data:`ARRANGEMENTS`) and the
agents of the load shape (:mod:`.workload`), runs the clock to the end of the window and reports
what the load generator reports over HTTP (:func:`luftpause.testkit.loadgen.summarize_agents`):
per group, runs completed in the window per minute, the p50 of their run times, time to first
token, the prompt-token cache hit rate (``cached_tokens`` over ``prompt_tokens`` of the usage),
plus what the arrangement and the engines counted. No process, no socket, no real time: the same
spec and seed give the same figures.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from luftpause.testkit.engine.model import EngineModel, profile
from luftpause.testkit.sim.arrangements import Arrangement, Direct, Router
from luftpause.testkit.sim.clock import VirtualClock
from luftpause.testkit.sim.engines import EnginePool
from luftpause.testkit.sim.gateway import Gateway, GatewaySettings
from luftpause.testkit.sim.replay import Replay, Trace
from luftpause.testkit.sim.scheduler import Luftpause
from luftpause.testkit.sim.workload import Agents, LoadShape, Run

ARRANGEMENTS = ("router", "smg", "luftpause", "luftpause-moving", "direct")
"""Every arrangement :func:`simulate` knows, the baseline (SGLang's router) first."""


@dataclass(frozen=True, slots=True)
class FloodSpec:
    """What to simulate: the load, the engines (``profile`` with ``slots`` running requests each,
    ``replicas`` of them), the seed of the agents' randomness, and per-arrangement settings."""

    shape: LoadShape | Trace
    """The agents' load, or a recorded trace to replay (:mod:`.replay`)."""
    profile: str
    slots: int | None = 8
    """Running requests per engine at most (``None``: the profile's own bound, for SGLang the KV
    pool's)."""
    replicas: int = 2
    seed: int = 0
    max_inflight: int = 32
    gateway: GatewaySettings = field(default_factory=GatewaySettings)
    policy: dict[str, Any] = field(default_factory=dict)
    """Scheduler policy settings for the luftpause arrangements (``state_from_replicas`` keywords)."""
    profile_changes: dict[str, Any] = field(default_factory=dict)
    """Fields of the engine profile to override (``EngineProfile`` field -> value), for engines
    started with other settings than the profile's: llama-server's ``-c`` (``pool_tokens``) and
    ``--cache-ram`` (``ram_cache_tokens``), say."""


def percentile(values: list[float], pct: float) -> float | None:
    """The ``pct``-th percentile of ``values`` (nearest rank on the sorted list), ``None`` if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1))))
    return ordered[rank]


def _build(name: str, spec: FloodSpec, clock: VirtualClock, pool: EnginePool) -> Arrangement:
    if name == "router":
        return Router(clock, pool)
    if name == "direct":
        return Direct(clock, pool)
    if name == "smg":
        return Gateway(clock, pool, pool.max_running(), spec.gateway)
    if name in ("luftpause", "luftpause-moving"):
        return Luftpause(
            clock,
            pool,
            strict_affinity=name == "luftpause",
            max_inflight=spec.max_inflight,
            policy=spec.policy,
        )
    raise ValueError(f"unknown arrangement {name!r}; choose from {ARRANGEMENTS}")


EngineMaker = Callable[[str, "int | None", int], EngineModel]
"""``(profile, slots, replica index) -> an engine model``."""


def _default_engine(
    name: str, slots: int | None, index: int, changes: dict[str, Any] | None = None
) -> EngineModel:
    """The named profile's engine; ``slots`` overrides its running-request bound (SGLang's
    ``--max-running-requests``, vLLM's ``--max-num-seqs``), ``None`` keeps the profile's;
    ``changes`` overrides other fields of the profile."""
    chosen = profile(name)
    if slots is not None:
        chosen = dataclasses.replace(chosen, max_running=slots)
    if changes:
        chosen = dataclasses.replace(chosen, **changes)
    return EngineModel(chosen)


def summarize(shape: LoadShape | Trace, runs: list[Run], duration_s: float) -> list[dict[str, Any]]:
    """Per agent group, the load generator's figures (``summarize_agents``' row keys)."""
    rows = []
    for index, group in enumerate(shape.groups):
        mine = [run for run in runs if run.group == index]
        completed = [run for run in mine if run.state == "completed"]
        times = [run.ended_at - run.started_at for run in completed if run.ended_at is not None]
        prompt = sum(run.prompt_tokens for run in mine)
        cached = sum(run.cached_tokens for run in mine)
        ttfts = [t for run in mine for t in run.ttfts]
        moved = sum(1 for run in mine if len(set(run.replicas)) > 1)
        rows.append(
            {
                "agents": group.agents,
                "class": group.service_class,
                "caller": group.caller,
                "via": group.via,
                "completed": len(completed),
                "failed": sum(1 for run in mine if run.state == "failed"),
                "cutOff": sum(1 for run in mine if run.state == "cut_off"),
                "unfinished": sum(1 for run in mine if run.state == "unfinished"),
                "runsPerMinute": round(len(completed) * 60.0 / duration_s, 2),
                "turns": sum(run.turns for run in mine),
                "promptTokens": prompt,
                "cacheHitRate": round(cached / prompt, 4) if prompt else None,
                "runTimeP50": percentile(times, 50),
                "runTimeP99": percentile(times, 99),
                "ttftP50": percentile(ttfts, 50),
                "ttftP99": percentile(ttfts, 99),
                "movedRuns": moved,
            }
        )
    return rows


def simulate(spec: FloodSpec, arrangement: str, engine: EngineMaker | None = None) -> dict[str, Any]:
    """Run ``spec``'s flood through ``arrangement`` in virtual time; the report (a JSON-able dict).

    ``{"arrangement", "simulated": true, "durationS", "groups": [row per group, see
    :func:`summarize`], "arrangementCounters", "engines": [per replica totals], "wallSeconds"}``.
    Raises ``ValueError`` for an unknown arrangement.
    """
    started = time.perf_counter()
    make = engine or (lambda name, slots, index: _default_engine(name, slots, index, spec.profile_changes))
    clock = VirtualClock()
    names = [f"sim-{index}" for index in range(spec.replicas)]
    pool = EnginePool(clock, [make(spec.profile, spec.slots, index) for index in range(spec.replicas)], names)
    built = _build(arrangement, spec, clock, pool)
    shape = spec.shape
    agents: Agents | Replay
    agents = (
        Replay(shape, clock, built)
        if isinstance(shape, Trace)
        else Agents(shape, clock, built, seed=spec.seed)
    )
    built.attach(agents)
    built.start()
    agents.start()
    clock.run_until(spec.shape.duration_s)
    return {
        "arrangement": arrangement,
        "simulated": True,
        "durationS": spec.shape.duration_s,
        "groups": summarize(spec.shape, agents.runs, spec.shape.duration_s),
        "arrangementCounters": built.counters(),
        "engines": [pool.stats(index) for index in range(spec.replicas)],
        "submitted": pool.submitted,
        "wallSeconds": round(time.perf_counter() - started, 3),
    }


def by_class(report: dict[str, Any], service_class: str, key: str) -> float | None:
    """``key`` of the (first) group of ``service_class`` in a :func:`simulate` report."""
    for row in report["groups"]:
        if row["class"] == service_class:
            value = row[key]
            return None if value is None else float(value)
    return None


def median_of(reports: list[dict[str, Any]], service_class: str, key: str) -> float | None:
    values = [v for r in reports if (v := by_class(r, service_class, key)) is not None]
    return statistics.median(values) if values else None
