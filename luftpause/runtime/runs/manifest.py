"""The journal's manifest: what ``runs.jsonl`` held when it was last opened, compacted or closed,
so that a journal found shorter than that (truncated, emptied, removed) is reported as records
lost rather than taken for a fresh start (docs/architecture.md "Runs and their journal").

``runs.jsonl.manifest`` beside the journal, one JSON object, replaced atomically (temporary file,
fsync, rename)::

    {"bytes": int, "runs": [handle], "why": "open" | "compaction" | "close", "at": Unix seconds}

Between two of those moments the journal only grows (records are appended; a torn last line
makes it longer, never shorter), so ``bytes`` is a floor. A compaction writes the manifest before
it renames the new journal into place: a crash between the two leaves a journal longer than the
manifest says, never shorter.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("luftpause.runtime.runs.journal")

MANIFEST_NAME = "runs.jsonl.manifest"
"""Beside the journal: what it held when last opened, compacted or closed (:class:`Manifest`)."""

_WHEN = {"open": "opened", "compaction": "compacted", "close": "closed"}


@dataclass(frozen=True, slots=True)
class Manifest:
    """What the journal held when it was last opened, compacted or closed (module docstring): a
    journal found shorter than ``bytes`` lost records, and the ``runs`` it held then that the
    replay does not find are lost (:meth:`~luftpause.runtime.runs.journal.Journal.shrunk`)."""

    bytes: int
    runs: tuple[str, ...]
    why: str
    at: float

    def to_json(self) -> dict[str, Any]:
        return {"bytes": self.bytes, "runs": list(self.runs), "why": self.why, "at": self.at}

    @classmethod
    def from_json(cls, value: Any) -> Manifest:
        """Raises ``ValueError`` for a value of another shape."""
        if not isinstance(value, dict):
            raise ValueError("not an object")
        size, runs = value.get("bytes"), value.get("runs")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ValueError(f"bytes: {size!r}")
        if not isinstance(runs, list) or not all(isinstance(h, str) for h in runs):
            raise ValueError("runs: not a list of handles")
        at = value.get("at")
        return cls(
            size, tuple(runs), str(value.get("why") or ""), float(at) if isinstance(at, int | float) else 0.0
        )


@dataclass(frozen=True, slots=True)
class Shrunk:
    """The journal is shorter than its manifest says it was (:meth:`Journal.shrunk`): ``found``
    bytes where ``expected`` were, and the runs it held then (``held``)."""

    found: int
    expected: int
    held: tuple[str, ...]
    since: Manifest

    def describe(self, path: Path | str) -> str:
        """``runs.jsonl is empty/truncated: N bytes, but it held M bytes and K runs when last <why>``."""
        state = "empty (or missing)" if self.found == 0 else "truncated"
        return (
            f"{Path(path).name} is {state}: {self.found} bytes, but it held {self.expected} bytes and "
            f"{len(self.held)} runs when it was last {_WHEN.get(self.since.why, 'written')}"
        )


def read_manifest(path: Path) -> Manifest | None:
    """The manifest at ``path``, or ``None``: none yet (a journal older than manifests, a fresh
    state directory), or one that cannot be read, which is logged as an error."""
    try:
        return Manifest.from_json(orjson.loads(path.read_bytes()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        log.error("%s cannot be read, so a shortened journal would go unnoticed: %s", path, exc)
        return None


def write_manifest(path: Path, manifest: Manifest) -> None:
    """Replace the manifest at ``path`` atomically; an ``OSError`` is logged, never raised (the
    journal itself is what must be durable)."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(orjson.dumps(manifest.to_json()))
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        log.error("%s could not be written: %s", path, exc)
