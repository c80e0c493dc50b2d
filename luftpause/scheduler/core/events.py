"""What happened: the inputs of :func:`luftpause.scheduler.core.decide.decide`.

Every event is a fact in the past tense, frozen and slotted. ``at`` is the shell's monotonic clock in
seconds (``time.monotonic()``), non-decreasing from one event to the next; the core never reads a
clock itself, so the same events always give the same decisions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ServiceClass = Literal["interactive", "batch"]
"""The class of work a run does: ``interactive`` (a person waits) or ``batch``."""

RunPhase = Literal["idle", "generating", "tool_paused"]
"""Where a run is: between answers, a turn in flight, or paused on a tool round."""

SERVICE_CLASSES: tuple[ServiceClass, ...] = ("interactive", "batch")
RUN_PHASES: tuple[RunPhase, ...] = ("idle", "generating", "tool_paused")


@dataclass(frozen=True, slots=True)
class TurnArrived:
    """A dataplane asked where turn ``turn_id`` of run ``run_id`` may run (an Admit).

    ``caller`` is ``""`` for the shared anonymous caller. A second arrival with the same ``turn_id``
    (an Admit retried after a reconnect) is answered from what the scheduler already knows.

    ``single_pass`` (``AdmitRequest.single_pass``): a single-pass turn (``POST /v1/decide``, a
    classifier or scorer). It goes only to single-pass replicas serving ``model``, never enters run
    state (``run_id`` is carried along and changes nothing) and never takes a generative slot.

    ``trace_id``: the turn's W3C trace id (32 lower-case hex digits) from the Admit's
    ``traceparent``, ``""`` without one; kept with the turn so that what becomes of it (expiry,
    abandon) can be logged with it.
    """

    turn_id: str
    run_id: str
    model: str
    service_class: ServiceClass
    caller: str
    dataplane_id: str
    at: float
    single_pass: bool = False
    trace_id: str = ""
    failover_from: str = ""
    """``AdmitRequest.failover_from``: the turn comes again because this replica failed it before
    answering (docs/failover.md): it goes to another usable replica of its model, refused 502 at
    once when there is none now rather than held until one is; ``""``: a first admission."""


@dataclass(frozen=True, slots=True)
class TurnStarted:
    """The dataplane sent the placed turn's request to its replica."""

    turn_id: str
    at: float


@dataclass(frozen=True, slots=True)
class FirstToken:
    """The placed turn streamed its first delta (content, reasoning or a tool call)."""

    turn_id: str
    at: float


@dataclass(frozen=True, slots=True)
class TurnFinished:
    """The engine completed the turn; ``tool_calls`` means the run now pauses on a tool round.

    Token counts come from the engine's usage (0 when it reported none).
    """

    turn_id: str
    at: float
    finish_reason: str
    tool_calls: bool
    prompt_tokens: int
    completion_tokens: int


@dataclass(frozen=True, slots=True)
class TurnFailed:
    """The placed turn ended without a completion (engine error, client gone mid-stream).

    ``engine_fault``: the replica failed it (an error status, a broken stream); false when its
    client left mid-stream, which says nothing of the replica (the circuit breaker counts only
    engine faults).
    """

    turn_id: str
    at: float
    error: str
    engine_fault: bool = True
    unreachable: bool = False
    """The engine was never reached (connection refused, or reset or timed out before any byte of
    its answer): the replica's breaker opens at once (rule 17), whatever its threshold."""


@dataclass(frozen=True, slots=True)
class TurnAbandoned:
    """The client left before the turn ran: a held turn leaves its queue, a placed one its slot."""

    turn_id: str
    at: float


@dataclass(frozen=True, slots=True)
class AbandonReported:
    """The dataplane reported that it gave turn ``turn_id`` up for good (``TurnEvent.ABANDONED``).

    Its client left while the Admit was outstanding, so the turn will never be sent to an engine.
    Unlike ``TurnAbandoned`` (an Admit call cancelled, which may be a broken connection that the
    dataplane retries) this is final: the turn is undone whatever the scheduler made of it, and an
    Admit for ``turn_id`` that arrives later (it may have crossed this report) is refused.
    """

    turn_id: str
    at: float


@dataclass(frozen=True, slots=True)
class RunEnded:
    """The run is over (``DELETE /v1/runs/{id}``): the scheduler forgets it at once."""

    run_id: str
    at: float


@dataclass(frozen=True, slots=True)
class Tick:
    """The shell's clock ticked (every 1 s): time for expiry."""

    at: float


@dataclass(frozen=True, slots=True)
class ReplicaProbed:
    """The shell probed replica ``replica`` (``GET <health_path>`` and ``GET /metrics``, every 2 s).

    ``healthy`` is False when the health check failed or timed out. The load fields come from the
    engine's Prometheus ``/metrics`` (SGLang or vLLM names, summed over label sets, or over the
    engines of ``load_from``) and are ``None`` when the replica reports no load (no metrics, or
    none under a known name): ``running`` and ``waiting`` are request counts, ``kv_usage`` and
    ``cache_hit_rate`` fractions in [0, 1].
    """

    replica: str
    at: float
    healthy: bool
    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    cache_hit_rate: float | None = None


