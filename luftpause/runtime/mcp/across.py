"""MCP calls that name no held run, on a shared PostgreSQL store: answered across the runtimes.

:mod:`~luftpause.runtime.mcp.routing` forwards a call naming a run to the runtime holding it.
Two kinds of call name no such run, yet are about runs other runtimes may hold; this module
answers them as one runtime holding every run would (docs/runtime-store.md):

* **Listings**: ``status`` without a handle (the caller's runs, paged), ``list()`` and
  ``list(caller=...)`` (a caller's top-level runs). The store says which runtimes hold runs of
  the caller (the ``caller`` column of the runs' ``start``/``run`` records, joined to their
  leases); each of them is asked for its listing (the same call, forwarded), this runtime answers
  for its own, and the answers are merged oldest first (by each run's start time, ``at``). ``total``
  and ``nextOffset`` count every runtime's runs; ``events`` are every runtime's pending
  notifications of the caller, each given once.
* **Pod names**: ``send``, ``read``, ``stop`` and ``list(handle=...)`` with a name instead of a
  handle. The name is looked for among the caller's descendants in the store's ``start`` and
  ``run`` records (name, parent, caller, tenant), level by level as
  :meth:`~luftpause.runtime.pods.operations.PodOperations.resolve` does, a live run over a stopped
  one (asked of the runtime holding it), then the newest; the call is then made with the run's
  handle, so it is forwarded to its runtime as any call naming a run. A top-level ``spawn`` or
  ``run`` with a ``name`` is refused while a running or idle top-level run of the caller has it on
  another runtime (this runtime's own are checked by the spawner); not atomically: two such
  spawns at the same moment on two runtimes may both be accepted.

Why listings ask each runtime rather than rebuild the runs from their records: a run's status is
its runtime's (a pending approval, ``stopping``, the counters of a turn in flight are not all in
the records until later), and the caller's pending notifications live with the runtime that
holds the run and are taken once; asking reuses the one implementation and its tenant rules (the
caller's key travels: another tenant's runs never appear). The store only says whom to ask.

A runtime holding runs of the caller that does not answer (dead, its lease not yet taken over)
is waited for as :class:`~luftpause.runtime.mcp.routing.Router` waits: its runs are taken over
within seconds, and the listing is gathered again, from whoever holds them then.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import httpx2
from mcp.server.mcpserver import Context
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CallToolResult, InputRequiredResult, TextContent

from luftpause.runtime.errors import StoreUnusable
from luftpause.runtime.mcp.callers import actor_of, caller_of
from luftpause.runtime.mcp.routing import FORWARDED_HEADER, SETTLE_TRIES, Router
from luftpause.runtime.mcp.run_tools import DEFAULT_STATUS_LIST, MAX_STATUS_LIST
from luftpause.runtime.runs.custody import RENEW_SECONDS, Whereabouts

if TYPE_CHECKING:
    from luftpause.runtime.runs.postgres import Connection

log = logging.getLogger("luftpause.runtime.mcp.across")

T = TypeVar("T")

Call = Callable[[str, dict[str, Any]], Awaitable[CallToolResult | InputRequiredResult]]
"""A tool call on this runtime: ``(name, arguments) -> result``."""

NAMED_TOOLS = frozenset({"send", "read", "stop", "list"})
"""Tools whose ``handle`` may be a pod name."""

SPAWNING = frozenset({"spawn", "run"})
"""Tools that may name the run they start (``name``)."""

_HOLDERS = (
    "SELECT DISTINCT ON (rec.handle) rec.handle, l.owner, l.expires_at > now(), r.url, "
    "(rec.body::jsonb->>'at')::float8 FROM luftpause_records rec "
    "JOIN luftpause_leases l ON l.handle = rec.handle "
    "LEFT JOIN luftpause_runtimes r ON r.owner = l.owner "
    "WHERE rec.stream = 'runs' AND rec.kind IN ('start', 'run') AND rec.caller = %s"
)
"""Every run of a caller in the store: its handle, holder, whether the lease is live, the
holder's URL and the run's start time (Unix seconds)."""

_OTHERS = "SELECT EXISTS (SELECT 1 FROM luftpause_leases WHERE owner <> %s)"
"""Whether a runtime other than the one named holds a run."""

_DIRECTORY = (
    "SELECT DISTINCT ON (handle) handle, b->>'name', b->>'parent', b->>'caller', b->>'tenant', "
    "(b->>'at')::float8 FROM (SELECT handle, body::jsonb AS b FROM luftpause_records "
    "WHERE stream = 'runs' AND kind IN ('start', 'run')) s"
)
"""Every run in the store, as a pod name's lookup needs it: handle, name, parent, caller,
tenant, start time."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One run as the store's ``start``/``run`` record gives it, for a name's lookup."""

    handle: str
    name: str | None
    parent: str | None
    caller: str | None
    tenant: str | None
    at: float


