"""MCP calls about a run another runtime holds, on a shared PostgreSQL store: forwarded to it.

With several runtimes on one database (docs/runtime-store.md), each run is driven by the one
runtime holding its lease (:mod:`luftpause.runtime.runs.custody`). A tool call naming runs this
runtime does not hold (``status``, ``await``, ``cancel``, ``approve``, ``tools``, ``send``,
``read``, ``stop``, ``list``; ``spawn`` and ``run`` by their ``parent``: :data:`ROUTED`) is
sent, as it came, to the runtime that holds them, at the
URL that runtime wrote in ``luftpause_runtimes`` (``[runtime] advertise_url``), and its answer
is given back unchanged. The owner answers it exactly as a call made to it: tenant rules,
durability before a changing answer, elicitation-less approvals, all its own.

* The caller travels with it: the request's ``Authorization`` (its caller key, so the owner
  finds the same tenant) and its caller, as ``x-luftpause-caller`` (already narrowed under the
  key's caller; narrowing again changes nothing).
* Never in a loop: a forwarded call carries :data:`FORWARDED_HEADER`, and a call that carries it
  is answered where it lands, never forwarded again (a run not held there is unknown there).
* A run whose owner died: its lease expires and a live runtime (maybe this one) takes it over;
  meanwhile the call waits (polling the lease every :data:`RENEW_SECONDS`), for up to
  :data:`WAIT_SECONDS`, then goes to whoever holds it. An owner that cannot be connected to is
  treated the same way (it is dead, its lease not yet expired).
* An owner that dies *during* a forwarded call: a call that changes nothing (``status``,
  ``await``, ``tools``, ``read``'s answer is idempotent enough: a cursor) is made again at the
  runtime that takes the run over; one that changes the run (``cancel``, ``approve``, ``send``,
  ``stop``) is answered with an error saying its outcome is unknown (``status`` tells): it is
  never repeated silently.
* Calls that name no run held anywhere (listings, pod names) are answered across the runtimes by
  :mod:`luftpause.runtime.mcp.across`.
* The handles of one call held by two different runtimes are refused with the reason (call
  once per runtime's runs).

The Tasks extension's ``tasks/get``, ``tasks/update`` and ``tasks/cancel`` go the same way
(:meth:`Router.reach`, called by :mod:`luftpause.runtime.mcp.tasks_extension`): a task is served
by the runtime holding its run, found from the task's record in the store; ``tasks/update`` and
``tasks/cancel`` are changing calls, answered ``-32603`` (outcome unknown) when that runtime dies
under them. A runtime that takes a dead runtime's runs over adopts their tasks
(:mod:`luftpause.runtime.mcp.tasks`).

Why forwarding rather than changes written to the store and waits woken by ``LISTEN/NOTIFY``:
every one of these calls already has one implementation, in the runtime driving the run, that
keeps the run's invariants (an approval answered once, a message queued in order, a cancel that
reaches the running turn); forwarding reuses it whole, where writing changes from outside would
need each of them made again for a run held elsewhere, plus a notification protocol.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult

from luftpause.runtime.mcp.callers import CALLER_HEADER, caller_of
from luftpause.runtime.runs.custody import LEASE_SECONDS, RENEW_SECONDS, Custody, Whereabouts

if TYPE_CHECKING:
    from luftpause.runtime.runs.postgres import PostgresDatabase
    from luftpause.runtime.runs.registry import RunRegistry

log = logging.getLogger("luftpause.runtime.mcp.routing")

T = TypeVar("T")

FORWARDED_HEADER = "x-luftpause-forwarded-by"
"""Set on a forwarded call to the forwarding runtime's name: such a call is never forwarded."""

ROUTED: dict[str, str] = {
    "status": "handle",
    "await": "handles",
    "cancel": "handle",
    "approve": "handle",
    "tools": "handle",
    "send": "handle",
    "read": "handle",
    "stop": "handle",
    "list": "handle",
    "spawn": "parent",
    "run": "parent",
}
"""The tools that name runs, and the argument that names them (``spawn`` and ``run``: the
parent, whose runtime holds the whole tree)."""

CHANGING = frozenset({"cancel", "approve", "send", "stop", "spawn", "run"})
"""Routed tools that change a run: never made twice when the owner died during the call."""

WAIT_SECONDS = LEASE_SECONDS + 4 * RENEW_SECONDS + 10.0
"""How long a call about a run whose owner died waits for the run to be taken over (seconds)."""


SETTLE_TRIES = 8
"""How many times (every ``RENEW_SECONDS / 4``) a call about a run whose lease this runtime has
just taken looks again for the run, while its records are replayed, before answering here."""


