"""The runs' records in PostgreSQL (``[runtime] store = "postgresql://..."``).

The same records as ``runs.jsonl`` and ``tasks.jsonl`` (:mod:`luftpause.runtime.runs.journal`),
one row each in ``luftpause_records`` (``migrations/0001_records.sql``): ``stream`` says which
journal, ``seq`` keeps the order they were appended in, ``caller`` holds the run's tenant on its
start record, ``body`` the record as JSON. Durable means committed: the writer thread
(:class:`~luftpause.runtime.runs.store.RecordStore`) commits everything queued together in one
transaction, then resolves its futures, as the file journal does with one ``fsync``.

Why psycopg 3 (not asyncpg): the store's writer is a thread that group-commits in order, the
file journal's design; psycopg's synchronous connection fits it as it is, where asyncpg would need
an event loop of its own in that thread. psycopg also binds libpq's connection URIs and
``LISTEN``/``NOTIFY``, and its ``binary`` wheel needs no PostgreSQL on the runtime's host.

Connections: each store's writer thread holds one connection of its own (its group commits).
Everything else (the reads, the lease renewals and takeovers, where a run is held) borrows one
from a small pool (``psycopg_pool``, :data:`POOL_SIZE` at most, each checked as it is taken), open
while a store of the database is open and closed with the last of them; before that (the replay
at start) each operation opens a connection of its own.

Retries: a connection that fails (the database restarting, a network cut) is opened again (a pooled
one is replaced) and the batch or the operation made again, with exponential backoff for up to
:attr:`PostgresDatabase.retry_seconds` (tenacity). Every record carries its own id (``rid``,
unique): a batch whose commit went through but whose answer was lost is not written twice. Past the
retries the batch's futures fail with :class:`~luftpause.runtime.errors.JournalWriteError`, as a
failed ``fsync`` does.

Schema: versioned SQL files in ``migrations/`` (``NNNN_<what>.sql``), applied in order at start
in one transaction under an advisory lock (several runtimes may start at once); the versions
applied are in ``luftpause_schema``. A database whose schema is newer than this luftpause knows is
refused (:class:`~luftpause.runtime.errors.StoreUnusable`), never written to.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Iterator
from importlib import resources
from typing import TYPE_CHECKING, Any, TypeVar

import psycopg
from psycopg_pool import ConnectionPool
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception_type,
    stop_after_delay,
    wait_exponential_jitter,
)

from luftpause.config import without_password
from luftpause.runtime.errors import JournalWriteError, LeaseLost, StoreUnusable
from luftpause.runtime.runs.custody import LEASE_SECONDS, RENEW_SECONDS, Custody
from luftpause.runtime.runs.journal import parse_lines
from luftpause.runtime.runs.store import COMPACT_BYTES, Pending, Record, RecordStore, Takeover, encode

if TYPE_CHECKING:
    from luftpause.runtime.runs.journal import DamagedLine
    from luftpause.runtime.runs.manifest import Shrunk

log = logging.getLogger("luftpause.runtime.runs.postgres")

T = TypeVar("T")
Connection = psycopg.Connection[tuple[Any, ...]]

MIGRATION_LOCK = 0x6C75_6674  # "luft": the advisory lock migrations take
"""The advisory lock key that serializes runtimes migrating the same database at once."""

POOL_SIZE = 4
"""Most pooled connections one database keeps (besides each writer's own): the reads and lease
operations are short, and few run at once (a renewal, a takeover, calls about runs held
elsewhere)."""

_MIGRATION_FILE = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")

_INSERT = (
    "INSERT INTO luftpause_records (stream, rid, handle, kind, caller, body, owner, generation) "
    "VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT (rid) DO NOTHING"
)

_FENCED_INSERT = (
    "INSERT INTO luftpause_records (stream, rid, handle, kind, caller, body, owner, generation) "
    "SELECT %s, %s, %s, %s, %s, %s, %s, %s WHERE EXISTS (SELECT 1 FROM luftpause_leases "
    "WHERE handle = %s AND owner = %s AND generation = %s) ON CONFLICT (rid) DO NOTHING"
)
"""A record of a run inserted only while its lease has the writer's owner and generation
(:mod:`luftpause.runtime.runs.custody`): a runtime that lost the run writes nothing more of it."""


def migrations() -> list[tuple[int, str]]:
    """The schema's migrations, ``(version, SQL)`` in version order, from the package's
    ``migrations/`` folder (versions 1, 2, ... with none missing)."""
    found = []
    for entry in resources.files("luftpause.runtime.runs").joinpath("migrations").iterdir():
        matched = _MIGRATION_FILE.match(entry.name)
        if matched is not None:
            found.append((int(matched.group(1)), entry.read_text(encoding="utf-8")))
    found.sort()
    if [version for version, _ in found] != list(range(1, len(found) + 1)):
        raise RuntimeError(f"luftpause's migrations are not numbered 1..n: {[v for v, _ in found]}")
    return found


SCHEMA_VERSION = len(migrations())
"""The schema version this luftpause writes (its newest migration)."""


class PostgresDatabase:
    """One PostgreSQL database holding a runtime's records: its URL (libpq's
    ``postgresql://user:password@host:port/database?...``), the schema's migrations and the
    retries every connection gets. :meth:`journal` gives a store per stream. ``lease_seconds`` and
    ``renew_seconds`` are the leases' (:mod:`luftpause.runtime.runs.custody`; tests shorten them),
    ``pool_size`` the most connections its pool keeps (module docstring)."""

    def __init__(
        self,
        url: str,
        *,
        owner: str | None = None,
        retry_seconds: float = 60.0,
        connect_timeout: int = 5,
        lease_seconds: float = LEASE_SECONDS,
        renew_seconds: float = RENEW_SECONDS,
        advertise_url: str | None = None,
        pool_size: int = POOL_SIZE,
    ) -> None:
        self.url = url
        self.label = without_password(url)
        self.custody = (
            Custody(owner, lease_seconds, advertise_url, renew_seconds=renew_seconds)
            if owner is not None
            else None
        )
        """The leases of the runtime ``owner`` (:mod:`luftpause.runtime.runs.custody`); without an
        owner (a reader, a test) no lease is taken and no record fenced."""
        self.retry_seconds = retry_seconds
        self.connect_timeout = connect_timeout
        self.pool_size = pool_size
        self._migrated = False
        self._lock = threading.Lock()
        self._pool: ConnectionPool[Connection] | None = None
        self._pool_users = 0
        self._pool_lock = threading.Lock()

    def journal(self, stream: str, compact_bytes: int = COMPACT_BYTES) -> PostgresJournal:
        """The store of ``stream`` (``"runs"`` or ``"tasks"``) in this database."""
        return PostgresJournal(self, stream, compact_bytes)

    def connect(self) -> Connection:
        """A new connection (not autocommit). Raises ``psycopg.OperationalError``."""
        return psycopg.connect(self.url, connect_timeout=self.connect_timeout)

    def open_pool(self) -> None:
        """Borrow :meth:`run` 's connections from a pool from now until the matching
        :meth:`close_pool` (counted: each store of the database opens it once, when it opens)."""
        with self._pool_lock:
            self._pool_users += 1
            if self._pool is not None:
                return
            self._pool = ConnectionPool(
                self.url,
                open=False,
                min_size=1,
                max_size=self.pool_size,
                kwargs={"connect_timeout": self.connect_timeout},
                # A connection the database closed (a restart) is found before it is used, and
                # replaced; waiting for one is bounded, then the operation's own retries go on.
                check=ConnectionPool.check_connection,
                timeout=float(self.connect_timeout),
                name=f"luftpause store {self.label}",
            )
            self._pool.open(wait=False)

    def close_pool(self) -> None:
        """The store that opened the pool closed; the last one closes the pool and its
        connections. :meth:`run` opens connections of its own again."""
        with self._pool_lock:
            self._pool_users = max(0, self._pool_users - 1)
            if self._pool_users > 0 or self._pool is None:
                return
            pool, self._pool = self._pool, None
        pool.close()

    @property
    def pooled(self) -> bool:
        """Whether :meth:`run` borrows pooled connections now."""
        return self._pool is not None

    @contextlib.contextmanager
    def _borrowed(self) -> Iterator[Connection]:
        """A connection for one operation, committed at the end (rolled back on an error): from
        the pool while it is open, else one of its own, closed after."""
        pool = self._pool
        if pool is None:
            with self.connect() as conn:
                yield conn
        else:
            with pool.connection() as conn:
                yield conn

    def retrying(self) -> Retrying:
        """Retries of an operation whose connection failed: exponential backoff with jitter, up
        to :attr:`retry_seconds`, then the last error is raised."""
        return Retrying(
            stop=stop_after_delay(self.retry_seconds),
            wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.1),
            retry=retry_if_exception_type(psycopg.OperationalError),
            reraise=True,
            before_sleep=self._retrying,
        )

    def _retrying(self, state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        log.warning("store %s: %s; trying again (attempt %d)", self.label, error, state.attempt_number)

    def run(self, operation: Callable[[Connection], T]) -> T:
        """``operation`` in a transaction on a connection of the pool (or of its own: module
        docstring), migrated first, retried on a connection failure; raises
        :class:`StoreUnusable` once the retries are spent."""
        self.migrate()
        try:
            for attempt in self.retrying():
                with attempt, self._borrowed() as conn:
                    return operation(conn)
        except psycopg.Error as exc:
            raise StoreUnusable(f"store {self.label}: {exc}") from exc
        raise AssertionError("unreachable: tenacity reraises")

    def migrate(self) -> int:
        """Bring the schema to :data:`SCHEMA_VERSION` (once per process); returns the version it
        was at. Raises :class:`StoreUnusable` for a schema newer than this luftpause knows, or a
        database that cannot be reached within the retries."""
        with self._lock:
            if self._migrated:
                return SCHEMA_VERSION
            try:
                for attempt in self.retrying():
                    with attempt, self.connect() as conn:
                        found = self._migrate(conn)
            except psycopg.Error as exc:
                raise StoreUnusable(f"store {self.label}: {exc}") from exc
            self._migrated = True
            return found

    def _migrate(self, conn: Connection) -> int:
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
            conn.execute(
                "CREATE TABLE IF NOT EXISTS luftpause_schema ("
                "version integer PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            row = conn.execute("SELECT coalesce(max(version), 0) FROM luftpause_schema").fetchone()
            found = int(row[0]) if row is not None else 0
            if found > SCHEMA_VERSION:
                raise StoreUnusable(
                    f"store {self.label}: its schema is at version {found}, newer than this luftpause "
                    f"knows ({SCHEMA_VERSION}): a newer luftpause wrote it; upgrade luftpause to use it"
                )
            for version, sql in migrations():
                if version > found:
                    conn.execute(sql.encode())
                    conn.execute("INSERT INTO luftpause_schema (version) VALUES (%s)", (version,))
                    log.info("store %s: schema migrated to version %d", self.label, version)
        return found


class PostgresJournal(RecordStore):
    """The records of one ``stream`` of a :class:`PostgresDatabase`: a
    :class:`~luftpause.runtime.runs.store.RecordStore` whose writer commits (module docstring)."""

    def __init__(self, database: PostgresDatabase, stream: str, compact_bytes: int = COMPACT_BYTES) -> None:
        super().__init__(compact_bytes)
        self.database = database
        self.stream = stream
        self._conn: Connection | None = None
        self._pool_open = False
        # What a custody round found and has not yet handed over (a later step of the round
        # failed): the runs lost, and the runs taken whose records are still to be read.
        self._lost: list[str] = []
        self._took: list[str] = []

    @property
    def label(self) -> str:
        return f"{self.database.label} ({self.stream})"

    @property
    def name(self) -> str:
        return f"the {self.stream} store"

    def check_writable(self) -> None:
        """Reach the database and bring its schema up to date; raises :class:`StoreUnusable`."""
        self.database.migrate()

    def numbered(
        self, on_damaged: Callable[[DamagedLine], None] | None = None
    ) -> Iterator[tuple[int, Record]]:
        """Every record of the stream in the order appended, numbered from 1; once this runtime
        has claimed its runs (:meth:`claim`), only theirs (the tasks: only its own)."""
        custody = self.database.custody
        params: list[Any]
        if custody is None or not custody.claimed:
            where, params = "stream = %s", [self.stream]
        elif self.stream == "runs":
            where, params = "stream = %s AND handle = ANY(%s)", [self.stream, custody.held()]
        else:
            where, params = "stream = %s AND owner = %s", [self.stream, custody.owner]
        yield from self._read(where, params, on_damaged)

    def _read(
        self, where: str, params: list[Any], on_damaged: Callable[[DamagedLine], None] | None = None
    ) -> Iterator[tuple[int, Record]]:
        rows = self.database.run(
            lambda conn: conn.execute(
                f"SELECT body FROM luftpause_records WHERE {where} ORDER BY seq".encode(), params
            ).fetchall()
        )
        lines = ((number, str(row[0]).encode()) for number, row in enumerate(rows, start=1))
        yield from parse_lines(lines, self.label, None, on_damaged)

    def _read_runs(self, handles: list[str]) -> list[tuple[int, Record]]:
        return list(self._read("stream = 'runs' AND handle = ANY(%s)", [handles]))

    # A shared store's records of runs another runtime wrote (the MCP tasks that follow their
    # runs: :mod:`luftpause.runtime.mcp.tasks`).

    @property
    def shared(self) -> bool:
        """Whether this store belongs to a runtime that shares the database with others (it has
        a custody: leases, and records read by owner)."""
        return self.database.custody is not None

    def records_of_others(self, handles: list[str]) -> list[Record]:
        """The records of this stream about the runs ``handles`` that another runtime wrote, in
        order (the tasks of runs this runtime took over). Raises :class:`StoreUnusable`."""
        custody = self.database.custody
        owner = custody.owner if custody is not None else ""
        where = "stream = %s AND handle = ANY(%s) AND owner IS DISTINCT FROM %s"
        return [record for _, record in self._read(where, [self.stream, handles, owner])]

    def drop_others(self, handles: list[str]) -> None:
        """Delete the records :meth:`records_of_others` gave, once this runtime has written its
        own copies of them. Raises :class:`StoreUnusable`."""
        custody = self.database.custody
        owner = custody.owner if custody is not None else ""
        self.database.run(
            lambda conn: conn.execute(
                "DELETE FROM luftpause_records WHERE stream = %s AND handle = ANY(%s) "
                "AND owner IS DISTINCT FROM %s",
                (self.stream, handles, owner),
            )
        )

    def find_task(self, task_id: str) -> str | None:
        """The run of the MCP task ``task_id`` (its ``task`` record's ``handle``), whichever
        runtime wrote it; ``None`` for a task no runtime recorded. ``task_id`` must be a task id
        as :func:`luftpause.runtime.mcp.tasks.new_task_id` makes them (no quote, no backslash):
        it is looked for as written in the record's JSON. Raises :class:`StoreUnusable`."""
        needle = f'"taskId":"{task_id}"'
        row = self.database.run(
            lambda conn: conn.execute(
                "SELECT handle FROM luftpause_records WHERE stream = %s AND kind = 'task' "
                "AND strpos(body, %s) > 0 LIMIT 1",
                (self.stream, needle),
            ).fetchone()
        )
        return str(row[0]) if row is not None else None

    def claim(self) -> None:
        """Take this runtime's runs before the replay (:meth:`Custody.claim_at_start`)."""
        custody = self.database.custody
        if custody is not None and self.stream == "runs" and not custody.claimed:
            held = self.database.run(custody.claim_at_start)
            log.info("store %s: runtime %s holds %d runs", self.label, custody.owner, len(held))

    @property
    def custody_period(self) -> float | None:
        """The runs' store of a runtime that holds leases: its renewal period (seconds)."""
        custody = self.database.custody
        return custody.renew_seconds if custody is not None and self.stream == "runs" else None

    async def custody_round(self) -> Takeover:
        """Renew this runtime's leases, then take over the expired leases of others; what changed
        (the records of the runs taken, read here). Raises what a step met
        (:class:`StoreUnusable`, or a fault); what the steps before it found is kept, and handed
        over by the next round that gets through (a lease renewal reports a lost run only once)."""
        custody = self.database.custody
        if custody is None or self.stream != "runs":
            return Takeover()
        lost = await asyncio.to_thread(self.database.run, custody.renew)
        self._lost += lost
        self._took = [handle for handle in self._took if handle not in lost]
        self._took += await asyncio.to_thread(self.database.run, custody.take_over)
        records = await asyncio.to_thread(self._read_runs, self._took) if self._took else []
        change = Takeover(self._lost, _TakenRuns(self.label, records) if self._took else None)
        self._lost, self._took = [], []
        return change

    def _connection(self) -> Connection:
        self.database.migrate()
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            if conn is not None:
                conn.close()
            conn = self._conn = self.database.connect()
        return conn

    def _drop_connection(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _open_medium(self, held: set[str]) -> int:
        if not self._pool_open:
            self.database.open_pool()
        try:
            row = self.database.run(
                lambda conn: conn.execute(
                    "SELECT coalesce(sum(octet_length(body) + 1), 0) FROM luftpause_records "
                    "WHERE stream = %s",
                    (self.stream,),
                ).fetchone()
            )
        except BaseException:
            if not self._pool_open:
                self.database.close_pool()
            raise
        self._pool_open = True
        return int(row[0]) if row is not None else 0

    def _close_medium(self, held: set[str]) -> None:
        self._drop_connection()
        if self._pool_open:
            self._pool_open = False
            self.database.close_pool()

    def _rows(self, records: list[tuple[bytes, Record]]) -> list[tuple[Any, ...]]:
        rows = []
        for line, record in records:
            kind = str(record.get("type"))
            caller = record.get("caller") if kind in ("start", "run") else None
            rows.append(
                (self.stream, uuid.uuid4(), str(record["handle"]), kind, caller, line[:-1].decode("utf-8"))
            )
        return rows

    def _commit(self, rows: list[tuple[Any, ...]], *, replace: bool = False) -> set[uuid.UUID]:
        """Insert ``rows`` in one transaction (after deleting the records this runtime holds,
        for ``replace``), retried on a connection failure; the ids of the rows refused by
        fencing (their run is held by another runtime now). Raises ``psycopg.Error``."""
        for attempt in self.database.retrying():
            with attempt:
                created: dict[str, int] = {}
                try:
                    conn = self._connection()
                    with conn.transaction():
                        if replace:
                            self._delete_held(conn)
                        refused = self._insert(conn, rows, created)
                except psycopg.OperationalError:
                    self._drop_connection()
                    raise
                if created and self.database.custody is not None:
                    self.database.custody.created(created)
                return refused
        raise AssertionError("unreachable: tenacity reraises")

    def _delete_held(self, conn: Connection) -> None:
        custody = self.database.custody
        if custody is None:
            conn.execute("DELETE FROM luftpause_records WHERE stream = %s", (self.stream,))
        elif self.stream == "runs":
            conn.execute(
                "DELETE FROM luftpause_records WHERE stream = %s AND handle = ANY(%s)",
                (self.stream, custody.held()),
            )
        else:
            conn.execute(
                "DELETE FROM luftpause_records WHERE stream = %s AND owner = %s", (self.stream, custody.owner)
            )

    def _insert(
        self, conn: Connection, rows: list[tuple[Any, ...]], created: dict[str, int]
    ) -> set[uuid.UUID]:
        custody = self.database.custody
        with conn.cursor() as cur:
            if custody is None or self.stream != "runs":
                owner = custody.owner if custody is not None else None
                cur.executemany(_INSERT, [(*row, owner, None) for row in rows])
                return set()
            fenced = []
            for row in rows:
                handle, kind = row[2], row[3]
                generation = created.get(handle, custody.generation(handle))
                if kind == "start" and generation is None:
                    generation = created[handle] = custody.create(conn, handle)
                owned = (custody.owner, -1 if generation is None else generation)
                fenced.append((*row, *owned, handle, *owned))
            cur.executemany(_FENCED_INSERT, fenced)
            rids = [row[1] for row in rows]
            found = cur.execute("SELECT rid FROM luftpause_records WHERE rid = ANY(%s)", (rids,)).fetchall()
        return set(rids) - {row[0] for row in found}

    def _write_batch(self, batch: list[Pending]) -> None:
        rows = self._rows([(line, record) for line, record, _ in batch])  # ids fixed before any try
        try:
            refused = self._commit(rows)
        except psycopg.Error as exc:
            for _, _, done in batch:
                done.set_exception(JournalWriteError(f"journal {self.label}: {exc}"))
            return
        for (line, record, done), row in zip(batch, rows, strict=True):
            if row[1] in refused:
                done.set_exception(
                    LeaseLost(
                        f"journal {self.label}: run {record['handle']} is held by another runtime "
                        "now (its lease moved): its record was refused"
                    )
                )
                continue
            self._size += len(line)
            done.set_result(None)

    def compact(self, records: Iterable[Record]) -> None:
        """:meth:`RecordStore.compact`; the connection it used is closed after, unless the writer
        thread holds it."""
        try:
            super().compact(records)
        finally:
            if self._thread is None:
                self._drop_connection()

    def _replace_all(self, records: list[Record]) -> int | None:
        lines = [(encode(record), record) for record in records]
        custody = self.database.custody
        try:
            self._commit(self._rows(lines), replace=True)
            if custody is not None and self.stream == "runs":
                kept = {str(record["handle"]) for record in records}
                gone = [handle for handle in custody.held() if handle not in kept]
                if gone:  # forgotten by retention: their leases go with their records
                    self.database.run(
                        lambda conn: conn.execute(
                            "DELETE FROM luftpause_leases WHERE owner = %s AND handle = ANY(%s)",
                            (custody.owner, gone),
                        )
                    )
                    custody.forget(gone)
        except (psycopg.Error, StoreUnusable) as exc:
            log.error("journal %s: compaction failed, the store is kept as it was: %s", self.label, exc)
            return None
        return sum(len(line) for line, _ in lines)


class _TakenRuns:
    """The records of the runs a takeover moved to this runtime, read already, for the replay
    (:class:`~luftpause.runtime.runs.store.Replayable`)."""

    def __init__(self, label: str, records: list[tuple[int, Record]]) -> None:
        self.label = label
        self.name = "the runs store"
        self._records = records

    def shrunk(self) -> Shrunk | None:
        return None

    def numbered(
        self, on_damaged: Callable[[DamagedLine], None] | None = None
    ) -> Iterator[tuple[int, Record]]:
        return iter(self._records)
