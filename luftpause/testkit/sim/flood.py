"""One flood in virtual time: agents, an arrangement and engine models on one clock.

    result = simulate(FloodSpec(shape, profile="sglang-llama-3.2-1b-fp8-8gb", slots=8), "luftpause")

:func:`simulate` builds a :class:`~.clock.VirtualClock`, one engine model per replica
(:mod:`luftpause.testkit.engine.model`), the arrangement named (:data:`ARRANGEMENTS`) and the
agents of the load shape (:mod:`.workload`), runs the clock to the end of the window and reports
what the load generator reports over HTTP (:func:`luftpause.testkit.commands.loadgen.summarize_agents`):
per group, runs completed in the window per minute, the p50 of their run times, time to first
token, the prompt-token cache hit rate (``cached_tokens`` over ``prompt_tokens`` of the usage),
plus what the arrangement and the engines counted. No process, no socket, no real time: the same
spec and seed give the same figures.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from luftpause.testkit.engine.model import EngineModel, profile
from luftpause.testkit.sim.arrangements import Arrangement, Direct, Router
from luftpause.testkit.sim.clock import VirtualClock
from luftpause.testkit.sim.continuum import Continuum
from luftpause.testkit.sim.engines import EnginePool
from luftpause.testkit.sim.gateway import Gateway, GatewaySettings
from luftpause.testkit.sim.replay import Replay, Trace
from luftpause.testkit.sim.scheduler import Luftpause
from luftpause.testkit.sim.thunderagent import ThunderAgent
from luftpause.testkit.sim.workload import Agents, LoadShape, Run

ARRANGEMENTS = ("router", "smg", "thunderagent", "continuum", "luftpause", "luftpause-moving", "direct")
"""Every arrangement :func:`simulate` knows, the baseline (SGLang's router) first."""
PEERS = ("router", "smg", "thunderagent", "continuum")
"""The arrangements luftpause is compared with."""
QUEUES = ("fcfs", "lpm", "priority")
"""The engines' waiting-queue order (:attr:`FloodSpec.queue`)."""


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
    queue: str = "fcfs"
    """Every arrangement's engines order their waiting queue so (:data:`QUEUES`): ``fcfs``;
    ``lpm``, SGLang's ``--schedule-policy lpm`` (:mod:`luftpause.testkit.engine.model.queue_order`);
    ``priority``, SGLang's ``--enable-priority-scheduling`` (vLLM's ``--scheduling-policy
    priority``) with the agents' class priorities (:data:`~.engines.CLASS_PRIORITY`). Continuum's
    engines keep their own order (program-level first-come first-served) whatever this says."""
    pool_scale: float = 1.0
    """Multiplies the profile's KV pool (FP8 KV, a larger memory fraction)."""
    smg_capacity: str = "reported"
    """SGLang Model Gateway's slot pool: ``reported`` (the engines' ``max_running_requests``
    summed) or ``load`` (``--worker-capacity-override``, set from the pool and the load:
    :func:`load_capacity`)."""

    def __post_init__(self) -> None:
        if self.queue not in QUEUES:
            raise ValueError(f"queue must be one of {QUEUES}, got {self.queue!r}")
        if not self.pool_scale > 0:
            raise ValueError(f"pool_scale must be positive, got {self.pool_scale}")
        if self.smg_capacity not in ("reported", "load"):
            raise ValueError(f"smg_capacity must be reported or load, got {self.smg_capacity!r}")


def percentile(values: list[float], pct: float) -> float | None:
    """The ``pct``-th percentile of ``values`` (nearest rank on the sorted list), ``None`` if empty."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1))))
    return ordered[rank]


def load_capacity(spec: FloodSpec, pool: EnginePool) -> int | None:
    """Running turns the pool's engines hold without thrashing their KV pools: per replica, its
    KV pool over the longest turn of the load (the system prompt, the task, every tool round's
    call and result, the reply), at most its running-request bound, summed. ``None`` for a
    replayed trace (no shape to size from)."""
    shape = spec.shape
    if not isinstance(shape, LoadShape):
        return None
    rounds = max((g.tool_rounds if g.tool_rounds is not None else shape.tool_rounds) for g in shape.groups)
    turn = (
        shape.context_tokens
        + shape.task_tokens
        + rounds * (shape.tool_call_tokens + shape.tool_result_tokens)
        + shape.reply_tokens
    )
    return sum(
        max(1, min(engine.profile.max_running, engine.profile.pool_tokens // turn)) for engine in pool.engines
    )


def _build(name: str, spec: FloodSpec, clock: VirtualClock, pool: EnginePool) -> Arrangement:
    if name == "router":
        return Router(clock, pool)
    if name == "direct":
        return Direct(clock, pool)
    if name == "smg":
        gateway = spec.gateway
        if spec.smg_capacity == "load" and gateway.capacity is None:
            gateway = dataclasses.replace(gateway, capacity=load_capacity(spec, pool))
        return Gateway(clock, pool, pool.max_running(), gateway)
    if name == "thunderagent":
        return ThunderAgent(clock, pool)
    if name == "continuum":
        return Continuum(clock, pool)
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
    name: str,
    slots: int | None,
    index: int,
    changes: dict[str, Any] | None = None,
    queue: str = "fcfs",
    pool_scale: float = 1.0,
    program_order: bool = False,
) -> EngineModel:
    """The named profile's engine; ``slots`` overrides its running-request bound (SGLang's
    ``--max-running-requests``, vLLM's ``--max-num-seqs``), ``None`` keeps the profile's;
    ``changes`` overrides other fields of the profile; ``queue`` and ``pool_scale`` as
    :class:`FloodSpec`'s; ``program_order``: Continuum's program-level FCFS instead of ``queue``."""
    chosen = profile(name)
    if slots is not None:
        chosen = dataclasses.replace(chosen, max_running=slots)
    if changes:
        chosen = dataclasses.replace(chosen, **changes)
    if pool_scale != 1.0:
        chosen = dataclasses.replace(chosen, pool_tokens=round(chosen.pool_tokens * pool_scale))
    if program_order:
        return EngineModel(chosen, schedule_policy="program")
    if queue == "priority":
        order = "lower_first" if chosen.style == "vllm" else "higher_first"
        return EngineModel(chosen, priority_order=order)
    return EngineModel(chosen, schedule_policy=queue)


def _figures(runs: list[Run], duration_s: float) -> dict[str, Any]:
    completed = [run for run in runs if run.state == "completed"]
    times = [run.ended_at - run.started_at for run in completed if run.ended_at is not None]
    prompt = sum(run.prompt_tokens for run in runs)
    cached = sum(run.cached_tokens for run in runs)
    ttfts = [t for run in runs for t in run.ttfts]
    return {
        "completed": len(completed),
        "failed": sum(1 for run in runs if run.state == "failed"),
        "cutOff": sum(1 for run in runs if run.state == "cut_off"),
        "unfinished": sum(1 for run in runs if run.state == "unfinished"),
        "runsPerMinute": round(len(completed) * 60.0 / duration_s, 2),
        "turns": sum(run.turns for run in runs),
        "promptTokens": prompt,
        "cacheHitRate": round(cached / prompt, 4) if prompt else None,
        "runTimeP50": percentile(times, 50),
        "runTimeP99": percentile(times, 99),
        "ttftP50": percentile(ttfts, 50),
        "ttftP99": percentile(ttfts, 99),
        "movedRuns": sum(1 for run in runs if len(set(run.replicas)) > 1),
    }


def summarize(shape: LoadShape | Trace, runs: list[Run], duration_s: float) -> list[dict[str, Any]]:
    """Per agent group, the load generator's figures (``summarize_agents``' row keys)."""
    rows = []
    for index, group in enumerate(shape.groups):
        mine = [run for run in runs if run.group == index]
        rows.append(
            {
                "agents": group.agents,
                "class": group.service_class,
                "caller": group.caller,
                "via": group.via,
                **_figures(mine, duration_s),
            }
        )
    return rows


def summarize_classes(shape: LoadShape | Trace, runs: list[Run], duration_s: float) -> list[dict[str, Any]]:
    """Per service class (every group of it together), the same figures as :func:`summarize`'s."""
    rows = []
    for service_class in ("interactive", "batch"):
        agents = sum(g.agents for g in shape.groups if g.service_class == service_class)
        if agents:
            mine = [run for run in runs if run.service_class == service_class]
            rows.append({"agents": agents, "class": service_class, **_figures(mine, duration_s)})
    return rows


