"""The parts of a streamed answer, assembled from an engine's Chat Completions deltas so that the
translators open each part once and close it only when it is whole.

The rules (Chat Completions streams as engines send them; the Messages and Responses streams
require one block / item open at a time, numbered in the order they open, and no delta after a
block's stop or an item's ``.done``):

* A **part** is a run of ``text``, a run of ``reasoning``, or one ``call`` (a tool call). Parts are
  opened in the order the engine began them; at most one is open (the *live* part); the others
  wait in order (the *queue*), their content buffered.
* A tool-call fragment belongs to a call by its **id** when the engine gives one it gave before at
  the same index; by its **index** otherwise (the latest call begun at that index). An id first
  seen at an index whose latest call has no id yet names that call (an id that comes late); an id
  first seen where that call already has another one begins a new call (engines that stream
  parallel calls under one index with distinct ids). An id reused by a call at another index is not
  distinct: the index decides, and the client gets a fresh id for the second call.
* The live part gives way to the next in the queue when it is **whole**: text and reasoning as soon
  as the engine moved on to another part; a call when it is named and its arguments parse as a JSON
  object (an object's text cannot grow into another valid one, so nothing more can belong to it).
  A call whose arguments do not parse yet keeps the live place, and the parts begun after it wait
  whole in the queue; so interleaved fragments of several calls reach the client as one call after
  another, each whole.
* At the engine's finish (its ``finish_reason``, or the end of its stream) every part is whole: the
  live part closes and each queued part opens, gets its buffered content as one delta, and closes.
* After a call closed early (its arguments parsed), a fragment of it with only whitespace is
  dropped (the arguments mean the same); anything else raises :class:`~luftpause.dataplane.apis.
  _chat_events.TranslationBroken`: the engine wrote past a complete JSON object, and no client can be
  given a call that changed after it was done.

:class:`Assembler` turns deltas into :class:`Op` s (``open`` / ``delta`` / ``close`` of a
:class:`Part`); the Messages and Responses translators write each op as their API's events. Only
parts that wait behind an unfinished call are buffered, besides each call's arguments (and, for
a Responses stream, the text its ``.done`` events repeat).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import orjson

from luftpause.dataplane.apis._chat_events import TranslationBroken

__all__ = ["Assembler", "Op", "Part"]

Kind = Literal["text", "reasoning", "call"]


@dataclass(slots=True, eq=False)
class Part:
    """One part of the answer. ``position``: its number among the opened parts (-1 until opened);
    ``parts``: its content so far (text, reasoning or the call's arguments), joined by
    :meth:`content`. For a call: ``call_id`` (the engine's, ``None`` until given), ``name``,
    ``index`` (the engine's tool index)."""

    kind: Kind
    index: int = -1
    call_id: str | None = None
    name: str | None = None
    parts: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)  # what the client was not sent yet
    position: int = -1
    closed: bool = False
    keep: bool = True  # keep the whole content (a call's always: its arguments must be checked)

    def add(self, text: str) -> None:
        if self.keep:
            self.parts.append(text)
        self.held.append(text)

    def content(self) -> str:
        if len(self.parts) > 1:
            self.parts[:] = ["".join(self.parts)]
        return self.parts[0] if self.parts else ""

    def take_held(self) -> str:
        text = "".join(self.held)
        self.held.clear()
        return text


Op = tuple[Literal["open", "delta", "close"], Part, str]
"""``("open", part, "")``, ``("delta", part, text)``, ``("close", part, "")``."""


def _whole_object(arguments: str) -> bool:
    text = arguments.rstrip()
    if not text.endswith("}"):
        return False
    try:
        return isinstance(orjson.loads(text), dict)
    except orjson.JSONDecodeError:
        return False


class Assembler:
    """Deltas in, :data:`Op` s out; see the module docstring.

    ``text(kind, text)`` for a content or reasoning delta, ``tool(index, id, name, arguments)`` for
    a tool-call fragment (``None`` for what it lacks), ``finish()`` at the engine's finish: each
    returns the ops to write now, in order. ``calls``: the calls opened, in order.
    ``keep_text``: keep the whole text and reasoning of each part (:meth:`Part.content`), which a
    Responses stream repeats in its ``.done`` events; a Messages stream needs only what waits."""

    __slots__ = ("_by_id", "_by_index", "_keep_text", "_live", "_opened", "_queue", "calls")

    def __init__(self, keep_text: bool = True) -> None:
        self._keep_text = keep_text
        self._live: Part | None = None
        self._queue: list[Part] = []
        self._by_id: dict[str, Part] = {}
        self._by_index: dict[int, Part] = {}
        self._opened = 0
        self.calls: list[Part] = []

    # --- deltas in --------------------------------------------------------------------------------

    def text(self, kind: Literal["text", "reasoning"], text: str) -> list[Op]:
        last = self._queue[-1] if self._queue else self._live
        if last is None or last.kind != kind or last.closed:
            last = Part(kind, keep=self._keep_text)
            self._add(last)
        last.add(text)
        return self._flow()

    def tool(self, index: int, call_id: str | None, name: str | None, arguments: str | None) -> list[Op]:
        call = self._call_of(index, call_id)
        if call.closed:
            if arguments and arguments.strip():
                raise TranslationBroken(
                    f"the engine sent more arguments for tool call {call.call_id or index} after "
                    "they were a complete JSON object"
                )
            return []
        if call.name is None and name is not None:
            call.name = name
        if arguments:
            call.add(arguments)
        return self._flow()

    def finish(self) -> list[Op]:
        """Close every part: the live one, then each queued one opened and closed whole."""
        ops: list[Op] = []
        while self._live is not None:
            self._close_live(ops)
        return ops

    def close_open(self) -> list[Op]:
        """At an engine error: the open part's held content and its close, unless it is a call
        whose arguments are not whole (never closed partial); the parts not opened are left unsent
        with the failed answer."""
        live = self._live
        self._live, self._queue = None, []
        if live is None or live.position < 0 or (live.kind == "call" and not _whole_object(live.content())):
            return []
        ops: list[Op] = []
        self._send_held(live, ops)
        live.closed = True
        ops.append(("close", live, ""))
        return ops

    # --- the parts --------------------------------------------------------------------------------

    def _call_of(self, index: int, call_id: str | None) -> Part:
        latest = self._by_index.get(index)
        if call_id is not None:
            known = self._by_id.get(call_id)
            if known is not None and known.index == index:
                return known
            if known is None and latest is not None and latest.call_id is None:
                latest.call_id = call_id  # an id that came after the call's first fragment
                self._by_id[call_id] = latest
                return latest
            if known is not None and latest is not None:
                return latest  # an id reused at another index: not distinct, the index decides
            call = Part("call", index, None if known is not None else call_id)
            if known is None:
                self._by_id[call_id] = call
        elif latest is not None:
            return latest
        else:
            call = Part("call", index)
        self._by_index[index] = call
        self._add(call)
        return call

    def _add(self, part: Part) -> None:
        if self._live is None:
            self._live = part
        else:
            self._queue.append(part)

    def _flow(self) -> list[Op]:
        """Send the live part what it has; let it give way while it is whole and others wait."""
        ops: list[Op] = []
        while True:
            live = self._live
            if live is None:
                return ops
            if live.position < 0:
                if live.kind == "call" and live.name is None:
                    return ops  # a block or item cannot open without its name
                self._open(live, ops)
            self._send_held(live, ops)
            if not self._queue or (live.kind == "call" and not _whole_object(live.content())):
                return ops
            self._close_live(ops)

    def _open(self, part: Part, ops: list[Op]) -> None:
        part.position = self._opened
        self._opened += 1
        if part.kind == "call":
            self.calls.append(part)
        ops.append(("open", part, ""))

    @staticmethod
    def _send_held(part: Part, ops: list[Op]) -> None:
        if part.held:
            text = part.take_held()
            if text:
                ops.append(("delta", part, text))

    def _close_live(self, ops: list[Op]) -> None:
        live = self._live
        assert live is not None
        if live.position < 0:
            if live.kind == "call" and live.name is None:
                live.name = ""  # never named by the engine: sent as it came, with its arguments
            self._open(live, ops)
        self._send_held(live, ops)
        live.closed = True
        ops.append(("close", live, ""))
        self._live = self._queue.pop(0) if self._queue else None
