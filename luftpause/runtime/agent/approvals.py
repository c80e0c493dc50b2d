"""Approval of tool calls by a person: the gate before each call, its answers, and asking by
elicitation inside ``await`` / ``run`` (the asking itself, an MCP matter, is
:mod:`luftpause.runtime.mcp.elicitation`).

Which calls wait (docs/architecture.md "Approvals"): a tool whose upstream server marks it
``destructiveHint: true`` and not ``readOnlyHint: true`` (MCP tool annotations; a tool without
annotations is not gated, since the hints are optional and untrusted), or a tool the run's
``spawn(approveTools=[...])`` names. Such a call makes the run ``AwaitingApproval`` with
``pendingApprovals [{id, tool, arguments}]`` (and, for clients written against one question at a
time, ``pendingApproval``: the first of them) until someone answers. Every call waits on its own
question: several gated calls of one reply (``parallelToolCalls``) are each asked about and
answered, in any order.

* a client that declared form elicitation is asked inside an ``await`` or ``run`` on that run,
  with a form of one boolean field ``allow``: on a 2025-era connection by a server-to-client
  ``elicitation/create`` request per question (``ctx.elicit``); on 2026-07-28, which has no
  server-to-client requests, by answering the call with an ``InputRequiredResult`` (one
  ``elicitation/create`` input request per pending approval, keyed ``approve:<approval id>``) that
  the client retries with its ``inputResponses``; a Tasks client sees them all as
  ``input_required``;
* any client can answer with ``approve(handle, allow, call?)``: ``call`` is the approval id, needed
  only when the run waits on more than one question. A run just resumed (after a restart, or
  taken over from a dead runtime) asks again the questions of the round it resumes; an
  ``approve`` that comes before it has asked waits for the question, up to
  :data:`ASK_AGAIN_SECONDS` (:meth:`Approvals.answer_when_asked`).

``accept`` with ``allow: true`` lets the call go; ``accept`` with ``allow: false`` or ``decline``
refuses it, and the sub-agent gets the failed tool result :data:`DECLINED`; ``cancel`` (the form
dismissed) leaves it pending and it is not asked again in that same ``await``.

An approval covers exactly one execution of one call. Decisions are journaled (``{"type":
"approval", "handle", "key", "tool", "allow", "at"}`` in ``runs.jsonl``) before the call goes on,
and an allowed call journals ``{"type": "started", "handle", "key", "tool", "at"}`` before it
executes, which uses the approval up. After a restart the run goes on where its journal ends:
it redoes the turn after its last completed tool round, or resumes the round whose reply was
journaled (:mod:`luftpause.runtime.agent.loop`), where a call whose completion was journaled is
neither made nor asked about again. A call with the same :func:`call_key` (same place in the
conversation, same position in the reply, same tool, same arguments) takes a journaled refusal,
or an approval that was never used, without asking again. A call that had started before the
restart but whose completion was not journaled may have run: it is asked again (the question says
so), so the person decides whether it is repeated; it is never repeated silently. A call that was
never answered is simply asked again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import hashlib
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from luftpause.runtime.errors import JournalWriteError, NoPendingApproval, RuntimeFault
from luftpause.runtime.runs.registry import Run, RunRegistry

if TYPE_CHECKING:
    from luftpause.runtime.agent.upstream import UpstreamPool

DECLINED = "Error: the user declined this tool call"
"""The tool result a refused call gives the sub-agent (it counts as a failed tool call)."""

ASK_AGAIN_SECONDS = 10.0
"""How long an answer waits for a resumed run to ask again a question its recorded round holds
(seconds): the run asks as soon as its loop reaches the call, in well under a second."""

_LOOK_AGAIN_SECONDS = 0.05


def call_key(run: Run, index: int, tool: str, arguments: dict[str, Any]) -> str:
    """Which call a decision is for, stable across a restart: the number of messages the run's
    conversation had when the call was made (it grows only when a tool round completes, and a
    resumed run restarts from the same count), the call's position ``index`` in its reply (so two
    identical calls of one reply are two questions), the tool, and a digest of the arguments."""
    canonical = json.dumps(arguments, sort_keys=True, ensure_ascii=True, default=str)
    digest = hashlib.sha256(canonical.encode("ascii")).hexdigest()[:16]
    return f"{len(run.messages)}:{index}:{tool}:{digest}"


@dataclass(eq=False)
class PendingApproval:
    """A tool call waiting for a person. ``id`` is unique within this process (a question asked
    again after a restart gets a new one, so a stale answer never lands on it)."""

    id: str
    handle: str
    key: str
    tool: str
    arguments: dict[str, Any]
    decided: asyncio.Future[bool] = field(repr=False)
    written: concurrent.futures.Future[None] | None = field(default=None, repr=False)
    """The journal write of the decision (:meth:`Approvals.decide`)."""
    repeat: bool = False
    """The same call was approved and had started before a restart: it may have run already."""

    @property
    def message(self) -> str:
        """The question shown to the person."""
        shown = json.dumps(self.arguments, ensure_ascii=False)
        if len(shown) > 2000:
            shown = shown[:2000] + "…"
        question = f"Sub-agent {self.handle} wants to call the tool {self.tool!r} with {shown}."
        if self.repeat:
            question += (
                " You approved this call before the runtime restarted and it had started, so it may"
                " have run already; allowing it runs it again."
            )
        return f"{question} Allow it?"

    def shown(self) -> dict[str, Any]:
        """``{"id", "tool", "arguments", "repeat"?}`` as ``pendingApprovals`` lists it."""
        out: dict[str, Any] = {"id": self.id, "tool": self.tool, "arguments": self.arguments}
        if self.repeat:
            out["repeat"] = True
        return out


class Approvals:
    """The runtime's approvals: :meth:`gate` is the loop's approval gate (given to
    :class:`~luftpause.runtime.agent.loop.SubAgentLoop` when it is built), :meth:`decide` and
    :meth:`answer` take a person's answers (the ``approve`` tool, elicitation, ``tasks/update``)."""

    def __init__(self, registry: RunRegistry, upstream: UpstreamPool) -> None:
        self.registry = registry
        self.upstream = upstream
        self._ids = itertools.count(1)

    def needs_approval(self, run: Run, tool: str) -> bool:
        """Whether a call of ``tool`` in ``run`` waits for a person."""
        if tool in run.spec.approval_tools:
            return True
        listed = self.upstream.tool_named(tool)
        hints = listed.annotations if listed is not None else None
        if hints is None:
            return False
        return hints.destructive_hint is True and hints.read_only_hint is not True

    async def gate(self, run: Run, tool: str, arguments: dict[str, Any], index: int = 0) -> str | None:
        """``None`` when the call (the ``index``-th of its reply) may go: no approval needed, or
        allowed and its ``started`` record journaled; :data:`DECLINED` when a person refused it; an
        error text when the start of an allowed call could not be journaled (it is not made, so a
        restart can never repeat it unasked). Waits as long as it takes; cancelling the run ends
        the wait."""
        if not self.needs_approval(run, tool):
            return None
        key = call_key(run, index, tool, arguments)
        allow = run.approvals.decisions.pop(key, None)
        if allow is None:
            approval = PendingApproval(
                id=f"{run.handle}.{next(self._ids)}",
                handle=run.handle,
                key=key,
                tool=tool,
                arguments=arguments,
                decided=asyncio.get_running_loop().create_future(),
                repeat=key in run.approvals.started,
            )
            run.approvals.pending.append(approval)
            self.registry.notify_changed()
            try:
                allow = await approval.decided
                if approval.written is not None:
                    await asyncio.wrap_future(approval.written)
            except JournalWriteError as exc:
                return f"Error: the call was not made: its approval could not be recorded ({exc})"
            finally:
                if approval in run.approvals.pending:
                    run.approvals.pending.remove(approval)
                self.registry.notify_changed()
        if not allow:
            return DECLINED
        run.approvals.started.discard(key)
        started = {"type": "started", "handle": run.handle, "key": key, "tool": tool, "at": time.time()}
        written = self.registry.append(run, started)
        if written is not None:
            try:
                await asyncio.wrap_future(written)
            except JournalWriteError as exc:
                return f"Error: the call was not made: its start could not be recorded ({exc})"
        return None

    def decide(self, approval: PendingApproval, allow: bool) -> bool:
        """Answer ``approval`` (its journal record queued first; the gate waits until it is
        durable); ``False`` when it was no longer pending (answered by someone else, or its run
        ended)."""
        try:
            run = self.registry.get(approval.handle)
        except RuntimeFault:
            return False
        if approval not in run.approvals.pending or approval.decided.done():
            return False
        record = {
            "type": "approval",
            "handle": run.handle,
            "key": approval.key,
            "tool": approval.tool,
            "allow": allow,
            "at": time.time(),
        }
        approval.written = self.registry.append(run, record)
        approval.decided.set_result(allow)
        return True

    def about_to_ask(self, run: Run) -> bool:
        """Whether ``run`` waits on no question yet but is resuming a recorded round with a call
        not yet made that needs a person (a run just resumed after a restart or a takeover, whose
        loop has not reached the call): it will ask."""
        pending = run.pending_round
        if run.done or pending is None or run.approvals.open():
            return False
        for index, made in enumerate(pending.calls):
            if index in pending.done or not isinstance(made, dict):
                continue
            function = made.get("function")
            name = function.get("name") if isinstance(function, dict) else None
            if isinstance(name, str) and self.needs_approval(run, name):
                return True
        return False

    async def answer_when_asked(self, handle: str, allow: bool, call: str | None = None) -> PendingApproval:
        """:meth:`answer`, once a run that is :meth:`about_to_ask` has asked (up to
        :data:`ASK_AGAIN_SECONDS`): a person who answers right after a restart or a takeover
        answers the question the run asks again, rather than being told it waits for none. Raises
        what :meth:`answer` raises."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + ASK_AGAIN_SECONDS
        while self.about_to_ask(self.registry.get(handle)) and loop.time() < deadline:
            changed = self.registry.changed_event
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), _LOOK_AGAIN_SECONDS)
        return self.answer(handle, allow, call)

    def answer(self, handle: str, allow: bool, call: str | None = None) -> PendingApproval:
        """``approve(handle, allow, call?)``: answer the run's pending approval ``call`` (an
        approval id), or its only one when ``call`` is not given. Raises :class:`UnknownRun` /
        :class:`ExpiredRun`, or :class:`NoPendingApproval` (no such question; or several pending
        and no ``call``: the message lists their ids)."""
        run = self.registry.get(handle)
        pending: list[PendingApproval] = run.approvals.open() if not run.done else []
        if call is not None:
            chosen = [a for a in pending if a.id == call]
            if not chosen:
                ids = ", ".join(a.id for a in pending) or "none"
                raise NoPendingApproval(f"run {handle!r} waits for no approval {call!r}; pending: {ids}")
        elif len(pending) > 1:
            listed = "; ".join(f"{a.id} ({a.tool})" for a in pending)
            raise NoPendingApproval(
                f"run {handle!r} waits for {len(pending)} approvals; name one with call: {listed}"
            )
        else:
            chosen = pending
        if not chosen or not self.decide(chosen[0], allow):
            raise NoPendingApproval(f"run {handle!r} is {run.display_state}; it waits for no approval")
        return chosen[0]
