"""The incremental SSE event scanner, pure-Python twin of ``_speedups/_sse_c.pyx``.

The dataplane relays an engine's ``text/event-stream`` response to the client byte for byte and
feeds every read (split anywhere) to an :class:`SSEScanner` on the side, to learn what it reports to
the scheduler: time to first token, usage, finish reason, the tool-call ids a turn emitted and
whether the engine reported an error in the stream.

Framing follows the WHATWG HTML spec, section 9.2.6 "Interpreting an event stream": lines end with
CR, LF or CRLF; one leading byte order mark is ignored; a line starting with ``:`` is a comment; a
field line is split at its first ``:`` and loses exactly one space after it; ``data`` lines of one
event join with LF; an empty line dispatches the event, unless it had no ``data`` field; an event
still open when the stream ends is never dispatched. Only ``data`` matters here: ``event``, ``id``
and ``retry`` are read past. The payloads are OpenAI ``chat.completion.chunk`` objects (API
reference, "The chat completion chunk object") or the ``[DONE]`` sentinel -- or an engine's error
event, which vLLM and SGLang send in place of chunks when a turn fails mid-stream (often followed by
``[DONE]``): a JSON object with a top-level ``"error"`` key (vLLM ``{"error": {"object": "error",
"message": ..., "type": ..., "code": 500}}``, SGLang ``{"error": {"message": ..., "code": ...}}``,
or a bare ``{"error": "..."}``), or, from older vLLM, ``{"object": "error", "message": ...,
"code": ...}``. Only the top level of the payload counts: content that mentions an error is content.

The scanner works on bytes and decodes (with orjson) only complete ``data`` payloads, so a UTF-8
character split between reads needs no care. It never raises on what the engine sends: bad framing,
bad UTF-8, bad JSON, JSON of an unexpected shape are all ignored quietly.

Its memory is bounded whatever the engine sends. It holds at most ``max_event_bytes`` of the event
being read: the event's ``data`` so far (joined with LF, as it would be dispatched) plus the line
being read (as received, without its line end; so a ``data:`` prefix counts, and a comment or other
field counts while it is the line being read). An event that would need more is dropped: what the
scanner holds of it is released, the rest of it is read past up to its blank line, it is counted in
``oversized_events`` (not in ``event_count``), and scanning resumes with the next event. The rule
depends only on the bytes, never on how they were cut into reads. A dropped event is never
dispatched, so whatever it carried -- the first token, a tool call, a finish reason, usage, an
error, ``[DONE]`` -- is simply not seen. What the dataplane sends is not affected: the scanner only
observes the bytes the relay passes on unchanged.

Both twins behave identically (``tests/dataplane/test_sse_scanner.py`` runs every case on both
and compares them on random streams); ``luftpause.dataplane.sse`` picks one at import time.
"""

from __future__ import annotations

import operator
import re
import sys

import orjson

__all__ = ["DEFAULT_MAX_EVENT_BYTES", "SSEScanner"]

DEFAULT_MAX_EVENT_BYTES = 16 * 1024 * 1024
"""Default bound on what a scanner holds of one event, in bytes: far above the tool-call argument
lines of hundreds of KB that agents send, far below what would hurt a dataplane relaying many turns."""

_DONE = b"[DONE]"
_BOM = b"\xef\xbb\xbf"
_LF = 0x0A
_CR = 0x0D
_COLON = 0x3A
_SPACE = 0x20

_MAX_ERROR_CHARS = 500
"""An error message longer than this (characters) is cut to it: it goes into one report."""

_NO_ERROR_MESSAGE = "engine error"


