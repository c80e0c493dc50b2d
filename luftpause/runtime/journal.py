"""The runtime's journal: ``runs.jsonl`` under ``[runtime] state_dir``, so runs survive a restart.

One JSON object per line (UTF-8, ``\\n``-terminated), appended in the order things happened::

    {"type": "start", "handle", "at", "task", "system", "model", "serviceClass", "caller",
     "maxToolCalls", "maxTokens", "tools", "parent", "budgetTokens", "budgetToolCalls",
     "budgetSeconds"}                                      every spawn argument, at spawn
    {"type": "round", "handle", "messages": [assistant, tool...], "counters": {...}}
                                                           one completed tool round
    {"type": "end", "handle", "at", "state", "answer"?, "error"?, "counters": {...}}
                                                           the run completed, failed or was cancelled
    {"type": "run", <start fields>, "at", "finishedAt", "state", "answer"?, "error"?,
     "counters": {...}}                                    a finished run, written by compaction

    counters = {"turns", "toolCalls", "failedToolCalls", "promptTokens", "completionTokens",
                "turnSeconds", "toolSeconds"}              totals of the run itself at that point

A ``round`` carries the counters as they stood when the round completed, so a run resumed after a
crash counts from there: the turn that was in flight at the crash is redone and counted once.

Durability: each record is one ``os.write`` on a descriptor opened ``O_APPEND``, followed by
``fsync``. So a crash of the process or of the machine loses at most the record being written,
which is then a torn last line; :func:`read_records` skips it with a warning (any line that does
not parse is skipped the same way, never fatal). An fsync costs about 0.3 ms on this machine's
ext4 against tool rounds that take hundreds of milliseconds; it blocks the event loop that long.

Compaction: when the file passes :data:`COMPACT_BYTES` (or twice its size after the last
compaction, whichever is larger, so a journal of many large finished runs is not rewritten on
every record), it is rewritten from the registry's runs: each finished run as one ``run`` record
(no conversation: ``await`` and ``status`` need only its outcome), each running run as its
``start`` and one ``round`` holding every completed round. Finished runs the registry has dropped
are left out. The rewrite goes to ``runs.jsonl.tmp``, is fsynced, then renamed over the journal.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("luftpause.runtime.journal")

JOURNAL_NAME = "runs.jsonl"

COMPACT_BYTES = 64 * 1024 * 1024
"""Journal size (bytes) past which it is rewritten with finished runs as single records."""

Record = dict[str, Any]


def encode(record: Record) -> bytes:
    """``record`` as one journal line (JSON and ``\\n``). orjson refuses integers past 64 bits and
    lone surrogates; such values are written by the standard library instead, escaped to ASCII."""
    try:
        return orjson.dumps(record) + b"\n"
    except orjson.JSONEncodeError:
        return json.dumps(record, ensure_ascii=True).encode("ascii") + b"\n"


def read_records(path: Path) -> Iterator[Record]:
    """Every record of the journal at ``path`` in order (nothing if it does not exist).

    A line that is not a JSON object (a torn last line after a crash, or damage) is skipped with a
    warning naming its line number; it is never fatal.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    lines = data.split(b"\n")
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict) or not isinstance(record.get("handle"), str):
            torn = number == len(lines) and not data.endswith(b"\n")
            log.warning(
                "%s line %d: %s (%d bytes), skipped",
                path,
                number,
                "torn last record" if torn else "not a journal record",
                len(line),
            )
            continue
        yield record


class Journal:
    """The open journal of one runtime process.

    ``snapshot`` gives the records that describe every run the registry holds, for compaction
    (:meth:`RunRegistry.journal_snapshot`).
    """

    def __init__(self, state_dir: Path, compact_bytes: int = COMPACT_BYTES) -> None:
        self.state_dir = state_dir
        self.path = state_dir / JOURNAL_NAME
        self.compact_bytes = compact_bytes
        self.snapshot: Callable[[], Iterable[Record]] | None = None
        self._fd: int | None = None
        self._size = 0
        self._compact_at = compact_bytes

    @property
    def size(self) -> int:
        """Bytes in the journal file (as of the last open, append or compaction)."""
        return self._size

    def records(self) -> Iterator[Record]:
        """The records on disk (see :func:`read_records`)."""
        return read_records(self.path)

    def open(self) -> None:
        """Open for appending. A torn last line is cut off first, so the next record starts on a
        line of its own. Creates the state directory if needed; raises ``OSError``."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._cut_torn_tail()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self._size = os.fstat(self._fd).st_size

    def _cut_torn_tail(self) -> None:
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            os.truncate(self.path, keep)
            log.warning("%s: cut a torn last record of %d bytes", self.path, len(data) - keep)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def append(self, record: Record) -> None:
        """Write ``record`` durably (one write, then fsync); compact when the file has grown past
        its threshold. A write error is logged, not raised: the run goes on, only its durability
        is lost."""
        if self._fd is None:
            return
        line = encode(record)
        try:
            os.write(self._fd, line)
            os.fsync(self._fd)
        except OSError as exc:
            kind, handle = record.get("type"), record.get("handle")
            log.error("journal %s: could not write a %s record of %s: %s", self.path, kind, handle, exc)
            return
        self._size += len(line)
        if self._size > self._compact_at and self.snapshot is not None:
            self.compact(self.snapshot())

    def compact(self, records: Iterable[Record]) -> None:
        """Replace the journal by ``records`` (atomically: temporary file, fsync, rename)."""
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                for record in records:
                    os.write(fd, encode(record))
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, self.path)
            dir_fd = os.open(self.state_dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            log.error("journal %s: compaction failed, the journal is kept as it was: %s", self.path, exc)
            return
        before = self._size
        was_open = self._fd is not None
        self.close()
        if was_open:
            self.open()
        else:
            self._size = self.path.stat().st_size
        self._compact_at = max(self.compact_bytes, 2 * self._size)
        log.info("journal %s compacted: %d -> %d bytes", self.path, before, self._size)
