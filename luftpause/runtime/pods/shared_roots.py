"""The workspace's root write grants, exclusive across the runtimes sharing one PostgreSQL store.

Each runtime keeps its own scope ledger (:mod:`luftpause.runtime.pods.scope`); a pod lives on one
runtime, so delegation below a root is checked there. What runtimes on one database must agree on
is the roots: the runs carved from the ``workspace`` principal. Their grants that write are rows
of ``luftpause_root_grants`` (``migrations/0004_root_grants.sql``)::

    handle text (the run), owner text (the runtime that wrote the row),
    scope text (the grant's rules as JSON, :meth:`Scope.to_json`), granted_at timestamptz

A root grant is checked and its row written in one transaction under the advisory lock
:data:`ROOTS_LOCK` (``pg_advisory_xact_lock``), before the spawn (or the ``send`` that re-grants
it) is answered: the rows of runs this runtime does not hold are taken as held by live roots, so a
write they hold is refused with :class:`ScopeExceeded` naming the run and ``another runtime``.
A row goes when its run's scope ends (:meth:`SharedRoots.publish`); the rows of a run move with it
at a takeover (keyed by handle: the taking runtime holds the run, so its own rows never refuse
it). A row whose handle never got a lease (a spawn that failed between the grant and its start
record) is dropped after :data:`ABANDONED_SECONDS`.

Calls here are synchronous and short (one transaction); they are retried on a connection failure
as every store call is (:meth:`PostgresDatabase.run`) and raise :class:`StoreUnusable` past that.
The file store needs none of this: one runtime per state directory.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from luftpause.runtime.errors import ScopeExceeded, StoreUnusable
from luftpause.runtime.pods.scope import EffectiveScope, Holding, Scope, is_within

if TYPE_CHECKING:
    from luftpause.runtime.runs.postgres import Connection, PostgresDatabase
    from luftpause.runtime.runs.store import RecordStore

log = logging.getLogger("luftpause.runtime.pods.shared_roots")

ROOTS_LOCK = 0x6C75_7277  # "luRW": the advisory lock root grants are checked and written under
"""The advisory lock key serializing root grants across the runtimes on one database."""

ABANDONED_SECONDS = 300
"""After this long, a row whose run has no lease (its spawn failed before its start record was
committed) is dropped."""


@dataclass(frozen=True, slots=True)
class ForeignHolding(Holding):
    """A root write grant held by a run of another runtime (a row of ``luftpause_root_grants``)."""

    owner: str = ""

    @property
    def refusal(self) -> str:
        return f"held by run {self.handle!r} on another runtime ({self.owner})"


def writes(scope: Scope) -> bool:
    """Whether ``scope`` allows writing anywhere (only such grants can conflict)."""
    return any(rule.effect == "allow" and "write" in rule.access for rule in scope.rules)


class SharedRoots:
    """The root write grants of the runtimes on ``database`` (module docstring); ``database``
    must have a custody (a runtime's, not a reader's)."""

    def __init__(self, database: PostgresDatabase) -> None:
        custody = database.custody
        if custody is None:
            raise ValueError("shared root grants need a runtime's store (one with a custody)")
        self.database = database
        self.custody = custody

    def claim(self, handle: str, scope: Scope, source: EffectiveScope, mine: Collection[str]) -> None:
        """Record that the root ``handle`` holds ``scope``, carved from ``source`` (the local
        ``workspace``'s effective scope), once no run of another runtime writes any of it: rows
        of ``mine`` and of the runs this runtime holds are not others'. Raises
        :class:`ScopeExceeded` (naming the run and its runtime) or :class:`StoreUnusable`."""
        body = json.dumps(scope.to_json(), separators=(",", ":"))

        def operation(conn: Connection) -> None:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (ROOTS_LOCK,))
                conn.execute(
                    "DELETE FROM luftpause_root_grants g "
                    "WHERE granted_at < now() - make_interval(secs => %s) "
                    "AND NOT EXISTS (SELECT 1 FROM luftpause_leases l WHERE l.handle = g.handle)",
                    (ABANDONED_SECONDS,),
                )
                ours = sorted({*mine, *self.custody.held(), handle})
                rows = conn.execute(
                    "SELECT handle, owner, scope FROM luftpause_root_grants WHERE NOT (handle = ANY(%s))",
                    (ours,),
                ).fetchall()
                others = tuple(
                    ForeignHolding(str(h), None, Scope.from_json(json.loads(str(s))), owner=str(o))
                    for h, o, s in rows
                )
                excess = is_within(scope, EffectiveScope(source.granted, source.held + others))
                if excess is not None:
                    raise ScopeExceeded(excess)
                self._upsert(conn, {handle: body})

        self.database.run(operation)

    def publish(self, roots: Mapping[str, Scope], gone: Collection[str] = ()) -> None:
        """Make this runtime's rows what its ledger holds: the rows of ``roots`` (its live roots
        that write, by handle) written, and those of ``gone`` and of every other run it holds
        deleted, unless another runtime holds that run now. Failures are logged (the next
        publish puts the rows right)."""
        bodies = {h: json.dumps(s.to_json(), separators=(",", ":")) for h, s in roots.items()}

        def operation(conn: Connection) -> None:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (ROOTS_LOCK,))
                drop = sorted({*gone, *self.custody.held()} - bodies.keys())
                # Never the row of a run another runtime holds now (one this runtime lost).
                conn.execute(
                    "DELETE FROM luftpause_root_grants g WHERE handle = ANY(%s) AND NOT EXISTS "
                    "(SELECT 1 FROM luftpause_leases l WHERE l.handle = g.handle AND l.owner <> %s)",
                    (drop, self.custody.owner),
                )
                self._upsert(conn, bodies)

        try:
            self.database.run(operation)
        except StoreUnusable as exc:
            log.error("the workspace's shared root grants were not updated: %s", exc)

    def release(self, handle: str) -> None:
        """Delete ``handle``'s row (a claim whose run was never made)."""
        self.publish({}, (handle,))

    def _upsert(self, conn: Connection, bodies: Mapping[str, str]) -> None:
        for handle, body in bodies.items():
            conn.execute(
                "INSERT INTO luftpause_root_grants (handle, owner, scope) VALUES (%s, %s, %s) "
                "ON CONFLICT (handle) DO UPDATE SET owner = EXCLUDED.owner, scope = EXCLUDED.scope",
                (handle, self.custody.owner, body),
            )


def shared_roots(journal: RecordStore | None) -> SharedRoots | None:
    """The shared root grants of a runs store several runtimes share (a PostgreSQL store with a
    custody); ``None`` for the file journal or no store."""
    database: Any = getattr(journal, "database", None)
    if database is None or not getattr(journal, "shared", False):
        return None
    return SharedRoots(database)