class SSEScanner:
    """Scan one turn's event stream, fed in reads of any size, and keep what it says.

    ``SSEScanner(keep_events=False, max_event_bytes=DEFAULT_MAX_EVENT_BYTES, choices=1)``:
    ``keep_events`` keeps each dispatched event's data in ``events``; ``max_event_bytes`` (bytes, at
    least 1) bounds what is held of one event (see the module docstring); ``choices`` is how many
    choices the request asked for (its ``n``, at least 1). Raises ``TypeError`` if
    ``max_event_bytes`` or ``choices`` is not an integer, ``ValueError`` if it is below 1 or above
    ``sys.maxsize``.

    Attributes (read them; the scanner alone writes them):

    * ``first_token_seen`` -- a chunk delta carried the first token: a non-empty ``content``,
      ``reasoning_content`` or ``reasoning`` string, or a non-empty ``tool_calls`` list. The
      role-only chunk and ``content: ""`` do not count.
    * ``finish_reason`` -- ``None`` until the answer says it ended: a non-null ``finish_reason``
      in a chunk, or ``[DONE]``. Then the engine's last non-null ``finish_reason`` (``str``; ``None``
      after a ``[DONE]`` with none), but ``"tool_calls"`` when any tool-call delta was seen, whatever
      the engine said (some engines say ``"stop"`` after emitting tool calls, and the scheduler must
      know a tool round follows). A tool-call delta alone never sets it: a stream cut after a tool
      call's first delta has not ended.
    * ``choices_finished`` -- every choice the request asked for has said its finish reason: for
      each index from 0 to ``choices - 1``, a chunk's choice with that ``index`` (absent or null: 0)
      carried a non-empty ``finish_reason``. Indexes outside that range count for nothing, a choice
      that says it twice counts once, and ``[DONE]`` does not set it (``done`` says that). The relay
      takes ``done or choices_finished`` as the answer's end: with ``n`` > 1 choices the first
      finish reason is not the end, and a stream that ends before every choice said one was cut
      short (docs/architecture.md "Failure contract").
    * ``saw_tool_calls`` -- some delta carried a non-empty ``tool_calls`` list.
    * ``tool_call_ids`` -- each distinct non-empty ``tool_calls[].id`` string, in order of first
      appearance (continuation deltas carry no id or an empty one).
    * ``prompt_tokens``, ``completion_tokens`` -- from the last ``usage`` object that carried them
      as non-negative integers (tokens), else ``-1``.
    * ``cached_tokens`` -- the prompt tokens the engine's prefix cache served: the last ``usage``'s
      ``prompt_tokens_details.cached_tokens`` (OpenAI's, SGLang's, vLLM's, llama.cpp's name) as a
      non-negative integer, else ``-1``.
    * ``response_id``, ``response_model`` -- the ``id`` and ``model`` strings (non-empty) of the
      first chunk object that had them (the engine's completion id and the model that answered),
      else ``None``; read until both are known, so from the first chunk on a usual stream.
    * ``done`` -- a ``data: [DONE]`` event was seen.
    * ``error`` -- the message (``str``, at most 500 characters) of the first error event, else
      ``None``. An error event is a payload whose top-level object has an ``"error"`` key that is not
      null, or an ``"object"`` key equal to ``"error"``. Its message is ``error["message"]`` when
      ``error`` is an object with a non-empty string ``message``; ``error`` itself when it is a
      non-empty string; else the top-level ``message`` when ``object`` is ``"error"`` and it is a
      non-empty string; else ``"engine error"``. An error event does not change ``done`` or
      ``finish_reason``: the caller decides that a turn with an error failed.
    * ``event_count`` -- number of dispatched events, i.e. events with at least one ``data`` field.
    * ``events`` -- with ``keep_events=True``, each dispatched event's data (``bytes``, lines joined
      with ``b"\\n"``) in order; else stays empty.
    * ``oversized_events`` -- number of events dropped for needing more than ``max_event_bytes``,
      counted as soon as the bound is crossed (read-only property).
    * ``buffered_bytes`` -- bytes held now of the event being read: its data so far plus the
      unfinished line; at most ``max_event_bytes`` between calls to :meth:`feed` (read-only
      property).
    * ``max_event_bytes`` -- the bound given to the constructor, in bytes (read-only property).
    * ``choices`` -- the choices given to the constructor (read-only property).
    """

    __slots__ = (
        "_at_start",
        "_choices",
        "_data",
        "_data_size",
        "_finished_choices",
        "_keep_events",
        "_line_open",
        "_max_event_bytes",
        "_oversized_events",
        "_seen_ids",
        "_skip_lf",
        "_skipping",
        "_tail",
        "cached_tokens",
        "choices_finished",
        "completion_tokens",
        "done",
        "error",
        "event_count",
        "events",
        "finish_reason",
        "first_token_seen",
        "prompt_tokens",
        "response_id",
        "response_model",
        "saw_tool_calls",
        "tool_call_ids",
    )

    def __init__(
        self, keep_events: bool = False, max_event_bytes: int = DEFAULT_MAX_EVENT_BYTES, choices: int = 1
    ) -> None:
        max_event_bytes = operator.index(max_event_bytes)
        if not 1 <= max_event_bytes <= sys.maxsize:  # the compiled twin holds it in a Py_ssize_t
            raise ValueError(
                f"max_event_bytes must be at least 1 and at most {sys.maxsize}, not {max_event_bytes}"
            )
        choices = operator.index(choices)
        if not 1 <= choices <= sys.maxsize:
            raise ValueError(f"choices must be at least 1 and at most {sys.maxsize}, not {choices}")
        self.first_token_seen: bool = False
        self.finish_reason: str | None = None
        self.choices_finished: bool = False
        self.saw_tool_calls: bool = False
        self.tool_call_ids: list[str] = []
        self.prompt_tokens: int = -1
        self.completion_tokens: int = -1
        self.cached_tokens: int = -1
        self.response_id: str | None = None
        self.response_model: str | None = None
        self.done: bool = False
        self.error: str | None = None
        self.event_count: int = 0
        self.events: list[bytes] = []
        self._keep_events = bool(keep_events)
        self._max_event_bytes = max_event_bytes
        self._oversized_events = 0
        self._seen_ids: set[str] = set()
        self._choices = choices
        # the indexes below ``choices`` whose finish reason came
        self._finished_choices: set[int] = set()
        # the line read so far whose end has not arrived yet
        self._tail = bytearray()
        # data lines of the event being read, and their size once joined with LF
        self._data: list[bytes] = []
        self._data_size = 0
        # the event being read outgrew max_event_bytes: read past it up to its blank line
        self._skipping = False
        # while skipping: the line being read began in an earlier read, so it is not blank
        self._line_open = False
        # the last read ended in CR: an LF opening the next read completes that CRLF
        self._skip_lf = False
        # no line completed yet: the first one may start with a byte order mark
        self._at_start = True

    @property
    def max_event_bytes(self) -> int:
        """The bound on what is held of one event, in bytes."""
        return self._max_event_bytes

    @property
    def choices(self) -> int:
        """How many choices the request asked for."""
        return self._choices

    @property
    def oversized_events(self) -> int:
        """Number of events dropped for needing more than ``max_event_bytes``."""
        return self._oversized_events

    @property
    def buffered_bytes(self) -> int:
        """Bytes held now of the event being read: its data so far plus the unfinished line."""
        return self._data_size + len(self._tail)

    def feed(self, chunk: bytes | bytearray) -> bool:
        """Consume the next ``chunk`` read from the engine (``bytes`` or ``bytearray``), cut anywhere.

        Returns ``True`` iff the turn's first token was seen inside this chunk, which happens at
        most once per scanner. Never raises on any content of ``chunk``.
        """
        if not chunk:
            return False
        if type(chunk) is not bytes:
            chunk = bytes(chunk)  # so that lines, data and ``events`` are bytes
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == _LF:
                chunk = chunk[1:]
                if not chunk:
                    return False
        # Only the new bytes are searched for a line end, so a line of any length read in many
        # pieces costs time linear in its length.
        if b"\n" not in chunk and b"\r" not in chunk:
            self._hold(chunk)
            return False
        lines = chunk.splitlines(keepends=True)
        last_byte = lines[-1][-1]
        rest = b""
        if last_byte == _CR:
            self._skip_lf = True
        elif last_byte != _LF:
            rest = lines.pop()
        had_first_token = self.first_token_seen
        # whether the first line continues one begun in an earlier read
        continued = bool(self._tail) or self._line_open
        # The event's data grows by less than the bytes read, so if the data, the unfinished line
        # and this whole read fit the bound, no line of this read needs testing against it.
        careful = self._skipping or (self._data_size + len(self._tail) + len(chunk) > self._max_event_bytes)
        for line in lines:
            if line[-1] == _LF:
                line = line[:-2] if line[-2:] == b"\r\n" else line[:-1]
            else:
                line = line[:-1]
            if continued:
                continued = False
                self._end_continued_line(line)
            elif careful:
                self._bounded_line(line)
            else:
                self._line(line)
        if rest:
            self._hold(rest)
        return self.first_token_seen and not had_first_token

    def _hold(self, part: bytes) -> None:
        """Keep ``part``, the non-empty start of a line whose end has not arrived yet."""
        if self._skipping:
            self._line_open = True
        elif self._data_size + len(self._tail) + len(part) > self._max_event_bytes:
            self._drop(line_open=True)
        else:
            self._tail += part

    def _end_continued_line(self, end: bytes) -> None:
        """Complete the line begun in an earlier read with its last part ``end``."""
        if self._skipping:
            self._line_open = False  # not a blank line: the dropped event goes on
            return
        tail = self._tail
        if self._data_size + len(tail) + len(end) > self._max_event_bytes:
            self._drop(line_open=False)
            return
        tail += end
        line = bytes(tail)
        tail.clear()
        self._line(line)

    def _bounded_line(self, line: bytes) -> None:
        """Interpret one complete line, unless it belongs to an event over the bound."""
        if self._skipping:
            if not line:  # the blank line that ends the dropped event
                self._skipping = False
        elif self._data_size + len(line) > self._max_event_bytes:
            self._drop(line_open=False)
        else:
            self._line(line)

    def _drop(self, line_open: bool) -> None:
        """Give up the event being read, which needs more than ``max_event_bytes``."""
        self._oversized_events += 1
        self._tail.clear()  # frees the buffer
        self._data = []
        self._data_size = 0
        self._skipping = True
        self._line_open = line_open
        self._at_start = False  # the first line has begun: a BOM can only open it

    def _line(self, line: bytes) -> None:
        """Interpret one complete line of an event within the bound, its end of line removed."""
        if self._at_start:
            self._at_start = False
            if line.startswith(_BOM):
                line = line[3:]
        if not line:
            self._dispatch()
        elif line[0] == _COLON:
            return
        elif line.startswith(b"data"):
            if len(line) == 4:
                value = b""
            elif line[4] == _COLON:
                value = line[6:] if len(line) > 5 and line[5] == _SPACE else line[5:]
            else:
                return  # a field merely starting with "data", e.g. "database:"
            # Within the bound still: a value is at least 4 bytes shorter than its line.
            self._data_size += len(value) + 1 if self._data else len(value)
            self._data.append(value)

    def _dispatch(self) -> None:
        """End the current event; an event without any ``data`` line is dropped."""
        pending = self._data
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"\n".join(pending)
        self._data = []
        self._data_size = 0
        self.event_count += 1
        if self._keep_events:
            self.events.append(data)
        self._payload(data)

    def _payload(self, data: bytes) -> None:
        """What one dispatched event's data says: the dialect's hook (Chat Completions here; the
        native Messages and Responses scanners of ``luftpause.dataplane.apis`` read their own)."""
        if data == _DONE:
            self.done = True
            if self.saw_tool_calls:
                self.finish_reason = "tool_calls"
        elif not (self.first_token_seen and _is_inert(data)):
            self._read_chunk_object(data)

    def _read_chunk_object(self, data: bytes) -> None:
        """Take an error, first token, finish reason, tool-call ids and usage from one payload."""
        try:
            obj = orjson.loads(data)
        except ValueError:  # orjson.JSONDecodeError: not JSON, or not UTF-8
            return
        if type(obj) is not dict:
            return
        if self.error is None:
            self.error = _error_message(obj)
        if self.response_model is None or self.response_id is None:
            self._read_identity(obj)
        usage = obj.get("usage")
        if type(usage) is dict:
            tokens = usage.get("prompt_tokens")
            if type(tokens) is int and tokens >= 0:
                self.prompt_tokens = tokens
            tokens = usage.get("completion_tokens")
            if type(tokens) is int and tokens >= 0:
                self.completion_tokens = tokens
            details = usage.get("prompt_tokens_details")
            if type(details) is dict:
                tokens = details.get("cached_tokens")
                if type(tokens) is int and tokens >= 0:
                    self.cached_tokens = tokens
        choices = obj.get("choices")
        if type(choices) is not list:
            return
        for choice in choices:
            if type(choice) is not dict:
                continue
            delta = choice.get("delta")
            if type(delta) is dict:
                tool_calls = delta.get("tool_calls")
                if type(tool_calls) is list and tool_calls:
                    self.saw_tool_calls = True
                    if self.finish_reason is not None:  # a call after the end was said
                        self.finish_reason = "tool_calls"
                    self.first_token_seen = True
                    for call in tool_calls:
                        if type(call) is dict:
                            call_id = call.get("id")
                            if type(call_id) is str and call_id and call_id not in self._seen_ids:
                                self._seen_ids.add(call_id)
                                self.tool_call_ids.append(call_id)
                elif not self.first_token_seen:
                    for key in ("content", "reasoning_content", "reasoning"):
                        text = delta.get(key)
                        if type(text) is str and text:
                            self.first_token_seen = True
                            break
            reason = choice.get("finish_reason")
            if type(reason) is str and reason:
                self.finish_reason = "tool_calls" if self.saw_tool_calls else reason
                if not self.choices_finished:
                    self._choice_finished(choice.get("index"))

    def _read_identity(self, obj: dict[str, object]) -> None:
        """The answer's ``id`` and ``model``, from the first chunk object that has them."""
        if self.response_id is None:
            value = obj.get("id")
            if type(value) is str and value:
                self.response_id = value
        if self.response_model is None:
            value = obj.get("model")
            if type(value) is str and value:
                self.response_model = value

    def _choice_finished(self, index: object) -> None:
        """The choice numbered ``index`` (a chunk choice's ``index``: ``None`` when absent or null,
        taken as 0) said its finish reason."""
        if index is None:
            index = 0
        if type(index) is int and 0 <= index < self._choices:
            finished = self._finished_choices
            finished.add(index)
            if len(finished) == self._choices:
                self.choices_finished = True


