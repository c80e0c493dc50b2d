"""Pods: runs that other runs and people direct (DESIGN.md "Pods", issue 6).

One :class:`Pods` per runtime. It wires the pure scope ledger (:mod:`luftpause.runtime.pods.scope`)
and the built-in workspace tools (:mod:`luftpause.runtime.pods.workspace`) to the run registry, and
does ``send`` / ``read`` / ``stop`` / ``list`` for three kinds of actor (:class:`Actor`): an MCP
caller, a sub-agent through its built-in tools, and a person on the monitor page.

States (``read``, ``list``, the monitor): ``running``; ``idle`` (completed or failed: a ``send``
continues it from its whole conversation); ``stopped`` (cancelled, stopped, or out of budget; it
takes nothing more). ``await`` and ``status`` keep the run's own state (``completed``, ``failed``,
``cancelled``, ``running``, ``AwaitingApproval``) and add ``podState`` beside it: ``await`` waits
until the run is done, so an ``idle`` run counts as done there.

Scope
-----

With ``[runtime] workspace = DIR`` the ledger holds a principal ``workspace`` granted
``allow read,write <real DIR>``; an MCP caller's run is carved from it, so two live runs never
write one path. Without a workspace an MCP caller's ``scope`` is carved from everything.
``spawn(scope=[rules])`` must be within the spawner's effective scope (refused with what
exceeds); rule paths may be relative to the workspace and are taken as real paths. Without
``scope`` a run may *read* what its spawner's grant lets it read and writes nothing (reads are
shared, so this never conflicts); a spawner holding no scope gives none. A run holds its scope
only while it is running: when it ends in any way (answers, fails, ``stop``, ``cancel``, a
budget, dropped from the registry) what it holds returns to its spawner, and what it delegated
onward stays with its live descendants (the ledger's re-parenting). An idle run (answered or
failed) that is sent more work gets the scope it returned granted again before it goes on
(``scopeReturned`` records what to give back), carved from its nearest ancestor that holds a
scope now (the workspace at the top: an idle spawner gave its own back), less what its own live
descendants still hold (``deny write`` rules for their parts, which return above it when they
end); if another run was given any of it meanwhile, the ``send`` is refused with what is held by
whom. ``cancel`` of an idle run ends it for good (``stopped``). Grants and ends are journaled in
``runs.jsonl`` (``scopeGrant`` / ``scopeEnd``) and replayed at start; a holder whose run is not
running after the replay (a crash between the two records) is ended then.

Built-in tools, offered beside the upstream ones: ``read_file``, ``write_file``, ``edit_file``,
``list_directory`` to a run that holds a scope (checked against its effective scope on the real
path); ``spawn``, ``send``, ``read``, ``stop``, ``list`` to a run spawned with
``orchestrate: true``, acting on its own descendants only. Built-in tools do not go through the
approval gate although ``write_file`` / ``edit_file`` carry ``destructiveHint``: the scope is
their gate (a person granted the paths when they set the workspace and scopes). Upstream tools'
declared path arguments (``[[mcp_servers]] path_arguments``) are checked against the scope of a
run before the call; a run that holds no scope may not pass them at all.

Limits: a run tree is at most ``[runtime] max_depth`` levels deep (a caller's run is level 1;
each run's level is fixed at spawn and journaled as a ``pod`` record, never recomputed from
ancestors that may have left the registry) and a run has at most ``max_children`` running
children (idle ones hold nothing; a ``send`` re-opening one counts it again and is refused at the
limit); beyond them ``spawn`` is refused with the limit and its configuration key. A sub-agent's
child inherits its spawner's tools, approval list, tool-call limit and ``maxTokens`` and may
only narrow them (:meth:`Pods.child_limits`); budgets bound the whole subtree anyway. Names are
1-64 printable characters, never starting ``run-`` (kept for handles), unique among a spawner's
running and idle children; ``send`` / ``read`` / ``stop`` take a handle (always first) or such a
name, looked up only among the actor's own children. A busy run's inbox holds at most
:data:`MAX_INBOX` messages; a run that stops with messages waiting tells each sender (a run or
MCP caller) that its message was not taken.

Notifications
-------------

When a run answers (goes idle), fails, or stops, and when someone other than its spawner sends it
a message, an event ``{"id", "kind": answered|error|stopped|message, "child", "handle",
"pointer", "at"}`` is queued on its spawner: the parent run, or the MCP caller (key
``caller:<caller>``) for a top-level run. ``pointer`` is short (``3 new output entries (read
since=2)``: entries since the spawner's last ``read`` of it, kept in memory only, so after a
restart it counts from 0; an error's first 200 characters; who stopped it), never the output. A run's pending
events go into its conversation before its next turn as one ``system`` message (journaled with
that round, so after a restart they are neither lost nor given twice); a caller's are returned,
once, by its next ``await`` or ``status`` (``events``). Events are journaled as ``event`` and
``eventsDelivered`` records. At most :data:`MAX_PENDING_EVENTS` wait per spawner (the oldest go)
and at most :data:`MAX_EVENT_QUEUES` spawners have a queue (the oldest queue goes); a stopped or
evicted run's queue is dropped (it takes no turn to hear it).

Independence
------------

A run belongs to no connection: any MCP connection can ``status``, ``read``, ``send`` and
``stop`` it by handle, and ``list(handle=...)`` shows its children. A caller is the MCP session
id on 2025-era connections, which a reconnecting client loses, so ``list(caller=...)`` lists the
top-level runs of a caller named explicitly (the old session id, or the ``clientInfo.name`` of a
2026-era client); ``list()`` lists the current caller's. Caller events go to the caller key that
spawned the run: on 2025-era connections that is one session (another session sees them only by
asking for the run by handle, ``status(handle)`` / ``read``); 2026-era connections have no
session, so clients declaring the same ``clientInfo.name`` share one caller, its runs and its
events (give each client its own name).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import Tool

from luftpause.config import Config
from luftpause.runtime.errors import BadToolInput, RuntimeFault, UnknownRun
from luftpause.runtime.pods.scope import (
    END,
    GRANT,
    SCOPE_SCHEMA,
    BadScope,
    Mode,
    Rule,
    Scope,
    ScopeExceeded,
    ScopeLedger,
    is_within,
    normalize_path,
    workspace_scope,
)
from luftpause.runtime.pods.workspace import TOOL_SCHEMAS, TOOLS, check_path_arguments, path_arguments
from luftpause.runtime.runs.record import CONVERSATION_DROPPED, last_output, output_entries
from luftpause.runtime.runs.registry import Run, RunRegistry, summarize

log = logging.getLogger("luftpause.runtime.pods.operations")

WORKSPACE = "workspace"
"""The ledger principal holding the configured workspace; MCP callers' runs are carved from it."""

