"""Run trees and their budgets: subtree walks, subtree cost totals, and which budget ran out.

Pure functions over the runs a registry holds (``runs``: handle -> run); no IO, no tasks. The
registry (:mod:`luftpause.runtime.runs.registry`) acts on what they find.

A budget set on a run bounds that run and all its descendants, children spawned later included::

    tokens     prompt + completion tokens of every turn in the subtree
    toolCalls  tool calls made in the subtree (failed ones too: they were asked for)
    seconds    wall-clock seconds since the budgeted run started (a restart's downtime counts)

A budget is exceeded when what is used is past the limit (``used > limit``). Tool calls never
overshoot: before each call the loop asks whether one more would pass a ``toolCalls`` budget on
the way up (``ahead``), and such a call is not made; the subtree is cancelled instead, the message
counting the call that was asked for. Tokens are checked before every turn (a turn with the budget
already used up is not sent) and after it, so a subtree may overshoot by at most one turn's
tokens; the seconds are also checked by a timer.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from luftpause.runtime.runs.record import add_counters

if TYPE_CHECKING:
    from luftpause.runtime.runs.record import Counters, Run


def subtree(root: Run, runs: Mapping[str, Run]) -> Iterator[Run]:
    """``root`` and every descendant still held in ``runs``, parents before their children.
    A child dropped from ``runs`` (a finished run past retention) is skipped with its subtree."""
    stack = [root]
    seen: set[str] = set()
    while stack:
        run = stack.pop()
        if run.handle in seen:  # a journal edited by hand could link a cycle
            continue
        seen.add(run.handle)
        yield run
        stack.extend(runs[h] for h in reversed(run.children) if h in runs)


def ancestors(run: Run, runs: Mapping[str, Run]) -> Iterator[Run]:
    """``run`` itself, then its parent, its parent's parent, ... while they are held."""
    seen: set[str] = set()
    current: Run | None = run
    while current is not None and current.handle not in seen:
        seen.add(current.handle)
        yield current
        current = runs.get(current.parent) if current.parent is not None else None


def subtree_counters(root: Run, runs: Mapping[str, Run]) -> Counters:
    """The costs of ``root`` and its held descendants, summed (:data:`~.record.COUNTER_KEYS`)."""
    total: Counters = {}
    for run in subtree(root, runs):
        add_counters(total, run.costs.to_json())
    return total


def all_subtree_counters(runs: Mapping[str, Run]) -> dict[str, Counters]:
    """:func:`subtree_counters` of every run at once, in one pass over the forest (O(runs))."""
    totals: dict[str, Counters] = {}
    for handle, run in runs.items():
        if handle in totals:
            continue
        # Post-order without recursion: a run's total is known once its children's are.
        order = list(subtree(run, runs))
        for node in reversed(order):
            if node.handle in totals:
                continue
            total = add_counters({}, node.costs.to_json())
            for child in node.children:
                if child in totals:
                    add_counters(total, totals[child])
            totals[node.handle] = total
    return totals


def budget_used(run: Run, runs: Mapping[str, Run], now: float) -> dict[str, float]:
    """What the subtree rooted at ``run`` has used of each budget ``run`` sets (same keys as
    its spec's ``limits``); ``now`` is ``time.time()`` seconds."""
    limits = run.spec.limits
    if not limits:
        return {}
    used: dict[str, float] = {}
    counters = subtree_counters(run, runs) if ("tokens" in limits or "toolCalls" in limits) else {}
    if "tokens" in limits:
        used["tokens"] = int(counters.get("promptTokens", 0) + counters.get("completionTokens", 0))
    if "toolCalls" in limits:
        used["toolCalls"] = int(counters.get("toolCalls", 0))
    if "seconds" in limits:
        used["seconds"] = round(max(0.0, now - run.started_at), 3)
    return used


def exceeded_message(which: str, used: float, limit: float) -> str:
    """``budget exceeded: <which> <used>/<limit>``, numbers as short as they go (``3``, ``1.5``)."""
    return f"budget exceeded: {which} {used:g}/{limit:g}"


def first_exceeded(
    run: Run, runs: Mapping[str, Run], now: float, ahead: Mapping[str, float] | None = None
) -> tuple[Run, str, str] | None:
    """The outermost run among ``run`` and its ancestors whose budget is exceeded (its subtree
    holds every other such subtree on the way up), with which budget (a key of its ``limits``)
    and the message (:func:`exceeded_message`); ``None`` when every budget on the way up holds.
    ``ahead`` is what the caller is about to use (``{"toolCalls": 1}`` before a call): a budget
    that it would pass counts as exceeded, with it counted in the message."""
    found: tuple[Run, str, str] | None = None
    for node in ancestors(run, runs):
        limits = node.spec.limits
        if not limits:
            continue
        used = budget_used(node, runs, now)
        for which, limit in limits.items():
            total = used[which] + (ahead or {}).get(which, 0)
            if total > limit:
                found = node, which, exceeded_message(which, total, limit)
                break
    return found
