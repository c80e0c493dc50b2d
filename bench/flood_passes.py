"""One pass of ``bench/flood.py`` and a series of them: fresh engines behind one arrangement
(:class:`pools.Pool`), the load of :mod:`flood_load` sent through it by own-loop agents or MCP
sub-agents, the figures of the pass (:func:`row_of`: runs/min and run time p50 per class, the
clients' and the engines' cache hit rates, retractions, failures) and the median row of each
arrangement over rotated repetitions (:func:`run_series`). ``flood.py`` parses the flags and
prints the table."""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flood_load import Load
from pools import LlamaEngines, Pool, RouterBalance  # bench/ is on sys.path: this script's directory
from prometheus_client.parser import text_string_to_metric_families

from luftpause.testkit.commands.loadgen import summarize_agents
from luftpause.testkit.fakes.fake_mcp import LOOKUP_DELAY_S
from luftpause.testkit.load.agents import AgentSettings, RunOutcome, closed_loop
from luftpause.testkit.load.agents_summary import percentile
from luftpause.testkit.load.subagents import SubagentSettings, closed_loop_subagents

__all__ = [
    "ENGINE_COUNTERS",
    "FIGURES",
    "MCP_TOOL_SECONDS",
    "TASK",
    "Setup",
    "by_class",
    "engine_counters",
    "measure",
    "median_row",
    "row_of",
    "run_series",
]

MCP_TOOL_SECONDS = sum(LOOKUP_DELAY_S) / 2
"""What an own-loop agent's tool takes in the MCP shape: the fake MCP server's ``lookup`` on average."""
TASK = "Research the question with the lookup tool, then answer briefly."


ENGINE_COUNTERS = {
    "promptTokens": ("sglang:prompt_tokens_total", "vllm:prefix_cache_queries_total"),
    "cachedTokens": ("sglang:cached_tokens_total", "vllm:prefix_cache_hits_total"),
    "retractions": ("sglang:num_retracted_requests_total", "vllm:num_preemptions_total"),
}
"""Each figure of :func:`engine_counters` and its sample names on ``/metrics``, SGLang's then vLLM's
(vLLM's prefix cache counts the prompt tokens it looked up and those it found, in tokens)."""


def engine_counters(engines: list[str]) -> dict[str, float | None]:
    """The engines' prefix-cache and retraction counters, summed over ``engines`` (base URLs):
    ``{"promptTokens", "cachedTokens", "retractions"}`` from SGLang's or vLLM's names on
    ``/metrics`` (:data:`ENGINE_COUNTERS`; the simulator's step model exposes either). An engine
    showing both namings counts once, by SGLang's; a figure none of whose names appeared on any
    engine is ``None`` (unknown), not 0. Raises ``urllib.error.URLError`` if an engine is
    unreachable."""
    totals: dict[str, float | None] = dict.fromkeys(ENGINE_COUNTERS)
    for url in engines:
        with urllib.request.urlopen(f"{url}/metrics", timeout=10) as response:
            text = response.read().decode()
        seen: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                seen[sample.name] = seen.get(sample.name, 0.0) + sample.value
        for figure, names in ENGINE_COUNTERS.items():
            value = next((seen[name] for name in names if name in seen), None)
            if value is not None:
                totals[figure] = (totals[figure] or 0.0) + value
    return totals


@dataclass(frozen=True)
class Setup:
    """How every pass of a series runs: the simulated engines' ``fake-engine`` flags (or ``llama``,
    real replicas), how many simulated ``replicas``, luftpause's ``max_inflight`` per replica, the
    router's ``router_balance`` (``None``: its defaults), and how the agents offer their tool
    (``tool_choice``, ``forced_calls``: :mod:`luftpause.testkit.load.agents`)."""

    engine_args: list[str]
    max_inflight: int | None = None
    llama: LlamaEngines | None = None
    replicas: int = 2
    router_balance: RouterBalance | None = None
    tool_choice: str | None = None
    forced_calls: bool = False


def measure(arrangement: str, load: Load, setup: Setup, seed: int = 0) -> dict[str, Any]:
    """One pass of ``load`` against fresh engines behind ``arrangement``: the loadgen summary;
    ``seed``: what the agents' tool times are drawn from."""
    spawned = load.spawned(arrangement)
    with (
        tempfile.TemporaryDirectory(prefix=f"flood-{arrangement}-") as tmp,
        Pool(
            Path(tmp),
            arrangement,
            setup.engine_args,
            setup.max_inflight,
            load.interactive,
            setup.llama,
            runtime=spawned,
            replicas=setup.replicas,
            router_balance=setup.router_balance,
        ) as pool,
    ):
        groups = load.groups(arrangement)
        load_before = os.getloadavg()
        if spawned:
            subagents = SubagentSettings(
                runtime_url=pool.runtime_url,
                task=TASK,
                context_tokens=load.context_tokens,
                max_tokens=load.max_tokens,
            )
            outcomes = asyncio.run(closed_loop_subagents(subagents, groups, load.duration_s))
        else:
            settings = AgentSettings(
                proxy=pool.url,
                spread=pool.spread,
                tool_rounds_by=load.tool_rounds_by,
                model=pool.model,
                task=TASK,
                tool_rounds=load.tool_rounds,
                context_tokens=load.context_tokens,
                tool_seconds=load.tool_seconds,
                max_tokens=load.max_tokens,
                tool_choice=setup.tool_choice,
                forced_calls=setup.forced_calls,
                seed=seed,
            )
            outcomes = asyncio.run(closed_loop(settings, groups, load.duration_s))
        summary = summarize_agents(groups, outcomes, load.duration_s)
        summary["spawned"] = spawned
        summary["loadAverage"] = [round(load_before[0], 2), round(os.getloadavg()[0], 2)]
        summary["classes"] = by_class(outcomes, load.duration_s)
        summary["replicas"] = len(pool.engines)
        summary["engines"] = engine_counters(pool.engines) if setup.llama is None else None
        if any(group["failed"] for group in summary["groups"]):
            logs = "\n".join(f"--- {c.name}\n{c.log_tail(10)}" for c in pool.children)
            print(f"{arrangement}: failed runs: {summary['errors']}\n{logs}", file=sys.stderr)
        return summary


