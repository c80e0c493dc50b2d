"""What ``await``, ``status`` and ``GET /status`` show of runs (MCP tool results, camelCase).

Listings of many runs stay small: a task is summarized (:func:`summarize`) and no answer text is
listed; one run's ``status(handle)`` or ``await`` gives its whole answer.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from luftpause.runtime.runs.budgets import all_subtree_counters
from luftpause.runtime.runs.record import Counters, summarize

if TYPE_CHECKING:
    from luftpause.runtime.runs.record import Run


def _rounded(counters: Counters) -> Counters:
    return {k: round(v, 3) if k.endswith("Seconds") else int(v) for k, v in counters.items()}


def run_result(run: Run) -> dict[str, Any]:
    """The run as ``await`` reports it (MCP tool result, camelCase)::

    {"handle", "state", "podState": running|idle|stopped, "stopping"?: {"by"} (asked to stop:
     its current turn finishes first), "answer"? (completed),
     "error"? (failed, cancelled),
     "pendingApprovals"?: [{"id", "tool", "arguments", "repeat"?}] (state "AwaitingApproval"),
     "pendingApproval"?: the first of them (clients that expect one question at a time),
     "durable"?: false, "journalError"? (a journal record of the run could not be written, or a
     restart found one damaged: what and where),
     "conversationDropped"?: true (finished, its conversation dropped for [runtime] retained_bytes),
     "toolCalls", "failedToolCalls", "turns", "seconds",
     "usage": {"promptTokens", "completionTokens"}}

    The registry adds ``limits``, ``used`` and ``exceeded`` for a run with budgets
    (:meth:`RunRegistry.result`).
    """
    out: dict[str, Any] = {"handle": run.handle, "state": run.display_state, "podState": run.pod_state}
    if run.stopping:
        out["stopping"] = {"by": run.stopped_by}
    waiting = run.approvals.open()
    if waiting and not run.done:
        out["pendingApprovals"] = [approval.shown() for approval in waiting]
        out["pendingApproval"] = out["pendingApprovals"][0]
    problems = [p for p in (run.durability.error, run.durability.damaged) if p is not None]
    if problems:
        out["durable"] = False
        out["journalError"] = "; ".join(problems)
    if run.conversation_dropped:  # for the byte budget: it takes no ``send`` any more
        out["conversationDropped"] = True
    if run.answer is not None:
        out["answer"] = run.answer
    if run.error is not None:
        out["error"] = run.error
    costs = run.costs
    out.update(
        toolCalls=costs.tool_calls,
        failedToolCalls=costs.failed_tool_calls,
        turns=costs.turns,
        seconds=round(run.seconds, 3),
        usage={"promptTokens": costs.prompt_tokens, "completionTokens": costs.completion_tokens},
    )
    return out


def run_status(run: Run, *, full_task: bool = False) -> dict[str, Any]:
    """:meth:`result` plus what the run was asked: ``model``, ``serviceClass``, ``caller``,
    ``task``, ``taskChars``, ``maxToolCalls``, ``maxTokens``, ``instruction`` (the named system
    prompt, or ``null``), ``startedAt`` (Unix seconds), ``parent`` and ``children`` (handles).

    ``task`` is the whole task with ``full_task``, else its :func:`summarize` summary (the
    first 200 characters and ``…``), so that listings of many runs stay small; ``taskChars``
    is always the whole task's length in characters.
    """
    spec = run.spec
    return {
        **run_result(run),
        "model": spec.model,
        "serviceClass": spec.service_class,
        "caller": spec.caller,
        "task": spec.task if full_task else summarize(spec.task),
        "taskChars": run.task_length,
        "maxToolCalls": spec.max_tool_calls,
        "maxTokens": spec.max_tokens,
        "instruction": spec.instruction,
        "startedAt": round(run.started_at, 3),
        "parent": run.parent,
        "children": list(run.children),
    }


def run_tree(
    runs: list[Run], held: Mapping[str, Run], budget_report: Callable[[Run], dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each of ``runs`` with its own and subtree costs (``held``: every run held, by handle; the
    subtrees are counted in it), in the order given (``GET /status``: every held run, oldest
    first), with ``budget_report(run)`` (the registry's limits, used, exceeded) merged in::

    {"id", "name", "state", "parent", "children": [ids], "task" (summary), "taskChars", "model",
     "serviceClass", "caller", "error"?, "own": {COUNTER_KEYS}, "subtree": {COUNTER_KEYS},
     "limits"?, "used"?, "exceeded"?}
    """
    totals = all_subtree_counters(held)
    out = []
    for run in runs:
        item: dict[str, Any] = {
            "id": run.handle,
            "name": run.name,
            "state": run.display_state,
            "parent": run.parent,
            "children": [h for h in run.children if h in held],
            "task": summarize(run.task),
            "taskChars": run.task_length,
            "model": run.spec.model,
            "serviceClass": run.spec.service_class,
            "caller": run.caller,
            "own": _rounded(run.costs.to_json()),
            "subtree": _rounded(totals[run.handle]),
        }
        if run.error is not None:
            item["error"] = run.error
        item.update(budget_report(run))
        out.append(item)
    return out
