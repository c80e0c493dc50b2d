# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""What a natively served Messages or Responses answer says: compiled twin of
``luftpause/dataplane/apis/_facts_py.py`` (see it for what each event means).

Dialects of the compiled chat scanner (``_sse_c.pyx``, whose declarations this module cimports):
the same framing, with another reading of each dispatched payload (the ``_payload`` hook). Once the
first token has been seen, a payload whose ``type`` (its first key, as both APIs write it) is a
plain content delta is not parsed: the pure twins' regular expressions, matched here byte by byte.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from libc.string cimport memcmp

from luftpause.dataplane._sse_c cimport SSEScanner, _skip_json_space

import orjson

from luftpause.dataplane._sse_c import DEFAULT_MAX_EVENT_BYTES

cdef object _loads = orjson.loads
cdef str _TOOL_CALLS = "tool_calls"
cdef str _ERROR = "error"
cdef str _NO_ERROR_MESSAGE = "engine error"
cdef Py_ssize_t _MAX_ERROR_CHARS = 500
cdef str _TOOL_USE = "tool_use"
cdef str _SERVER_TOOL_USE = "server_tool_use"
cdef str _FUNCTION_CALL = "function_call"
cdef str _CUSTOM_TOOL_CALL = "custom_tool_call"
cdef dict _MESSAGES_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "pause_turn": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
}
cdef frozenset _RESPONSES_TEXT_DELTAS = frozenset({
    "response.output_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_summary_text.delta",
    "response.refusal.delta",
})


cdef inline bint _at(const unsigned char* s, Py_ssize_t i, Py_ssize_t n, const char* lit, Py_ssize_t k) noexcept:
    return n - i >= k and memcmp(s + i, lit, k) == 0


cdef Py_ssize_t _type_value(const unsigned char* s, Py_ssize_t n) noexcept:
    """The offset just after the opening quote of the string value of a payload that opens
    ``{"type":"`` (JSON space allowed after the brace and around the colon), else -1."""
    cdef Py_ssize_t i
    if n < 1 or s[0] != b'{':
        return -1
    i = _skip_json_space(s, 1, n)
    if not _at(s, i, n, b'"type"', 6):
        return -1
    i = _skip_json_space(s, i + 6, n)
    if i >= n or s[i] != b':':
        return -1
    i = _skip_json_space(s, i + 1, n)
    if i >= n or s[i] != b'"':
        return -1
    return i + 1


cdef bint _messages_inert(const unsigned char* s, Py_ssize_t n) noexcept:
    """``content_block_delta``, ``content_block_stop`` or ``ping``: nothing once the first token
    was seen (the pure twin's ``_MESSAGES_INERT``)."""
    cdef Py_ssize_t i = _type_value(s, n)
    if i < 0:
        return False
    return (
        _at(s, i, n, b'content_block_delta"', 20)
        or _at(s, i, n, b'content_block_stop"', 19)
        or _at(s, i, n, b'ping"', 5)
    )


cdef bint _responses_inert(const unsigned char* s, Py_ssize_t n) noexcept:
    """``response.<output_text | function_call_arguments | reasoning_text | reasoning_summary_text
    | refusal>.<delta | done>`` (the pure twin's ``_RESPONSES_INERT``)."""
    cdef Py_ssize_t i = _type_value(s, n)
    if i < 0 or not _at(s, i, n, b"response.", 9):
        return False
    i += 9
    if _at(s, i, n, b"output_text.", 12):
        i += 12
    elif _at(s, i, n, b"function_call_arguments.", 24):
        i += 24
    elif _at(s, i, n, b"reasoning_text.", 15):
        i += 15
    elif _at(s, i, n, b"reasoning_summary_text.", 23):
        i += 23
    elif _at(s, i, n, b"refusal.", 8):
        i += 8
    else:
        return False
    return _at(s, i, n, b'delta"', 6) or _at(s, i, n, b'done"', 5)


cdef object _count(object value):
    """``value`` when it is a non-negative ``int`` (tokens), else ``None``."""
    if type(value) is int and value >= 0:
        return value
    return None


cdef str _message_of(object error, object fallback=None):
    """An error's message, at most 500 characters, ``"engine error"`` when it has none."""
    cdef object message = None
    if type(error) is dict:
        message = (<dict>error).get("message")
    elif type(error) is str:
        message = error
    if type(message) is not str or len(<str>message) == 0:
        message = fallback
    if type(message) is not str or len(<str>message) == 0:
        return _NO_ERROR_MESSAGE
    return (<str>message)[:_MAX_ERROR_CHARS]


cdef inline bint _is_call_item(object kind) except -1:
    return kind == _FUNCTION_CALL or kind == _CUSTOM_TOOL_CALL


cdef class _NativeScanner(SSEScanner):
    """The compiled scanner's framing with another reading of each payload; ``stop_reason`` the
    native end (Messages' ``stop_reason``, Responses' ``status``), read-only."""

    cdef readonly object stop_reason

    def __init__(self, keep_events: bool = False, max_event_bytes=DEFAULT_MAX_EVENT_BYTES) -> None:
        SSEScanner.__init__(self, keep_events, max_event_bytes)
        self.stop_reason = None

    cdef bint _inert(self, const unsigned char* s, Py_ssize_t n) noexcept:
        return False

    cdef int _read(self, dict d) except -1:
        return 0

    cdef int _payload(self, bytes data) except -1:
        if self.first_token_seen and self._inert(
            <const unsigned char*>PyBytes_AS_STRING(data), PyBytes_GET_SIZE(data)
        ):
            return 0
        try:
            obj = _loads(data)
        except ValueError:
            return 0
        if type(obj) is dict:
            return self._read(<dict>obj)
        return 0

    cdef int _tool_call(self, object call_id) except -1:
        self.saw_tool_calls = True
        self.first_token_seen = True
        if self.finish_reason is not None:  # a call after the end was said
            self.finish_reason = _TOOL_CALLS
        if type(call_id) is str and len(<str>call_id) > 0 and call_id not in self._seen_ids:
            self._seen_ids.add(call_id)
            self.tool_call_ids.append(call_id)
        return 0