@dataclass(frozen=True, slots=True)
class ReplicasProbed:
    """One probe round: every replica probed at once (``probes``, at most one per replica).

    The whole round is applied before any held turn is placed, and the replicas it gave room are
    then filled least loaded first, so the first replica of a round does not take every held turn
    that could go to any (a lone ``ReplicaProbed`` is a round of one).
    """

    at: float
    probes: tuple[ReplicaProbed, ...]


@dataclass(frozen=True, slots=True)
class RunRecord:
    """One run as a dataplane knows it, handed over on resync.

    ``last_replica`` is ``""`` when the run has not been placed yet.
    """

    run_id: str
    last_replica: str
    phase: RunPhase
    service_class: ServiceClass
    caller: str


@dataclass(frozen=True, slots=True)
class InFlightRecord:
    """One turn a dataplane has sent to ``replica`` and not yet seen end, handed over on resync.

    Whether it is a single-pass turn is read from ``replica``'s kind: a turn on a single-pass
    replica is adopted as one (its slot is counted, no run is touched).
    """

    turn_id: str
    run_id: str
    replica: str
    model: str
    service_class: ServiceClass
    caller: str


@dataclass(frozen=True, slots=True)
class Resynced:
    """Dataplane ``dataplane_id`` (re)connected and handed over its runs and in-flight turns.

    Its view replaces the scheduler's for that dataplane: its in-flight turns count against capacity
    (a turn id listed twice counts once) and its runs keep their affinity. ``pending`` are turn ids
    whose Admit is still out: their placements stand even though ``turns`` does not list them.
    ``takes_leases`` (``ResyncRequest.takes_leases``): it may be granted capacity leases.
    """

    dataplane_id: str
    at: float
    runs: tuple[RunRecord, ...]
    turns: tuple[InFlightRecord, ...]
    pending: frozenset[str] = frozenset()
    takes_leases: bool = False
    """It places turns under capacity leases (rule 14); its earlier leases are gone either way."""


@dataclass(frozen=True, slots=True)
class DataplaneLost:
    """The last open Connect stream of dataplane ``dataplane_id`` ended (closed, broken or cancelled).

    The dataplane may be reconnecting, restarting, or gone for good: if no ``Resynced`` for it (the
    first message of its next stream) comes within the grace (``dataplane_grace_s``, 60 s by
    default), the turns placed for it are released on the next ``Tick``. The shell counts a new
    stream open from its resync on, so an old stream seen to end after that is no loss. Dataplanes
    that send no id are never lost.
    """

    dataplane_id: str
    at: float


@dataclass(frozen=True, slots=True)
class LeasedTurnPlaced:
    """Dataplane ``dataplane_id`` placed turn ``turn_id`` on ``replica`` under a capacity lease.

    The turn went to its engine without an Admit (``LeasedTurn`` on the stream); ``epoch`` is the
    lease's (``GrantLease.epoch``). It is placed whatever the scheduler's lease says now: one that
    crossed a revocation on the wire is counted in ``lease_crossings`` (rule 14). ``trace_id``:
    as ``TurnArrived``'s (from the ``LeasedTurn``'s ``traceparent``).
    """

    turn_id: str
    run_id: str
    model: str
    service_class: ServiceClass
    caller: str
    dataplane_id: str
    replica: str
    epoch: int
    at: float
    trace_id: str = ""


@dataclass(frozen=True, slots=True)
class ReplicaAdded:
    """Replica ``name`` joined the set (the admin API, or ``SIGHUP`` with it new in the file).

    ``index`` orders it after every replica known so far (ties between equally loaded replicas).
    A name already in the set is ignored (the shell refuses it first).
    """

    name: str
    at: float
    models: tuple[str, ...]
    kind: Literal["generative", "single_pass"]
    max_inflight: int


@dataclass(frozen=True, slots=True)
class ReplicaDrained:
    """Replica ``name`` was set draining: it takes no new run, its runs finish there (rule 16)."""

    name: str
    at: float


@dataclass(frozen=True, slots=True)
class ReplicaRestored:
    """Replica ``name`` was put back in rotation: no longer draining, nor being removed."""

    name: str
    at: float


@dataclass(frozen=True, slots=True)
class ReplicaRemoved:
    """Replica ``name`` was removed from the set: it takes no turn from now on and leaves the set
    when its last placed turn ends (``RetireReplica``), at once when it has none (rule 16)."""

    name: str
    at: float


Event = (
    TurnArrived
    | LeasedTurnPlaced
    | TurnStarted
    | FirstToken
    | TurnFinished
    | TurnFailed
    | TurnAbandoned
    | AbandonReported
    | RunEnded
    | ReplicaProbed
    | ReplicasProbed
    | Tick
    | Resynced
    | DataplaneLost
    | ReplicaAdded
    | ReplicaDrained
    | ReplicaRestored
    | ReplicaRemoved
)