EVENT = "event"
DELIVERED = "eventsDelivered"
POD = "pod"
"""Journal record ``{"type": "pod", "handle", "depth"}``: a run's level in its tree, fixed at spawn."""
RETURNED = "scopeReturned"
"""Journal record ``{"type": "scopeReturned", "handle", "scope": [rule json]}``: what an idle run
gave back, re-granted when it is sent more work."""
MAX_PENDING_EVENTS = 200
MAX_EVENT_QUEUES = 1000
"""Spawners (runs and MCP callers) with pending events kept at most; past it the oldest queue goes."""
MAX_INBOX = 100
"""Messages waiting in one busy run's inbox at most; ``send`` is refused beyond (retry later)."""
MAX_NAME_CHARS = 64
POINTER_CHARS = 200
SUMMARY_CHARS = 200
"""Characters of a last answer's first line shown by ``list`` and the monitor."""


NO_WORKSPACE = (
    "scope: no [runtime] workspace is configured, so there is no filesystem scope to hand out "
    "(set [runtime] workspace to the directory runs may work in)"
)
"""The refusal of a scope asked for when the configuration has no workspace."""


class PodRefused(BadToolInput):
    """A pod operation that cannot be done: a limit, a name taken, a run out of reach."""


@dataclass(frozen=True, slots=True)
class Actor:
    """Who acts: ``key`` is how events and names are scoped (a run's handle, ``caller:<id>``, or
    ``person``), ``run`` the sub-agent when it is one (it may then act on its descendants only),
    ``label`` how the spawner is told who did it."""

    key: str
    label: str
    run: Run | None = None
    caller: str | None = None

    @classmethod
    def of_run(cls, run: Run) -> Actor:
        return cls(run.handle, f"run {run.name or run.handle}", run, run.caller)

    @classmethod
    def of_caller(cls, caller: str) -> Actor:
        return cls(f"caller:{caller}", f"MCP caller {caller}", None, caller)


PERSON = Actor("person", "a person (monitor)")


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


def spawner_key(run: Run) -> str:
    """Where ``run``'s events go: its parent's handle, or its MCP caller."""
    return run.parent if run.parent is not None else f"caller:{run.caller}"


def outputs(run: Run) -> list[str]:
    """The run's output entries still held (:func:`~luftpause.runtime.runs.record.output_entries`
    gives them with the absolute index of the first; ``read`` cursors count from there)."""
    return output_entries(run)[1]


def one_line(text: str | None, limit: int = SUMMARY_CHARS) -> str | None:
    if not text:
        return None
    first = text.strip().splitlines()[0] if text.strip() else ""
    return summarize(first, limit)


def inherited_tools(spawner: Run, tools: Iterable[str] | None, who: str) -> list[str] | None:
    """The tools a child of ``spawner`` may use: ``tools`` (names) when the spawner may use them
    all, the spawner's own when ``tools`` is None; ``None`` means every tool. Tools only narrow down
    a run tree, whoever spawns into it. Raises :class:`PodRefused` naming the tools beyond the
    spawner's (``who`` says whose they are in the message: ``"you"``, ``"run 'x'"``)."""
    if tools is None:
        return sorted(spawner.allowed_tools) if spawner.allowed_tools is not None else None
    if spawner.allowed_tools is not None and (wider := sorted(set(tools) - spawner.allowed_tools)):
        raise PodRefused(f"tools: {', '.join(wider)} not among the tools {who} may use")
    return list(tools)


def inherited_approvals(spawner: Run, approve_tools: Iterable[str] | None) -> list[str]:
    """The tools whose calls wait for approval in a child of ``spawner``: the spawner's plus
    ``approve_tools`` (what needs approval for the spawner needs it for the child)."""
    return sorted(spawner.approve_tools | set(approve_tools or ()))


