"""Approval of tool calls by a person: the gate before each call, its answers, and asking by
elicitation inside ``await`` / ``run``.

Which calls wait (DESIGN.md, "The runtime", Approval): a tool whose upstream server marks it
``destructiveHint: true`` and not ``readOnlyHint: true`` (MCP tool annotations; a tool without
annotations is not gated, since the hints are optional and untrusted), or a tool the run's
``spawn(approveTools=[...])`` names. Such a call makes the run ``AwaitingApproval`` with
``pendingApproval {tool, arguments}`` until someone answers:

* a client that declared form elicitation is asked inside an ``await`` or ``run`` on that run,
  with a form of one boolean field ``allow``: on a 2025-era connection by a server-to-client
  ``elicitation/create`` request (``ctx.elicit``); on 2026-07-28, which has no server-to-client
  requests, by answering the call with an ``InputRequiredResult`` (one ``elicitation/create``
  input request per pending approval, keyed ``approve:<approval id>``) that the client retries
  with its ``inputResponses``;
* any client can answer with ``approve(handle, allow)``.

``accept`` with ``allow: true`` lets the call go; ``accept`` with ``allow: false`` or ``decline``
refuses it, and the sub-agent gets the failed tool result :data:`DECLINED`; ``cancel`` (the form
dismissed) leaves it pending and it is not asked again in that same ``await``.

Decisions are journaled (``{"type": "approval", "handle", "key", "tool", "allow", "at"}`` in
``runs.jsonl``) before the call goes on. After a restart the run redoes the turn after its last
completed tool round; a call with the same :func:`call_key` (same place in the conversation, same
tool, same arguments) takes the journaled decision without asking again. A call that was never
answered is simply asked again.
"""

from __future__ import annotations

import asyncio
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
from luftpause.runtime.runs import Run, RunRegistry, WaitMode

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from luftpause.runtime.upstream import UpstreamPool

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


def call_key(run: Run, tool: str, arguments: dict[str, Any]) -> str:
    """Which call a decision is for, stable across a restart: the number of messages the run's
    conversation had when the call was made (it grows only when a tool round completes, and a
    resumed run restarts from the same count), the tool, and a digest of the arguments. Two
    identical calls in one round share their decision."""
    canonical = json.dumps(arguments, sort_keys=True, ensure_ascii=True, default=str)
    digest = hashlib.sha256(canonical.encode("ascii")).hexdigest()[:16]
    return f"{len(run.messages)}:{tool}:{digest}"


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

    @property
    def message(self) -> str:
        """The question shown to the person."""
        shown = json.dumps(self.arguments, ensure_ascii=False)
        if len(shown) > 2000:
            shown = shown[:2000] + "…"
        return f"Sub-agent {self.handle} wants to call the tool {self.tool!r} with {shown}. Allow it?"

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
    (:attr:`luftpause.runtime.loop.SubAgentLoop.approval_gate`)."""

    def __init__(self, registry: RunRegistry, upstream: UpstreamPool) -> None:
        self.registry = registry
        self.upstream = upstream
        self._ids = itertools.count(1)

    def needs_approval(self, run: Run, tool: str) -> bool:
        """Whether a call of ``tool`` in ``run`` waits for a person."""
        if tool in run.approve_tools:
            return True
        for server in self.upstream.servers:  # the first server listing a name serves it
            for listed in server.tools if server.connected else ():
                if listed.name == tool:
                    hints = listed.annotations
                    if hints is None:
                        return False
                    return hints.destructive_hint is True and hints.read_only_hint is not True
        return False

    async def gate(self, run: Run, tool: str, arguments: dict[str, Any]) -> str | None:
        """``None`` when the call may go (no approval needed, or allowed), :data:`DECLINED` when a
        person refused it. Waits as long as it takes; cancelling the run ends the wait."""
        if not self.needs_approval(run, tool):
            return None
        key = call_key(run, tool, arguments)
        allow = run.decisions.get(key)
        if allow is None:
            approval = PendingApproval(
                id=f"{run.handle}.{next(self._ids)}",
                handle=run.handle,
                key=key,
                tool=tool,
                arguments=arguments,
                decided=asyncio.get_running_loop().create_future(),
            )
            run.pending_approval = approval
            self.registry.notify_changed()
            try:
                allow = await approval.decided
            finally:
                if run.pending_approval is approval:
                    run.pending_approval = None
                self.registry.notify_changed()
        return None if allow else DECLINED

    def decide(self, approval: PendingApproval, allow: bool) -> bool:
        """Answer ``approval`` (journaled first); ``False`` when it was no longer pending (answered
        by someone else, or its run ended)."""
        try:
            run = self.registry.get(approval.handle)
        except RuntimeFault:
            return False
        if run.pending_approval is not approval or approval.decided.done():
            return False
        run.decisions[approval.key] = allow
        if self.registry.journal is not None:
            self.registry.journal.append(
                {
                    "type": "approval",
                    "handle": run.handle,
                    "key": approval.key,
                    "tool": approval.tool,
                    "allow": allow,
                    "at": time.time(),
                }
            )
        approval.decided.set_result(allow)
        return True

    def answer(self, handle: str, allow: bool) -> PendingApproval:
        """``approve(handle, allow)``: answer the run's pending approval. Raises
        :class:`UnknownRun` / :class:`ExpiredRun`, or :class:`NoPendingApproval`."""
        run = self.registry.get(handle)
        approval: PendingApproval | None = run.pending_approval
        if approval is None or run.done or not self.decide(approval, allow):
            raise NoPendingApproval(f"run {handle!r} is {run.display_state}; it waits for no approval")
        return approval


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
        by_id = {r.pending_approval.id: r.pending_approval for r in runs if r.pending_approval is not None}
        for key, response in (ctx.input_responses or {}).items():
            approval = by_id.get(key[len(INPUT_KEY_PREFIX) :]) if key.startswith(INPUT_KEY_PREFIX) else None
            allow = allow_of(response)
            if approval is not None and allow is not None:
                approvals.decide(approval, allow)

    def unasked() -> list[PendingApproval]:
        return [
            r.pending_approval
            for r in runs
            if r.pending_approval is not None and not r.done and r.pending_approval.id not in asked
        ]

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
