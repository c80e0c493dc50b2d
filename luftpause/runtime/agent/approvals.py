"""Approval of tool calls by a person: the gate before each call, its answers, and asking by
elicitation inside ``await`` / ``run``.

Which calls wait (DESIGN.md, "The runtime", Approval): a tool whose upstream server marks it
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
  only when the run waits on more than one question.

``accept`` with ``allow: true`` lets the call go; ``accept`` with ``allow: false`` or ``decline``
refuses it, and the sub-agent gets the failed tool result :data:`DECLINED`; ``cancel`` (the form
dismissed) leaves it pending and it is not asked again in that same ``await``.

An approval covers exactly one execution of one call. Decisions are journaled (``{"type":
"approval", "handle", "key", "tool", "allow", "at"}`` in ``runs.jsonl``) before the call goes on,
and an allowed call journals ``{"type": "started", "handle", "key", "tool", "at"}`` before it
executes, which uses the approval up. After a restart the run redoes the turn after its last
completed tool round; a call with the same :func:`call_key` (same place in the conversation, same
position in the reply, same tool, same arguments) takes a journaled refusal, or an approval that
was never used, without asking again. A call that had started before the restart may have run:
it is asked again (the question says so), so the person decides whether it is repeated; it is
never repeated silently. A call that was never answered is simply asked again.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import hashlib
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from mcp.server.elicitation import AcceptedElicitation, DeclinedElicitation, render_elicitation_schema
from mcp.server.mcpserver import Context
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult
from mcp_types.version import is_version_at_least
from pydantic import BaseModel, Field

from luftpause.runtime.errors import RuntimeFault
from luftpause.runtime.runs.journal import JournalWriteError
from luftpause.runtime.runs.registry import Run, RunRegistry, WaitMode

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from luftpause.runtime.agent.upstream import UpstreamPool

DECLINED = "Error: the user declined this tool call"
"""The tool result a refused call gives the sub-agent (it counts as a failed tool call)."""

INPUT_KEY_PREFIX = "approve:"
"""Prefix of the ``inputRequests`` keys of approval questions (2026-07-28)."""

INPUT_REQUIRED_VERSION = "2026-07-28"
"""First protocol revision that elicits through ``InputRequiredResult`` (no server-to-client
requests)."""


class ApprovalForm(BaseModel):
    """The elicitation form: one boolean field (form mode allows flat primitive fields only)."""

    allow: bool = Field(description="Allow this tool call?")


class NoPendingApproval(RuntimeFault):
    """``approve`` on a run that waits for no approval; the message says which run."""

    status = 409


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

    def input_request(self) -> ElicitRequest:
        """This question as a form-mode ``elicitation/create`` request."""
        schema = render_elicitation_schema(ApprovalForm)
        return ElicitRequest(params=ElicitRequestFormParams(message=self.message, requested_schema=schema))


def allow_of(answer: Any) -> bool | None:
    """The decision in an elicitation answer (``ElicitResult`` or the SDK's typed result):
    ``True`` / ``False``, or ``None`` for a cancelled or unusable one (left pending)."""
    if isinstance(answer, AcceptedElicitation):
        return bool(answer.data.allow)
    if isinstance(answer, DeclinedElicitation):
        return False
    if isinstance(answer, ElicitResult):
        if answer.action == "decline":
            return False
        if answer.action == "accept" and isinstance(answer.content, dict):
            allow = answer.content.get("allow")
            return allow if isinstance(allow, bool) else None
    return None


class Approvals:
    """The runtime's approvals: :meth:`gate` is the loop's approval gate
    (:attr:`luftpause.runtime.agent.loop.SubAgentLoop.approval_gate`)."""

    def __init__(self, registry: RunRegistry, upstream: UpstreamPool) -> None:
        self.registry = registry
        self.upstream = upstream
        self._ids = itertools.count(1)

    def needs_approval(self, run: Run, tool: str) -> bool:
        """Whether a call of ``tool`` in ``run`` waits for a person."""
        if tool in run.approve_tools:
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
        allow = run.decisions.pop(key, None)
        if allow is None:
            approval = PendingApproval(
                id=f"{run.handle}.{next(self._ids)}",
                handle=run.handle,
                key=key,
                tool=tool,
                arguments=arguments,
                decided=asyncio.get_running_loop().create_future(),
                repeat=key in run.started_calls,
            )
            run.pending_approvals.append(approval)
            self.registry.notify_changed()
            try:
                allow = await approval.decided
                if approval.written is not None:
                    await asyncio.wrap_future(approval.written)
            except JournalWriteError as exc:
                return f"Error: the call was not made: its approval could not be recorded ({exc})"
            finally:
                if approval in run.pending_approvals:
                    run.pending_approvals.remove(approval)
                self.registry.notify_changed()
        if not allow:
            return DECLINED
        run.started_calls.discard(key)
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
        if approval not in run.pending_approvals or approval.decided.done():
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

    def answer(self, handle: str, allow: bool, call: str | None = None) -> PendingApproval:
        """``approve(handle, allow, call?)``: answer the run's pending approval ``call`` (an
        approval id), or its only one when ``call`` is not given. Raises :class:`UnknownRun` /
        :class:`ExpiredRun`, or :class:`NoPendingApproval` (no such question; or several pending
        and no ``call``: the message lists their ids)."""
        run = self.registry.get(handle)
        pending: list[PendingApproval] = run.open_approvals() if not run.done else []
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


def elicits_forms(ctx: Context) -> bool:
    """Whether the client declared form elicitation (a bare ``elicitation: {}`` counts as form)."""
    capabilities = ctx.client_capabilities
    elicitation = capabilities.elicitation if capabilities is not None else None
    return elicitation is not None and (elicitation.form is not None or elicitation.url is None)


def uses_input_required(ctx: Context) -> bool:
    """Whether the request's protocol elicits through ``InputRequiredResult`` (2026-07-28+)."""
    version = ctx.protocol_version
    return version is not None and is_version_at_least(version, INPUT_REQUIRED_VERSION)


