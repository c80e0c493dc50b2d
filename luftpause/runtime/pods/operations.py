"""Pods: the operations on runs that other runs and people direct (docs/architecture.md "Pods").

``send`` / ``read`` / ``stop`` / ``list``, and what the monitor shows, for three kinds of actor
(:class:`~luftpause.runtime.pods.actors.Actor`): an MCP caller, a sub-agent through its built-in
tools (acting on its own descendants only), and a person on the monitor page.

States (``read``, ``list``, the monitor): ``running``; ``idle`` (completed or failed: a ``send``
continues it from its whole conversation); ``stopped`` (cancelled, stopped, or out of budget; it
takes nothing more). ``await`` and ``status`` keep the run's own state (``completed``, ``failed``,
``cancelled``, ``running``, ``AwaitingApproval``) and add ``podState`` beside it: ``await`` waits
until the run is done, so an ``idle`` run counts as done there. Where one word is shown for a
run (``list``'s ``state``, the monitor), an idle run that failed is shown with ``runState``
``failed`` beside it, so no one takes a failure for a rest.

``send`` / ``read`` / ``stop`` take a handle (always first) or a name, looked up among the
actor's descendants, nearest level first (its own children, then theirs). A busy run's inbox
holds at most :data:`MAX_INBOX` messages. ``stop`` answers with what the run's scope does
(:meth:`RunScopes.stop_summary`): what returns to its spawner and when, and what stays with its
live descendants; a running run asked to stop shows ``stopping`` (who asked) in ``stop``,
``status``, ``list`` and the monitor until its current turn ends.

Independence: a run belongs to no connection. Any MCP connection can ``status``, ``read``,
``send`` and ``stop`` it by handle, and ``list(handle=...)`` shows its children, within its
tenant: with caller keys, another tenant's run is not found (:mod:`~luftpause.runtime.runs.tenants`).
``list(caller=...)`` lists the top-level runs of a caller named explicitly (a reconnecting
client's old caller: :mod:`luftpause.runtime.mcp.callers`); ``list()`` lists the current caller's.

The parts this uses, each given when it is built: the run registry, the runs' scopes
(:mod:`luftpause.runtime.pods.scopes`), notifications (:mod:`luftpause.runtime.pods.notifications`)
and tree limits (:mod:`luftpause.runtime.pods.tree`).
"""

from __future__ import annotations

import secrets
from typing import Any

from luftpause.runtime.errors import PodRefused, UnknownRun
from luftpause.runtime.pods.actors import PERSON, Actor, one_line, spawner_key
from luftpause.runtime.pods.notifications import Notifications
from luftpause.runtime.pods.scopes import RunScopes, descends
from luftpause.runtime.pods.tree import TreeLimits
from luftpause.runtime.runs.record import (
    last_output,
    output_entries,
    summarize,
)
from luftpause.runtime.runs.registry import Run, RunRegistry
from luftpause.runtime.runs.tenants import Tenant, only_visible, visible

MAX_INBOX = 100
"""Messages waiting in one busy run's inbox at most; ``send`` is refused beyond (retry later)."""


