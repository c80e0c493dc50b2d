"""The runtime's Prometheus metrics, served at ``GET /metrics`` (conventions, process collectors and
exposition: :mod:`luftpause.observe.metrics`), and its readiness (``GET /readyz``,
:mod:`luftpause.serving.health`).

Read when ``/metrics`` is scraped, from the parts that keep them: the run registry (runs held and
its :class:`~luftpause.runtime.runs.registry.RunCounts`), the journal's size, the sub-agent loop's
counts (given through :class:`LoopCountsView`: this part may not import the loop), the upstream
servers' connections and the MCP SDK's sessions (given as callables).

============================================================  =========================================
``luftpause_runtime_runs{state}``                              runs held now: ``running``, ``completed``,
                                                               ``failed``, ``cancelled`` (finished ones
                                                               as long as they are retained)
``luftpause_runtime_runs_started_total``                       runs spawned (replayed ones not counted)
``luftpause_runtime_runs_ended_total{state}``                  runs that ended, by final state (a run
                                                               continued by ``send`` ends again)
``luftpause_runtime_turns_total{outcome}``                     sub-agent LLM turns: ``answered``,
                                                               ``failed``
``luftpause_runtime_tool_calls_total{server}``                 tool calls the models made, by the
                                                               upstream MCP server they went to
                                                               (``builtin``: the runtime's own tools;
                                                               ``none``: refused before reaching one)
``luftpause_runtime_tool_errors_total{server}``                those that failed
``luftpause_runtime_budget_cancellations_total{budget}``       run subtrees cancelled because a budget
                                                               ran out: ``tokens``, ``toolCalls``,
                                                               ``seconds``
``luftpause_runtime_approvals_waiting``                        tool calls waiting for a person now
``luftpause_runtime_journal_bytes``                            size of ``runs.jsonl``
``luftpause_runtime_retained_bytes``                           bytes counted for the finished runs kept
                                                               (bounded by ``[runtime] retained_bytes``)
``luftpause_runtime_mcp_sessions``                             MCP sessions open now (2025-era
                                                               connections; stateless requests hold none)
``luftpause_runtime_upstream_connected{server}``               1 while the upstream MCP server is
                                                               connected, else 0
``luftpause_build_info{process, version}``                     always 1
============================================================  =========================================

Labels are bounded: ``server`` takes the configured ``[[mcp_servers]]`` names and the two above,
``state``, ``outcome`` and ``budget`` fixed sets. Run handles and callers are never labels.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from luftpause.observe.metrics import build_info, counter_by
from luftpause.runtime.runs.registry import FINAL_STATES, RunRegistry
from luftpause.runtime.runs.store import RecordStore
from luftpause.serving.health import Check

__all__ = ["LoopCountsView", "RuntimeMetrics", "readiness"]

RUN_STATES = ("running", *FINAL_STATES)


class LoopCountsView(Protocol):
    """What the sub-agent loop counts (``luftpause.runtime.agent.loop.LoopCounts``)."""

    @property
    def turns(self) -> dict[str, int]: ...
    @property
    def tool_calls(self) -> dict[str, int]: ...
    @property
    def tool_errors(self) -> dict[str, int]: ...


def readiness(registry: RunRegistry) -> dict[str, Check]:
    """``/readyz``'s checks: ``journal``, replayed and its unfinished runs resumed; degraded (still
    ready) when the replay met damage, which the detail says (``GET /status``'s ``journal``)."""
    if registry.ready:
        report = registry.journal_report
        if report.damaged:
            return {"journal": Check(True, f"replayed with damage: {report.summary()}", degraded=True)}
        return {"journal": Check(True, "replayed; unfinished runs resumed")}
    return {"journal": Check(False, "not replayed yet, or the runtime is stopping")}


class RuntimeMetrics:
    """The collector of one runtime's metrics (``prometheus_client``'s collector interface).

    ``upstream()`` gives ``(server name, connected)`` per configured MCP server, ``mcp_sessions()``
    the SDK's open sessions.
    """

    def __init__(
        self,
        registry: RunRegistry,
        journal: RecordStore,
        loop: LoopCountsView,
        upstream: Callable[[], Iterable[tuple[str, bool]]],
        mcp_sessions: Callable[[], int],
    ) -> None:
        self.registry = registry
        self.journal = journal
        self.loop = loop
        self.upstream = upstream
        self.mcp_sessions = mcp_sessions

    def collect(self) -> Iterator[Metric]:
        registry = self.registry
        yield build_info("runtime")
        states = dict.fromkeys(RUN_STATES, 0)
        waiting = 0
        for run in registry.all():
            states[run.state] = states.get(run.state, 0) + 1
            if not run.done:
                waiting += len(run.approvals.open())
        runs = GaugeMetricFamily("luftpause_runtime_runs", "Runs held now, by state.", labels=["state"])
        for state, count in states.items():
            runs.add_metric([state], count)
        yield runs
        counts = registry.counts
        yield CounterMetricFamily(
            "luftpause_runtime_runs_started",
            "Runs spawned since the runtime started (replayed ones not counted).",
            value=counts.started,
        )
        yield counter_by(
            "luftpause_runtime_runs_ended",
            "Runs that ended, by final state (not those a shutdown interrupted: they resume).",
            "state",
            counts.ended,
        )
        yield counter_by(
            "luftpause_runtime_turns",
            "Sub-agent LLM turns, by outcome (answered, failed).",
            "outcome",
            self.loop.turns,
        )
        yield counter_by(
            "luftpause_runtime_tool_calls",
            "Tool calls the sub-agents' models made, by the MCP server they went to "
            "(builtin: the runtime's own tools; none: refused before reaching one).",
            "server",
            self.loop.tool_calls,
        )
        yield counter_by(
            "luftpause_runtime_tool_errors",
            "Tool calls that failed, by the MCP server they went to (as tool_calls).",
            "server",
            self.loop.tool_errors,
        )
        yield counter_by(
            "luftpause_runtime_budget_cancellations",
            "Run subtrees cancelled because a budget ran out, by budget.",
            "budget",
            counts.budget_cancellations,
        )
        yield GaugeMetricFamily(
            "luftpause_runtime_approvals_waiting",
            "Tool calls waiting for a person's approval now.",
            value=waiting,
        )
        yield GaugeMetricFamily(
            "luftpause_runtime_journal_bytes",
            "Size of the runs' store (runs.jsonl, or its PostgreSQL rows as journal lines), in bytes.",
            value=self.journal.size,
        )
        yield GaugeMetricFamily(
            "luftpause_runtime_retained_bytes",
            "Bytes counted for the finished runs kept in memory ([runtime] retained_bytes bounds them).",
            value=registry.retained_total,
        )
        yield GaugeMetricFamily(
            "luftpause_runtime_mcp_sessions",
            "MCP sessions open now (stateless requests hold none).",
            value=self.mcp_sessions(),
        )
        connected = GaugeMetricFamily(
            "luftpause_runtime_upstream_connected",
            "1 while the upstream MCP server is connected, else 0.",
            labels=["server"],
        )
        for name, up in self.upstream():
            connected.add_metric([name], 1 if up else 0)
        yield connected
