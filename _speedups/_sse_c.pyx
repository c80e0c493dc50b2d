# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The incremental SSE event scanner, compiled twin of ``luftpause/dataplane/_sse_py.py``.

Same behaviour, same attributes, same rules (WHATWG HTML 9.2.6 "Interpreting an event stream";
OpenAI ``chat.completion.chunk`` payloads); see the pure twin for the full account. Here the byte
work -- finding line ends with ``memchr``, matching ``data`` fields, holding the unfinished line and
the event being read -- runs in C over the read's buffer, and Python objects are made only for a
``data`` value and for what orjson returns from a complete payload.

What is held of one event is bounded by ``max_event_bytes`` exactly as in the pure twin: the event's
data so far plus the line being read; an event that would need more is dropped, read past up to its
blank line and counted in ``oversized_events``.

The natively served Messages and Responses answers are read by dialects of this scanner in their
own extension module (``_facts_c.pyx``), beside their pure twins.
"""

from cpython.bytearray cimport PyByteArray_AS_STRING, PyByteArray_GET_SIZE, PyByteArray_Resize
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize, PyBytes_GET_SIZE
from libc.string cimport memchr, memcmp, memcpy

import operator
import sys

import orjson

DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024

cdef object _loads = orjson.loads
cdef object _index = operator.index
cdef object _MAXSIZE = sys.maxsize
cdef bytes _DONE = b"[DONE]"
cdef str _TOOL_CALLS = "tool_calls"
cdef str _ERROR = "error"
cdef str _NO_ERROR_MESSAGE = "engine error"
cdef Py_ssize_t _MAX_ERROR_CHARS = 500

cdef enum:
    LF = 10
    CR = 13


cdef inline int _append(bytearray buf, const unsigned char* s, Py_ssize_t n) except -1:
    """Append ``n`` bytes at ``s`` to ``buf``, with no temporary bytes object."""
    cdef Py_ssize_t size = PyByteArray_GET_SIZE(buf)
    PyByteArray_Resize(buf, size + n)
    memcpy(PyByteArray_AS_STRING(buf) + size, s, n)
    return 0


cdef inline Py_ssize_t _null_after(const unsigned char* s, Py_ssize_t j, Py_ssize_t n) noexcept:
    """The offset after ``: null`` (JSON space allowed around the colon) at ``j``, else -1."""
    j = _skip_json_space(s, j, n)
    if j >= n or s[j] != b':':
        return -1
    j = _skip_json_space(s, j + 1, n)
    if n - j >= 4 and memcmp(s + j, b"null", 4) == 0:
        return j + 4
    return -1


cdef bint _is_inert(const unsigned char* s, Py_ssize_t n) noexcept:
    """Whether a payload provably changes nothing once the first token has been seen.

    After the first token, a payload matters only through a ``usage``, ``tool_calls``,
    ``finish_reason`` or ``error`` key whose value is not null, or an ``"object": "error"``. Without
    ``\\u`` escapes those keys can only be written as the literal bytes ``"usage"`` etc., so if every
    such byte run (in a key or not: the test errs towards parsing) is followed by ``: null``,
    parsing the payload would change nothing and orjson is not called. That covers ``"object":
    "error"`` too: its value is the byte run ``"error"``, followed by no colon, so it is parsed;
    ``"object": "chat.completion.chunk"``, on every chunk, stays inert. Most chunks of a stream are
    content deltas like that. Anything else, including what is not JSON at all, is left to orjson
    and the full reading.

    First ``memchr`` from backslash to backslash for a ``\\u`` (none in most payloads), then one
    pass over the bytes in a plain loop, comparing the bytes after each quote with the four runs
    (the pure twin's regular expression finds the same runs, left to right, each resuming after
    the last, so the decisions are the same). Calling ``memchr`` from quote to quote (about 40 in a
    content delta's 260 bytes), or glibc's ``memmem`` once per run, cost two to three times as
    much: on the bench's 19-event answer the scanner took 24 us, then 18 (``memmem``), now 9.
    """
    cdef Py_ssize_t i
    cdef Py_ssize_t key_len
    cdef unsigned char c
    cdef const unsigned char* q = <const unsigned char*>memchr(s, b'\\', n)
    while q != NULL:  # backslashes are rare outside escaped text: memchr skips to each at once
        i = q - s + 1
        if i < n and s[i] == b'u':
            return False
        q = <const unsigned char*>memchr(s + i, b'\\', n - i)
    i = 0
    while i < n:
        c = s[i]
        if c == b'"' and i + 1 < n:
            c = s[i + 1]
            key_len = 0
            if c == b'f':
                if n - i >= 15 and memcmp(s + i + 1, b'finish_reason"', 14) == 0:
                    key_len = 15
            elif c == b'u':
                if n - i >= 7 and memcmp(s + i + 1, b'usage"', 6) == 0:
                    key_len = 7
            elif c == b't':
                if n - i >= 12 and memcmp(s + i + 1, b'tool_calls"', 11) == 0:
                    key_len = 12
            elif c == b'e':
                if n - i >= 7 and memcmp(s + i + 1, b'error"', 6) == 0:
                    key_len = 7
            if key_len:
                i = _null_after(s, i + key_len, n)
                if i < 0:
                    return False
                continue
        i += 1
    return True


cdef object _error_message(dict d):
    """The message of ``d`` if it is an engine's error event, else ``None`` (see the pure twin)."""
    cdef object error = d.get(_ERROR)
    cdef bint is_error_object = d.get("object") == _ERROR
    cdef object message = None
    if error is None and not is_error_object:
        return None
    if type(error) is dict:
        message = (<dict>error).get("message")
    elif type(error) is str:
        message = error
    if (type(message) is not str or len(<str>message) == 0) and is_error_object:
        message = d.get("message")
    if type(message) is not str or len(<str>message) == 0:
        return _NO_ERROR_MESSAGE
    return (<str>message)[:_MAX_ERROR_CHARS]


cdef class SSEScanner:
    """Scan one turn's event stream, fed in reads of any size, and keep what it says.

    ``SSEScanner(keep_events=False, max_event_bytes=DEFAULT_MAX_EVENT_BYTES, choices=1)``; raises
    ``TypeError`` if ``max_event_bytes`` or ``choices`` is not an integer, ``ValueError`` if it is
    below 1 or above ``sys.maxsize``.

    Attributes are read-only from Python: ``first_token_seen``, ``finish_reason``,
    ``choices_finished``, ``saw_tool_calls``, ``tool_call_ids``, ``prompt_tokens``,
    ``completion_tokens``, ``cached_tokens``, ``response_id``, ``response_model``, ``done``, ``error``, ``event_count``, ``events``, ``oversized_events``,
    ``buffered_bytes``, ``max_event_bytes``, ``choices``; their meaning is given in
    ``luftpause.dataplane._sse_py``. Its C attributes and methods are declared in
    ``luftpause.dataplane._sse_c.pxd``, where the dialects of ``_facts_c.pyx`` that subclass it read
    them.
    """

    def __init__(
        self, keep_events: bool = False, max_event_bytes=DEFAULT_MAX_EVENT_BYTES, choices=1
    ) -> None:
        # untyped: an ``int`` annotation would make Cython accept 1.5 as 1
        bound = _index(max_event_bytes)
        if not 1 <= bound <= _MAXSIZE:
            raise ValueError(f"max_event_bytes must be at least 1 and at most {_MAXSIZE}, not {bound}")
        count = _index(choices)
        if not 1 <= count <= _MAXSIZE:
            raise ValueError(f"choices must be at least 1 and at most {_MAXSIZE}, not {count}")
        self.max_event_bytes = bound
        self.choices = count
        self.choices_finished = False
        self._finished_choices = set()
        self.oversized_events = 0
        self.first_token_seen = False
        self.finish_reason = None
        self.saw_tool_calls = False
        self.tool_call_ids = []
        self.prompt_tokens = -1
        self.completion_tokens = -1
        self.cached_tokens = -1
        self.response_id = None
        self.response_model = None
        self.done = False
        self.error = None
        self.event_count = 0
        self.events = []
        self._keep_events = bool(keep_events)
        self._seen_ids = set()
        self._tail = bytearray()
        self._n_data = 0
        self._data = None
        self._data_lines = None
        self._data_size = 0
        self._skipping = False
        self._line_open = False
        self._skip_lf = False
        self._at_start = True

    @property
    def buffered_bytes(self) -> int:
        """Bytes held now of the event being read: its data so far plus the unfinished line."""
        return self._data_size + PyByteArray_GET_SIZE(self._tail)

    def feed(self, chunk) -> bool:
        """Consume the next ``chunk`` read from the engine (``bytes`` or ``bytearray``), cut anywhere.

        Returns ``True`` iff the turn's first token was seen inside this chunk, which happens at
        most once per scanner. Never raises on any content of ``chunk``.
        """
        cdef bytes buf = chunk if type(chunk) is bytes else bytes(memoryview(chunk))
        cdef const unsigned char* p = <const unsigned char*>PyBytes_AS_STRING(buf)
        cdef Py_ssize_t n = PyBytes_GET_SIZE(buf)
        cdef Py_ssize_t pos = 0
        cdef Py_ssize_t end
        cdef Py_ssize_t held
        cdef Py_ssize_t cr = -1  # offset of the next CR at or after pos, or n if none
        cdef const unsigned char* hit
        cdef bint had_first_token = self.first_token_seen
        cdef bytes line
        if n == 0:
            return False
        if self._skip_lf:
            self._skip_lf = False
            if p[0] == LF:
                pos = 1
        while pos < n:
            # The end of the line is the first CR or LF. CR is rare in practice, so its next
            # position is looked up once and reused until the scan passes it.
            if cr < pos:
                hit = <const unsigned char*>memchr(p + pos, CR, n - pos)
                cr = n if hit == NULL else hit - p
            hit = <const unsigned char*>memchr(p + pos, LF, cr - pos)
            end = cr if hit == NULL else hit - p
            if end == n:
                # No line end in the rest of this read: keep it for the next. Each byte is
                # searched only once, so a long line read in many pieces costs linear time.
                self._hold(p + pos, n - pos)
                break
            if self._skipping:
                if end == pos and not self._line_open:
                    self._skipping = False  # the blank line that ends the dropped event
                self._line_open = False
            else:
                held = PyByteArray_GET_SIZE(self._tail)
                if self._data_size + held + (end - pos) > self.max_event_bytes:
                    self._drop(False)
                elif held:
                    _append(self._tail, p + pos, end - pos)
                    line = PyBytes_FromStringAndSize(PyByteArray_AS_STRING(self._tail), held + end - pos)
                    del self._tail[:]
                    self._line(<const unsigned char*>PyBytes_AS_STRING(line), PyBytes_GET_SIZE(line))
                else:
                    self._line(p + pos, end - pos)
            if p[end] == CR:
                if end + 1 == n:
                    self._skip_lf = True
                    pos = n
                elif p[end + 1] == LF:
                    pos = end + 2
                else:
                    pos = end + 1
            else:
                pos = end + 1
        return self.first_token_seen and not had_first_token

    cdef int _hold(self, const unsigned char* s, Py_ssize_t n) except -1:
        """Keep the ``n`` > 0 bytes at ``s``, the start of a line whose end has not arrived yet."""
        if self._skipping:
            self._line_open = True
        elif self._data_size + PyByteArray_GET_SIZE(self._tail) + n > self.max_event_bytes:
            self._drop(True)
        else:
            _append(self._tail, s, n)
        return 0

    cdef int _drop(self, bint line_open) except -1:
        """Give up the event being read, which needs more than ``max_event_bytes``."""
        self.oversized_events += 1
        del self._tail[:]  # frees the buffer
        self._data = None
        self._data_lines = None
        self._n_data = 0
        self._data_size = 0
        self._skipping = True
        self._line_open = line_open
        self._at_start = False  # the first line has begun: a BOM can only open it
        return 0

    cdef int _line(self, const unsigned char* s, Py_ssize_t n) except -1:
        """Interpret one complete line of ``n`` bytes at ``s``, its end of line removed."""
        if self._at_start:
            self._at_start = False
            if n >= 3 and s[0] == 0xEF and s[1] == 0xBB and s[2] == 0xBF:
                s += 3
                n -= 3
        if n == 0:
            return self._dispatch()
        if s[0] == b':':
            return 0
        if n < 4 or memcmp(s, b"data", 4) != 0:
            return 0
        if n == 4:
            return self._add_data(s, 0)
        if s[4] != b':':
            return 0  # a field merely starting with "data", e.g. "database:"
        if n > 5 and s[5] == b' ':
            return self._add_data(s + 6, n - 6)
        return self._add_data(s + 5, n - 5)

    cdef int _add_data(self, const unsigned char* s, Py_ssize_t n) except -1:
        # Within the bound still: a value is at least 4 bytes shorter than its line.
        cdef unsigned char lf = LF
        if self._n_data == 0:
            self._data = PyBytes_FromStringAndSize(<const char*>s, n)
            self._data_size = n
        else:
            if self._n_data == 1:
                self._data_lines = bytearray(self._data)
                self._data = None  # hold the event's data once
            _append(self._data_lines, &lf, 1)
            _append(self._data_lines, s, n)
            self._data_size += 1 + n
        self._n_data += 1
        return 0

    cdef int _dispatch(self) except -1:
        """End the current event; an event without any ``data`` line is dropped."""
        cdef bytes data
        if self._n_data == 0:
            return 0
        if self._n_data == 1:
            data = self._data
        else:
            data = bytes(self._data_lines)
            self._data_lines = None
        self._data = None
        self._n_data = 0
        self._data_size = 0
        self.event_count += 1
        if self._keep_events:
            self.events.append(data)
        return self._payload(data)

    cdef int _payload(self, bytes data) except -1:
        """What one dispatched event's data says: the dialect's hook (Chat Completions here; the
        native Messages and Responses scanners below read their own)."""
        if PyBytes_GET_SIZE(data) == 6 and memcmp(PyBytes_AS_STRING(data), b"[DONE]", 6) == 0:
            self.done = True
            if self.saw_tool_calls:
                self.finish_reason = _TOOL_CALLS
            return 0
        if self.first_token_seen and _is_inert(
            <const unsigned char*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data)
        ):
            return 0
        return self._read_chunk_object(data)

    cdef int _read_chunk_object(self, bytes data) except -1:
        """Take an error, first token, finish reason, tool-call ids and usage from one payload."""
        cdef dict d
        cdef object usage, tokens, details, choices, choice, delta, tool_calls, call, call_id, text, reason
        try:
            obj = _loads(data)
        except ValueError:  # orjson.JSONDecodeError: not JSON, or not UTF-8
            return 0
        if type(obj) is not dict:
            return 0
        d = <dict>obj
        if self.error is None:
            self.error = _error_message(d)
        if self.response_model is None or self.response_id is None:
            self._read_identity(d)
        usage = d.get("usage")
        if type(usage) is dict:
            tokens = (<dict>usage).get("prompt_tokens")
            if type(tokens) is int and tokens >= 0:
                self.prompt_tokens = tokens
            tokens = (<dict>usage).get("completion_tokens")
            if type(tokens) is int and tokens >= 0:
                self.completion_tokens = tokens
            details = (<dict>usage).get("prompt_tokens_details")
            if type(details) is dict:
                tokens = (<dict>details).get("cached_tokens")
                if type(tokens) is int and tokens >= 0:
                    self.cached_tokens = tokens
        choices = d.get("choices")
        if type(choices) is not list:
            return 0
        for choice in <list>choices:
            if type(choice) is not dict:
                continue
            delta = (<dict>choice).get("delta")
            if type(delta) is dict:
                tool_calls = (<dict>delta).get("tool_calls")
                if type(tool_calls) is list and len(<list>tool_calls) > 0:
                    self.saw_tool_calls = True
                    if self.finish_reason is not None:  # a call after the end was said
                        self.finish_reason = _TOOL_CALLS
                    self.first_token_seen = True
                    for call in <list>tool_calls:
                        if type(call) is dict:
                            call_id = (<dict>call).get("id")
                            if type(call_id) is str and len(<str>call_id) > 0 \
                                    and call_id not in self._seen_ids:
                                self._seen_ids.add(call_id)
                                self.tool_call_ids.append(call_id)
                elif not self.first_token_seen:
                    for key in ("content", "reasoning_content", "reasoning"):
                        text = (<dict>delta).get(key)
                        if type(text) is str and len(<str>text) > 0:
                            self.first_token_seen = True
                            break
            reason = (<dict>choice).get("finish_reason")
            if type(reason) is str and len(<str>reason) > 0:
                self.finish_reason = _TOOL_CALLS if self.saw_tool_calls else reason
                if not self.choices_finished:
                    self._choice_finished((<dict>choice).get("index"))
        return 0

    cdef int _read_identity(self, dict d) except -1:
        """The answer's ``id`` and ``model``, from the first chunk object that has them."""
        cdef object value
        if self.response_id is None:
            value = d.get("id")
            if type(value) is str and len(<str>value) > 0:
                self.response_id = value
        if self.response_model is None:
            value = d.get("model")
            if type(value) is str and len(<str>value) > 0:
                self.response_model = value
        return 0

    cdef int _choice_finished(self, object index) except -1:
        """The choice numbered ``index`` (``None`` when absent or null, taken as 0) said its finish
        reason; every one of ``choices`` has once each index below it did."""
        if index is None:
            index = 0
        if type(index) is int and 0 <= index < self.choices:
            self._finished_choices.add(index)
            if len(self._finished_choices) == self.choices:
                self.choices_finished = True
        return 0