# The byte runs a payload can matter through once the first token has been seen (the keys, with
# both quotes), and what must follow each for the payload to stay inert: JSON space (RFC 8259:
# space, tab, LF, CR), a colon, JSON space, ``null``.
_KEY_RUN = re.compile(rb'"(?:usage|tool_calls|finish_reason|error)"')
_NULL_VALUE = re.compile(rb"[ \t\n\r]*:[ \t\n\r]*null")


def _is_inert(data: bytes) -> bool:
    """Whether a payload provably changes nothing once the first token has been seen.

    The compiled twin's test, decision for decision (it walks the quotes with ``memchr``; here
    ``re`` finds the same byte runs, left to right, each resuming after the last). After the first
    token, a payload matters only through a ``usage``, ``tool_calls``, ``finish_reason`` or
    ``error`` key whose value is not null, or an ``"object": "error"``. Without ``\\u`` escapes
    those keys can only be written as the literal bytes ``"usage"`` etc., so if every such byte run
    (in a key or not: the test errs towards parsing) is followed by ``: null``, parsing the payload
    would change nothing and orjson is not called. That covers ``"object": "error"`` too: its value
    is the byte run ``"error"``, followed by no colon, so it is parsed; ``"object":
    "chat.completion.chunk"``, on every chunk, stays inert. A payload with none of these runs
    (what is not JSON included) is inert: it could report nothing beyond the first token.
    """
    if b"\\u" in data:
        return False
    null_value = _NULL_VALUE.match
    for key in _KEY_RUN.finditer(data):
        if null_value(data, key.end()) is None:
            return False
    return True


def _error_message(obj: dict[str, object]) -> str | None:
    """The message of ``obj`` if it is an engine's error event, else ``None`` (see ``SSEScanner``)."""
    error = obj.get("error")
    is_error_object = obj.get("object") == "error"
    if error is None and not is_error_object:
        return None
    message: object = None
    if type(error) is dict:
        message = error.get("message")
    elif type(error) is str:
        message = error
    if (type(message) is not str or not message) and is_error_object:
        message = obj.get("message")
    if type(message) is not str or not message:
        return _NO_ERROR_MESSAGE
    return message[:_MAX_ERROR_CHARS]
