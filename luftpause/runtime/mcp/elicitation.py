"""Asking a person about the tool calls runs wait on, inside an MCP ``await`` or ``run``: by
elicitation on 2025-era connections, by an input-required result on 2026-07-28 ones (the rules
are :mod:`luftpause.runtime.agent.approvals`'; this module only asks and hands the answers on).

The form: one boolean field ``allow`` (form-mode elicitation takes a flat object of primitive
fields only; MCP spec 2025-11-25, "Elicitation"). On 2026-07-28 each question is an
``elicitation/create`` input request keyed ``approve:<approval id>`` (MCP 2026-07-28, multi
round-trip requests); the SDK seals the ``requestState`` the call answers with and verifies what
the client echoes on its retry.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

from mcp.server.elicitation import AcceptedElicitation, DeclinedElicitation, render_elicitation_schema
from mcp.server.mcpserver import Context
from mcp_types import ElicitRequest, ElicitRequestFormParams, ElicitResult, InputRequiredResult
from mcp_types.version import is_version_at_least
from pydantic import BaseModel, Field

from luftpause.runtime.agent.approvals import Approvals, PendingApproval
from luftpause.runtime.runs.registry import Run, WaitMode

INPUT_KEY_PREFIX = "approve:"
"""Prefix of the ``inputRequests`` keys of approval questions (2026-07-28)."""

INPUT_REQUIRED_VERSION = "2026-07-28"
"""First protocol revision that elicits through ``InputRequiredResult`` (no server-to-client
requests)."""


class ApprovalForm(BaseModel):
    """The elicitation form: one boolean field (form mode allows flat primitive fields only)."""

    allow: bool = Field(description="Allow this tool call?")


def input_request(approval: PendingApproval) -> ElicitRequest:
    """``approval``'s question as a form-mode ``elicitation/create`` request."""
    schema = render_elicitation_schema(ApprovalForm)
    return ElicitRequest(params=ElicitRequestFormParams(message=approval.message, requested_schema=schema))


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
        by_id = {a.id: a for r in runs for a in r.approvals.pending}
        for key, response in (ctx.input_responses or {}).items():
            approval = by_id.get(key[len(INPUT_KEY_PREFIX) :]) if key.startswith(INPUT_KEY_PREFIX) else None
            allow = allow_of(response)
            if approval is not None and allow is not None:
                approvals.decide(approval, allow)

    def unasked() -> list[PendingApproval]:
        return [a for r in runs if not r.done for a in r.approvals.open() if a.id not in asked]

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
                input_requests={f"{INPUT_KEY_PREFIX}{a.id}": input_request(a) for a in pending},
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
