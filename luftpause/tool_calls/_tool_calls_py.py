"""The ``tool_call_id -> run`` table, pure-Python twin of ``_speedups/_tool_calls_c.pyx``.

A client that sends no ``x-luftpause-run-id`` is still known by the tool-call ids in its messages: the
dataplane remembers every id an engine emitted in a response, with the run of that turn, and looks up
the ids a later request carries (docs/architecture.md "The proxy"; issue 4); the scheduler keeps
the same table for every dataplane's ids. Ids are the engine's own,
byte-identical: nothing here rewrites them.

Rules (both twins, ``tests/common/test_tool_call_run_table.py`` checks them on each and
compares them on random operation sequences):

* Time is an input. Every method takes ``now``, seconds on a monotonic clock (``loop.time()``); the
  table never reads a clock. A ``now`` earlier than the latest one passed so far, or NaN, counts as
  that latest one, so the order in which ids were remembered is also the order in which they expire.
* An id remembered at ``t`` lives while ``now < t + ttl_s`` and is expired from ``now >= t + ttl_s``
  on: at exactly ``ttl_s`` after it was remembered it no longer counts. ``t + ttl_s`` is computed
  once, as a float, when the id is remembered.
* Remembering an id that is already held (engines reuse ``call_0`` in every response) moves it to
  the run that emitted it now, with a fresh expiry: a reused id resolves to its most recent emitter.
* Empty ids, and items that are not ``str``, are never remembered nor looked up: engines send
  continuation deltas with ``"id": ""``, and an empty id would join unrelated runs.
* When the ids of one request name several runs, the run of the id remembered most recently wins:
  it is the run that answered last, so the request most likely continues it.
* Expired ids stay held (and count in ``len``) until :meth:`ToolCallTable.prune` drops them; the
  dataplane prunes every 60 s. They are never returned by a lookup.
* Memory is bounded twice: by the expiry, and by ``max_entries`` (default 1,000,000 ids). A
  remember that would hold more evicts the ids remembered least recently, first. A client can make
  an engine emit ids without end, but not grow the table past the bound; the ids evicted first are
  the oldest, which are the least useful, since a request is identified by its latest tool round.

Which ids of a request are looked up (:func:`request_tool_call_ids`): those of its latest tool
round. Walking the messages from the end, it takes every ``tool`` message's ``tool_call_id`` and the
``tool_calls[*].id`` of ``assistant`` messages, and stops after the first ``assistant`` message with
tool calls once it holds an id. The results of the latest round answer calls emitted by the turn
this request continues, so they name the run most precisely; older rounds could only name it again,
or -- where an engine reuses ``call_0`` -- name whichever other run emitted that id last. A long
history costs nothing past its latest round, and at most ``MAX_LOOKUP_IDS`` ids are taken.
"""

from __future__ import annotations

import math
import operator
import sys
from collections import OrderedDict
from collections.abc import Iterable

__all__ = [
    "DEFAULT_MAX_ENTRIES",
    "DEFAULT_TTL_S",
    "MAX_LOOKUP_IDS",
    "ToolCallTable",
    "completion_tool_call_ids",
    "request_tool_call_ids",
]

DEFAULT_TTL_S = 1800.0
"""How long an emitted tool-call id is remembered, in seconds (docs/architecture.md "Constants": 30 min)."""

DEFAULT_MAX_ENTRIES = 1_000_000
"""At most this many ids are held. An id of 30 characters costs about 190 bytes in the compiled twin and
290 in this one (measured with tracemalloc), so 190-290 MB at worst: reached only by a flood, since
10,000 runs emitting a round of 1-4 ids a minute hold about 600,000."""

MAX_LOOKUP_IDS = 64
"""At most this many ids are taken from one request: far more than one tool round has, and a
request of a hundred thousand tool messages costs no more than one of 64."""


