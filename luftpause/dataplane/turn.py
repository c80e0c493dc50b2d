"""One turn as the dataplane admits and forwards it, in three immutable stages, and the ways its
request and answer may be shaped on the way (an engine's ``priority``; a front door API other than
Chat Completions).

Stages, each a frozen record made once by the part that decides it: :class:`Turn`, what intake
decided (``intake/turns.py``); :class:`Admitted`, what admission decided (the replica, the
failovers left; ``server/turns.py`` from ``link/placement.py``'s answer); :class:`Relayed`, what the
relay saw (``relay/loop.py``). Nothing writes a stage after it is made: a turn sent again to
another replica is a new :class:`Turn` (:meth:`Turn.again`) admitted anew.

Front doors: a turn carries what goes to the engine (``upstream_path``, ``body``) and, when its
client speaks another API than the engine's, a :class:`Translation` of the engine's answer (the
translators of ``luftpause.dataplane.apis`` fit it). Every fact (first token, usage, finish reason,
tool-call ids) is then still read from the engine's own Chat Completions answer, so a translator
only shapes what the client sees. A turn of another API may also carry a :class:`Native` way to
a replica that serves that API itself: its bytes go there unchanged and the answer's facts are read
by that API's own scanner. A Chat Completions turn has neither: its answer is relayed unchanged.
"""

from __future__ import annotations

import dataclasses
import itertools
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from luftpause.config import EnginePriority, ReplicaConfig
from luftpause.v1 import scheduler_pb2 as pb

if TYPE_CHECKING:
    from luftpause.dataplane.relay.machine import Outcome
    from luftpause.dataplane.sse import SSEScanner

__all__ = [
    "CHAT_PATH",
    "CLASSIFY_PATH",
    "PRIORITY_VALUES",
    "RUN_ID_HEADER",
    "Admitted",
    "Facts",
    "Native",
    "Relayed",
    "StreamTranslation",
    "Translation",
    "Turn",
    "new_id",
    "with_priority",
]

RUN_ID_HEADER = "x-luftpause-run-id"

CHAT_PATH = "/v1/chat/completions"
CLASSIFY_PATH = "/classify"
"""Where a single-pass turn goes on its replica: vLLM's classification route."""


class StreamTranslation(Protocol):
    """One streamed answer's translation, as ``luftpause.dataplane.apis`` makes them
    (``MessagesStream``, ``ResponsesStream``): the engine's Chat Completions SSE in, the client's
    API's SSE out.

    ``feed(read) -> bytes`` takes every read of the engine's body as it came (cut anywhere) and
    returns what to send the client now (maybe ``b""``; the API's opening events come with the
    first); ``finish() -> bytes`` at the end of the engine's body returns the closing events. Either
    raises when the answer cannot be translated faithfully or ended early: the relay then aborts the
    client's connection, as for a chat stream that broke. ``scanner`` is the
    :class:`~luftpause.dataplane.sse.SSEScanner` that read the engine's bytes inside ``feed``: the
    turn's facts (first token, usage, finish reason, error), so the relay scans nothing twice;
    ``tool_call_ids`` the ids of the tool calls the client was sent.
    """

    tool_call_ids: list[str]

    @property
    def scanner(self) -> SSEScanner: ...

    def feed(self, chunk: bytes | bytearray) -> bytes: ...

    def finish(self) -> bytes: ...


@dataclass(frozen=True, slots=True)
class Translation:
    """How the answer to one turn reaches a client that speaks another API than the engine.

    The engine answers in Chat Completions (OpenAI API reference, "Create chat completion");
    the relay reads every fact from that answer and gives the client:

    * for a streamed 200 answer, what ``stream()`` (a new :class:`StreamTranslation`, made when the
      engine's head came) makes of it;
    * for a whole 200 answer, ``whole(body)`` (the engine's JSON bytes in, the client's out);
    * for an engine's refusal (429, 5xx), ``refusal(status, body)``, the client's body in its API's
      error shape (status and ``Retry-After`` unchanged).

    ``whole`` raises :class:`~luftpause.dataplane.relay.upstream.EngineError` for an engine's answer it
    cannot read (the turn fails: 502); else neither it nor ``refusal`` may raise (a fault there is
    a fault of the turn: 500).
    """

    stream: Callable[[], StreamTranslation]
    whole: Callable[[bytes], bytes]
    refusal: Callable[[int, bytes], bytes]


Facts = tuple[str, bool, int, int, list[str]]
"""``(finish_reason, tool calls emitted, prompt tokens, completion tokens, tool-call ids)`` of a
whole answer, ``-1`` for a count not known."""


