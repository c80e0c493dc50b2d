"""Where the runs' records are kept: the store interface the registry, the replay and the task
registry use, and the choice between its two kinds (``[runtime] store``).

A store is an ordered, durable log of records (their shapes: :mod:`luftpause.runtime.runs.journal`):
every record is appended in the order things happened, is durable once its future resolves, and
is read back in that order at start (the replay, :mod:`luftpause.runtime.runs.replay`). When it
grows past its threshold it is *compacted*: replaced whole, atomically, by the records that
rebuild what its owner holds. Two kinds:

* ``"file"`` (the default): ``runs.jsonl`` and ``tasks.jsonl`` under ``[runtime] state_dir``
  (:class:`~luftpause.runtime.runs.journal.Journal`), durable by ``fsync``;
* ``postgresql://...``: the same records as rows of one PostgreSQL database
  (:class:`~luftpause.runtime.runs.postgres.PostgresJournal`), durable by the transaction's commit;
  needs the ``postgresql`` extra (psycopg 3).

Both share :class:`RecordStore`: one writer thread per store fed by a queue, so records reach the
store in the order they were appended, and everything queued together shares one ``fsync`` or one
commit. :meth:`RecordStore.append` returns a future that resolves once the record is durable, or
fails with :class:`~luftpause.runtime.errors.JournalWriteError`; :meth:`RecordStore.written` waits
for everything appended so far (an answer that reports a change waits for it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import orjson

from luftpause.runtime.errors import JournalWriteError, LeaseLost, StoreUnusable

if TYPE_CHECKING:
    from luftpause.config import RuntimeConfig
    from luftpause.runtime.runs.journal import DamagedLine
    from luftpause.runtime.runs.manifest import Shrunk

log = logging.getLogger("luftpause.runtime.runs.store")

Record = dict[str, Any]

COMPACT_BYTES = 64 * 1024 * 1024
"""Store size (bytes) past which it is rewritten with finished runs as single records."""

FILE = "file"
"""``[runtime] store`` for the file journal under ``[runtime] state_dir`` (the default)."""

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
"""How a ``[runtime] store`` naming a PostgreSQL database begins (libpq's connection URIs)."""


def encode(record: Record) -> bytes:
    """``record`` as one line of JSON (with its ``\\n``). orjson refuses integers past 64 bits and
    lone surrogates; such values are written by the standard library instead, escaped to ASCII."""
    try:
        return orjson.dumps(record) + b"\n"
    except orjson.JSONEncodeError:
        import json

        return json.dumps(record, ensure_ascii=True).encode("ascii") + b"\n"


class Replayable(Protocol):
    """What a replay reads (:func:`luftpause.runtime.runs.replay.replay_journal`): a store, or
    the records of the runs a takeover moved to this runtime."""

    @property
    def label(self) -> str: ...

    @property
    def name(self) -> str: ...

    def shrunk(self) -> Shrunk | None: ...

    def numbered(
        self, on_damaged: Callable[[DamagedLine], None] | None = None
    ) -> Iterator[tuple[int, Record]]: ...


@dataclass
class Takeover:
    """What changed in the runs this runtime holds, when several runtimes share a store
    (:mod:`luftpause.runtime.runs.custody`): the runs it ``lost`` (another runtime holds them
    now: stop driving them) and the records of the runs it ``took`` over (to replay and resume)."""

    lost: list[str] = field(default_factory=list)
    took: Replayable | None = None


class _Compaction:
    def __init__(self, records: list[Record]) -> None:
        self.records = records


_STOP = object()

Pending = tuple[bytes, Record, concurrent.futures.Future[None]]
"""One queued record: its encoded line, the record, and the future its writer settles."""


class RecordStore(ABC):
    """The runs' (or the tasks') records, opened by their owner (:meth:`open`), which gives it
    what it needs then: ``snapshot``, the records that describe everything the owner holds, for
    compaction (:meth:`RunRegistry.journal_snapshot`; called on the event loop, it must return
    records that later changes do not alter: lists copied), and ``on_failure(record, error)``,
    called on the event loop for each record that could not be written.

    A kind of store gives where the records go (:meth:`_open_medium`, :meth:`_write_batch`,
    :meth:`_replace_all`, :meth:`_close_medium`) and how they are read back (:meth:`numbered`);
    the order, the futures and the compaction threshold are kept here.
    """

    def __init__(self, compact_bytes: int = COMPACT_BYTES) -> None:
        self.compact_bytes = compact_bytes
        self._held: set[str] = set()
        self._held_lock = threading.Lock()
        self._snapshot: Callable[[], Iterable[Record]] | None = None
        self._on_failure: Callable[[Record, OSError], None] | None = None
        self._size = 0
        self._queued_size = 0
        self._compact_at = compact_bytes
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last: concurrent.futures.Future[None] | None = None

    # What a kind of store says about itself and reads.

    @property
    @abstractmethod
    def label(self) -> str:
        """Where the records are, for the log (a path; a database URL without its password)."""

    @property
    @abstractmethod
    def name(self) -> str:
        """A short name for problems shown to users (``runs.jsonl``)."""

    @abstractmethod
    def numbered(
        self, on_damaged: Callable[[DamagedLine], None] | None = None
    ) -> Iterator[tuple[int, Record]]:
        """Every record held, in order, with its number (1-based; the line of a file). A record
        that cannot be read is given to ``on_damaged`` instead (never fatal)."""

    def records(self, on_damaged: Callable[[DamagedLine], None] | None = None) -> Iterator[Record]:
        """Every record held, in order (:meth:`numbered` without the numbers)."""
        for _, record in self.numbered(on_damaged):
            yield record

    def shrunk(self) -> Shrunk | None:
        """Whether the store holds less than it held when last opened, compacted or closed
        (records lost behind its back); ``None`` where that cannot happen or did not."""
        return None

    @abstractmethod
    def check_writable(self) -> None:
        """Make sure records can be written (creating what is needed); raises ``OSError`` naming
        the place and the reason."""

    @abstractmethod
    def _open_medium(self, held: set[str]) -> int:
        """Open the medium for appending; returns the bytes it holds. Raises ``OSError``."""

    @abstractmethod
    def _close_medium(self, held: set[str]) -> None:
        """Close the medium after the writer thread has written everything queued."""

    @abstractmethod
    def _write_batch(self, batch: list[Pending]) -> None:
        """Make every record of ``batch`` durable, in order, then settle each future (its result,
        or a :class:`JournalWriteError`). Runs on the writer thread; must not raise."""

    @abstractmethod
    def _replace_all(self, records: list[Record]) -> int | None:
        """Replace everything held by ``records`` atomically (a compaction); the bytes now held,
        or ``None`` when it failed and the store is kept as it was (logged). Writer thread (or
        the caller's, before it runs)."""

    def claim(self) -> None:  # noqa: B027 (a hook: only a shared store has something to do)
        """Before the replay: take the runs this runtime is to hold (a store shared by several
        runtimes: :mod:`luftpause.runtime.runs.custody`); nothing for a store of its own."""

    @property
    def custody_period(self) -> float | None:
        """How often (seconds) :meth:`custody_round` is to run while serving, for a store several
        runtimes share (:mod:`luftpause.runtime.runs.takeovers` runs it); ``None`` for a store of
        this runtime's own: nothing to follow."""
        return None

    async def custody_round(self) -> Takeover:
        """Renew this runtime's hold on its runs and take over those of dead runtimes: what
        changed (:class:`Takeover`). Raises what it met (a store unreachable, a fault): the
        follower logs it and tries again. Nothing for a store of this runtime's own."""
        return Takeover()

    # The shared machinery.

    @property
    def size(self) -> int:
        """Bytes held (as of the last open, write or compaction)."""
        return self._size

    def open(
        self,
        snapshot: Callable[[], Iterable[Record]] | None = None,
        on_failure: Callable[[Record, OSError], None] | None = None,
        held: Iterable[str] = (),
    ) -> None:
        """Open for appending and start the writer thread; ``snapshot`` and ``on_failure`` as the
        class docstring says (without a ``snapshot`` the store is never compacted). ``held``: the
        runs the replay found. Raises ``OSError``."""
        self._snapshot = snapshot
        self._on_failure = on_failure
        with self._held_lock:
            self._held = set(held)
            self._size = self._queued_size = self._open_medium(self._held)
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        self._thread = threading.Thread(target=self._writer, name=f"store {self.name}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Write what is queued, stop the writer thread and close the medium."""
        if self._thread is None:
            return
        self._queue.put(_STOP)
        self._thread.join()
        self._thread = None
        with self._held_lock:
            self._close_medium(self._held)

    def append(self, record: Record) -> concurrent.futures.Future[None]:
        """Queue ``record`` for the writer thread; the future resolves once it is durable, or
        fails with :class:`JournalWriteError`. Starts a compaction when the store has grown past
        its threshold. On a closed store the future is already failed."""
        done: concurrent.futures.Future[None] = concurrent.futures.Future()
        # Running from the start, so no awaiter can cancel it: a task awaiting it through
        # asyncio.wrap_future and cancelled (a client gone, a run cancelled) would cancel it too,
        # and the writer's set_result on a cancelled future raised and ended the writer thread,
        # after which no record was written and every wait for one hung.
        done.set_running_or_notify_cancel()
        if self._thread is None:
            done.set_exception(JournalWriteError(f"journal {self.label} is not open"))
            return done
        line = encode(record)
        if record.get("type") == "start":
            with self._held_lock:
                self._held.add(str(record["handle"]))
        done.add_done_callback(lambda f: self._settled(record, f))
        self._queue.put((line, record, done))
        self._last = done
        self._queued_size += len(line)
        if self._queued_size > self._compact_at and self._snapshot is not None:
            self.compact_later(self._snapshot())
        return done

    async def write(self, record: Record) -> None:
        """Append ``record`` and wait until it is durable; raises :class:`JournalWriteError`."""
        await asyncio.wrap_future(self.append(record))

    async def written(self) -> None:
        """Wait until every record appended so far is durable, or has failed (the writer keeps
        their order, so the last one's future settles after all of them; a failure was logged
        and reported to ``on_failure``). For an answer that must not be given before the change
        it reports is durable: a kill after the answer must not lose it."""
        last = self._last
        if last is None:
            return
        with contextlib.suppress(OSError):
            await asyncio.wrap_future(last)

    def _settled(self, record: Record, done: concurrent.futures.Future[None]) -> None:
        exc = done.exception()
        if exc is None:
            return
        # A record refused by fencing is about a run another runtime holds now: the loss itself is
        # logged as an error once (the lease renewal that found it), not once per record.
        level = logging.WARNING if isinstance(exc, LeaseLost) else logging.ERROR
        log.log(level, "%s (a %s record of %s)", exc, record.get("type"), record.get("handle"))
        if self._on_failure is None or not isinstance(exc, OSError):
            return
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._on_failure, record, exc)
        else:
            self._on_failure(record, exc)

    def compact_later(self, records: Iterable[Record]) -> None:
        """Queue a compaction to ``records`` (taken now; written by the writer thread in order
        with the records around it)."""
        self._compact_at = max(self.compact_bytes, 2 * self._queued_size)
        self._queue.put(_Compaction(list(records)))

    def compact(self, records: Iterable[Record]) -> None:
        """Replace the store by ``records`` now, on the calling thread. For use before the writer
        thread runs (at start); later, use :meth:`compact_later`."""
        self._compact_now(list(records))

    def _compact_now(self, records: list[Record]) -> None:
        before = self._size
        size = self._replace_all(records)
        if size is None:
            return
        self._size = self._queued_size = size
        self._compact_at = max(self.compact_bytes, 2 * size)
        log.info("journal %s compacted: %d -> %d bytes", self.label, before, size)

    def _writer(self) -> None:
        while True:
            item = self._queue.get()
            batch = [item]
            while True:  # everything queued meanwhile shares one fsync or commit
                try:
                    batch.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            lines: list[Pending] = []
            stop = False
            for entry in batch:
                if entry is _STOP:
                    stop = True
                elif isinstance(entry, _Compaction):
                    self._flush(lines)
                    lines = []
                    self._compact_now(entry.records)
                else:
                    lines.append(entry)
            self._flush(lines)
            if stop:
                return

    def _flush(self, lines: list[Pending]) -> None:
        if not lines:
            return
        try:
            self._write_batch(lines)
        except Exception as exc:  # a fault of ours: the writer thread must live on, or every wait hangs
            log.exception("journal %s: writing a batch failed", self.label)
            for _, _, done in lines:
                if not done.done():
                    done.set_exception(JournalWriteError(f"journal {self.label}: {exc}"))


@dataclass(frozen=True)
class Stores:
    """The two stores of one runtime: the runs' records (``runs.jsonl``) and the MCP tasks'
    (``tasks.jsonl``), of the kind ``[runtime] store`` chose."""

    runs: RecordStore
    tasks: RecordStore


def is_postgres(store: str) -> bool:
    """Whether ``[runtime] store`` names a PostgreSQL database."""
    return store.startswith(POSTGRES_SCHEMES)


def open_stores(settings: RuntimeConfig) -> Stores:
    """The stores ``settings`` chose (``[runtime] store``): the file journals under ``state_dir``,
    or the PostgreSQL database at the URL (imports psycopg: raises
    :class:`~luftpause.runtime.errors.StoreUnusable` naming the ``postgresql`` extra when it is
    not installed). Opens nothing yet."""
    if is_postgres(settings.store):
        from luftpause.runtime.runs.custody import runtime_identity

        try:
            from luftpause.runtime.runs.postgres import PostgresDatabase
        except ImportError as exc:
            raise StoreUnusable(
                f"a postgresql:// store needs psycopg, which is not installed ({exc}): "
                "pip install 'luftpause[postgresql]'"
            ) from None

        database = PostgresDatabase(
            settings.store, owner=runtime_identity(settings.listen), advertise_url=settings.advertised()
        )
        return Stores(database.journal("runs"), database.journal("tasks"))
    from luftpause.runtime.runs.journal import TASKS_JOURNAL_NAME, Journal

    state_dir = Path(settings.state_dir)
    return Stores(Journal(state_dir), Journal(state_dir, file_name=TASKS_JOURNAL_NAME))
