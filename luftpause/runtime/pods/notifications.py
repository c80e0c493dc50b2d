"""Notifications: what a spawner is told about its runs, and what a run finds before its next turn.

When a run answers (goes idle), fails, or stops, and when someone other than its spawner sends it
a message, an event ``{"id", "kind": answered|error|stopped|message, "child", "handle",
"pointer", "at"}`` is queued on its spawner (:func:`~luftpause.runtime.pods.actors.spawner_key`):
the parent run, or the MCP caller (key ``caller:<caller>``) for a top-level run. ``pointer`` is
short (``3 new output entries (read since=2)``: entries since the spawner's last ``read`` of it,
kept in memory only, so after a restart it counts from 0; an error's first 200 characters; who
stopped it), never the output.

A run's pending events go into its conversation before its next turn as one ``system`` message,
followed by the messages of its inbox as ``user`` messages (:meth:`Notifications.before_turn`,
journaled with that round, so after a restart they are neither lost nor given twice); a caller's
are returned, once, by its next ``await`` or ``status`` (``events``). At most
:data:`MAX_PENDING_EVENTS` wait per spawner (the oldest go) and at most :data:`MAX_EVENT_QUEUES`
spawners have a queue (the oldest queue goes); a stopped or evicted run's queue is dropped (it
takes no turn to hear it). A run that stops with messages waiting tells each sender (a run or MCP
caller) that its message was not taken.

Journal records::

    {"type": "event", "to", "id", "kind", "child", "handle", "pointer", "at"}   one queued
    {"type": "eventsDelivered", "handle", "to": key, "ids": [event id]}        taken or dropped
    a ``round`` record's "events": [event id]                                  delivered in it

Every record names a run in ``handle``: an event the run it is about, ``eventsDelivered`` the run
its events are about (one record per run). A store that several runtimes share keeps each record
with its run, and writes it only while the runtime holds that run (docs/runtime-store.md): a
record naming an MCP caller (``caller:<caller>``) would be no run's, and refused, so a caller's
events would be given again after a restart or a takeover.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from luftpause.runtime.pods.actors import spawner_key
from luftpause.runtime.runs.changes import NetworkChanges
from luftpause.runtime.runs.record import Run, output_entries, summarize
from luftpause.runtime.runs.store import Record, RecordStore

EVENT = "event"
DELIVERED = "eventsDelivered"
MAX_PENDING_EVENTS = 200
MAX_EVENT_QUEUES = 1000
"""Spawners (runs and MCP callers) with pending events kept at most; past it the oldest queue goes."""
POINTER_CHARS = 200


@dataclass(slots=True)
class Event:
    id: str
    to: str
    handle: str
    child: str
    kind: str
    pointer: str
    at: float

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "child": self.child,
            "handle": self.handle,
            "pointer": self.pointer,
            "at": round(self.at, 3),
        }

    def record(self) -> dict[str, Any]:
        return {"type": EVENT, "to": self.to, **self.to_json()}


class Notifications:
    """The spawners' event queues and the senders of messages waiting in inboxes (module
    docstring); a run listener of the registry, and the loop's arrivals
    (:class:`~luftpause.runtime.agent.loop.Arrivals`)."""

    record_types = frozenset({EVENT, DELIVERED})

    def __init__(self, journal: RecordStore | None, changes: NetworkChanges) -> None:
        self.journal = journal
        self.changes = changes
        self.events: dict[str, list[Event]] = {}
        self.inbox_senders: dict[str, str] = {}
        """Who sent each message waiting in an inbox (message id -> actor key), to tell them when
        it is not taken (not journaled)."""
        self.spawner_cursors: dict[str, int] = {}
        """Per run, the cursor of its spawner's last ``read`` (for event pointers; not journaled:
        after a restart a pointer counts from 0)."""

    def _journal(self, record: Record) -> None:
        self.changes.bump()
        if self.journal is not None:
            self.journal.append(record)

    # --- queues ----------------------------------------------------------------------------------

    def queue(self, run: Run, kind: str, pointer: str) -> None:
        """Tell ``run``'s spawner (journaled)."""
        self.queue_to(spawner_key(run), run, kind, pointer)

    def queue_to(self, to: str, run: Run, kind: str, pointer: str) -> None:
        """Tell the spawner ``to`` (a run's handle, ``caller:<caller>``) about ``run`` (journaled)."""
        event = Event(
            f"ev-{secrets.token_hex(6)}",
            to,
            run.handle,
            run.name or run.handle,
            kind,
            pointer,
            time.time(),
        )
        self._journal(event.record())
        pending = self.events.pop(event.to, [])  # re-inserted: the dict is oldest queue first
        pending.append(event)
        del pending[:-MAX_PENDING_EVENTS]
        self.events[event.to] = pending
        while len(self.events) > MAX_EVENT_QUEUES:
            self._discard(next(iter(self.events)))
        self.changes.notify()

    def _drop(self, key: str, ids: set[str]) -> None:
        pending = self.events.get(key)
        if pending:
            kept = [e for e in pending if e.id not in ids]
            if kept:
                self.events[key] = kept
            else:
                del self.events[key]

    def _discard(self, key: str) -> None:
        """Drop ``key``'s queue for good (a spawner that will never take it), journaled."""
        self._delivered(key, self.events.pop(key, []))

    def _delivered(self, key: str, events: list[Event]) -> None:
        """Journal ``events`` of ``key``'s queue as taken: one record per run they are about
        (module docstring)."""
        about: dict[str, list[str]] = {}
        for event in events:
            about.setdefault(event.handle, []).append(event.id)
        for handle, ids in about.items():
            self._journal({"type": DELIVERED, "handle": handle, "to": key, "ids": ids})

    def pending(self, key: str) -> list[dict[str, Any]]:
        """The events waiting for ``key`` (not consumed)."""
        return [e.to_json() for e in self.events.get(key, ())]

    def pending_count(self, key: str) -> int:
        return len(self.events.get(key, ()))

    def take_caller_events(self, caller: str) -> list[dict[str, Any]]:
        """An MCP caller's pending events, consumed (journaled as delivered): each is given once."""
        key = f"caller:{caller}"
        pending = self.events.pop(key, [])
        self._delivered(key, pending)
        return [e.to_json() for e in pending]

    def pointer(self, run: Run) -> str:
        """``3 new output entries (read since=2)``: new since the spawner's last ``read``."""
        since = self.spawner_cursors.get(run.handle, 0)
        base, entries = output_entries(run)
        count = base + len(entries)
        return f"{max(count - since, 0)} new output entries (read since={since})"

    def read_by_spawner(self, run: Run, cursor: int) -> None:
        """The spawner of ``run`` read its output up to ``cursor``: later pointers count from it."""
        self.spawner_cursors[run.handle] = cursor

    def message_waiting(self, message_id: str, sender: str) -> None:
        """A message from actor key ``sender`` waits in an inbox: tell it if it is not taken."""
        self.inbox_senders[message_id] = sender

    # --- the loop's arrivals ---------------------------------------------------------------------

    def before_turn(self, run: Run) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """The run's pending events (one ``system`` message summarising them) and its inbox (each
        message a ``user`` message), taken, for the loop to journal as one round with the ids it
        delivered (``delivered``, ``events``)."""
        events = self.events.get(run.handle) or []
        inbox = list(run.inbox)
        if not events and not inbox:
            return [], {}
        messages: list[dict[str, Any]] = []
        if events:
            lines = [f"- {e.kind}: child {e.child!r} ({e.handle}): {e.pointer}" for e in events]
            text = (
                f"Notifications about your child runs since your last turn ({len(events)}):\n"
                + "\n".join(lines)
                + "\nUse read(handle, since) to see their output."
            )
            messages.append({"role": "system", "content": text})
        for message in inbox:
            messages.append({"role": "user", "content": message["content"]})
            self.inbox_senders.pop(str(message.get("id")), None)
        run.inbox = []
        self.events.pop(run.handle, None)  # journaled as delivered by the round record
        return messages, {"delivered": [m["id"] for m in inbox], "events": [e.id for e in events]}

    # --- the run listener ------------------------------------------------------------------------

    def replay(self, record: Record) -> None:
        kind = record.get("type")
        # Its own records raise when they do not apply (the replay counts them as damage); a
        # run's round is the replay's to count.
        if kind == EVENT:
            event = Event(
                str(record["id"]),
                str(record["to"]),
                str(record["handle"]),
                str(record["child"]),
                str(record["kind"]),
                str(record["pointer"]),
                float(record["at"]),
            )
            self.events.setdefault(event.to, []).append(event)
        elif kind == DELIVERED:
            self._drop(str(record["to"]), set(record.get("ids") or ()))
        elif kind == "round" and isinstance(record.get("events"), list):
            self._drop(str(record["handle"]), set(record["events"]))

    def replayed(self, runs: Mapping[str, Run]) -> None:
        pass

    def run_ended(self, run: Run) -> None:
        if run.pod_state == "stopped":
            who = f"stopped by {run.stopped_by}" if run.stopped_by else (run.error or "cancelled")
            dropped = len(run.inbox)
            lost = f"; {dropped} messages sent to it were not taken" if dropped else ""
            self.queue(run, "stopped", f"{summarize(who, POINTER_CHARS)}; {self.pointer(run)}{lost}")
            self._tell_unread_senders(run)
            self._discard(run.handle)  # a stopped run takes no turn to hear them at
        elif run.state == "failed":
            self.queue(run, "error", summarize(run.error or "failed", POINTER_CHARS))
        else:
            self.queue(run, "answered", self.pointer(run))

    def _tell_unread_senders(self, run: Run) -> None:
        """A run stopping with messages in its inbox: each sender that was told "next turn" (a
        run or an MCP caller; not a person, who sees the page) hears its message was not taken."""
        for message in run.inbox:
            sender = self.inbox_senders.pop(str(message.get("id")), None)
            if sender is None:
                continue
            size = len(message.get("content") or "")
            pointer = f"your message ({size} characters) was not taken: the run stopped first"
            self.queue_to(sender, run, "message", pointer)

    def run_dropped(self, handle: str) -> None:
        self.spawner_cursors.pop(handle, None)
        self._discard(handle)

    def snapshot(self) -> Iterable[Record]:
        for pending in self.events.values():
            for event in pending:
                yield event.record()
