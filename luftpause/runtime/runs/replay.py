"""Runs to and from the journal: the records that rebuild every held run (compaction), and the
rebuilding of runs from ``runs.jsonl`` after a restart (replay).

Both are functions of records and runs only; the registry (:mod:`luftpause.runtime.runs.registry`)
calls them and keeps what they give. Shapes of the records: :mod:`luftpause.runtime.runs.journal`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from luftpause.runtime.runs.record import Counters, Run, apply_outcome, summarize, take_message

if TYPE_CHECKING:
    from luftpause.runtime.runs.journal import Journal, Record
    from luftpause.runtime.runs.registry import RunListener

log = logging.getLogger("luftpause.runtime.runs")


def journal_snapshot(
    runs: Iterable[Run],
    checkpoints: Mapping[str, Counters],
    extra: Iterable[Callable[[], Iterable[Record]]] = (),
) -> Iterator[dict[str, Any]]:
    """Records that rebuild every run of ``runs``: a finished run as one ``run`` record
    (:meth:`Run.compacted_record`: what it retains, its conversation or, once that was dropped
    for the byte budget, its kept output entries with their base index, so ``read`` cursors stay
    valid across compaction and restart), a running run as its ``start`` and one ``round`` with
    all its completed rounds, counted as ``checkpoints`` says (its counters at its last completed
    round); then each of ``extra``'s records (the registry's listeners)."""
    for run in runs:
        first = 2 if run.spec.system else 1
        if run.done and not run.interrupted:
            yield run.compacted_record()
            continue
        yield run.start_record()
        for key in sorted(run.approvals.started):
            yield {"type": "started", "handle": run.handle, "key": key}
        for key, allow in run.approvals.decisions.items():
            yield {"type": "approval", "handle": run.handle, "key": key, "allow": allow}
        for message in run.inbox:
            yield {"type": "message", "handle": run.handle, **message}
        if run.stopped_by is not None:
            yield {"type": "stop", "handle": run.handle, "by": run.stopped_by}
        if len(run.messages) > first:
            yield {
                "type": "round",
                "handle": run.handle,
                "messages": run.messages[first:],
                "counters": checkpoints.get(run.handle, run.costs.to_json()),
            }
    for snapshot in extra:
        yield from snapshot()


@dataclass
class Replayed:
    """What a journal rebuilt: every run by handle (parents linked to their children), and each
    unfinished run's counters at its last completed round."""

    runs: dict[str, Run] = field(default_factory=dict)
    checkpoints: dict[str, Counters] = field(default_factory=dict)


def _conversation(run: Run, record: Record) -> None:
    """A compacted ``run`` record's conversation (or, once dropped, its kept outputs) onto ``run``."""
    if record.get("conversationDropped"):
        outputs = record.get("outputs") or []
        if not isinstance(outputs, list):
            raise TypeError("outputs is not a list")
        retention = run.retention
        retention.conversation_dropped = True
        retention.kept_outputs = [str(entry) for entry in outputs]
        retention.outputs_base = int(record.get("outputsBase") or 0)
        retention.task_chars = int(record.get("taskChars") or len(run.spec.task))
        run.messages = []
        run.spec = run.spec.model_copy(update={"task": summarize(run.spec.task)})
        return
    messages = record.get("messages") or []
    if not isinstance(messages, list):
        raise TypeError("messages is not a list")
    run.messages.extend(messages)


def replay_journal(
    journal: Journal, listeners: Iterable[RunListener] = (), foreign: frozenset[str] = frozenset()
) -> Replayed:
    """Rebuild the runs of ``journal``: finished ones as they ended, unfinished ones at their last
    completed tool round. Every record goes to each of ``listeners`` first; the types in
    ``foreign`` are theirs and not read here. A record that does not fit (no start before it, a
    field missing) is skipped with a warning."""
    out = Replayed()
    runs = out.runs
    listeners = tuple(listeners)
    for record in journal.records():
        kind, handle = record.get("type"), record["handle"]
        try:
            for listener in listeners:
                listener.replay(record)
            if kind in foreign:
                continue
            if kind in ("start", "run"):
                run = Run.from_start_record(record)
                if kind == "run":
                    _conversation(run, record)
                    apply_outcome(run, record)
                runs[handle] = run
                continue
            run = runs[handle]
            if kind == "message":
                if run.pod_state != "stopped":
                    content, sender = str(record["content"]), str(record.get("from") or "")
                    take_message(run, content, sender, str(record["id"]))
                continue
            if kind == "stop":
                run.stopped_by = str(record.get("by") or "someone")
                continue
            if run.done:
                continue
            if kind == "round":
                messages = record["messages"]
                if not isinstance(messages, list):
                    raise TypeError("messages is not a list")
                run.messages.extend(messages)
                run.costs.take(record["counters"])
                out.checkpoints[handle] = run.costs.to_json()
                delivered = set(record.get("delivered") or ())
                if delivered:
                    run.inbox = [m for m in run.inbox if m["id"] not in delivered]
            elif kind == "end":
                apply_outcome(run, record)
            elif kind == "approval":
                run.approvals.decisions[str(record["key"])] = bool(record["allow"])
            elif kind == "started":  # the approval was used up: a resumed run asks again
                key = str(record["key"])
                run.approvals.decisions.pop(key, None)
                run.approvals.started.add(key)
            else:
                raise ValueError(f"unknown record type {kind!r}")
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("journal %s: a %s record of %s skipped: %r", journal.path, kind, handle, exc)
    for run in runs.values():
        parent = runs.get(run.parent) if run.parent is not None else None
        if parent is not None:
            parent.children.append(run.handle)
    unfinished = sum(1 for run in runs.values() if not run.done)
    if runs:
        log.info(
            "journal %s: %d runs, %d finished, %d to resume",
            journal.path,
            len(runs),
            len(runs) - unfinished,
            unfinished,
        )
    return out
