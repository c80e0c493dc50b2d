"""The registry's runs to and from the journal: the records that rebuild every held run
(compaction), and the rebuilding of runs from ``runs.jsonl`` after a restart (replay).

Shapes of the records: :mod:`luftpause.runtime.runs.journal`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from luftpause.runtime.runs.record import Run, apply_outcome, summarize

if TYPE_CHECKING:
    from luftpause.runtime.runs.journal import Journal
    from luftpause.runtime.runs.registry import RunRegistry

log = logging.getLogger("luftpause.runtime.runs.registry")


def journal_snapshot(registry: RunRegistry) -> Iterator[dict[str, Any]]:
    """Records that rebuild every held run: a finished run as one ``run`` record
    (:meth:`Run.compacted_record`: what it retains, its conversation or, once that was dropped
    for the byte budget, its kept output entries with their base index, so ``read`` cursors stay
    valid across compaction and restart), a running run as its ``start`` and one ``round`` with
    all its completed rounds (compaction)."""
    for run in list(registry._runs.values()):
        start = run.start_record()
        first = 2 if run.system else 1
        if run.done and not run.interrupted:
            yield run.compacted_record()
            continue
        yield start
        for key in sorted(run.started_calls):
            yield {"type": "started", "handle": run.handle, "key": key}
        for key, allow in run.decisions.items():
            yield {"type": "approval", "handle": run.handle, "key": key, "allow": allow}
        for message in run.inbox:
            yield {"type": "message", "handle": run.handle, **message}
        if run.stopped_by is not None:
            yield {"type": "stop", "handle": run.handle, "by": run.stopped_by}
        if len(run.messages) > first:
            counters = registry._checkpoints.get(run.handle, run.counters())
            yield {
                "type": "round",
                "handle": run.handle,
                "messages": run.messages[first:],
                "counters": counters,
            }
    for extra in registry.extra_snapshot:
        yield from extra()


def replay_journal(registry: RunRegistry, journal: Journal) -> list[Run]:
    """Rebuild the runs of ``journal``: finished ones into the registry as they ended, the
    unfinished ones (returned, in start order) at their last completed tool round. A record
    that does not fit (no start before it, a field missing) is skipped with a warning."""
    runs: dict[str, Run] = {}
    for record in journal.records():
        kind, handle = record.get("type"), record["handle"]
        try:
            for listener in registry.on_replay:
                listener(record)
            if kind in registry.foreign_records:
                continue
            if kind in ("start", "run"):
                run = Run.from_start_record(record)
                if kind == "run":
                    if record.get("conversationDropped"):
                        outputs = record.get("outputs") or []
                        if not isinstance(outputs, list):
                            raise TypeError("outputs is not a list")
                        run.conversation_dropped = True
                        run.messages = []
                        run.kept_outputs = [str(entry) for entry in outputs]
                        run.outputs_base = int(record.get("outputsBase") or 0)
                        run.task_chars = int(record.get("taskChars") or len(run.task))
                        run.task = summarize(run.task)
                    else:
                        messages = record.get("messages") or []
                        if not isinstance(messages, list):
                            raise TypeError("messages is not a list")
                        run.messages.extend(messages)
                    apply_outcome(run, record)
                runs[handle] = run
                continue
            run = runs[handle]
            if kind == "message":
                if run.pod_state != "stopped":
                    content, sender = str(record["content"]), str(record.get("from") or "")
                    registry._take_message(run, content, sender, str(record["id"]))
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
                run.set_counters(record["counters"])
                registry._checkpoints[handle] = run.counters()
                delivered = set(record.get("delivered") or ())
                if delivered:
                    run.inbox = [m for m in run.inbox if m["id"] not in delivered]
            elif kind == "end":
                apply_outcome(run, record)
            elif kind == "approval":
                run.decisions[str(record["key"])] = bool(record["allow"])
            elif kind == "started":  # the approval was used up: a resumed run asks again
                key = str(record["key"])
                run.decisions.pop(key, None)
                run.started_calls.add(key)
            else:
                raise ValueError(f"unknown record type {kind!r}")
        except (KeyError, TypeError, ValueError) as exc:
            log.warning("journal %s: a %s record of %s skipped: %r", journal.path, kind, handle, exc)
    for run in runs.values():
        parent = runs.get(run.parent) if run.parent is not None else None
        if parent is not None:
            parent.children.append(run.handle)
    now_wall, now = time.time(), registry._clock()
    for run in runs.values():
        registry._hook(run)
        registry._runs[run.handle] = run
    for run in sorted((r for r in runs.values() if r.done), key=lambda r: r.finished_at or 0.0):
        registry._ended_at[run.handle] = now - max(0.0, now_wall - (run.finished_at or now_wall))
        registry._retain(run)
    registry.evict_expired()
    unfinished = [run for run in runs.values() if not run.done]
    if runs:
        log.info(
            "journal %s: %d runs, %d finished, %d to resume",
            journal.path,
            len(runs),
            len(runs) - len(unfinished),
            len(unfinished),
        )
    return unfinished
