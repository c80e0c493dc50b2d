"""The runtime's journal: ``runs.jsonl`` under ``[runtime] state_dir``, so runs survive a restart.

One JSON object per line (UTF-8, ``\\n``-terminated), appended in the order things happened::

    {"type": "start", "handle", "at", "task", "system", "model", "serviceClass", "caller",
     "maxToolCalls", "maxTokens", "parallelToolCalls", "tools", "parent", "budgetTokens",
     "budgetToolCalls", "budgetSeconds", "approveTools", "name", "orchestrate"}
                                                           every spawn argument, at spawn
    {"type": "turn", "handle", "turn", "message": assistant, "counters": {...}}
                                                           a reply that calls tools: the tool round
                                                           it begins (durable before any call runs)
    {"type": "call", "handle", "turn", "index", "message": tool message, "failed"}
                                                           one call of that round completed
    {"type": "round", "handle", "messages": [assistant, tool...], "counters": {...},
     "delivered"?: [message id]}                           one completed tool round (whole: it
                                                           repeats its turn and call records)
    {"type": "approval", "handle", "key", "tool", "allow", "at"}
                                                           a person's decision on one tool call
    {"type": "started", "handle", "key", "tool", "at"}     an approved call is about to execute:
                                                           the approval is used up
    {"type": "message", "handle", "id", "content", "from"} ``send`` to the run (pods)
    {"type": "stop", "handle", "by"}                       ``stop`` on the run (pods)
    {"type": "end", "handle", "state", "finishedAt", "answer"?, "error"?, "exceeded"?,
     "stoppedBy"?, "counters": {...}}                      the run completed, failed or was cancelled
    {"type": "run", <start fields>, <end fields>, "messages": [...]}
    {"type": "run", <start fields>, <end fields>, "conversationDropped": true, "outputs": [text],
     "outputsBase", "taskChars"}                           a finished run, written by compaction:
                                                           its conversation, or once that was
                                                           dropped for [runtime] retained_bytes
                                                           its newest output entries and the
                                                           read index of the first
    pods add their own record types (scope grants and ends, notifications: pods.py)

    counters = {"turns", "toolCalls", "failedToolCalls", "promptTokens", "completionTokens",
                "turnSeconds", "toolSeconds"}              totals of the run itself at that point

A ``round`` carries the counters as they stood when the round completed, so a run resumed after a
crash counts from there: the turn that was in flight at the crash is redone and counted once. A
``turn`` carries them as they stood when its reply came; each ``call`` after it adds its one call
(and its failure). A run whose journal ends inside a round (a ``turn``, some ``call`` s, no
``round``) resumes that round: it is not asked for the reply again, and runs only the calls with no
``call`` record, under the same ids (at least once: a call that started but whose ``call`` record
was not written runs again; :func:`luftpause.runtime.agent.upstream.call_id`).

Writing happens off the event loop, in one writer thread per journal fed by a queue, so records
reach the file in the order they were appended. Each record is written whole (``os.write`` is
repeated until every byte is written: a short write never glues two records) on a descriptor
opened ``O_APPEND``, then ``fsync``-ed; records queued together share one fsync. :meth:`append`
returns a future that resolves once the record is durable, or fails with the ``OSError``;
:meth:`write` awaits it. Callers await it where a record must be on disk before something is
acknowledged or done (a spawn's ``start``, a task's creation, an approval and its ``started``
record before the call executes, a round before the next turn). A record that could not be
written is reported to the ``on_failure`` its owner gave :meth:`Journal.open` (the registry marks
its run as not durable) and logged as an error.

A crash of the process or of the machine loses at most the records being written, the last of
them possibly a torn last line; :func:`read_records` skips it with a warning, never fatal.

Torn or damaged: a *torn* line is the file's last one with no ``\n`` after it (a write the crash
cut short, whose ``fsync`` never returned, so nothing it records was acknowledged: skipping it
loses nothing anyone was told). Any other line that is not a journal record (it does not parse,
or is not an object with a ``handle``) is *damaged*: it was written whole, may have been
acknowledged, and is reported (:class:`DamagedLine`, with what the line still shows,
:func:`salvage`) so the replay keeps its run visible, as failed with the reason, never gone
(:mod:`luftpause.runtime.runs.replay`). A damage that still parses as a valid record (a flipped
digit) is not detected: lines carry no checksum.

Compaction: when the file passes :data:`COMPACT_BYTES` (or twice its size after the last
compaction, whichever is larger, so a journal of many large finished runs is not rewritten on
every record), it is rewritten from the registry's runs by the writer thread, in order with the
records around it: each finished run as one ``run`` record, each running run as its ``start`` and
one ``round`` holding every completed round. Finished runs the registry has dropped are left out,
and each finished run is written as the registry retains it (``[runtime] retained_bytes``), so the
compacted file is about the retained bytes plus the running runs.
The rewrite goes to ``runs.jsonl.tmp``, is fsynced, then renamed over the journal.

Beside it, ``runs.jsonl.manifest`` (:mod:`luftpause.runtime.runs.manifest`) says how many bytes
and which runs it held when it was last opened, compacted or closed, so a journal found shorter
than that at the next start (truncated, emptied) is reported with the runs it lost
(:meth:`Journal.shrunk`), not taken for a fresh start.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from luftpause.runtime.errors import JournalWriteError
from luftpause.runtime.runs.manifest import MANIFEST_NAME, Manifest, Shrunk, read_manifest, write_manifest
from luftpause.runtime.runs.store import COMPACT_BYTES as COMPACT_BYTES
from luftpause.runtime.runs.store import Pending, RecordStore
from luftpause.runtime.runs.store import Record as Record
from luftpause.runtime.runs.store import encode as encode

log = logging.getLogger("luftpause.runtime.runs.journal")

JOURNAL_NAME = "runs.jsonl"


TASKS_JOURNAL_NAME = "tasks.jsonl"
"""The MCP tasks' journal beside it (:mod:`luftpause.runtime.mcp.tasks`): the same format rules."""