def simulate(spec: FloodSpec, arrangement: str, engine: EngineMaker | None = None) -> dict[str, Any]:
    """Run ``spec``'s flood through ``arrangement`` in virtual time; the report (a JSON-able dict).

    ``{"arrangement", "simulated": true, "durationS", "groups": [row per group, see
    :func:`summarize`], "arrangementCounters", "engines": [per replica totals], "wallSeconds"}``.
    Raises ``ValueError`` for an unknown arrangement.
    """
    started = time.perf_counter()
    program_order = arrangement == "continuum"
    make = engine or (
        lambda name, slots, index: _default_engine(
            name, slots, index, spec.profile_changes, spec.queue, spec.pool_scale, program_order
        )
    )
    clock = VirtualClock()
    names = [f"sim-{index}" for index in range(spec.replicas)]
    engines = [make(spec.profile, spec.slots, index) for index in range(spec.replicas)]
    sign = -1 if engines[0].profile.style == "vllm" else 1
    pool = EnginePool(clock, engines, names, priority_sign=sign)
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
        "classes": summarize_classes(spec.shape, agents.runs, spec.shape.duration_s),
        "arrangementCounters": built.counters(),
        "engines": [pool.stats(index) for index in range(spec.replicas)],
        "submitted": pool.submitted,
        "wallSeconds": round(time.perf_counter() - started, 3),
    }


def by_class(report: dict[str, Any], service_class: str, key: str) -> float | None:
    """``key`` of ``service_class`` (all its groups together) in a :func:`simulate` report."""
    for row in report.get("classes", report["groups"]):
        if row["class"] == service_class:
            value = row[key]
            return None if value is None else float(value)
    return None