@dataclass(frozen=True, slots=True)
class Native:
    """How a turn of another front door reaches a replica that serves its API itself
    (``[[replicas]] apis``): ``body`` (the client's bytes) goes to ``path`` unchanged and the answer
    comes back unchanged; ``scanner()`` makes the fact scanner of its event stream (the chat
    :class:`~luftpause.dataplane.sse.SSEScanner`'s interface), ``whole(body)`` reads the facts of a
    whole answer. ``api``: ``"messages"`` or ``"responses"``."""

    api: str
    path: str
    body: bytes
    scanner: Callable[[], SSEScanner]
    whole: Callable[[bytes], Facts]


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

    ``body`` must be what the front door took: a JSON object (``json_with_model`` in ``intake.checks``:
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


@dataclass(frozen=True, slots=True)
class Turn:
    """What intake decided of one request (the turn's first stage; :class:`Admitted` and
    :class:`Relayed` are the next two): ids, class and caller, what goes to the engine.

    ``run_id`` is ``""`` for a single-pass turn (``POST /v1/decide``), which belongs to no run.
    ``body`` is what the engine is sent (the client's bytes for Chat Completions and
    ``/v1/decide``), to ``upstream_path`` on the replica (``""``: :data:`CHAT_PATH`, or
    :data:`CLASSIFY_PATH` for a single-pass turn); ``translation`` shapes the answer for a client of
    another API (None: relayed unchanged). ``arrived`` is the clock's time (seconds) at which the
    request's body had been read. ``traceparent`` is what goes on with the turn (to the scheduler
    and the engine): the client's header as it came, or, while tracing is active, the context of
    the dataplane's own span of it (a new value, made when the span starts); ``tracestate`` (W3C
    Trace Context: forwarded with its ``traceparent``) goes on to the engine with it, unchanged.
    Sent again to another replica (docs/failover.md), it is the same turn under a new ``turn_id``.
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
    new_run: bool = False
    """The run was made up for this turn (no header, no known tool call): forgotten again if the
    turn never reaches a replica."""
    ask_ids: tuple[str, ...] = ()
    """The tool-call ids the request answers, when this dataplane did not know them and made up
    its run: the scheduler is asked which run emitted them (``AdmitRequest.tool_call_ids``), and
    the turn takes that run (``AdmitReply.run_id``). Such a turn is never placed under a lease."""
    client_priority: bool = False
    """The client's body has a top-level ``priority`` of its own: sent as it came, never tagged."""
    choices: int = 1
    """How many choices the request asked for (Chat Completions' ``n``): a streamed answer is whole
    only once each of them said its finish reason, or at ``[DONE]``."""
    upstream_path: str = ""
    translation: Translation | None = None
    native: Native | None = None
    """How the turn goes to a replica that serves its API natively (None: a chat turn, or no
    replica of its model does); the relay takes it there, and ``translation`` elsewhere."""

    @staticmethod
    def new_id() -> str:
        """A fresh turn id (:func:`new_id`)."""
        return new_id()

    @property
    def path(self) -> str:
        """Where the turn goes on its replica."""
        return self.upstream_path or (CLASSIFY_PATH if self.single_pass else CHAT_PATH)

    def again(self) -> Turn:
        """This turn once more, for another replica: a new turn id, everything else as intake
        decided it."""
        return dataclasses.replace(self, turn_id=new_id())

    def named(self, run_id: str, made_up: bool = False) -> Turn:
        """This turn in the run the scheduler named for it (``made_up``: still the one made up
        here), nothing more to ask about."""
        return dataclasses.replace(self, run_id=run_id, new_run=made_up, ask_ids=())

    def traced(self, traceparent: str, tracestate: str | None) -> Turn:
        """This turn carrying its own span's context on (``traceparent``, ``tracestate``)."""
        return dataclasses.replace(self, traceparent=traceparent, tracestate=tracestate)


@dataclass(frozen=True, slots=True)
class Admitted:
    """What admission decided of a turn (its second stage): ``replica``, where it goes (as this
    dataplane's replica set names it); ``failovers_left``, how many more times it may go to another
    replica when this one fails before answering (``[dataplane.failover]``: 1 when failover is on,
    0 for a turn already sent once); ``failover_from``, the replica that failed it before
    answering, for a turn sent again (``AdmitRequest.failover_from``; ``""`` for a first send)."""

    turn: Turn
    replica: ReplicaConfig
    failovers_left: int = 0
    failover_from: str = ""


@dataclass(frozen=True, slots=True)
class Relayed:
    """What the relay saw of an admitted turn (its third stage): the ``replica`` it was sent to,
    whether that replica served its API ``natively`` (the client's bytes there, the answer back
    unchanged), when its first token came (the clock's seconds; ``None``: none came, or the answer
    was whole) and its ``outcome`` (:class:`~luftpause.dataplane.relay.machine.Finished` or
    :class:`~luftpause.dataplane.relay.machine.Failed`)."""

    replica: str
    native: bool
    first_token_at: float | None
    outcome: Outcome