_TAIL_PROBE_BYTES = 64 * 1024
"""How much of the file's end :meth:`Journal.open` reads to find a torn last record (bytes); a
longer torn record is found by reading further back."""


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd``, repeating ``os.write`` after a short write. Raises
    ``OSError`` (including a write that makes no progress, as ``ENOSPC``)."""
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        if written <= 0:
            raise OSError(28, "no space left: a write made no progress")
        view = view[written:]


@dataclass(frozen=True, slots=True)
class DamagedLine:
    """A line of the journal that is not a record and is not its torn last line (module
    docstring): its ``number`` (1-based), why it is not a record, and what it still shows
    (:func:`salvage`: ``type``, ``handle``, ...)."""

    number: int
    reason: str
    salvaged: dict[str, Any] = field(default_factory=dict)

    @property
    def handle(self) -> str | None:
        """The run the line names, when that could still be read."""
        handle = self.salvaged.get("handle")
        return handle if isinstance(handle, str) and handle else None

    def describe(self, path: Path | str = JOURNAL_NAME) -> str:
        """``<file> line N (<type> record) is damaged: <reason>``."""
        kind = self.salvaged.get("type")
        what = f" ({kind} record)" if isinstance(kind, str) and kind.isidentifier() else ""
        return f"{Path(path).name} line {self.number}{what} is damaged: {self.reason}"


SALVAGED_FIELDS = ("type", "handle", "caller", "parent", "name", "task", "model", "serviceClass")
"""The string fields :func:`salvage` looks for in a damaged line (those that rebuild a run's
place: which run, whose, under which parent, asked what)."""

_NUMBER = r"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?"


def salvage(line: bytes | dict[str, Any]) -> dict[str, Any]:
    """What a damaged line still shows: each of :data:`SALVAGED_FIELDS` whose ``"key": "string"``
    is still intact (the first occurrence: records are written with their own fields first), and
    ``at`` (a number). A line that parsed as an object (but is no record) gives those of its keys
    that are strings. Best effort: nothing here is trusted beyond being shown."""
    if isinstance(line, dict):
        out: dict[str, Any] = {k: line[k] for k in SALVAGED_FIELDS if isinstance(line.get(k), str)}
        if isinstance(line.get("at"), int | float) and not isinstance(line.get("at"), bool):
            out["at"] = float(line["at"])
        return out
    text = line.decode("utf-8", errors="replace")
    out = {}
    for key in SALVAGED_FIELDS:
        found = re.search(rf'"{key}"\s*:\s*("(?:[^"\\\x00-\x1f]|\\.)*")', text)
        if found is None:
            continue
        try:
            value = json.loads(found.group(1))
        except ValueError:
            continue
        if isinstance(value, str):
            out[key] = value
    at = re.search(rf'"at"\s*:\s*({_NUMBER})', text)
    if at is not None:
        out["at"] = float(at.group(1))
    return out


def read_records(path: Path, on_damaged: Callable[[DamagedLine], None] | None = None) -> Iterator[Record]:
    """Every record of the journal at ``path`` in order (nothing if it does not exist); the file is
    read once and parsed with orjson.

    A torn last line (module docstring) is skipped with a warning. A damaged line is skipped with
    an error naming its line number and given to ``on_damaged`` (called in order, between the
    records around it). Neither is ever fatal.
    """
    for _, record in read_numbered(path, on_damaged):
        yield record


def read_numbered(
    path: Path, on_damaged: Callable[[DamagedLine], None] | None = None
) -> Iterator[tuple[int, Record]]:
    """:func:`read_records` with each record's line number (1-based)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return
    lines = data.split(b"\n")
    torn = len(lines) if not data.endswith(b"\n") else None
    yield from parse_lines(enumerate(lines, start=1), str(path), torn, on_damaged)


