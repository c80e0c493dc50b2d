"""Runs to and from the journal: the records that rebuild every held run (compaction), and the
rebuilding of runs from ``runs.jsonl`` after a restart (replay).

Both are functions of records and runs only; the registry (:mod:`luftpause.runtime.runs.registry`)
calls them and keeps what they give. Shapes of the records: :mod:`luftpause.runtime.runs.journal`.

Damage (a line that is not a record and not the torn last one, :class:`DamagedLine`) never makes a
run vanish:

* a run whose ``start`` (or compacted ``run``) record is damaged, does not fit (a field a run
  needs is missing or out of its bounds), or is missing while later records name the run, is
  rebuilt from what is left (:func:`lost_start`: what the damaged line still shows, then its later
  records) and marked ``start_lost``: it takes no more turns;
* a damaged line that names a run already held is damage to one of its later records.

* a damaged line whose run cannot be told (garbage, or a record with its handle gone) may have
  been a record of any run open at that point of the journal: each of them is marked with it.

A run found damaged that has no journaled outcome after the damage is not resumed (it could repeat
or lose what the line held) but failed, with the reason as its error (``Replayed.failed``: the
registry journals their ends). One that ended after it keeps its outcome. Either way the damage is
shown (``journalError`` in ``await`` and ``status``).

Every line or record that could not be applied is counted (:class:`JournalReport`: ``GET
/status``'s ``journal`` and ``/readyz``'s ``degraded``), with the first one's line number and the
runs it may have lost, which the log names. So is a journal shorter than its manifest says it was
(:meth:`~luftpause.runtime.runs.journal.Journal.shrunk`): truncated or emptied, its lost records
are an error reported, never a fresh start; the runs it held then and the replay does not find
are named as lost.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from luftpause.runtime.errors import RuntimeFault
from luftpause.runtime.runs.journal import DamagedLine
from luftpause.runtime.runs.record import (
    Counters,
    PendingRound,
    Run,
    apply_outcome,
    summarize,
    take_message,
)
from luftpause.runtime.runs.spec import RunSpec

if TYPE_CHECKING:
    from luftpause.runtime.runs.listeners import RunListener
    from luftpause.runtime.runs.store import Record, Replayable

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
        pending = run.pending_round
        if pending is not None:  # a round begun: its reply and the calls done, as they were journaled
            yield pending.turn_record(run.handle)
            for index in sorted(pending.done):
                yield pending.call_record(run.handle, index)
    for snapshot in extra:
        yield from snapshot()


@dataclass
class JournalReport:
    """The damage a replay met (module docstring): ``skipped`` lines and records that could not be
    applied, the first one's ``first_line`` (1-based), the ``runs`` they may have lost (handles),
    ``unidentified`` of them whose run could not be told at all, and ``shrunk``: the journal is
    shorter than its manifest says it was (its description). Clean: :attr:`damaged` is false."""

    skipped: int = 0
    first_line: int | None = None
    runs: set[str] = field(default_factory=set)
    unidentified: int = 0
    shrunk: str | None = None
    lost: set[str] = field(default_factory=set)
    """Runs the manifest names that the shrunk journal no longer holds at all."""

    @property
    def damaged(self) -> bool:
        return self.skipped > 0 or self.shrunk is not None

    def skip(self, line: int | None, handle: str | None) -> None:
        self.skipped += 1
        if line is not None and (self.first_line is None or line < self.first_line):
            self.first_line = line
        if handle is None:
            self.unidentified += 1
        else:
            self.runs.add(handle)

    def summary(self) -> str:
        """One line for a person (``/readyz``'s detail, the log): what was found."""
        parts = []
        if self.shrunk is not None:
            parts.append(f"{self.shrunk}; {len(self.lost)} runs lost with it")
        if self.skipped:
            unknown = f" ({self.unidentified} naming no run that could be told)" if self.unidentified else ""
            parts.append(
                f"{self.skipped} records skipped{unknown}, the first at line {self.first_line}; "
                f"{len(self.runs)} runs may have lost records"
            )
        return "; ".join(parts) or "replayed whole"

    def to_json(self) -> dict[str, Any]:
        """``GET /status``'s ``journal``: ``{"damaged": bool, "recordsSkipped", "firstBadLine":
        int | null, "unidentifiedRecords", "runsPossiblyLost": [handle], "shrunk": str | null,
        "runsLost": [handle], "summary"}``."""
        return {
            "damaged": self.damaged,
            "recordsSkipped": self.skipped,
            "firstBadLine": self.first_line,
            "unidentifiedRecords": self.unidentified,
            "runsPossiblyLost": sorted(self.runs | self.lost),
            "shrunk": self.shrunk,
            "runsLost": sorted(self.lost),
            "summary": self.summary(),
        }


@dataclass
class Replayed:
    """What a journal rebuilt: every run by handle (parents linked to their children), each
    unfinished run's counters at its last completed round, the runs it failed for damage
    (module docstring), whose ``end`` records are not journaled yet, and the damage it met."""

    runs: dict[str, Run] = field(default_factory=dict)
    checkpoints: dict[str, Counters] = field(default_factory=dict)
    failed: list[Run] = field(default_factory=list)
    report: JournalReport = field(default_factory=JournalReport)


LOST_TASK = "(unknown: its start record is lost)"
"""The task shown for a run whose start record was lost and whose task could not be read back."""

LOST_MODEL = "unknown"
"""The model shown for such a run when its model could not be read back."""


def lost_start(handle: str, salvaged: Mapping[str, Any], damage: str) -> Run:
    """A run whose ``start`` record is lost (damaged, not fitting, or missing), rebuilt from what
    ``salvaged`` still shows (``task``, ``model``, ``caller``, ``parent``, ``name``,
    ``serviceClass``, ``at``; what is missing or does not fit takes a placeholder), marked with
    ``damage`` and ``start_lost``. Still running: the replay fails it unless an outcome follows."""
    fields: dict[str, Any] = {"task": LOST_TASK, "model": LOST_MODEL}
    for key in ("task", "model", "caller", "parent", "name", "serviceClass"):
        value = salvaged.get(key)
        if isinstance(value, str) and value:
            fields[key] = value
    try:
        spec = RunSpec.from_record(fields)
    except ValueError:  # a salvaged field out of its bounds: only what always fits
        kept: dict[str, Any] = {k: fields[k] for k in ("model", "caller") if k in fields}
        spec = RunSpec.from_record({**kept, "task": LOST_TASK})
    at = salvaged.get("at")
    started_at = float(at) if isinstance(at, int | float) and not isinstance(at, bool) else time.time()
    run = Run.new(handle, spec, started_at=started_at, resumed=True)
    run.durability.damaged = damage
    run.durability.start_lost = True
    return run


class _Damage:
    """The damage a replay met, by run: lines given by :func:`read_records` as they come, and
    start records that do not fit. A run's damage is *settled* by an outcome journaled after it."""

    def __init__(self, runs: dict[str, Run], path: str, report: JournalReport) -> None:
        self.runs = runs
        self.path = path
        self.report = report
        self.unsettled: set[str] = set()

    def line(self, line: DamagedLine) -> None:
        handle = line.handle
        described = line.describe(self.path)
        self.report.skip(line.number, handle)
        if handle is None:
            # It may have been a record of any run open here: each is marked, none looks clean.
            open_runs = [held for held in self.runs.values() if not held.done]
            for held in open_runs:
                self.mark(held, f"{described}; it names no run, so it may have been one of this run's")
                self.report.runs.add(held.handle)
            named = ", ".join(held.handle for held in open_runs) or "none open here"
            log.error(
                "journal %s: %s; it names no run that could be told: it may have been a record of "
                "any run open at that line (%s), or the start of one now lost without a trace",
                self.path,
                described,
                named,
            )
            return
        run = self.runs.get(handle)
        if run is None:  # the first line of a run: its start
            self.runs[handle] = lost_start(handle, line.salvaged, described)
        else:
            self.mark(run, described)
        self.unsettled.add(handle)

    def mark(self, run: Run, damage: str) -> None:
        found = run.durability.damaged
        run.durability.damaged = damage if found is None else f"{found}; {damage}"
        self.unsettled.add(run.handle)

    def lost(self, handle: str, salvaged: Mapping[str, Any], damage: str) -> Run:
        run = self.runs[handle] = lost_start(handle, salvaged, damage)
        self.unsettled.add(handle)
        return run

    def settled(self, handle: str) -> None:
        self.unsettled.discard(handle)

    def fail_unsettled(self) -> list[Run]:
        """Fail every run whose damage no outcome followed and that is still running."""
        failed = []
        for handle in sorted(self.unsettled):
            run = self.runs.get(handle)
            if run is None or run.done:
                continue
            run.end("failed", error=f"not resumed after a restart: {run.durability.damaged}")
            failed.append(run)
            log.error("journal %s: run %s failed: %s", self.path, handle, run.error)
        return failed


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
    journal: Replayable, listeners: Iterable[RunListener] = (), foreign: frozenset[str] = frozenset()
) -> Replayed:
    """Rebuild the runs of ``journal``: finished ones as they ended, unfinished ones at their last
    completed tool round. Every record goes to each of ``listeners`` first; the types in
    ``foreign`` are theirs and not read here. A record that does not fit (no start before it, a
    field missing) is skipped with a warning."""
    out = Replayed()
    runs = out.runs
    report = out.report
    listeners = tuple(listeners)
    damage = _Damage(runs, journal.label, report)
    shrunk = journal.shrunk()
    for number, record in journal.numbered(on_damaged=damage.line):
        kind, handle = record.get("type"), record["handle"]
        try:
            for listener in listeners:
                try:
                    listener.replay(record)
                except (RuntimeFault, KeyError, TypeError, ValueError) as exc:
                    report.skip(number, handle)
                    log.error(
                        "journal %s line %d: a %s record of %s could not be applied, skipped: %s",
                        journal.label,
                        number,
                        kind,
                        handle,
                        _short(exc),
                    )
            if kind in foreign:
                continue
            if kind in ("start", "run"):
                try:
                    run = Run.from_start_record(record)
                except (KeyError, TypeError, ValueError) as exc:
                    problem = f"{journal.name}: its {kind} record does not fit: {_short(exc)}"
                    run = damage.lost(handle, record, problem)
                else:
                    runs[handle] = run
                if kind == "run":
                    _conversation(run, record)
                    apply_outcome(run, record)
                    _damage_of(run, record)
                    damage.settled(handle)
                continue
            found = runs.get(handle)
            if found is None:  # a run's records with no start before them: its start was lost
                problem = f"{journal.name}: its start record is missing (a {kind} record names it)"
                found = damage.lost(handle, {}, problem)
            run = found
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
                run.pending_round = None
                out.checkpoints[handle] = run.costs.to_json()
                delivered = set(record.get("delivered") or ())
                if delivered:
                    run.inbox = [m for m in run.inbox if m["id"] not in delivered]
            elif kind == "turn":
                message, counters = record["message"], record["counters"]
                if not isinstance(message, dict) or not isinstance(counters, dict):
                    raise TypeError("message or counters is not an object")
                run.pending_round = PendingRound(int(record["turn"]), message, counters)
                run.costs.take(counters)
            elif kind == "call":
                _call(run, record)
            elif kind == "end":
                apply_outcome(run, record)
                damage.settled(handle)
            elif kind == "approval":
                run.approvals.decisions[str(record["key"])] = bool(record["allow"])
            elif kind == "started":  # the approval was used up: a resumed run asks again
                key = str(record["key"])
                run.approvals.decisions.pop(key, None)
                run.approvals.started.add(key)
            else:
                raise ValueError(f"unknown record type {kind!r}")
        except (KeyError, TypeError, ValueError) as exc:
            report.skip(number, handle)
            log.error(
                "journal %s line %d: a %s record of %s could not be applied, skipped: %s",
                journal.label,
                number,
                kind,
                handle,
                _short(exc),
            )
    if shrunk is not None:
        report.shrunk = shrunk.describe(journal.label)
        for run in runs.values():  # its later records may be what was cut off
            if not run.done:
                damage.mark(run, f"{report.shrunk}: its records after the last one left may be lost")
                report.runs.add(run.handle)
        report.lost = set(shrunk.held) - set(runs)
        lost = ", ".join(sorted(report.lost)) or "none of those it held then"
        log.error("journal %s: %s; records are lost; runs lost: %s", journal.label, report.shrunk, lost)
    out.failed = damage.fail_unsettled()
    if report.skipped:
        log.error(
            "journal %s: %s; runs that may have lost records: %s",
            journal.label,
            report.summary(),
            ", ".join(sorted(report.runs)) or "none that could be told",
        )
    for run in runs.values():
        parent = runs.get(run.parent) if run.parent is not None else None
        if parent is not None:
            parent.children.append(run.handle)
    unfinished = sum(1 for run in runs.values() if not run.done)
    if runs:
        log.info(
            "journal %s: %d runs, %d finished, %d to resume",
            journal.label,
            len(runs),
            len(runs) - unfinished,
            unfinished,
        )
    return out


