# The compiled chat scanner's declarations, for the dialects that subclass it in another extension
# module (``_facts_c.pyx``: the natively served Messages and Responses answers). Named by the
# module's full name: Cython finds a dotted ``.pxd`` beside the ``.pyx`` files that compile as
# ``luftpause.dataplane._sse_c`` or cimport it, so setup.py needs no include path.

cdef inline Py_ssize_t _skip_json_space(const unsigned char* s, Py_ssize_t i, Py_ssize_t n) noexcept:
    """The offset of the first byte at or after ``i`` that is not JSON space (RFC 8259: space,
    tab, LF, CR), ``n`` if none."""
    while i < n and (s[i] == b' ' or s[i] == b'\t' or s[i] == b'\n' or s[i] == b'\r'):
        i += 1
    return i


cdef class SSEScanner:
    cdef readonly bint first_token_seen
    cdef readonly object finish_reason
    cdef readonly bint choices_finished
    cdef readonly bint saw_tool_calls
    cdef readonly list tool_call_ids
    cdef readonly object prompt_tokens
    cdef readonly object completion_tokens
    cdef readonly object cached_tokens
    cdef readonly object response_id
    cdef readonly object response_model
    cdef readonly bint done
    cdef readonly object error
    cdef readonly Py_ssize_t event_count
    cdef readonly list events
    cdef readonly Py_ssize_t oversized_events
    cdef readonly Py_ssize_t max_event_bytes
    cdef readonly Py_ssize_t choices

    cdef bint _keep_events
    cdef set _seen_ids
    # the indexes below ``choices`` whose finish reason came
    cdef set _finished_choices
    # the line read so far whose end has not arrived yet
    cdef bytearray _tail
    # data of the event being read: the first data line alone, and all of them joined once there
    # are two or more (events of several data lines are rare in chat streams); its size joined
    cdef Py_ssize_t _n_data
    cdef bytes _data
    cdef bytearray _data_lines
    cdef Py_ssize_t _data_size
    # the event being read outgrew max_event_bytes: read past it up to its blank line
    cdef bint _skipping
    # while skipping: the line being read began in an earlier read, so it is not blank
    cdef bint _line_open
    # the last read ended in CR: an LF opening the next read completes that CRLF
    cdef bint _skip_lf
    # no line completed yet: the first one may start with a byte order mark
    cdef bint _at_start

    cdef int _hold(self, const unsigned char* s, Py_ssize_t n) except -1
    cdef int _drop(self, bint line_open) except -1
    cdef int _line(self, const unsigned char* s, Py_ssize_t n) except -1
    cdef int _add_data(self, const unsigned char* s, Py_ssize_t n) except -1
    cdef int _dispatch(self) except -1
    # what one dispatched event's data says: the dialect's hook
    cdef int _payload(self, bytes data) except -1
    cdef int _read_chunk_object(self, bytes data) except -1
    cdef int _read_identity(self, dict d) except -1
    cdef int _choice_finished(self, object index) except -1