class PodOperations:
    """``send``, ``read``, ``stop``, ``list`` and the monitor's views, for any actor."""

    def __init__(
        self, registry: RunRegistry, scopes: RunScopes, notifications: Notifications, tree: TreeLimits
    ) -> None:
        self.registry = registry
        self.scopes = scopes
        self.notifications = notifications
        self.tree = tree

    def resolve(self, actor: Actor, target: str) -> Run:
        """The run ``target`` names: a handle, or a name among ``actor``'s descendants (its own
        children first, then theirs, level by level: the nearest level that has the name wins,
        a live run over a stopped one, then the newest). A sub-agent reaches only its
        descendants. Raises :class:`UnknownRun` / :class:`PodRefused`."""
        run = self.registry.find(target)
        if run is not None and not visible(run, actor.tenant):
            raise UnknownRun(target)  # another tenant's: answered as a handle that does not exist
        if run is None:
            if actor.run is not None or actor.caller is not None:
                run = self._named(actor, target)
            if run is None:
                self.registry.get(target)  # raises UnknownRun or ExpiredRun, whichever it is
                raise UnknownRun(target)
        if actor.run is not None and not descends(run, actor.run.handle, self.registry.find):
            raise PodRefused(f"run {run.handle} is not one of your descendants")
        return run

    def _named(self, actor: Actor, name: str) -> Run | None:
        """The run called ``name`` nearest below ``actor`` (:meth:`resolve`), or ``None``."""
        level = self.children_of(actor)
        seen: set[str] = set()
        while level:
            named = [r for r in level if r.name == name]
            if named:
                live = [r for r in named if r.pod_state != "stopped"]
                return (live or named)[-1]
            seen.update(r.handle for r in level)
            parents = {r.handle for r in level}
            level = [r for r in self.registry.all() if r.parent in parents and r.handle not in seen]
        return None

    def children_of(self, actor: Actor) -> list[Run]:
        """The runs ``actor`` spawned and still held: a run's children, a caller's top-level runs."""
        if actor.run is not None:
            return [r for r in self.registry.all() if r.parent == actor.run.handle]
        held = self.registry.all()
        return [r for r in held if r.parent is None and r.caller == actor.caller and visible(r, actor.tenant)]

    def send(self, actor: Actor, target: str, message: str) -> dict[str, Any]:
        """``send``: ``{"handle", "name", "state", "delivered": "now" | "next turn"}``."""
        run = self.resolve(actor, target)
        if actor.run is run:
            raise PodRefused("a run cannot send a message to itself")
        refused = run.message_refusal
        if refused is not None:
            raise PodRefused(refused)
        # A message from anyone but the spawner says who sent it (the run may answer to its spawner).
        own = actor.key == spawner_key(run)
        text = message if own else f"[message from {actor.label}] {message}"
        if run.done:
            parent = self.registry.find(run.parent) if run.parent is not None else None
            siblings = self.registry.children(parent) if parent is not None else []
            self.tree.check_running_children(parent, siblings)
            self.scopes.regrant(run, self.registry.find)
        elif len(run.inbox) >= MAX_INBOX:
            raise PodRefused(f"run {run.handle} has {MAX_INBOX} messages waiting already; send later")
        message_id = f"msg-{secrets.token_hex(6)}"
        reopened = self.registry.deliver(run, text, actor.label, message_id)
        if not reopened and actor.key != PERSON.key:
            self.notifications.message_waiting(message_id, actor.key)
        if reopened:
            self.registry.start(run)
        if not own:
            pointer = f"{actor.label} sent it a message ({len(message)} characters)"
            self.notifications.queue(run, "message", pointer)
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
            self.notifications.read_by_spawner(run, total)
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
        """``stop``: graceful; ``{"handle", "name", "state", "scope"}``: ``state`` is ``stopped``
        at once for an idle run, ``running`` until its current turn ends; ``scope`` what its scope
        does (:meth:`RunScopes.stop_summary`: what returns to its spawner and when, what stays with
        its live descendants), ``null`` when it held none and no descendant holds any."""
        run = self.resolve(actor, target)
        if actor.run is run:
            raise PodRefused("a run cannot stop itself; answer instead")
        summary = self.scopes.stop_summary(run, self.registry.find)
        self.registry.request_stop(run, actor.label)
        out = {"handle": run.handle, "name": run.name, "state": run.pod_state, "scope": summary}
        if run.stopping:
            out["stopping"] = {"by": run.stopped_by}
        return out

    def describe(self, run: Run) -> dict[str, Any]:
        """One run as ``list`` and the monitor show it::

        {"handle", "name", "state": running|idle|stopped, "stopping"?: {"by"} (asked to stop,
         its current turn finishing), "runState", "parent", "caller",
         "task" (summary), "scope": {"granted", "heldByChildren"} | null, "lastAnswer" (first
         line, 200 chars) | null, "error"?, "journalError"? (a restart found its journal
         damaged: what and where), "children": [handles], "pendingEvents": n}
        """
        effective = self.scopes.effective(run)
        item: dict[str, Any] = {
            "handle": run.handle,
            "name": run.name,
            "state": run.pod_state,
            "runState": run.display_state,
            "parent": run.parent,
            "caller": run.caller,
            "task": summarize(run.task),
            "scope": effective.to_json() if effective is not None else None,
            "lastAnswer": one_line(last_output(run)),
            "children": list(run.children),
            "pendingEvents": self.notifications.pending_count(run.handle),
        }
        if run.stopping:
            item["stopping"] = {"by": run.stopped_by}
        if run.error is not None:
            item["error"] = run.error
        if run.durability.damaged is not None:
            item["journalError"] = run.durability.damaged
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
            held = only_visible(self.registry.all(), actor.tenant)
            runs = [r for r in held if r.parent is None and r.caller == caller]
        else:
            runs = self.children_of(actor)
        return {"runs": [self.describe(r) for r in runs]}

    def network(self, tenant: Tenant | None = None) -> list[dict[str, Any]]:
        """Every held run, :meth:`describe`\\ d, oldest first (the monitor's tree), with what a
        person watching the network also wants: ``serviceClass``, ``turns`` and ``toolCalls``
        (the run's own counters; ``luftpause top`` shows them)."""
        return [
            {
                **self.describe(r),
                "serviceClass": r.spec.service_class,
                "turns": r.costs.turns,
                "toolCalls": r.costs.tool_calls,
            }
            for r in only_visible(self.registry.all(), tenant)
        ]

    def conversation(
        self, handle: str, since: int | None = None, tenant: Tenant | None = None
    ) -> dict[str, Any]:
        """``{"run": describe, "messages": [...], "from", "cursor", "pendingEvents": [event],
        "conversationDropped"?: true}``: the conversation's messages from index ``since`` (all
        without it), ``from`` the index the first one returned has (``0`` when ``since`` is past
        the conversation: it was dropped, or the cursor came from elsewhere; start over), and
        ``cursor`` the count of messages (the next ``since``). A conversation only grows while it
        is held, so a cursor stays valid."""
        run = self.registry.get_for(handle, tenant)
        start = since if since is not None and 0 <= since <= len(run.messages) else 0
        out: dict[str, Any] = {
            "run": self.describe(run),
            "messages": run.messages[start:],
            "from": start,
            "cursor": len(run.messages),
            "pendingEvents": self.notifications.pending(run.handle),
        }
        if run.conversation_dropped:
            out["conversationDropped"] = True
        return out

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