async def wait_asking(
    approvals: Approvals,
    ctx: Context,
    runs: list[Run],
    mode: WaitMode,
    seconds: float,
    on_progress: Callable[[float, int], Awaitable[None]] | None = None,
    state: dict[str, Any] | None = None,
) -> bool | InputRequiredResult:
    """Wait like :meth:`RunRegistry.wait` (``True``: timed out) while asking the client about
    the approvals ``runs`` wait for, as the module docstring says. Returns an
    ``InputRequiredResult`` for the tool to answer with when a 2026-07-28 client must be asked;
    ends the wait early (``False``) when a run waits for an approval this client cannot be asked,
    so that it learns of it and can ``approve``. ``state`` goes into the ``requestState`` beside
    the ids asked (the SDK seals it; :func:`request_state` reads it back on the retry)."""
    can_ask = elicits_forms(ctx)
    modern = uses_input_required(ctx)
    asked: set[str] = set()
    if modern and can_ask:
        before = request_state(ctx).get("asked")
        if isinstance(before, list):
            asked.update(a for a in before if isinstance(a, str))
        by_id = {a.id: a for r in runs for a in r.pending_approvals}
        for key, response in (ctx.input_responses or {}).items():
            approval = by_id.get(key[len(INPUT_KEY_PREFIX) :]) if key.startswith(INPUT_KEY_PREFIX) else None
            allow = allow_of(response)
            if approval is not None and allow is not None:
                approvals.decide(approval, allow)

    def unasked() -> list[PendingApproval]:
        return [a for r in runs if not r.done for a in r.open_approvals() if a.id not in asked]

    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        timed_out = await approvals.registry.wait(
            runs, mode, max(0.0, deadline - loop.time()), on_progress, interrupt=lambda: bool(unasked())
        )
        pending = unasked()
        if not pending:
            return timed_out
        if not can_ask:
            return False
        asked.update(a.id for a in pending)
        if modern:
            return InputRequiredResult(
                input_requests={f"{INPUT_KEY_PREFIX}{a.id}": a.input_request() for a in pending},
                request_state=json.dumps({**(state or {}), "asked": sorted(asked)}),
            )
        for approval in pending:
            allow = allow_of(await ctx.elicit(approval.message, ApprovalForm))
            if allow is not None:
                approvals.decide(approval, allow)


def request_state(ctx: Context) -> dict[str, Any]:
    """The ``requestState`` a 2026-07-28 client echoed on its retry, as the object
    :func:`wait_asking` wrote (``{"asked": [approval id], ...}``); ``{}`` on a first round. The SDK
    seals the state it sends and verifies what comes back, so it is ours."""
    raw = ctx.request_state
    if not raw:
        return {}
    try:
        state = json.loads(raw)
    except ValueError:
        return {}
    return state if isinstance(state, dict) else {}
