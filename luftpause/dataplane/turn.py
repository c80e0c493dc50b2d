"""One turn as the dataplane admits and forwards it, and the ways its request and answer may be
shaped on the way (an engine's ``priority``; a front door API other than Chat Completions).

Front doors: a turn carries what goes to the engine (``upstream_path``, ``body``) and, when its
client speaks another API than the engine's, a :class:`Translation` of the engine's answer. The
relay reads every fact (first token, usage, finish reason, tool-call ids) from the engine's own
Chat Completions answer, then hands the bytes to the translation, so a translator only shapes what
the client sees. A Chat Completions turn has no translation: its answer is relayed unchanged.
"""

from __future__ import annotations

import itertools
import secrets
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from luftpause.config import EnginePriority
from luftpause.v1 import scheduler_pb2 as pb

if TYPE_CHECKING:
    from opentelemetry.trace import Span

__all__ = [
    "CHAT_PATH",
    "CLASSIFY_PATH",
    "PRIORITY_VALUES",
    "RUN_ID_HEADER",
    "Translation",
    "Turn",
    "new_id",
    "with_priority",
]

RUN_ID_HEADER = "x-luftpause-run-id"

CHAT_PATH = "/v1/chat/completions"
CLASSIFY_PATH = "/classify"
"""Where a single-pass turn goes on its replica: vLLM's classification route."""


class Translation(Protocol):
    """How the answer to one turn reaches a client that speaks another API than the engine.

    The engine answers in Chat Completions (OpenAI API reference, "Create chat completion"); the
    relay calls, in order and on one task:

    * :meth:`stream` with every piece of an SSE answer as it was read (events may be split across
      pieces), returning the bytes to send the client now (``b""``: nothing yet);
    * :meth:`stream_end` once the engine's stream ended cleanly (``[DONE]`` or a finish reason),
      returning the client's closing bytes (its API's last events); never called for a stream that
      broke, whose client connection is aborted instead;
    * :meth:`whole` with a whole (non-streamed) 200 answer, returning the client's body;
    * :meth:`refusal` with the status and body of an engine's refusal (429, 5xx), returning the
      client's body in its API's error shape.

    Each returns ``bytes``; none may block or raise (a fault of the translation is a fault of the
    turn, which the dataplane answers 500 before the answer began and aborts after).
    """

    def stream(self, piece: bytes) -> bytes: ...

    def stream_end(self) -> bytes: ...

    def whole(self, body: bytes) -> bytes: ...

    def refusal(self, status: int, body: bytes) -> bytes: ...


PRIORITY_VALUES: dict[str, dict[int, int]] = {
    "lower_first": {pb.INTERACTIVE: 0, pb.BATCH: 1},
    "higher_first": {pb.INTERACTIVE: 1, pb.BATCH: 0},
}
"""The ``priority`` a turn carries to a replica with ``[[replicas]] priority`` set, by that order
and the turn's service class: the interactive class gets the value the engine serves first.

Why these values: vLLM (lower first) gives a request without the field priority 0, so an untagged
request from another client ranks with interactive turns, ahead of batch ones, never behind them
(0 is also the one value vLLM takes without its priority policy, so a replica set up wrongly still
serves interactive turns). SGLang gives an untagged request the value it serves last, whichever
order it uses, so no choice of ours can move it ahead; 0 and 1 differ by less than its
``--priority-scheduling-preemption-threshold`` (default 10), so an interactive turn reorders the
waiting queue but never preempts a running batch turn (whose decode would be thrown away)."""

# The same, as the bytes spliced in: the opening brace and the member that follows it.
_PRIORITY_HEADS: dict[str, dict[int, bytes]] = {
    order: {cls: b'{"priority":%d,' % value for cls, value in values.items()}
    for order, values in PRIORITY_VALUES.items()
}


def with_priority(body: bytes, order: EnginePriority, service_class: int) -> bytes:
    """``body`` with ``"priority":N,`` spliced in right after its opening brace, ``N`` from
    :data:`PRIORITY_VALUES` for ``order`` and ``service_class`` (a ``ServiceClass``).

    ``body`` must be what the front door took: a JSON object (``_json_with_model`` in ``app.py``:
    only JSON whitespace may precede its brace, and orjson refuses a byte order mark) with at least
    one member (``model``), so the comma is followed by one, and without a ``priority`` member of
    its own (a client's explicit choice is sent as it came; the caller checks). Nothing else is
    parsed or re-encoded: the client's bytes follow unchanged, copied once.
    """
    start = body.index(b"{")
    return b"".join((body[:start], _PRIORITY_HEADS[order][service_class], memoryview(body)[start + 1 :]))


_ID_PREFIX = secrets.token_hex(8)
"""64 random bits per process: ids made here never meet another process's (dataplanes, restarts)."""
_ID_COUNTER = itertools.count()


def new_id() -> str:
    """A fresh id, unique across processes: this process's random prefix and a counter (hex).

    Cheaper than ``uuid4()``, which reads the kernel's random source on every call.
    """
    return f"{_ID_PREFIX}{next(_ID_COUNTER):x}"


@dataclass(slots=True)
class Turn:
    """One request as admitted: ids, class and caller, what goes to the engine.

    ``run_id`` is ``""`` for a single-pass turn (``POST /v1/decide``), which belongs to no run.
    ``body`` is what the engine is sent (the client's bytes for Chat Completions and
    ``/v1/decide``), to ``upstream_path`` on the replica (``""``: :data:`CHAT_PATH`, or
    :data:`CLASSIFY_PATH` for a single-pass turn); ``translation`` shapes the answer for a client of
    another API (None: relayed unchanged). ``arrived`` is the ``loop.time()`` (seconds) at which the
    request's body had been read; ``first_token_at`` the ``loop.time()`` of its first token, once it
    came. ``traceparent`` is what goes on with the turn (to the scheduler and the engine): the
    dataplane's own span of it (``span``) while tracing is active, else the client's header as it
    came; ``tracestate`` (W3C Trace Context: forwarded with its ``traceparent``) goes on to the
    engine with it, unchanged.
    """

    turn_id: str
    run_id: str
    model: str
    service_class: int
    caller: str
    body: bytes
    traceparent: str | None
    tracestate: str | None = None
    single_pass: bool = False
    arrived: float = 0.0
    first_token_at: float | None = None
    span: Span | None = None
    new_run: bool = False
    """The run was made up for this turn (no header, no known tool call): forgotten again if the
    turn never reaches a replica."""
    client_priority: bool = False
    """The client's body has a top-level ``priority`` of its own: sent as it came, never tagged."""
    upstream_path: str = ""
    translation: Translation | None = None
    replica: str = ""
    """Where the turn was sent, once it was."""

    @staticmethod
    def new_id() -> str:
        """A fresh turn id (:func:`new_id`)."""
        return new_id()

    @property
    def path(self) -> str:
        """Where the turn goes on its replica."""
        return self.upstream_path or (CLASSIFY_PATH if self.single_pass else CHAT_PATH)