def by_class(outcomes: list[RunOutcome], duration_s: float) -> dict[str, dict[str, float | None]]:
    """Per service class over all its groups: ``{"runsPerMinute", "runTimeP50"}`` (completed runs
    only; seconds)."""
    figures: dict[str, dict[str, float | None]] = {}
    for service_class in sorted({o.service_class for o in outcomes}):
        done = sorted(
            o.seconds for o in outcomes if o.service_class == service_class and o.state == "completed"
        )
        figures[service_class] = {
            "runsPerMinute": round(len(done) * 60.0 / duration_s, 2),
            "runTimeP50": percentile(done, 50),
        }
    return figures


def row_of(summary: dict[str, Any]) -> dict[str, Any]:
    """The figures of one pass: interactive and batch runs/min, run time p50, cache hit rate (per
    class over its groups: ``summary["classes"]`` when there, else the one group of each class)."""
    classes = summary.get("classes") or {group["class"]: group for group in summary["groups"]}
    empty = {"runsPerMinute": 0.0, "runTimeP50": None}
    interactive = classes.get("interactive", empty)
    batch = classes.get("batch") if any(g["class"] == "batch" for g in summary["groups"]) else None
    prompt = sum(g["promptTokens"] for g in summary["groups"])
    cached = sum((g["cacheHitRate"] or 0.0) * g["promptTokens"] for g in summary["groups"])
    engines = summary.get("engines")
    retractions = engines["retractions"] if engines else None
    return {
        "interactiveRunsPerMinute": interactive["runsPerMinute"],
        "interactiveRunTimeP50": interactive["runTimeP50"],
        "batchRunsPerMinute": batch["runsPerMinute"] if batch else None,
        # the clients' view (usage.prompt_tokens_details); None for sub-agents, whose runtime keeps none
        "cacheHitRate": round(cached / prompt, 4) if prompt and not summary.get("spawned") else None,
        "engineCacheHitRate": (
            round(engines["cachedTokens"] / engines["promptTokens"], 4)
            if engines and engines["promptTokens"] and engines["cachedTokens"] is not None
            else None
        ),
        # None: no engine showed a retraction or preemption counter (unknown, not none happened)
        "retractions": None if retractions is None else int(retractions),
        "failed": sum(g["failed"] for g in summary["groups"]),
        "toolRounds": sum(g.get("toolRounds", 0) for g in summary["groups"]),
        "unforced": sum(g.get("unforced", 0) for g in summary["groups"]),
        "loadAverage": summary.get("loadAverage"),
        "replicas": summary.get("replicas"),
        "groups": [
            {k: g.get(k) for k in ("class", "caller", "agents", "completed", "failed", "turns", "toolRounds")}
            for g in summary["groups"]
        ],
    }


FIGURES = (
    "interactiveRunsPerMinute",
    "interactiveRunTimeP50",
    "batchRunsPerMinute",
    "cacheHitRate",
    "engineCacheHitRate",
)


def median_row(arrangement: str, passes: list[dict[str, Any]]) -> dict[str, Any]:
    row: dict[str, Any] = {"arrangement": arrangement}
    for key in (*FIGURES, "retractions"):
        values = [p[key] for p in passes if p[key] is not None]
        row[key] = round(statistics.median(values), 4) if values else None
    for key in ("failed", "toolRounds", "unforced"):
        row[key] = sum(p.get(key, 0) for p in passes)
    row["repetitions"] = passes
    return row


def run_series(
    name: str, load: Load, arrangements: list[str], repeat: int, setup: Setup, seeds: list[int]
) -> list[dict[str, Any]]:
    """``repeat`` repetitions of every arrangement, rotated (repetition ``i`` starts from the
    ``i``-th and draws tool times from ``seeds[i % len(seeds)]``): one median row per arrangement."""
    passes: dict[str, list[dict[str, Any]]] = {a: [] for a in arrangements}
    for rep in range(repeat):
        order = arrangements[rep % len(arrangements) :] + arrangements[: rep % len(arrangements)]
        for arrangement in order:
            started = time.monotonic()
            row = row_of(measure(arrangement, load, setup, seeds[rep % len(seeds)]))
            print(
                f"{name} #{rep + 1} {arrangement}: {row} ({time.monotonic() - started:.0f} s)",
                file=sys.stderr,
            )
            passes[arrangement].append(row)
    return [median_row(a, passes[a]) for a in arrangements]
