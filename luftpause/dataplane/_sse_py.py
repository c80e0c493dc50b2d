"""The incremental SSE event scanner, pure-Python twin of ``_speedups/_sse_c.pyx``.

The dataplane relays an engine's ``text/event-stream`` response to the client byte for byte and
feeds every read (split anywhere) to an :class:`SSEScanner` on the side, to learn what it reports to
the scheduler: time to first token, usage, finish reason and the tool-call ids a turn emitted.

Framing follows the WHATWG HTML spec, section 9.2.6 "Interpreting an event stream": lines end with
CR, LF or CRLF; one leading byte order mark is ignored; a line starting with ``:`` is a comment; a
field line is split at its first ``:`` and loses exactly one space after it; ``data`` lines of one
event join with LF; an empty line dispatches the event, unless it had no ``data`` field; an event
still open when the stream ends is never dispatched. Only ``data`` matters here: ``event``, ``id``
and ``retry`` are read past. The payloads are OpenAI ``chat.completion.chunk`` objects (API
reference, "The chat completion chunk object") or the ``[DONE]`` sentinel.

The scanner works on bytes and decodes (with orjson) only complete ``data`` payloads, so a UTF-8
character split between reads needs no care. It never raises on what the engine sends: bad framing,
bad UTF-8, bad JSON, JSON of an unexpected shape are all ignored quietly.

Both twins behave identically (``tests/test_sse.py`` runs every case on both and compares them on
random streams); ``luftpause.dataplane.sse`` picks one at import time.
"""

from __future__ import annotations

import orjson

__all__ = ["SSEScanner"]

_DONE = b"[DONE]"
_BOM = b"\xef\xbb\xbf"
_LF = 0x0A
_CR = 0x0D
_COLON = 0x3A
_SPACE = 0x20


class SSEScanner:
    """Scan one turn's event stream, fed in reads of any size, and keep what it says.

    Attributes (read them; the scanner alone writes them):

    * ``first_token_seen`` -- a chunk delta carried the first token: a non-empty ``content``,
      ``reasoning_content`` or ``reasoning`` string, or a non-empty ``tool_calls`` list. The
      role-only chunk and ``content: ""`` do not count.
    * ``finish_reason`` -- the engine's last non-null ``finish_reason`` (``str``), or ``None``; but
      ``"tool_calls"`` once any tool-call delta was seen, whatever the engine said (some engines say
      ``"stop"`` after emitting tool calls, and the scheduler must know a tool round follows).
    * ``saw_tool_calls`` -- some delta carried a non-empty ``tool_calls`` list.
    * ``tool_call_ids`` -- each distinct non-empty ``tool_calls[].id`` string, in order of first
      appearance (continuation deltas carry no id or an empty one).
    * ``prompt_tokens``, ``completion_tokens`` -- from the last ``usage`` object that carried them
      as non-negative integers (tokens), else ``-1``.
    * ``done`` -- a ``data: [DONE]`` event was seen.
    * ``event_count`` -- number of dispatched events, i.e. events with at least one ``data`` field.
    * ``events`` -- with ``keep_events=True``, each dispatched event's data (``bytes``, lines joined
      with ``b"\\n"``) in order; else stays empty.
    """

    __slots__ = (
        "_at_start",
        "_data",
        "_keep_events",
        "_seen_ids",
        "_skip_lf",
        "_tail",
        "completion_tokens",
        "done",
        "event_count",
        "events",
        "finish_reason",
        "first_token_seen",
        "prompt_tokens",
        "saw_tool_calls",
        "tool_call_ids",
    )

    def __init__(self, keep_events: bool = False) -> None:
        self.first_token_seen: bool = False
        self.finish_reason: str | None = None
        self.saw_tool_calls: bool = False
        self.tool_call_ids: list[str] = []
        self.prompt_tokens: int = -1
        self.completion_tokens: int = -1
        self.done: bool = False
        self.event_count: int = 0
        self.events: list[bytes] = []
        self._keep_events = bool(keep_events)
        self._seen_ids: set[str] = set()
        # the line read so far whose end has not arrived yet
        self._tail = bytearray()
        # data lines of the event being read
        self._data: list[bytes] = []
        # the last read ended in CR: an LF opening the next read completes that CRLF
        self._skip_lf = False
        # no line completed yet: the first one may start with a byte order mark
        self._at_start = True

    def feed(self, chunk: bytes | bytearray) -> bool:
        """Consume the next ``chunk`` read from the engine (``bytes`` or ``bytearray``), cut anywhere.

        Returns ``True`` iff the turn's first token was seen inside this chunk, which happens at
        most once per scanner. Never raises on any content of ``chunk``.
        """
        if not chunk:
            return False
        if self._skip_lf:
            self._skip_lf = False
            if chunk[0] == _LF:
                chunk = chunk[1:]
                if not chunk:
                    return False
        # Only the new bytes are searched for a line end, so a line of any length read in many
        # pieces costs time linear in its length.
        if b"\n" not in chunk and b"\r" not in chunk:
            self._tail += chunk
            return False
        tail = self._tail
        if tail:
            tail += chunk
            buf = bytes(tail)
            tail.clear()
        else:
            buf = bytes(chunk)
        lines = buf.splitlines(keepends=True)
        last_byte = lines[-1][-1]
        if last_byte == _CR:
            self._skip_lf = True
        elif last_byte != _LF:
            tail += lines.pop()
        had_first_token = self.first_token_seen
        for line in lines:
            if line[-1] == _LF:
                line = line[:-2] if line[-2:] == b"\r\n" else line[:-1]
            else:
                line = line[:-1]
            self._line(line)
        return self.first_token_seen and not had_first_token

    def _line(self, line: bytes) -> None:
        """Interpret one complete line, its end of line removed."""
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
                self._data.append(b"")
            elif line[4] == _COLON:
                if len(line) > 5 and line[5] == _SPACE:
                    self._data.append(line[6:])
                else:
                    self._data.append(line[5:])
            # else: a field merely starting with "data", e.g. "database:", ignored

    def _dispatch(self) -> None:
        """End the current event; an event without any ``data`` line is dropped."""
        pending = self._data
        if not pending:
            return
        data = pending[0] if len(pending) == 1 else b"\n".join(pending)
        self._data = []
        self.event_count += 1
        if self._keep_events:
            self.events.append(data)
        if data == _DONE:
            self.done = True
        else:
            self._read_chunk_object(data)

    def _read_chunk_object(self, data: bytes) -> None:
        """Take first token, finish reason, tool-call ids and usage from one chunk object."""
        try:
            obj = orjson.loads(data)
        except ValueError:  # orjson.JSONDecodeError: not JSON, or not UTF-8
            return
        if type(obj) is not dict:
            return
        usage = obj.get("usage")
        if type(usage) is dict:
            tokens = usage.get("prompt_tokens")
            if type(tokens) is int and tokens >= 0:
                self.prompt_tokens = tokens
            tokens = usage.get("completion_tokens")
            if type(tokens) is int and tokens >= 0:
                self.completion_tokens = tokens
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
            if type(reason) is str and reason and not self.saw_tool_calls:
                self.finish_reason = reason