def parse_lines(
    lines: Iterable[tuple[int, bytes]],
    where: str,
    torn: int | None = None,
    on_damaged: Callable[[DamagedLine], None] | None = None,
) -> Iterator[tuple[int, Record]]:
    """The records of numbered journal ``lines`` (each one encoded record, as :func:`encode`
    writes it, without its ``\\n``), with their numbers; ``where`` names the journal in the log.
    A line numbered ``torn`` that is not a record is the torn last line (skipped with a warning);
    any other line that is not a record is damaged (:func:`read_records`). Shared by the file
    journal and the stores whose records are rows (:mod:`luftpause.runtime.runs.postgres`)."""
    for number, line in lines:
        if not line.strip():
            continue
        problem = ""
        try:
            record = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            try:  # lines the standard library wrote (ASCII-escaped lone surrogates: see encode)
                record = json.loads(line)
            except ValueError:
                record, problem = None, f"not JSON ({exc})"
        if isinstance(record, dict) and isinstance(record.get("handle"), str):
            yield number, record
            continue
        if number == torn:
            log.warning("%s line %d: torn last record (%d bytes), skipped", where, number, len(line))
            continue
        if not problem:
            shape = "an object" if isinstance(record, dict) else f"a JSON {type(record).__name__}"
            problem = f"not a journal record ({shape} with no handle)"
        damaged = DamagedLine(number, problem, salvage(record if isinstance(record, dict) else line))
        log.error("%s, %d bytes, skipped", damaged.describe(where), len(line))
        if on_damaged is not None:
            on_damaged(damaged)


