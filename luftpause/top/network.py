"""The run network as ``luftpause top`` shows it, without drawing it: the tree fitted to a number of
lines (:func:`fit`), each run's state in the pages' words (:func:`state_word`), the counts line,
a scope in a few characters, and the line that counts what did not fit. Pure functions of the
monitor's ``runs`` list (:mod:`luftpause.runtime.web.monitor`); no terminal library needed."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "RUN_STATE_WORDS",
    "Fitted",
    "count_text",
    "counts_line",
    "fit",
    "more_line",
    "short_scope",
    "state_word",
    "stopped",
]

RUN_STATE_WORDS = {
    "running": "running",
    "AwaitingApproval": "awaiting approval",
    "completed": "completed",
    "failed": "failed",
    "cancelled": "cancelled",
}
"""A run state (``runState``) in the words of the pages' shared script (``WORDS`` in
``luftpause/scheduler/page.html`` and ``luftpause/runtime/web/monitor.html``); another state is
shown as it is sent, none as ``-``."""


@dataclass(frozen=True, slots=True)
class Fitted:
    """What one frame shows: ``lines`` are ``(guide, run)`` in display order, ``guide`` the tree
    lines drawn before the run's name (``""`` for a root, ``├─ `` / ``└─ `` below a spawner,
    after ``│  `` or spaces for each level above); ``hidden`` the runs left out,
    ``hidden_running`` and ``hidden_awaiting`` how many of them are running and awaiting approval."""

    lines: list[tuple[str, Mapping[str, Any]]]
    hidden: int = 0
    hidden_running: int = 0
    hidden_awaiting: int = 0


def fit(runs: Sequence[Mapping[str, Any]], limit: int | None) -> Fitted:
    """The runs of the monitor's ``runs`` list (oldest first, each with ``handle`` and
    ``parent``) as a tree of at most ``limit`` lines (``None``: all of them).

    A run whose parent is not in the list (evicted, or a caller's run) is a root. With ``limit``
    below the count, one line is kept for the count of the rest, and runs are chosen active
    first (running or awaiting approval: pod state ``running``; or a spawner of such a run), then
    newest first, each with the ancestors
    it hangs from (a run whose missing ancestors do not fit is left out; a later one with fewer
    may still fit). Siblings are shown in the same order."""
    by_handle = {str(r.get("handle")): i for i, r in enumerate(runs)}

    def parent_of(i: int) -> int | None:
        parent = runs[i].get("parent")
        return by_handle.get(str(parent)) if parent is not None else None

    # Active: in a turn or a tool round, or the spawner of such a run at any level. Active runs come first,
    # then the newest (the monitor lists runs oldest first).
    active: set[int] = set()
    for i, run in enumerate(runs):
        at: int | None = i if run.get("state") == "running" else None
        while at is not None and at not in active:
            active.add(at)
            at = parent_of(at)
    order = sorted(range(len(runs)), key=lambda i: (i not in active, -i))
    if limit is None or len(runs) <= limit:
        chosen = set(range(len(runs)))
    else:
        budget = max(0, limit - 1)  # the last line says how many more there are
        chosen = set()
        for i in order:
            if len(chosen) >= budget:
                break
            path: list[int] = []
            at = i
            while at is not None and at not in chosen and at not in path:  # `path`: a cycle guard
                path.append(at)
                at = parent_of(at)
            if len(chosen) + len(path) <= budget:
                chosen.update(path)

    children: dict[int | None, list[int]] = {}
    for i in order:  # each sibling list in rank order
        if i in chosen:
            parent = parent_of(i)
            children.setdefault(parent if parent in chosen else None, []).append(i)
    lines: list[tuple[str, Mapping[str, Any]]] = []
    roots = children.get(None, [])
    # (run, the guide of its line, the guide its children's lines start with)
    stack = [(i, "", "") for i in reversed(roots)]
    seen: set[int] = set()
    while stack:
        i, guide, below = stack.pop()
        if i in seen:
            continue
        seen.add(i)
        lines.append((guide, runs[i]))
        kids = children.get(i, [])
        for n, c in reversed(list(enumerate(kids))):
            last = n == len(kids) - 1
            stack.append((c, below + ("└─ " if last else "├─ "), below + ("   " if last else "│  ")))
    hidden = [r for i, r in enumerate(runs) if i not in seen]
    words = [state_word(r) for r in hidden]
    return Fitted(lines, len(hidden), words.count("running"), words.count("awaiting approval"))


def state_word(run: Mapping[str, Any]) -> str:
    """The run's own state (``runState``) in :data:`RUN_STATE_WORDS`: ``awaiting approval`` for
    ``AwaitingApproval``, an unknown state as it is, ``-`` for none."""
    own = run.get("runState")
    key = own if isinstance(own, str) else ""
    return RUN_STATE_WORDS.get(key, key or "-")


def stopped(run: Mapping[str, Any]) -> bool:
    """Stopped after it had completed or failed (pod state ``stopped``, run state not
    ``cancelled``): it keeps its word and takes no more messages."""
    return run.get("state") == "stopped" and run.get("runState") != "cancelled"


def counts_line(runs: Iterable[Mapping[str, Any]]) -> str:
    """``12 runs: 3 running, 1 awaiting approval, 7 completed, 1 failed`` (by
    :func:`state_word`, in the order of :data:`RUN_STATE_WORDS`, other states after them, then
    ``N with no state``)."""
    by_word: dict[str, int] = {}
    for run in runs:
        word = state_word(run)
        by_word[word] = by_word.get(word, 0) + 1
    known = list(RUN_STATE_WORDS.values())
    others = sorted(set(by_word) - {*known, "-"})
    parts = [f"{by_word[w]:,} {w}" for w in (*known, *others) if w in by_word]
    if "-" in by_word:
        parts.append(f"{by_word['-']:,} with no state")
    total = sum(by_word.values())
    noun = "run" if total == 1 else "runs"
    return f"{total:,} {noun}: " + ", ".join(parts) if parts else "no runs"


def short_scope(scope: Mapping[str, Any] | None) -> str:
    """The scope a run holds in a few characters: its first allow rule (``rw /ws/b``: read,
    write, path), ``+N`` more rules, ``N lent`` parts held by its children; ``-`` for none."""
    if not scope:
        return "-"
    rules = list(scope.get("granted") or ())
    if not rules:
        return "(empty)"
    first = next((r for r in rules if r.get("effect") == "allow"), rules[0])
    access = "".join(m[0] for m in first.get("access") or () if m)
    text = f"{'' if first.get('effect') == 'allow' else 'deny '}{access} {first.get('path')}"
    if len(rules) > 1:
        text += f" +{len(rules) - 1}"
    lent = len(scope.get("heldByChildren") or ())
    return text + (f" ({lent} lent)" if lent else "")


def more_line(fitted: Fitted) -> str:
    """``… 9,961 more runs (2 running, 1 awaiting approval)``: the runs :func:`fit` left out."""
    live = [(fitted.hidden_running, "running"), (fitted.hidden_awaiting, "awaiting approval")]
    said = ", ".join(f"{n:,} {word}" for n, word in live if n)
    return f"… {fitted.hidden:,} more runs" + (f" ({said})" if said else "")


def count_text(value: Any) -> str:
    """An integer count with thousands separators (``1,234``); ``-`` for anything else."""
    return f"{value:,}" if isinstance(value, int) and not isinstance(value, bool) else "-"