class Router:
    """Forwards the :data:`ROUTED` calls about runs ``registry`` does not hold to their owner
    (module docstring). ``database`` is the shared store (its custody names this runtime)."""

    def __init__(
        self, registry: RunRegistry, database: PostgresDatabase, wait_seconds: float = WAIT_SECONDS
    ) -> None:
        custody = database.custody
        assert custody is not None, "a router needs a runtime's custody"
        self.registry = registry
        self.database = database
        self.custody = custody
        self.wait_seconds = wait_seconds

    def _named(self, name: str, arguments: dict[str, Any]) -> list[str]:
        key = ROUTED.get(name)
        value = arguments.get(key) if key is not None else None
        if isinstance(value, str):
            return [value]
        if isinstance(value, list):
            return [h for h in value if isinstance(h, str)]
        return []

    async def _where(self, handles: list[str]) -> dict[str, Whereabouts | None]:
        def look(conn: Any) -> dict[str, Whereabouts | None]:
            return {handle: Custody.whereabouts(conn, handle) for handle in handles}

        return await asyncio.to_thread(self.database.run, look)

    async def route(self, name: str, arguments: dict[str, Any], ctx: Context) -> CallToolResult | None:
        """The owner's answer to this call, or ``None`` when it is this runtime's to answer (its
        runs, no run named, unknown handles, a call already forwarded). Raises ``ToolError`` when
        the owner cannot be reached within :attr:`wait_seconds`, when the handles are held by
        several runtimes, or when the owner died during a changing call."""
        headers = ctx.headers
        if headers is not None and headers.get(FORWARDED_HEADER):
            return None
        named = self._named(name, arguments)
        foreign = [h for h in named if self.registry.find(h) is None]
        if not foreign:
            return None
        return await self.reach(
            foreign,
            name,
            lambda place: self._forward(place, name, arguments, ctx),
            changing=name in CHANGING,
            held_here=lambda: all(self.registry.find(h) is not None for h in foreign),
            refuse=ToolError,
            all_named=len(foreign) == len(named),
        )

    async def reach(
        self,
        foreign: list[str],
        name: str,
        forward: Callable[[Whereabouts], Awaitable[T]],
        *,
        changing: bool,
        held_here: Callable[[], bool],
        refuse: Callable[[str], Exception],
        all_named: bool = True,
    ) -> T | None:
        """``forward(place)`` at the runtime holding the runs ``foreign`` (none held here), the
        call ``name`` about them, as :meth:`route` does for a tool call (module docstring); also
        the Tasks extension's methods (:mod:`luftpause.runtime.mcp.tasks_extension`). ``None``:
        this runtime's to answer (no such run anywhere, or held here: once ``held_here()`` says
        its records are replayed, or after :data:`SETTLE_TRIES`). ``changing``: a call never made
        twice when its runtime dies during it; ``all_named``: ``foreign`` is every run the call
        names. ``forward`` raises ``httpx2.HTTPError``, ``OSError`` or an ``ExceptionGroup`` of
        them when the other runtime does not answer. Raises ``refuse(reason)`` when the owner
        cannot be reached within :attr:`wait_seconds`, when the runs are held by several
        runtimes, or when the owner died during a changing call."""
        deadline = time.monotonic() + self.wait_seconds
        settling = SETTLE_TRIES
        while True:
            places = await self._where(foreign)
            owners = {place.owner for place in places.values() if place is not None}
            if len(owners) > 1 or (owners and not all_named):
                holders = ", ".join(sorted(owners | ({self.custody.owner} if len(owners) == 1 else set())))
                raise refuse(
                    f"the runs named are held by different runtimes ({holders}); "
                    f"call {name} once for each runtime's runs"
                )
            owner = next(iter(owners), None)
            place = places[foreign[0]]
            if owner is None:
                return None  # no such run anywhere: answered here, as unknown
            if owner == self.custody.owner:
                settling -= 1
                if settling < 0 or held_here():
                    return None  # held here (or dropped by retention here: answered as expired)
                # Taken over by this runtime, its records not replayed yet: a moment.
            elif place is not None and place.live and place.url:
                try:
                    return await forward(place)
                except (httpx2.HTTPError, OSError, ExceptionGroup) as exc:
                    if _never_sent(exc):  # dead, its lease not expired yet
                        log.warning("runtime %s at %s does not answer (%s)", owner, place.url, _leaves(exc))
                    elif changing:
                        raise refuse(
                            f"runtime {owner}, holding run {foreign[0]}, stopped answering during "
                            f"{name}: whether it took effect is unknown; see status({foreign[0]!r})"
                        ) from exc
                    else:
                        log.warning("runtime %s stopped answering during %s (%s)", owner, name, _leaves(exc))
                        deadline = time.monotonic() + self.wait_seconds  # its takeover starts now
            if time.monotonic() > deadline:
                raise refuse(
                    f"run {foreign[0]} is held by runtime {owner}, which does not answer, and no "
                    f"runtime has taken it over yet; try again"
                )
            await asyncio.sleep(RENEW_SECONDS / 4 if owner == self.custody.owner else RENEW_SECONDS)

    async def where(self, handle: str) -> Whereabouts | None:
        """Who holds ``handle`` now (``None``: no lease names it)."""
        return (await self._where([handle]))[handle]

    async def forward(
        self, place: Whereabouts, name: str, arguments: dict[str, Any], ctx: Context
    ) -> CallToolResult:
        """The answer of the runtime at ``place`` to the call ``name(arguments)`` made for the
        caller of ``ctx`` (never forwarded again there). Raises ``httpx2.HTTPError``, ``OSError``
        or an ``ExceptionGroup`` of them when that runtime cannot be reached or stops answering."""
        return await self._forward(place, name, arguments, ctx)

    async def _forward(
        self, place: Whereabouts, name: str, arguments: dict[str, Any], ctx: Context
    ) -> CallToolResult:
        assert place.url is not None
        forwarded = {FORWARDED_HEADER: self.custody.owner, CALLER_HEADER: caller_of(ctx)}
        authorization = ctx.headers.get("authorization") if ctx.headers is not None else None
        if authorization:
            forwarded["authorization"] = authorization
        timeout = httpx2.Timeout(30.0, read=None)
        async with (
            httpx2.AsyncClient(headers=forwarded, timeout=timeout) as http,
            Client(streamable_http_client(f"{place.url}/mcp", http_client=http)) as client,
        ):
            log.info("forwarding %s about %s to runtime %s", name, self._named(name, arguments), place.owner)
            return await client.call_tool(name, arguments)


def _leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc``, exception groups (the SDK's task groups) flattened."""
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _never_sent(exc: BaseException) -> bool:
    """Whether ``exc`` says the call never reached the other runtime: its connection refused."""
    return all(isinstance(leaf, httpx2.ConnectError | ConnectionRefusedError) for leaf in _leaves(exc))