def read_only(scope: Scope) -> Scope:
    """The read part of ``scope``: its rules that name ``read``, for reading only."""
    return Scope.of(*(Rule(r.effect, frozenset({"read"}), r.path) for r in scope.rules if "read" in r.access))


def _tool(schema: Mapping[str, Any]) -> Tool:
    return Tool.model_validate(schema)


WORKSPACE_TOOLS = tuple(_tool(s) for s in TOOL_SCHEMAS)
_HANDLE = {"type": "string", "description": "a run's handle, or the name you gave your child"}
ORCHESTRATION_SCHEMAS: tuple[dict[str, Any], ...] = (
    {
        "name": "spawn",
        "description": (
            "Start a child sub-agent on `task`; returns its handle at once. `name` (unique among your "
            "children) lets you address it. `scope` hands it part of your filesystem scope (allow/deny "
            "rules); what you give for writing you cannot write until it answers or stops. "
            "`orchestrate` lets it spawn children of its own. It gets your tools, or the part of "
            "them you name in `tools`; tools needing approval for you need it for it too, and "
            "`approveTools` adds more. You are told when it answers, fails or stops."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {
                "task": {"type": "string", "minLength": 1},
                "name": {"type": "string", "minLength": 1, "maxLength": 64},
                "scope": SCOPE_SCHEMA,
                "orchestrate": {"type": "boolean"},
                "system": {"type": "string"},
                "maxToolCalls": {"type": "integer", "minimum": 0, "maximum": 1000},
                "tools": {"type": "array", "items": {"type": "string"}},
                "approveTools": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["task"],
            "additionalProperties": False,
        },
    },
    {
        "name": "send",
        "description": (
            "Send a message to your child run: an idle one continues with it, a busy one gets it "
            "at its next turn."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"handle": _HANDLE, "message": {"type": "string", "minLength": 1}},
            "required": ["handle", "message"],
            "additionalProperties": False,
        },
    },
    {
        "name": "read",
        "description": (
            "Your child run's output entries after cursor `since` (all without it), a new cursor "
            "and its state (running, idle, stopped)."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"handle": _HANDLE, "since": {"type": "integer", "minimum": 0}},
            "required": ["handle"],
            "additionalProperties": False,
        },
    },
    {
        "name": "stop",
        "description": (
            "Stop your child run gracefully: its current turn finishes, no new one starts, its "
            "scope returns to you."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"handle": _HANDLE},
            "required": ["handle"],
            "additionalProperties": False,
        },
    },
    {
        "name": "list",
        "description": (
            "Your child runs (or those of your descendant `handle`): name, state, scope held, last answer."
        ),
        "inputSchema": {
            "type": "object",
            "properties": {"handle": _HANDLE},
            "additionalProperties": False,
        },
    },
)
ORCHESTRATION = tuple(_tool(s) for s in ORCHESTRATION_SCHEMAS)


@dataclass(frozen=True, slots=True)
class SpawnPlan:
    """What :meth:`Pods.plan_spawn` decided: the ledger holder the scope comes from, the scope
    to grant (``None``: the run holds none) and the new run's level in its tree."""

    ledger_parent: str | None
    scope: Scope | None
    depth: int = 1


