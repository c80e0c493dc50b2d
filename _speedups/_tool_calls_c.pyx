# cython: language_level=3, boundscheck=False, wraparound=False
"""The ``tool_call_id -> run`` table, compiled twin of ``luftpause/tool_calls/_tool_calls_py.py``.

Same behaviour, same rules; see the pure twin for the full account (expiry at exactly ``ttl_s``,
a reused id moves to its latest emitter, empty ids ignored, the most recently remembered id of a
request wins, at most ``max_entries`` ids held, the oldest evicted first).

Where the pure twin keeps an ``OrderedDict`` of tuples, this one keeps a ``dict`` of small C-level
entries threaded on a doubly linked list, oldest first: a lookup is one dict probe and two field
reads per id, and moving a reused id to the newest end, evicting the oldest and pruning are O(1)
per id. The entries are not tracked by the cyclic garbage collector (a million of them would only
slow its full collections), so every path that takes one off the list breaks its links, and the
table breaks the rest when it is freed.
"""

cimport cython

import math
import operator
import sys

DEFAULT_TTL_S = 1800.0
DEFAULT_MAX_ENTRIES = 1_000_000
MAX_LOOKUP_IDS = 64

cdef Py_ssize_t _MAX_LOOKUP_IDS = MAX_LOOKUP_IDS
cdef object _index = operator.index
cdef object _isfinite = math.isfinite
cdef object _MAXSIZE = sys.maxsize
cdef str _ROLE = "role"
cdef str _TOOL = "tool"
cdef str _ASSISTANT = "assistant"
cdef str _TOOL_CALL_ID = "tool_call_id"
cdef str _TOOL_CALLS = "tool_calls"
cdef str _ID = "id"
cdef str _CHOICES = "choices"
cdef str _MESSAGE = "message"


@cython.final
@cython.no_gc
@cython.freelist(64)
cdef class _Entry:
    """One remembered id: its run, when it expires (seconds), its place in the order of remembering."""

    cdef str key
    cdef str run_id
    cdef double expires
    cdef long long seq
    cdef _Entry prev  # remembered just before this one (older), or None
    cdef _Entry next  # remembered just after this one (newer), or None


@cython.final
@cython.no_gc_clear
cdef class ToolCallTable:
    """Which run emitted each tool-call id, for ``ttl_s`` seconds; see the pure twin.

    ``ToolCallTable(ttl_s=1800.0, max_entries=1_000_000)``; raises ``ValueError`` unless ``ttl_s``
    is finite and above 0, ``TypeError`` if ``max_entries`` is not an integer, ``ValueError`` if it
    is below 1 or above ``sys.maxsize``. ``len(table)`` counts the ids held; ``evictions`` the ids dropped for the bound.
    """

    cdef dict _entries
    cdef _Entry _head  # the oldest entry, first to expire
    cdef _Entry _tail  # the newest
    cdef double _ttl_s
    cdef double _latest
    cdef long long _seq
    cdef Py_ssize_t _max_entries
    cdef readonly Py_ssize_t evictions

    def __init__(self, ttl_s=DEFAULT_TTL_S, max_entries=DEFAULT_MAX_ENTRIES) -> None:
        # untyped arguments, converted as the pure twin converts them: float() and operator.index()
        cdef double ttl = float(ttl_s)
        if not (ttl > 0.0 and _isfinite(ttl)):
            raise ValueError(f"ttl_s must be a finite number of seconds above 0, not {ttl}")
        bound = _index(max_entries)
        if not 1 <= bound <= _MAXSIZE:
            raise ValueError(f"max_entries must be at least 1 and at most {_MAXSIZE}, not {bound}")
        self._clear()
        self._entries = {}
        self._ttl_s = ttl
        self._max_entries = bound
        self._seq = 0
        self._latest = -math.inf
        self.evictions = 0

    def __dealloc__(self) -> None:
        self._clear()

    cdef void _clear(self) noexcept:
        """Break every link of the list: the entries are not tracked by the garbage collector."""
        cdef _Entry entry = self._head
        cdef _Entry following
        while entry is not None:
            following = entry.next
            entry.prev = None
            entry.next = None
            entry = following
        self._head = None
        self._tail = None

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

    cdef inline double _clock(self, object now) except? -1.0:
        cdef double t = float(now)
        if t > self._latest:  # False for NaN: a NaN counts as the latest time
            self._latest = t
        return self._latest

    cdef inline void _unlink(self, _Entry entry) noexcept:
        if entry.prev is None:
            self._head = entry.next
        else:
            entry.prev.next = entry.next
        if entry.next is None:
            self._tail = entry.prev
        else:
            entry.next.prev = entry.prev
        entry.prev = None
        entry.next = None

    cdef inline void _append(self, _Entry entry) noexcept:
        entry.prev = self._tail
        entry.next = None
        if self._tail is None:
            self._head = entry
        else:
            self._tail.next = entry
        self._tail = entry

    cdef int _drop_oldest(self) except -1:
        cdef _Entry entry = self._head
        self._unlink(entry)
        del self._entries[entry.key]
        return 0

    def remember(self, run_id, ids, now) -> None:
        """Note that a response of run ``run_id`` emitted the tool-call ``ids`` at ``now`` (seconds).

        Empty ids and items that are not ``str`` are skipped; an id already held now belongs to
        ``run_id``. Raises ``TypeError`` if ``run_id`` is not a ``str``, ``ValueError`` if it is
        empty.
        """
        cdef _Entry entry
        cdef object found
        cdef double expires
        if type(run_id) is not str:
            raise TypeError(f"run_id must be a str, not {type(run_id).__name__}")
        if len(<str>run_id) == 0:
            raise ValueError("run_id must not be empty")
        expires = self._clock(now) + self._ttl_s
        for call_id in ids:
            if type(call_id) is not str or len(<str>call_id) == 0:
                continue
            self._seq += 1
            found = self._entries.get(call_id)
            if found is None:
                entry = _Entry.__new__(_Entry)
                entry.key = <str>call_id
                self._entries[call_id] = entry
            else:
                entry = <_Entry>found
                self._unlink(entry)
            entry.run_id = <str>run_id
            entry.expires = expires
            entry.seq = self._seq
            self._append(entry)
            if len(self._entries) > self._max_entries:
                self._drop_oldest()
                self.evictions += 1

    def lookup(self, ids, now):
        """The run that most recently emitted one of ``ids`` and has not expired, else ``None``.

        Empty ids and items that are not ``str`` are skipped. Never raises on the content of
        ``ids``.
        """
        cdef double t = self._clock(now)
        cdef _Entry best = None
        cdef _Entry entry
        cdef object found
        for call_id in ids:
            if type(call_id) is not str or len(<str>call_id) == 0:
                continue
            found = self._entries.get(call_id)
            if found is None:
                continue
            entry = <_Entry>found
            if t >= entry.expires:
                continue
            if best is None or entry.seq > best.seq:
                best = entry
        return None if best is None else best.run_id

    def prune(self, now) -> int:
        """Drop every id expired at ``now`` (seconds); return how many were dropped."""
        cdef double t = self._clock(now)
        cdef Py_ssize_t dropped = 0
        # Oldest first, and expiry follows the order of remembering: stop at the first live id.
        while self._head is not None and t >= self._head.expires:
            self._drop_oldest()
            dropped += 1
        return dropped


