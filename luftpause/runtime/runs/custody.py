"""Which runtime holds which run, when several runtimes share one PostgreSQL store: a lease per run.

``luftpause_leases`` (``migrations/0002_leases.sql``) has one row per run: its ``owner`` (the
runtime's identity, ``<host>/<[runtime] listen>``, the same across a restart of that runtime),
its ``generation`` and when it ``expires_at``. The rules:

* a runtime creates the lease of every run it spawns (generation 1) in the transaction that
  writes the run's ``start`` record;
* it renews all its leases every :data:`RENEW_SECONDS` (one ``UPDATE``), to
  :data:`LEASE_SECONDS` from now; a lease it no longer finds was taken over: it has lost that run;
* at start it claims its own leases (a restart of the same runtime resumes its runs at once),
  the runs no lease names yet (a store written before leases), and the runs of dead runtimes;
* afterwards, every :data:`RENEW_SECONDS`, it takes over the runs of dead runtimes: an owner
  with a lease expired is dead (it renews all its leases in one statement, so its oldest lease
  expires first), and all its leases are taken at once, those that expire later too (a run it
  spawned after its last renewal): under that owner's advisory lock (so one runtime takes all of
  a dead runtime's runs, and a run tree is never split), ``SELECT ... FOR UPDATE SKIP LOCKED``,
  then each lease moves to it with its generation one higher;
* every record written is fenced (:mod:`luftpause.runtime.runs.postgres`): it carries its run's
  generation and is inserted only while the lease still has that owner and generation, so a
  runtime that was paused past its lease (and so lost it) can write nothing more about the run.

A takeover resumes the run as a restart does: from its records, at its last completed tool round
(:mod:`luftpause.runtime.runs.replay`); a tool call that was in flight at the dead runtime runs
again, under the same id (at least once).
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg

    Connection = psycopg.Connection[tuple[Any, ...]]

log = logging.getLogger("luftpause.runtime.runs.custody")

LEASE_SECONDS = 10.0
"""How long a lease holds without renewal (seconds): a dead runtime's runs are taken over between
this and this plus :data:`RENEW_SECONDS` after its last renewal."""

RENEW_SECONDS = 2.0
"""How often a runtime renews its leases and looks for expired ones (seconds)."""


def runtime_identity(listen: str) -> str:
    """The owner name of the runtime listening at ``listen`` on this host (``<host>/<listen>``):
    stable across restarts, so a restarted runtime reclaims its own runs at once; two runtimes
    never share it (they cannot listen at the same address on one host)."""
    return f"{socket.gethostname()}/{listen}"


@dataclass(frozen=True)
class Whereabouts:
    """Which runtime holds a run: its ``owner``, whether its lease is ``live`` (unexpired), and
    the ``url`` it answers at (``None``: a runtime that wrote none)."""

    owner: str
    live: bool
    url: str | None


class Custody:
    """The leases of one runtime (``owner``): the generation it holds of each run, and the SQL
    that claims, renews and takes over leases, every ``renew_seconds``, each for
    ``lease_seconds`` (the defaults :data:`RENEW_SECONDS` and :data:`LEASE_SECONDS`; tests shorten
    them). Thread-safe: the writer threads read :meth:`generation` while the event loop's
    takeovers add to it."""

    def __init__(
        self,
        owner: str,
        lease_seconds: float = LEASE_SECONDS,
        url: str | None = None,
        *,
        renew_seconds: float = RENEW_SECONDS,
    ) -> None:
        if not 0 < renew_seconds < lease_seconds:
            raise ValueError(f"renew_seconds must be > 0 and below lease_seconds, got {renew_seconds!r}")
        self.owner = owner
        self.url = url
        """Where other runtimes reach this one (``[runtime] advertise_url``), written to
        ``luftpause_runtimes`` at start; ``None``: not written (a reader, a test)."""
        self.lease_seconds = lease_seconds
        self.renew_seconds = renew_seconds
        self._held: dict[str, int] = {}
        self._lock = threading.Lock()
        self.claimed = False
        """Whether :meth:`claim_at_start` ran: reads are then limited to the runs held."""

    def generation(self, handle: str) -> int | None:
        """The generation of ``handle``'s lease held here, or ``None`` for a run not held."""
        with self._lock:
            return self._held.get(handle)

    def held(self) -> list[str]:
        """Every run held here."""
        with self._lock:
            return list(self._held)

    def _take(self, rows: list[tuple[Any, ...]]) -> list[str]:
        with self._lock:
            for handle, generation in rows:
                self._held[str(handle)] = int(generation)
        return [str(handle) for handle, _ in rows]

    def forget(self, handles: list[str]) -> None:
        """Stop holding ``handles`` (runs dropped by retention, or lost)."""
        with self._lock:
            for handle in handles:
                self._held.pop(handle, None)

    def create(self, conn: Connection, handle: str) -> int:
        """The lease of a run this runtime spawns, in the caller's transaction; its generation (1).
        The run counts as held only once that transaction committed (:meth:`created`): a renewal
        running meanwhile would not see the lease and take the run for lost."""
        conn.execute(
            "INSERT INTO luftpause_leases (handle, owner, generation, expires_at) "
            "VALUES (%s, %s, 1, now() + make_interval(secs => %s)) ON CONFLICT (handle) DO NOTHING",
            (handle, self.owner, self.lease_seconds),
        )
        return 1

    def created(self, generations: dict[str, int]) -> None:
        """The leases :meth:`create` made are committed: their runs are held."""
        with self._lock:
            for handle, generation in generations.items():
                self._held.setdefault(handle, generation)

    def claim_at_start(self, conn: Connection) -> list[str]:
        """Claim this runtime's own leases, the runs no lease names, and those of dead runtimes
        (module docstring), and write where this runtime answers (:attr:`url`); the runs held
        now. One transaction."""
        with conn.transaction():
            if self.url is not None:
                conn.execute(
                    "INSERT INTO luftpause_runtimes (owner, url) VALUES (%s, %s) ON CONFLICT (owner) "
                    "DO UPDATE SET url = excluded.url, started_at = now()",
                    (self.owner, self.url),
                )
            conn.execute(
                "INSERT INTO luftpause_leases (handle, owner, generation, expires_at) "
                "SELECT DISTINCT r.handle, %s, 0, now() FROM luftpause_records r "
                "WHERE r.stream = 'runs' AND NOT EXISTS "
                "(SELECT 1 FROM luftpause_leases l WHERE l.handle = r.handle) "
                "ON CONFLICT (handle) DO NOTHING",
                (self.owner,),
            )
            own = conn.execute(
                "UPDATE luftpause_leases SET generation = generation + 1, "
                "expires_at = now() + make_interval(secs => %s) WHERE owner = %s "
                "RETURNING handle, generation",
                (self.lease_seconds, self.owner),
            ).fetchall()
            self._take(own)
            self._take_expired(conn)
        self.claimed = True
        return self.held()

    @staticmethod
    def whereabouts(conn: Connection, handle: str) -> Whereabouts | None:
        """Who holds ``handle`` now, or ``None`` when no lease names it (no such run)."""
        row = conn.execute(
            "SELECT l.owner, l.expires_at > now(), r.url FROM luftpause_leases l "
            "LEFT JOIN luftpause_runtimes r ON r.owner = l.owner WHERE l.handle = %s",
            (handle,),
        ).fetchone()
        if row is None:
            return None
        return Whereabouts(str(row[0]), bool(row[1]), row[2])

    def renew(self, conn: Connection) -> list[str]:
        """Renew every lease held; returns the runs whose lease was lost (taken over by another
        runtime after it expired), which are no longer held."""
        with self._lock:
            before = dict(self._held)  # committed before the UPDATE below: it sees them all
        with conn.transaction():
            rows = conn.execute(
                "UPDATE luftpause_leases SET expires_at = now() + make_interval(secs => %s) "
                "WHERE owner = %s RETURNING handle, generation",
                (self.lease_seconds, self.owner),
            ).fetchall()
        found = {str(handle): int(generation) for handle, generation in rows}
        with self._lock:
            lost = [h for h, g in before.items() if found.get(h) != g and self._held.get(h) == g]
            for handle in lost:
                del self._held[handle]
        if lost:
            log.error("runtime %s lost the lease of %d runs: %s", self.owner, len(lost), ", ".join(lost))
        return lost

    def take_over(self, conn: Connection) -> list[str]:
        """Take over every lease of each other runtime that has a lease expired (module
        docstring); the runs taken."""
        with conn.transaction():
            return self._take_expired(conn)

    def _take_expired(self, conn: Connection) -> list[str]:
        owners = conn.execute(
            "SELECT DISTINCT owner FROM luftpause_leases WHERE expires_at < now() AND owner <> %s",
            (self.owner,),
        ).fetchall()
        taken: list[str] = []
        for (owner,) in owners:
            locked = conn.execute(
                "SELECT pg_try_advisory_xact_lock(hashtext('luftpause lease ' || %s))", (owner,)
            ).fetchone()
            if locked is None or not locked[0]:
                continue  # another runtime is taking this one's runs over
            # All its leases, not only those expired: a spawner's lease may expire before that of
            # a child it spawned after its last renewal, and a pod moves whole.
            rows = conn.execute(
                "SELECT handle FROM luftpause_leases WHERE owner = %s FOR UPDATE SKIP LOCKED", (owner,)
            ).fetchall()
            moved = conn.execute(
                "UPDATE luftpause_leases SET owner = %s, generation = generation + 1, "
                "expires_at = now() + make_interval(secs => %s) WHERE handle = ANY(%s) "
                "RETURNING handle, generation",
                (self.owner, self.lease_seconds, [row[0] for row in rows]),
            ).fetchall()
            taken += self._take(moved)
            if moved:
                log.warning(
                    "runtime %s took over %d runs of %s, whose lease expired", self.owner, len(moved), owner
                )
        return taken