@dataclass(frozen=True, slots=True)
class Holders:
    """The runtimes holding a caller's runs: ``others`` (the other runtimes, by owner), ``at``
    (each run's start time, by handle) and ``settling`` (runs this runtime has just taken over
    and not yet replayed)."""

    others: dict[str, Whereabouts]
    at: dict[str, float]
    settling: bool


class AcrossRuntimes:
    """Answers the calls of the module docstring on the runtime of ``router`` (its registry,
    store and custody), forwarding with :meth:`Router.forward`."""

    def __init__(self, router: Router) -> None:
        self.router = router
        self.registry = router.registry
        self.database = router.database
        self.owner = router.custody.owner

    async def answer(
        self, name: str, arguments: dict[str, Any], ctx: Context, local: Call, routed: Call
    ) -> dict[str, Any] | CallToolResult | InputRequiredResult | None:
        """The answer to a call of the module docstring: a merged listing (the tool's result,
        to render as the tool renders it), or the answer of the call made with the handle a name
        stands for; ``None`` for any other call (answered as before). ``local`` makes a call on
        this runtime alone; ``routed`` makes it as a client's call is made (forwarded when it
        names a run held elsewhere). Raises ``ToolError``."""
        headers = ctx.headers
        if headers is not None and headers.get(FORWARDED_HEADER):
            return None  # asked by another runtime: this runtime's own runs only
        target = arguments.get("handle")
        if name == "status" and target is None:
            return await self._status(arguments, ctx, local)
        if name == "list" and target is None:
            return await self._list(arguments, ctx, local)
        if name in NAMED_TOOLS and isinstance(target, str) and self._maybe_name(target):
            if await self._others():
                handle = await self._resolve(target, ctx)
                if handle is not None:
                    return await routed(name, {**arguments, "handle": handle})
        pod_name = arguments.get("name")
        if name in SPAWNING and isinstance(pod_name, str) and arguments.get("parent") is None:
            if await self._others():
                await self._check_name_free(pod_name, ctx)
        return None

    async def _others(self) -> bool:
        """Whether another runtime holds any run: if none does, a name is this runtime's to find."""

        def look(conn: Connection) -> bool:
            row = conn.execute(_OTHERS, (self.owner,)).fetchone()
            return bool(row is not None and row[0])

        return await self._query(look)

    def _maybe_name(self, target: str) -> bool:
        # Names never start "run-" (kept for handles); a run held here is answered here.
        return not target.startswith("run-") and self.registry.find(target) is None

    # --- listings --------------------------------------------------------------------------------

    async def _status(self, arguments: dict[str, Any], ctx: Context, local: Call) -> dict[str, Any]:
        caller = caller_of(ctx)
        events: list[Any] = []
        # The call as asked, here first: its arguments are checked as the tool checks them (a bad
        # limit is refused with the tool's own message) before anything is asked elsewhere.
        events.extend(_structured(await local("status", arguments)).get("events", ()))
        limit = int(arguments.get("limit", DEFAULT_STATUS_LIST))
        offset = int(arguments.get("offset", 0))
        wanted = offset + limit

        async def listing(call: Call) -> tuple[list[dict[str, Any]], int]:
            runs: list[dict[str, Any]] = []
            total = 0
            while True:
                asked = {"limit": min(wanted - len(runs), MAX_STATUS_LIST), "offset": len(runs)}
                page = _structured(await call("status", asked))
                runs += page["runs"]
                total = int(page["total"])
                events.extend(page.get("events", ()))
                if "nextOffset" not in page or len(runs) >= wanted:
                    return runs, total

        gathered, _ = await self._gather(caller, ctx, listing)
        mine, total = await listing(local)
        runs = mine + [run for runs, _ in gathered.values() for run in runs]
        total += sum(count for _, count in gathered.values())
        runs.sort(key=lambda run: (_when(run.get("startedAt")), run["handle"]))
        answer: dict[str, Any] = {"runs": runs[offset:wanted], "total": total, "caller": caller}
        if wanted < total:
            answer["nextOffset"] = wanted
        if events:
            answer["events"] = events
        return answer

    async def _list(self, arguments: dict[str, Any], ctx: Context, local: Call) -> dict[str, Any]:
        named = arguments.get("caller")
        caller = named if isinstance(named, str) else caller_of(ctx)

        async def listing(call: Call) -> list[dict[str, Any]]:
            return list(_structured(await call("list", dict(arguments)))["runs"])

        mine = await listing(local)  # first: a bad argument is refused before anything is asked elsewhere
        gathered, holders = await self._gather(caller, ctx, listing)
        runs = mine + [run for runs in gathered.values() for run in runs]
        runs.sort(key=lambda run: (_when(holders.at.get(run["handle"])), run["handle"]))
        return {"runs": runs}

    async def _holders(self, caller: str) -> Holders:
        def look(conn: Connection) -> list[tuple[Any, ...]]:
            return conn.execute(_HOLDERS, (caller,)).fetchall()

        rows = await self._query(look)
        others: dict[str, Whereabouts] = {}
        settling = False
        for handle, owner, live, url, _ in rows:
            if owner != self.owner:
                others[str(owner)] = Whereabouts(str(owner), bool(live), url)
            elif self.registry.find(handle) is None and not self.registry.retention.expired(handle):
                settling = True  # taken over here a moment ago, its records not replayed yet
        at = {str(handle): float(at) for handle, _, _, _, at in rows if at is not None}
        return Holders(others, at, settling)

    async def _gather(
        self, caller: str, ctx: Context, listing: Callable[[Call], Awaitable[T]]
    ) -> tuple[dict[str, T], Holders]:
        """``listing`` of every other runtime holding runs of ``caller`` (by owner), and the
        holders it was gathered from. A runtime that does not answer is waited for, then the
        whole listing is gathered again (its runs may have moved to one already asked)."""
        deadline = time.monotonic() + self.router.wait_seconds
        settling = SETTLE_TRIES
        while True:
            holders = await self._holders(caller)
            answers: dict[str, T] = {}
            silent: list[str] = []
            for owner, place in holders.others.items():
                if place.live and place.url:
                    try:
                        answers[owner] = await listing(self._forwarding(place, ctx))
                        continue
                    except (httpx2.HTTPError, OSError, ExceptionGroup) as exc:
                        log.warning("runtime %s at %s does not answer a listing (%s)", owner, place.url, exc)
                silent.append(owner)
            settling -= 1 if holders.settling else 0
            if not silent and (not holders.settling or settling < 0):
                return answers, holders
            if time.monotonic() > deadline:
                raise ToolError(
                    f"runtime {', '.join(silent)}, holding some of your runs, does not answer, and no "
                    "runtime has taken them over yet; try again"
                )
            await asyncio.sleep(RENEW_SECONDS if silent else RENEW_SECONDS / 4)

    def _forwarding(self, place: Whereabouts, ctx: Context) -> Call:
        async def call(name: str, arguments: dict[str, Any]) -> CallToolResult:
            return await self.router.forward(place, name, arguments, ctx)

        return call

    # --- pod names -------------------------------------------------------------------------------

    async def _directory(self, ctx: Context) -> tuple[list[Entry], list[Entry]]:
        """Every run of the store the caller of ``ctx`` may see, oldest first, and of them the
        caller's own top-level runs (the first level of a name's lookup)."""

        def look(conn: Connection) -> list[tuple[Any, ...]]:
            return conn.execute(_DIRECTORY).fetchall()

        rows = await self._query(look)
        entries = [Entry(str(h), n, p, c, t, float(a) if a is not None else 0.0) for h, n, p, c, t, a in rows]
        entries.sort(key=lambda entry: (entry.at, entry.handle))
        actor = actor_of(ctx)
        tenant = actor.tenant
        visible = [e for e in entries if tenant is None or tenant.admin or e.tenant == tenant.name]
        return visible, [e for e in visible if e.parent is None and e.caller == actor.caller]

    async def _check_name_free(self, name: str, ctx: Context) -> None:
        """Refuse a top-level spawn named ``name`` when a running or idle top-level run of the
        caller has that name on any runtime (as :meth:`TreeLimits.check_spawn` does on one)."""
        _, top = await self._directory(ctx)
        for entry in top:
            if entry.name == name and entry.handle not in self._held_here():
                state = await self._pod_state(entry.handle, ctx)
                if state is not None and state != "stopped":
                    raise ToolError(f"name {name!r} is taken among the spawner's running or idle children")

    def _held_here(self) -> set[str]:
        return {run.handle for run in self.registry.all()}

    async def _query(self, look: Callable[[Connection], T]) -> T:
        """``look`` on the store; a store that cannot be reached is refused as a ``ToolError``."""
        try:
            return await asyncio.to_thread(self.database.run, look)
        except StoreUnusable as exc:
            raise ToolError(f"{exc}; try again") from None

    async def _resolve(self, name: str, ctx: Context) -> str | None:
        """The handle of the run ``name`` names for the MCP caller of ``ctx`` across the
        runtimes (module docstring), or ``None`` when no run of the store has that name there."""
        visible, level = await self._directory(ctx)
        seen: set[str] = set()
        while level:
            named = [e for e in level if e.name == name]
            if named:
                return await self._nearest(named, ctx)
            seen.update(e.handle for e in level)
            parents = {e.handle for e in level}
            level = [e for e in visible if e.parent in parents and e.handle not in seen]
        return None

    async def _nearest(self, named: list[Entry], ctx: Context) -> str | None:
        """Of the runs ``named`` (oldest first), the newest that is not stopped, else the newest
        (as :meth:`PodOperations.resolve`); a run no runtime answers for any more is passed over."""
        found: list[tuple[str, str]] = []
        for entry in reversed(named):
            state = await self._pod_state(entry.handle, ctx)
            if state is None:
                continue
            if state != "stopped":
                return entry.handle
            found.append((entry.handle, state))
        return found[0][0] if found else None

    async def _pod_state(self, handle: str, ctx: Context) -> str | None:
        run = self.registry.find(handle)
        if run is not None:
            return run.pod_state
        place = await self.router.where(handle)
        if place is None or place.owner == self.owner or not place.live or not place.url:
            return None
        try:
            result = await self.router.forward(place, "status", {"handle": handle}, ctx)
        except (httpx2.HTTPError, OSError, ExceptionGroup):
            return None
        if result.is_error or not isinstance(result.structured_content, dict):
            return None
        state = result.structured_content.get("run", {}).get("podState")
        return str(state) if state is not None else None


def _when(at: Any) -> float:
    return float(at) if isinstance(at, int | float) else math.inf


def _structured(result: CallToolResult | InputRequiredResult) -> dict[str, Any]:
    """The structured answer of a listing call; a refusal is raised as the ``ToolError`` it was."""
    if isinstance(result, InputRequiredResult):
        raise ToolError("a listing asked for input")
    if result.is_error or not isinstance(result.structured_content, dict):
        text = "\n".join(block.text for block in result.content if isinstance(block, TextContent))
        raise ToolError(text or "a runtime answered a listing without its runs")
    return result.structured_content