def _call(run: Run, record: Record) -> None:
    """A ``call`` record onto the run's pending round: the call is done, counted as the loop
    counted it (one call, and one failure if it failed)."""
    pending = run.pending_round
    turn, index = int(record["turn"]), int(record["index"])
    if pending is None or pending.turn != turn:
        raise ValueError(f"a call of turn {turn}, which has no tool round pending")
    message = record["message"]
    if not isinstance(message, dict) or not 0 <= index < len(pending.calls):
        raise ValueError(f"call {index} of turn {turn} does not fit its round")
    if index in pending.done:
        return
    failed = bool(record.get("failed"))
    pending.done[index] = (message, failed)
    run.costs.tool_calls += 1
    run.costs.failed_tool_calls += failed


def _damage_of(run: Run, record: Record) -> None:
    """What a compacted ``run`` record says a replay found damaged (:meth:`Run.compacted_record`)."""
    damaged = record.get("damaged")
    if isinstance(damaged, str) and damaged:
        found = run.durability.damaged  # set when this very record did not fit
        run.durability.damaged = damaged if found is None else f"{damaged}; {found}"
        run.durability.start_lost = run.durability.start_lost or bool(record.get("startLost"))


def _short(exc: Exception) -> str:
    """An exception's text on one line (a pydantic error spans several)."""
    return " ".join(str(exc).split())[:300] or type(exc).__name__