class Pods:
    """The runtime's pods: scope ledger, notifications, and the operations on runs.

    ``launch`` (set by :func:`luftpause.runtime.mcp.server.build_mcp_server`) spawns a run like the
    ``spawn`` tool does; ``start_loop`` (set in the server's lifespan) starts a re-opened run's
    loop. Call :meth:`after_replay` once the registry has replayed its journal.
    """

    def __init__(self, registry: RunRegistry, config: Config) -> None:
        self.registry = registry
        runtime = config.runtime
        self.max_depth = runtime.max_depth
        self.max_children = runtime.max_children
        self.workspace = normalize_path(os.path.realpath(runtime.workspace)) if runtime.workspace else None
        self.ledger = ScopeLedger()
        if self.workspace is not None:
            self.ledger.grant(WORKSPACE, workspace_scope(self.workspace), parent=None)
        self.path_arguments: dict[str, dict[str, Mode]] = {}
        for server in config.mcp_servers:
            for tool, declared in path_arguments(server).items():
                self.path_arguments.setdefault(tool, declared)
        self.events: dict[str, list[Event]] = {}
        self.depths: dict[str, int] = {}
        """Each held run's level in its tree (1: a caller's run), fixed at spawn and journaled."""
        self.returned: dict[str, Scope] = {}
        """What each idle run gave back when it went idle, re-granted by a ``send`` (journaled)."""
        self.inbox_senders: dict[str, str] = {}
        """Who sent each message waiting in an inbox (message id -> actor key), to tell them when
        it is not taken (not journaled)."""
        self.spawner_cursors: dict[str, int] = {}
        """Per run, the cursor of its spawner's last ``read`` (for event pointers; not journaled:
        after a restart a pointer counts from 0)."""
        self.launch: Callable[..., Run] | None = None
        self.start_loop: Callable[[Run], None] | None = None
        registry.on_finish.append(self._finished)
        registry.on_evict.append(self._evicted)
        registry.on_replay.append(self._replayed)
        registry.foreign_records |= {GRANT, END, EVENT, DELIVERED, POD, RETURNED}
        registry.extra_snapshot.append(self._snapshot)

    # --- journal ---------------------------------------------------------------------------------

    def _journal(self, record: dict[str, Any]) -> None:
        self.registry.version += 1  # scope, events, depth: each record is a change to the network
        if self.registry.journal is not None:
            self.registry.journal.append(record)

    def _replayed(self, record: dict[str, Any]) -> None:
        kind = record.get("type")
        try:
            if kind in (GRANT, END):
                self.ledger.apply(record)
                if kind == GRANT:
                    self.returned.pop(str(record["handle"]), None)
            elif kind == POD:
                self.depths[str(record["handle"])] = int(record["depth"])
            elif kind == RETURNED:
                self.returned[str(record["handle"])] = Scope.from_json(record["scope"])
            elif kind == EVENT:
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
                self._drop_events(str(record["to"]), set(record.get("ids") or ()))
            elif kind == "round" and record.get("events"):
                self._drop_events(str(record["handle"]), set(record["events"]))
        except (RuntimeFault, KeyError, TypeError, ValueError) as exc:
            log.warning("journal: a %s record of %s skipped: %s", kind, record.get("handle"), exc)

    def after_replay(self) -> None:
        """End the scope of every holder whose run is gone or not running (its ``scopeEnd`` was
        lost in a crash between the two records); an idle one's is kept to re-grant."""
        for handle in self.ledger.live():
            if handle == WORKSPACE:
                continue
            try:
                run: Run | None = self.registry.get(handle)
            except RuntimeFault:
                run = None
            if run is None or run.done:
                self._return_scope(handle, keep=run is not None and run.pod_state == "idle")

    def _snapshot(self) -> Iterable[dict[str, Any]]:
        for record in self.ledger.to_records():
            if record["handle"] != WORKSPACE:
                yield record
        for handle, depth in self.depths.items():
            yield {"type": POD, "handle": handle, "depth": depth}
        for handle, scope in self.returned.items():
            yield {"type": RETURNED, "handle": handle, "scope": scope.to_json()}
        for pending in self.events.values():
            for event in pending:
                yield event.record()

    # --- notifications ---------------------------------------------------------------------------

    def _queue(self, run: Run, kind: str, pointer: str) -> None:
        self._queue_to(spawner_key(run), run, kind, pointer)

    def _queue_to(self, to: str, run: Run, kind: str, pointer: str) -> None:
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
            oldest = next(iter(self.events))
            self._discard_events(oldest)
        self.registry.notify_changed()

    def _drop_events(self, key: str, ids: set[str]) -> None:
        pending = self.events.get(key)
        if pending:
            kept = [e for e in pending if e.id not in ids]
            if kept:
                self.events[key] = kept
            else:
                del self.events[key]

    def _discard_events(self, key: str) -> None:
        """Drop ``key``'s queue for good (a spawner that will never take it), journaled."""
        pending = self.events.pop(key, [])
        if pending:
            self._journal({"type": DELIVERED, "handle": key, "to": key, "ids": [e.id for e in pending]})

    def pending(self, key: str) -> list[dict[str, Any]]:
        """The events waiting for ``key`` (not consumed)."""
        return [e.to_json() for e in self.events.get(key, ())]

    def take_caller_events(self, caller: str) -> list[dict[str, Any]]:
        """An MCP caller's pending events, consumed (journaled as delivered): each is given once."""
        key = f"caller:{caller}"
        pending = self.events.pop(key, [])
        if pending:
            self._journal({"type": DELIVERED, "handle": key, "to": key, "ids": [e.id for e in pending]})
        return [e.to_json() for e in pending]

    def _pointer(self, run: Run) -> str:
        """``3 new output entries (read since=2)``: new since the spawner's last ``read``."""
        since = self.spawner_cursors.get(run.handle, 0)
        base, entries = output_entries(run)
        count = base + len(entries)
        return f"{max(count - since, 0)} new output entries (read since={since})"

    def _return_scope(self, handle: str, *, keep: bool) -> None:
        """End ``handle``'s grant (journaled); ``keep``: remember it to re-grant on a ``send``."""
        if handle not in self.ledger:
            return
        scope = self.ledger.granted(handle)
        self._journal(self.ledger.end(handle))
        if keep:
            self.returned[handle] = scope
            self._journal({"type": RETURNED, "handle": handle, "scope": scope.to_json()})

    def _finished(self, run: Run) -> None:
        if run.pod_state == "stopped":
            who = f"stopped by {run.stopped_by}" if run.stopped_by else (run.error or "cancelled")
            dropped = len(run.inbox)
            lost = f"; {dropped} messages sent to it were not taken" if dropped else ""
            self._queue(run, "stopped", f"{summarize(who, POINTER_CHARS)}; {self._pointer(run)}{lost}")
            self._tell_unread_senders(run)
            self._return_scope(run.handle, keep=False)
            self.returned.pop(run.handle, None)
            self._discard_events(run.handle)  # a stopped run takes no turn to hear them at
            return
        self._return_scope(run.handle, keep=True)
        if run.state == "failed":
            self._queue(run, "error", summarize(run.error or "failed", POINTER_CHARS))
        else:
            self._queue(run, "answered", self._pointer(run))

    def _tell_unread_senders(self, run: Run) -> None:
        """A run stopping with messages in its inbox: each sender that was told "next turn" (a
        run or an MCP caller; not a person, who sees the page) hears its message was not taken."""
        for message in run.inbox:
            sender = self.inbox_senders.pop(str(message.get("id")), None)
            if sender is None:
                continue
            size = len(message.get("content") or "")
            pointer = f"your message ({size} characters) was not taken: the run stopped first"
            self._queue_to(sender, run, "message", pointer)

    def _evicted(self, handle: str) -> None:
        self._return_scope(handle, keep=False)
        self.returned.pop(handle, None)
        self.depths.pop(handle, None)
        self.spawner_cursors.pop(handle, None)
        self._discard_events(handle)

    def before_turn(self, run: Run) -> None:
        """The run's inbox and pending events into its conversation as one journaled round: one
        ``system`` message summarising the events, then each message as a ``user`` message."""
        events = self.events.get(run.handle) or []
        inbox = list(run.inbox)
        if not events and not inbox:
            return
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
        self.events.pop(run.handle, None)  # journaled as delivered by the round record below
        run.complete_round(messages, delivered=[m["id"] for m in inbox], events=[e.id for e in events])

    # --- spawn -----------------------------------------------------------------------------------

    def depth(self, run: Run | None) -> int:
        """``run``'s level in its tree, as fixed at its spawn (a caller's run is 1; ``None``: 0).
        Never walked through ancestors, which may have left the registry; a run spawned before
        depths were kept counts as deep as the limit, so it spawns nothing more."""
        if run is None:
            return 0
        return self.depths.get(run.handle, self.max_depth)

    def _children(self, parent: Run | None, caller: str) -> list[Run]:
        if parent is None:
            return [r for r in self.registry.of_caller(caller) if r.parent is None]
        return [r for r in self.registry.all() if r.parent == parent.handle]

    def _check_name(self, name: str) -> None:
        if not name or len(name) > MAX_NAME_CHARS or not name.isprintable() or name != name.strip():
            raise PodRefused(
                f"name {name!r}: expected 1 to {MAX_NAME_CHARS} printable characters, "
                "without spaces at either end"
            )
        if any(0xD800 <= ord(c) <= 0xDFFF for c in name):
            raise PodRefused(f"name {name!r}: not valid Unicode text (a lone surrogate)")
        if name.startswith("run-"):
            raise PodRefused(f"name {name!r}: names starting with 'run-' are kept for handles")

    def _check_running_children(self, parent: Run | None, caller: str) -> None:
        if parent is None:
            return
        running = [r for r in self._children(parent, caller) if r.pod_state == "running"]
        if len(running) >= self.max_children:
            raise PodRefused(
                f"children limit: run {parent.handle} has {len(running)} running children, "
                f"[runtime] max_children = {self.max_children}; wait for one to answer or stop one"
            )

    def _real_rules(self, scope_json: Any) -> Scope:
        if not isinstance(scope_json, list):
            raise BadScope(f"scope: expected a list of rules, got {scope_json!r}")
        rules = []
        for item in scope_json:
            if isinstance(item, Mapping) and isinstance(item.get("path"), str):
                path = item["path"]
                if not path.startswith("/") and self.workspace is not None:
                    path = os.path.join(self.workspace, path)
                if path.startswith("/"):
                    item = {**item, "path": os.path.realpath(path)}
            rules.append(item)
        return Scope.from_json(rules)

    def plan_spawn(self, parent: Run | None, caller: str, name: str | None, scope_json: Any) -> SpawnPlan:
        """Check a spawn under ``parent`` (``None``: by MCP caller ``caller``) before it happens:
        depth and children limits, ``name`` free, ``scope_json`` within the spawner's effective
        scope. Raises :class:`PodRefused`, :class:`BadScope` or :class:`ScopeExceeded`."""
        level = self.depth(parent) + 1
        if level > self.max_depth:
            raise PodRefused(
                f"depth limit: the new run would be at level {level} of its tree, beyond "
                f"[runtime] max_depth = {self.max_depth}"
            )
        self._check_running_children(parent, caller)
        if name is not None:
            self._check_name(name)
            siblings = [r for r in self._children(parent, caller) if r.pod_state != "stopped"]
            if any(r.name == name for r in siblings):
                raise PodRefused(f"name {name!r} is taken among the spawner's running or idle children")
        if parent is not None:
            ledger_parent: str | None = parent.handle if parent.handle in self.ledger else None
            if ledger_parent is None:
                if scope_json is not None:
                    raise PodRefused("scope: the spawner holds no scope, so it has none to hand on")
                return SpawnPlan(None, None, level)
        else:
            ledger_parent = WORKSPACE if self.workspace is not None else None
        if scope_json is None:
            if ledger_parent is None:
                return SpawnPlan(None, None, level)
            return SpawnPlan(ledger_parent, read_only(self.ledger.granted(ledger_parent)), level)
        if ledger_parent is None:
            # The ledger's root would be the whole filesystem: an MCP caller's runs get a scope
            # only within the configured workspace, never one they name themselves.
            raise PodRefused(NO_WORKSPACE)
        scope = self._real_rules(scope_json)
        excess = is_within(scope, self.ledger.effective(ledger_parent))
        if excess is not None:
            raise ScopeExceeded(excess)
        return SpawnPlan(ledger_parent, scope, level)

    def grant(self, run: Run, plan: SpawnPlan) -> None:
        """Give the new ``run`` its planned scope and record its depth (both journaled)."""
        self.depths[run.handle] = plan.depth
        self._journal({"type": POD, "handle": run.handle, "depth": plan.depth})
        if plan.scope is not None:
            self._journal(self.ledger.grant(run.handle, plan.scope, parent=plan.ledger_parent, name=run.name))

    def _regrant(self, run: Run) -> None:
        """Before an idle ``run`` continues: give it back the scope it returned when it went
        idle, carved again from its spawner's effective scope. Raises :class:`PodRefused` with
        what is held by whom when that is not free any more (a sibling was given it meanwhile);
        and when its spawner has ``max_children`` running children."""
        parent = self.registry.get(run.parent) if run.parent is not None else None
        self._check_running_children(parent, run.caller)
        scope = self.returned.get(run.handle)
        if scope is None or run.handle in self.ledger:
            return
        # Carved from the nearest ancestor holding a scope now; an idle spawner gave its own back,
        # so then from above it (the workspace at the top): the ledger still lets at most one live
        # run write any path, and what the run held was within what its ancestors held.
        source: str | None = WORKSPACE if self.workspace is not None else None
        ancestor = parent
        while ancestor is not None:
            if ancestor.handle in self.ledger:
                source = ancestor.handle
                break
            try:
                ancestor = self.registry.get(ancestor.parent) if ancestor.parent is not None else None
            except RuntimeFault:
                ancestor = None
        # What its own live descendants hold (they kept it when it went idle) stays theirs: the
        # run gets its scope back without those parts, which return to the ledger's holder above
        # them when they end.
        withheld = [
            Rule("deny", frozenset({"write"}), rule.path)
            for holder in self.ledger.live()
            if holder != WORKSPACE and self._descends_handle(holder, run.handle)
            for rule in self.ledger.granted(holder).rules
            if rule.effect == "allow" and "write" in rule.access
        ]
        if withheld:
            scope = Scope.of(*scope.rules, *withheld)
        if source is None:
            raise PodRefused(NO_WORKSPACE)  # a journal from a configuration that had one
        excess = is_within(scope, self.ledger.effective(source))
        if excess is not None:
            raise PodRefused(f"run {run.handle} cannot continue: the scope it held is not free now: {excess}")
        self._journal(self.ledger.grant(run.handle, scope, parent=source, name=run.name))
        del self.returned[run.handle]

    # --- operations ------------------------------------------------------------------------------

    def resolve(self, actor: Actor, target: str) -> Run:
        """The run ``target`` names (a handle, or a live child's name of ``actor``). A sub-agent
        reaches only its descendants. Raises :class:`UnknownRun` / :class:`PodRefused`."""
        run: Run | None = None
        try:
            run = self.registry.get(target)
        except UnknownRun:
            if actor.run is not None or actor.caller is not None:
                named = [r for r in self._children_of(actor) if r.name == target]
                live = [r for r in named if r.pod_state != "stopped"]
                candidates = live or named
                run = candidates[-1] if candidates else None
            if run is None:
                raise
        if actor.run is not None and not self._descends(run, actor.run):
            raise PodRefused(f"run {run.handle} is not one of your descendants")
        return run

    def _children_of(self, actor: Actor) -> list[Run]:
        if actor.run is not None:
            return [r for r in self.registry.all() if r.parent == actor.run.handle]
        return [r for r in self.registry.all() if r.parent is None and r.caller == actor.caller]

    def _descends_handle(self, handle: str, ancestor: str) -> bool:
        try:
            run = self.registry.get(handle)
        except RuntimeFault:
            return False
        return self._descends(run, ancestor)

    def _descends(self, run: Run, ancestor: Run | str) -> bool:
        ancestor_handle = ancestor if isinstance(ancestor, str) else ancestor.handle
        parent = run.parent
        while parent is not None:
            if parent == ancestor_handle:
                return True
            try:
                parent = self.registry.get(parent).parent
            except RuntimeFault:
                return False
        return False

    def send(self, actor: Actor, target: str, message: str) -> dict[str, Any]:
        """``send``: ``{"handle", "name", "state", "delivered": "now" | "next turn"}``."""
        run = self.resolve(actor, target)
        if actor.run is run:
            raise PodRefused("a run cannot send a message to itself")
        if run.pod_state == "stopped":
            raise PodRefused(f"run {run.handle} is stopped; it takes no messages")
        if run.conversation_dropped:
            raise PodRefused(CONVERSATION_DROPPED.format(handle=run.handle))
        # A message from anyone but the spawner says who sent it (the run may answer to its spawner).
        own = actor.key == spawner_key(run)
        text = message if own else f"[message from {actor.label}] {message}"
        if run.done:
            self._regrant(run)
        elif len(run.inbox) >= MAX_INBOX:
            raise PodRefused(f"run {run.handle} has {MAX_INBOX} messages waiting already; send later")
        message_id = f"msg-{secrets.token_hex(6)}"
        reopened = self.registry.deliver(run, text, actor.label, message_id)
        if not reopened and actor is not PERSON:
            self.inbox_senders[message_id] = actor.key
        if reopened:
            if self.start_loop is None:
                raise RuntimeError("pods: no loop to continue a run with (outside the server's lifespan)")
            self.start_loop(run)
        if not own:
            self._queue(run, "message", f"{actor.label} sent it a message ({len(message)} characters)")
        return {
            "handle": run.handle,
            "name": run.name,
            "state": run.pod_state,
            "delivered": "now" if reopened else "next turn",
        }

    def read(self, actor: Actor, target: str, since: int | None = None) -> dict[str, Any]:
        """``read``: ``{"handle", "name", "state", "entries": [text], "cursor", "dropped"?,
        "error"?}``; ``entries`` are the output entries after ``since`` (all without it),
        ``cursor`` the count of entries so far (pass it as the next ``since``). Entries keep
        their index for good (across compaction and restart); when entries after ``since`` were
        dropped for ``[runtime] retained_bytes``, ``dropped`` says how many, and ``entries``
        starts at the first one kept."""
        run = self.resolve(actor, target)
        base, entries = output_entries(run)
        total = base + len(entries)
        start = min(max(since or 0, 0), total)
        if actor.key == spawner_key(run):
            self.spawner_cursors[run.handle] = total
        out: dict[str, Any] = {
            "handle": run.handle,
            "name": run.name,
            "state": run.pod_state,
            "entries": entries[max(start - base, 0) :],
            "cursor": total,
        }
        if start < base:
            out["dropped"] = base - start
        if run.error is not None:
            out["error"] = run.error
        return out

    def stop(self, actor: Actor, target: str) -> dict[str, Any]:
        """``stop``: graceful; ``{"handle", "name", "state"}`` (``stopped`` at once for an idle
        run, ``running`` until its current turn ends)."""
        run = self.resolve(actor, target)
        if actor.run is run:
            raise PodRefused("a run cannot stop itself; answer instead")
        self.registry.request_stop(run, actor.label)
        return {"handle": run.handle, "name": run.name, "state": run.pod_state}

    def describe(self, run: Run) -> dict[str, Any]:
        """One run as ``list`` and the monitor show it::

        {"handle", "name", "state": running|idle|stopped, "runState", "parent", "caller",
         "task" (summary), "scope": {"granted", "heldByChildren"} | null, "lastAnswer" (first
         line, 200 chars) | null, "error"?, "children": [handles], "pendingEvents": n}
        """
        last = last_output(run)
        item: dict[str, Any] = {
            "handle": run.handle,
            "name": run.name,
            "state": run.pod_state,
            "runState": run.display_state,
            "parent": run.parent,
            "caller": run.caller,
            "task": summarize(run.task),
            "scope": self.ledger.effective(run.handle).to_json() if run.handle in self.ledger else None,
            "lastAnswer": one_line(last),
            "children": list(run.children),
            "pendingEvents": len(self.events.get(run.handle, ())),
        }
        if run.error is not None:
            item["error"] = run.error
        if run.conversation_dropped:
            item["conversationDropped"] = True
        return item

    def list_runs(self, actor: Actor, of: str | None = None, caller: str | None = None) -> dict[str, Any]:
        """``list``: ``{"runs": [describe]}``: the children of run ``of``, else the top-level
        runs of ``caller`` (default: the actor's own children)."""
        if of is not None:
            parent = self.resolve(actor, of)
            runs = [r for r in self.registry.all() if r.parent == parent.handle]
        elif caller is not None:
            runs = [r for r in self.registry.all() if r.parent is None and r.caller == caller]
        else:
            runs = self._children_of(actor)
        return {"runs": [self.describe(r) for r in runs]}

    def network(self) -> list[dict[str, Any]]:
        """Every held run, :meth:`describe`\\ d, oldest first (the monitor's tree), with what a
        person watching the network also wants: ``serviceClass``, ``turns`` and ``toolCalls``
        (the run's own counters; ``luftpause top`` shows them)."""
        return [
            {**self.describe(r), "serviceClass": r.service_class, "turns": r.turns, "toolCalls": r.tool_calls}
            for r in self.registry.all()
        ]

    def conversation(self, handle: str, since: int | None = None) -> dict[str, Any]:
        """``{"run": describe, "messages": [...], "from", "cursor", "pendingEvents": [event],
        "conversationDropped"?: true}``: the conversation's messages from index ``since`` (all
        without it), ``from`` the index the first one returned has (``0`` when ``since`` is past
        the conversation: it was dropped, or the cursor came from elsewhere; start over), and
        ``cursor`` the count of messages (the next ``since``). A conversation only grows while it
        is held, so a cursor stays valid."""
        run = self.registry.get(handle)
        pending = self.pending(run.handle)
        start = since if since is not None and 0 <= since <= len(run.messages) else 0
        out: dict[str, Any] = {
            "run": self.describe(run),
            "messages": run.messages[start:],
            "from": start,
            "cursor": len(run.messages),
            "pendingEvents": pending,
        }
        if run.conversation_dropped:
            out["conversationDropped"] = True
        return out

    # --- the loop's hooks (luftpause.runtime.agent.loop.PodHooks) --------------------------------------

    def builtin_tools(self, run: Run) -> list[Tool]:
        tools: list[Tool] = []
        if run.handle in self.ledger:
            tools.extend(WORKSPACE_TOOLS)
        if run.orchestrate:
            tools.extend(ORCHESTRATION)
        return tools

    async def call_builtin(self, run: Run, name: str, arguments: dict[str, Any]) -> tuple[str, bool]:
        """One built-in tool call: ``(text, failed)``; never raises but for cancellation. A
        workspace tool runs in a worker thread against a snapshot of the run's effective scope
        taken here, on the event loop (the ledger is not thread-safe and may change meanwhile:
        the snapshot is the scope as it stood when the call began)."""
        try:
            if name in TOOLS:
                if run.handle not in self.ledger:
                    return f"Error: {name}: this run holds no filesystem scope now", True
                check = self.ledger.effective(run.handle).check
                text = await asyncio.to_thread(TOOLS[name], check, arguments, base=self.workspace)
                return text, False
            return json.dumps(self._orchestrate(run, name, arguments), ensure_ascii=False), False
        except (RuntimeFault, ToolError) as exc:
            return f"Error: {exc}", True
        except Exception as exc:  # an OSError, a UnicodeError, a KeyError: the tool failed, not the run
            log.info("%s: built-in tool %s raised %r", run.handle, name, exc)
            return f"Error: {name} failed: {type(exc).__name__}: {exc}", True

    def _orchestrate(self, run: Run, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        actor = Actor.of_run(run)
        if name == "spawn":
            if self.launch is None:
                raise RuntimeError("pods: spawn is not wired (outside the server)")
            child = self.launch(**self.child_limits(run, arguments))
            return {"handle": child.handle, "name": child.name, "state": child.pod_state}
        if name == "send":
            return self.send(actor, arguments["handle"], arguments["message"])
        if name == "read":
            return self.read(actor, arguments["handle"], arguments.get("since"))
        if name == "stop":
            return self.stop(actor, arguments["handle"])
        if name == "list":
            return self.list_runs(actor, of=arguments.get("handle"))
        raise PodRefused(f"no built-in tool {name!r}")

    def child_limits(self, run: Run, arguments: Mapping[str, Any]) -> dict[str, Any]:
        """The ``launch`` arguments of a sub-agent's ``spawn``: a child inherits its spawner's
        limits and may only narrow them. ``tools``: the spawner's allowed tools, or the subset it
        names (naming one it may not use is refused); ``approveTools``: the spawner's plus any it
        names (what needs approval for the spawner needs it for the child); ``maxToolCalls`` at
        most the spawner's (default: the smaller of 8 and the spawner's); ``maxTokens``,
        ``parallelToolCalls``, model and service class: the spawner's. Budgets need no copy: a
        run's budgets bound its whole subtree, the child included. Raises :class:`PodRefused`."""
        allowed = inherited_tools(run, arguments.get("tools"), "you")
        max_calls = int(arguments.get("maxToolCalls", min(8, run.max_tool_calls)))
        if max_calls > run.max_tool_calls:
            raise PodRefused(
                f"maxToolCalls: {max_calls} is more than your own ({run.max_tool_calls}); "
                "a child may only narrow it"
            )
        return {
            "caller": run.caller,
            "task": arguments["task"],
            "parent": run.handle,
            "name": arguments.get("name"),
            "scope": arguments.get("scope"),
            "orchestrate": bool(arguments.get("orchestrate", False)),
            "system": arguments.get("system"),
            "maxToolCalls": max_calls,
            "tools": allowed,
            "approveTools": inherited_approvals(run, arguments.get("approveTools")),
            "maxTokens": run.max_tokens,
            "parallelToolCalls": run.parallel_tool_calls,
            "model": run.model,
            "serviceClass": run.service_class,
        }

    def upstream_refusal(self, run: Run, name: str, arguments: dict[str, Any]) -> str | None:
        """Check an upstream call's declared path arguments against ``run``'s scope: the refusal
        text, or ``None`` once each declared argument in ``arguments`` has been replaced, in
        place, by the real path that was checked (so the server gets exactly what was allowed;
        ``~`` and URIs are refused, :func:`~luftpause.runtime.pods.workspace.check_path_arguments`)."""
        declared = self.path_arguments.get(name)
        if not declared:
            return None
        if run.handle not in self.ledger:
            names = ", ".join(declared)
            return f"Error: {name} takes paths ({names}) and this run holds no filesystem scope"
        try:
            check = self.ledger.effective(run.handle).check
            arguments.update(check_path_arguments(check, declared, arguments, base=self.workspace))
        except RuntimeFault as exc:
            return f"Error: {exc}"
        return None

    def end_idle(self, run: Run, by: str) -> list[Run]:
        """``cancel`` of an idle run: it and its idle descendants end for good (``stopped``, by
        ``by``): each is told to its spawner and takes no more work. Returns those ended."""
        ended = []
        stack = [run]
        while stack:
            current = stack.pop()
            if current.pod_state == "idle":
                self.registry.request_stop(current, by)
                ended.append(current)
            stack.extend(r for r in self.registry.all() if r.parent == current.handle)
        return ended