class Journal(RecordStore):
    """The file journal of one runtime process (:class:`RecordStore`, written as the module
    docstring says): ``<state_dir>/runs.jsonl``, or ``file_name`` beside it (``tasks.jsonl``)."""

    def __init__(
        self, state_dir: Path, compact_bytes: int = COMPACT_BYTES, *, file_name: str = JOURNAL_NAME
    ) -> None:
        super().__init__(compact_bytes)
        self.state_dir = state_dir
        self.path = state_dir / file_name
        # Each file its own manifest (tasks.jsonl's once wrote runs.jsonl's, with its own size).
        manifest = MANIFEST_NAME if file_name == JOURNAL_NAME else f"{file_name}.manifest"
        self.manifest_path = state_dir / manifest
        self._fd: int | None = None

    @property
    def label(self) -> str:
        return str(self.path)

    @property
    def name(self) -> str:
        return self.path.name

    def numbered(
        self, on_damaged: Callable[[DamagedLine], None] | None = None
    ) -> Iterator[tuple[int, Record]]:
        """The records on disk with their line numbers (see :func:`read_numbered`)."""
        return read_numbered(self.path, on_damaged)

    def manifest(self) -> Manifest | None:
        """The manifest beside the journal (:func:`read_manifest`)."""
        return read_manifest(self.manifest_path)

    def shrunk(self) -> Shrunk | None:
        """Whether the journal on disk is shorter than its manifest says it was (truncated or
        emptied since it was last opened, compacted or closed), before it is opened."""
        manifest = self.manifest()
        if manifest is None:
            return None
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size >= manifest.bytes:
            return None
        return Shrunk(size, manifest.bytes, manifest.runs, manifest)

    def _write_manifest(self, why: str, size: int, runs: Iterable[str]) -> None:
        write_manifest(self.manifest_path, Manifest(size, tuple(sorted(runs)), why, time.time()))

    def check_writable(self) -> None:
        """Create the state directory if needed and make sure a file can be created in it. Raises
        ``OSError`` naming the path (read-only file system, permissions)."""
        self.state_dir.mkdir(parents=True, exist_ok=True)
        probe = self.state_dir / f".{self.path.name}.probe"
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.close(fd)
        probe.unlink()

    def _open_medium(self, held: set[str]) -> int:
        # A torn last line is cut off first, so the next record starts on a line of its own; the
        # manifest records the runs the replay found with the journal's size (Manifest).
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self._cut_torn_tail()
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        size = os.fstat(self._fd).st_size
        self._write_manifest("open", size, held)
        return size

    def _cut_torn_tail(self) -> None:
        # Reads only the end of the file (the replay has read the whole file once already).
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            return
        if size == 0:
            return
        with open(self.path, "rb") as f:
            probe = _TAIL_PROBE_BYTES
            while True:
                start = max(0, size - probe)
                f.seek(start)
                tail = f.read(size - start)
                if tail.endswith(b"\n"):
                    return
                newline = tail.rfind(b"\n")
                if newline >= 0 or start == 0:
                    keep = start + newline + 1
                    break
                probe *= 4
        os.truncate(self.path, keep)
        log.warning("%s: cut a torn last record of %d bytes", self.path, size - keep)

    def _close_medium(self, held: set[str]) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self._write_manifest("close", self._size, held)

    def _write_batch(self, batch: list[Pending]) -> None:
        written: list[concurrent.futures.Future[None]] = []
        for line, _, done in batch:
            try:
                if self._fd is None:
                    raise OSError(9, "journal closed")
                write_all(self._fd, line)
            except OSError as exc:
                done.set_exception(JournalWriteError(f"journal {self.path}: {exc}"))
                continue
            self._size += len(line)
            written.append(done)
        try:
            if written and self._fd is not None:
                os.fsync(self._fd)
        except OSError as exc:
            for done in written:
                done.set_exception(JournalWriteError(f"journal {self.path}: fsync: {exc}"))
            return
        for done in written:
            done.set_result(None)

    def _replace_all(self, records: list[Record]) -> int | None:
        # Temporary file, fsync, rename over the journal, fsync of the directory.
        tmp = self.path.with_name(self.path.name + ".tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            try:
                for record in records:
                    write_all(fd, encode(record))
                os.fsync(fd)
                size = os.fstat(fd).st_size
            finally:
                os.close(fd)
            held = {str(r["handle"]) for r in records if r.get("type") in ("start", "run")}
            with self._held_lock:
                # Before the rename: a crash between the two leaves a journal longer than its
                # manifest says, never shorter (which would read as records lost).
                self._held = held
                self._write_manifest("compaction", size, held)
            os.replace(tmp, self.path)
            dir_fd = os.open(self.state_dir, os.O_RDONLY)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except OSError as exc:
            log.error("journal %s: compaction failed, the journal is kept as it was: %s", self.path, exc)
            return None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return self.path.stat().st_size