cdef inline bint _is_id(object value) noexcept:
    return type(value) is str and len(<str>value) != 0


def request_tool_call_ids(messages) -> list:
    """The tool-call ids of the latest tool round in a request's ``messages``; see the pure twin.

    Distinct non-empty ids in document order, at most ``MAX_LOOKUP_IDS``. Never raises.
    """
    cdef list found = []
    cdef object role, calls, call_id
    if type(messages) is not list:
        return found
    for message in reversed(<list>messages):
        if type(message) is not dict:
            continue
        role = (<dict>message).get(_ROLE)
        if type(role) is not str:
            continue
        if role == _TOOL:
            call_id = (<dict>message).get(_TOOL_CALL_ID)
            if _is_id(call_id) and call_id not in found:
                found.append(call_id)
                if len(found) == _MAX_LOOKUP_IDS:
                    break
        elif role == _ASSISTANT:
            calls = (<dict>message).get(_TOOL_CALLS)
            if type(calls) is not list:
                continue
            for call in reversed(<list>calls):
                if type(call) is not dict:
                    continue
                call_id = (<dict>call).get(_ID)
                if _is_id(call_id) and call_id not in found:
                    found.append(call_id)
                    if len(found) == _MAX_LOOKUP_IDS:
                        break
            if len(found) != 0:  # the latest round that carries an id: older rounds are not read
                break
    found.reverse()
    return found


def completion_tool_call_ids(completion) -> list:
    """The tool-call ids a non-streamed ``chat.completion`` emitted; see the pure twin. Never raises."""
    cdef list found = []
    cdef set seen = set()
    cdef object choices, message, calls, call_id
    if type(completion) is not dict:
        return found
    choices = (<dict>completion).get(_CHOICES)
    if type(choices) is not list:
        return found
    for choice in <list>choices:
        if type(choice) is not dict:
            continue
        message = (<dict>choice).get(_MESSAGE)
        if type(message) is not dict:
            continue
        calls = (<dict>message).get(_TOOL_CALLS)
        if type(calls) is not list:
            continue
        for call in <list>calls:
            if type(call) is dict:
                call_id = (<dict>call).get(_ID)
                if _is_id(call_id) and call_id not in seen:
                    seen.add(call_id)
                    found.append(call_id)
    return found