class ToolCallTable:
    """Which run emitted each tool-call id, for ``ttl_s`` seconds; see the module docstring.

    ``ToolCallTable(ttl_s=1800.0, max_entries=1_000_000)``: ``ttl_s`` is the lifetime of an id in
    seconds, finite and above 0 (else ``ValueError``); ``max_entries`` the most ids held, at least 1
    and at most ``sys.maxsize`` (``TypeError`` if it is not an integer, else ``ValueError``).

    ``len(table)`` is the number of ids held, expired ones not yet pruned included. ``evictions``
    counts the ids dropped so far because the table was full.
    """

    __slots__ = ("_entries", "_latest", "_max_entries", "_seq", "_ttl_s", "evictions")

    def __init__(self, ttl_s: float = DEFAULT_TTL_S, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        ttl_s = float(ttl_s)
        if not (ttl_s > 0.0 and math.isfinite(ttl_s)):
            raise ValueError(f"ttl_s must be a finite number of seconds above 0, not {ttl_s}")
        max_entries = operator.index(max_entries)
        if not 1 <= max_entries <= sys.maxsize:  # the compiled twin holds it in a Py_ssize_t
            raise ValueError(f"max_entries must be at least 1 and at most {sys.maxsize}, not {max_entries}")
        self._ttl_s = ttl_s
        self._max_entries = max_entries
        # id -> (run id, expiry in seconds, sequence number), oldest remembered first. The sequence
        # number orders ids remembered at the same ``now``, so "most recent" is never a tie.
        self._entries: OrderedDict[str, tuple[str, float, int]] = OrderedDict()
        self._seq = 0
        self._latest = -math.inf
        self.evictions: int = 0

    @property
    def ttl_s(self) -> float:
        """The lifetime of an id, in seconds."""
        return self._ttl_s

    @property
    def max_entries(self) -> int:
        """The most ids held at once."""
        return self._max_entries

    def __len__(self) -> int:
        return len(self._entries)

    def _clock(self, now: float) -> float:
        now = float(now)
        if now > self._latest:  # False for NaN: a NaN counts as the latest time
            self._latest = now
        return self._latest

    def remember(self, run_id: str, ids: Iterable[object], now: float) -> None:
        """Note that a response of run ``run_id`` emitted the tool-call ``ids`` at ``now`` (seconds).

        Empty ids and items that are not ``str`` are skipped; an id already held now belongs to
        ``run_id``. Raises ``TypeError`` if ``run_id`` is not a ``str``, ``ValueError`` if it is
        empty.
        """
        if type(run_id) is not str:
            raise TypeError(f"run_id must be a str, not {type(run_id).__name__}")
        if not run_id:
            raise ValueError("run_id must not be empty")
        expires = self._clock(now) + self._ttl_s
        entries = self._entries
        for call_id in ids:
            if type(call_id) is not str or not call_id:
                continue
            self._seq += 1
            if call_id in entries:
                entries.move_to_end(call_id)
            entries[call_id] = (run_id, expires, self._seq)
            if len(entries) > self._max_entries:
                entries.popitem(last=False)
                self.evictions += 1

    def lookup(self, ids: Iterable[object], now: float) -> str | None:
        """The run that most recently emitted one of ``ids`` and has not expired, else ``None``.

        ``ids`` are a request's tool-call ids (see :func:`request_tool_call_ids`); empty ids and
        items that are not ``str`` are skipped. Never raises on the content of ``ids``.
        """
        now = self._clock(now)
        entries = self._entries
        best: tuple[str, float, int] | None = None
        for call_id in ids:
            if type(call_id) is not str or not call_id:
                continue
            entry = entries.get(call_id)
            if entry is None or now >= entry[1]:
                continue
            if best is None or entry[2] > best[2]:
                best = entry
        return None if best is None else best[0]

    def prune(self, now: float) -> int:
        """Drop every id expired at ``now`` (seconds); return how many were dropped."""
        now = self._clock(now)
        entries = self._entries
        dropped = 0
        # Oldest first, and expiry follows the order of remembering: stop at the first live id.
        while entries:
            oldest = next(iter(entries.values()))
            if now < oldest[1]:
                break
            entries.popitem(last=False)
            dropped += 1
        return dropped


def request_tool_call_ids(messages: object) -> list[str]:
    """The tool-call ids of the latest tool round in a request's ``messages``, to look its run up.

    ``messages`` is the parsed ``messages`` array of an OpenAI Chat Completions request (API
    reference, "Create chat completion"). Walking from the last message back, it takes every
    ``tool`` message's ``tool_call_id`` and the ``tool_calls[*].id`` of ``assistant`` messages, and
    stops after the first ``assistant`` message with a ``tool_calls`` list once it holds an id (see
    the module docstring for why). Returns distinct non-empty ids in document order (each where it
    last occurs), at most ``MAX_LOOKUP_IDS``: the latest ones.
    Never raises: anything not of that shape (a non-list, non-dict messages, missing or non-string
    fields) is passed over.
    """
    if type(messages) is not list:
        return []
    found: list[str] = []
    for message in reversed(messages):
        if type(message) is not dict:
            continue
        role = message.get("role")
        if type(role) is not str:
            continue
        if role == "tool":
            call_id = message.get("tool_call_id")
            if type(call_id) is str and call_id and call_id not in found:
                found.append(call_id)
                if len(found) == MAX_LOOKUP_IDS:
                    break
        elif role == "assistant":
            calls = message.get("tool_calls")
            if type(calls) is not list:
                continue
            # backwards, like the messages, so that the reversal below gives the document order
            for call in reversed(calls):
                if type(call) is not dict:
                    continue
                call_id = call.get("id")
                if type(call_id) is str and call_id and call_id not in found:
                    found.append(call_id)
                    if len(found) == MAX_LOOKUP_IDS:
                        break
            if found:  # the latest round that carries an id: older rounds are not read
                break
    found.reverse()
    return found


def completion_tool_call_ids(completion: object) -> list[str]:
    """The tool-call ids a non-streamed response emitted, to remember them.

    ``completion`` is a parsed OpenAI ``chat.completion`` object (API reference, "The chat
    completion object"): its ``choices[*].message.tool_calls[*].id``. Returns distinct non-empty
    ids in order of first appearance, as ``SSEScanner.tool_call_ids`` does for a stream. Never
    raises: anything not of that shape is passed over.
    """
    found: list[str] = []
    seen: set[str] = set()  # an engine can be made to emit any number of calls
    if type(completion) is not dict:
        return found
    choices = completion.get("choices")
    if type(choices) is not list:
        return found
    for choice in choices:
        if type(choice) is not dict:
            continue
        message = choice.get("message")
        if type(message) is not dict:
            continue
        calls = message.get("tool_calls")
        if type(calls) is not list:
            continue
        for call in calls:
            if type(call) is dict:
                call_id = call.get("id")
                if type(call_id) is str and call_id and call_id not in seen:
                    seen.add(call_id)
                    found.append(call_id)
    return found