cdef class MessagesScanner(_NativeScanner):
    """Facts of an Anthropic Messages event stream (see ``luftpause.dataplane.apis._facts_py``)."""

    cdef bint _inert(self, const unsigned char* s, Py_ssize_t n) noexcept:
        return _messages_inert(s, n)

    cdef int _read(self, dict d) except -1:
        cdef object kind = d.get("type")
        cdef object delta, dtype, text, block, message, reason
        if kind == "content_block_delta":
            delta = d.get("delta")
            if not self.first_token_seen and type(delta) is dict:
                dtype = (<dict>delta).get("type")
                text = None
                if dtype == "input_json_delta":
                    self.first_token_seen = True
                elif dtype == "text_delta":
                    text = (<dict>delta).get("text")
                elif dtype == "thinking_delta":
                    text = (<dict>delta).get("thinking")
                if type(text) is str and len(<str>text) > 0:
                    self.first_token_seen = True
        elif kind == "content_block_start":
            block = d.get("content_block")
            if type(block) is dict:
                dtype = (<dict>block).get("type")
                if dtype == _TOOL_USE or dtype == _SERVER_TOOL_USE:
                    self._tool_call((<dict>block).get("id"))
                else:
                    text = (<dict>block).get("text")
                    if type(text) is str and len(<str>text) > 0:
                        self.first_token_seen = True
        elif kind == "message_start":
            message = d.get("message")
            if type(message) is dict:
                self._usage((<dict>message).get("usage"))
        elif kind == "message_delta":
            delta = d.get("delta")
            if type(delta) is dict:
                reason = (<dict>delta).get("stop_reason")
                if type(reason) is str and len(<str>reason) > 0:
                    self.stop_reason = reason
                    if self.saw_tool_calls:
                        self.finish_reason = _TOOL_CALLS
                    else:
                        self.finish_reason = _MESSAGES_FINISH.get(reason, reason)
                    self.choices_finished = True
            self._usage(d.get("usage"))
        elif kind == "message_stop":
            self.done = True
        elif kind == _ERROR and self.error is None:
            self.error = _message_of(d.get(_ERROR))
        return 0

    cdef int _usage(self, object usage) except -1:
        cdef object tokens, more
        if type(usage) is not dict:
            return 0
        tokens = _count((<dict>usage).get("input_tokens"))
        if tokens is not None:
            for key in ("cache_read_input_tokens", "cache_creation_input_tokens"):
                more = _count((<dict>usage).get(key))
                if more is not None:
                    tokens = tokens + more
            self.prompt_tokens = tokens
        tokens = _count((<dict>usage).get("output_tokens"))
        if tokens is not None:
            self.completion_tokens = tokens
        return 0


cdef class ResponsesScanner(_NativeScanner):
    """Facts of an OpenAI Responses event stream (see ``luftpause.dataplane.apis._facts_py``)."""

    cdef bint _inert(self, const unsigned char* s, Py_ssize_t n) noexcept:
        return _responses_inert(s, n)

    cdef int _read(self, dict d) except -1:
        cdef object kind = d.get("type")
        cdef object delta, item, response, output, status, usage, tokens, details, reason
        if type(kind) is not str:
            return 0
        if kind in _RESPONSES_TEXT_DELTAS:
            delta = d.get("delta")
            if type(delta) is str and len(<str>delta) > 0:
                self.first_token_seen = True
        elif kind == "response.function_call_arguments.delta":
            self.first_token_seen = True
        elif kind == "response.output_item.added" or kind == "response.output_item.done":
            item = d.get("item")
            if type(item) is dict and _is_call_item((<dict>item).get("type")):
                self._tool_call((<dict>item).get("call_id"))
        elif kind == "response.completed" or kind == "response.incomplete":
            self.done = True
            response = d.get("response")
            if type(response) is not dict:
                response = {}
            status = (<dict>response).get("status")
            self.stop_reason = str(status) if status else (<str>kind).rpartition(".")[2]
            output = (<dict>response).get("output")
            if type(output) is list:
                for item in <list>output:
                    if type(item) is dict and _is_call_item((<dict>item).get("type")):
                        self._tool_call((<dict>item).get("call_id"))
            if self.saw_tool_calls:
                self.finish_reason = _TOOL_CALLS
            elif kind == "response.completed":
                self.finish_reason = "stop"
            else:
                details = (<dict>response).get("incomplete_details")
                reason = (<dict>details).get("reason") if type(details) is dict else None
                self.finish_reason = "content_filter" if reason == "content_filter" else "length"
            self.choices_finished = True
            usage = (<dict>response).get("usage")
            if type(usage) is dict:
                tokens = _count((<dict>usage).get("input_tokens"))
                if tokens is not None:
                    self.prompt_tokens = tokens
                tokens = _count((<dict>usage).get("output_tokens"))
                if tokens is not None:
                    self.completion_tokens = tokens
        elif kind == "response.failed" and self.error is None:
            response = d.get("response")
            self.error = _message_of((<dict>response).get(_ERROR) if type(response) is dict else None)
        elif kind == _ERROR and self.error is None:
            self.error = _message_of(d.get(_ERROR), d.get("message"))
        return 0

