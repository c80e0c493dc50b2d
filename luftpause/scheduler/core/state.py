"""The scheduler's placement state: replicas, runs, held turns and placed (in-flight) turns.

Plain mutable records, changed only by :mod:`luftpause.scheduler.core.decide`. Built from the
configuration's replicas by :func:`new_state`; everything else arrives as events.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal, Protocol, TypeVar

from luftpause.scheduler.core.events import RunPhase, ServiceClass
from luftpause.scheduler.core.held import HeldTurns
from luftpause.scheduler.core.policies.breaker import BreakerState
from luftpause.scheduler.core.policies.expiry import RUN_EXPIRY_S
from luftpause.scheduler.core.policies.idle_affinity import IdleAffinity
from luftpause.scheduler.core.policies.kv_admission import KvAdmission
from luftpause.scheduler.core.policies.limits import Bucket, Protection
from luftpause.scheduler.core.policies.lost_dataplane import DATAPLANE_GRACE_S
from luftpause.scheduler.core.policies.pause_hold import PauseHold
from luftpause.scheduler.core.policies.run_order import RunOrder

if TYPE_CHECKING:
    from luftpause.config import Config

_V = TypeVar("_V")


class ReplicaSpec(Protocol):
    """What the core reads of a configured replica (``luftpause.config.ReplicaConfig`` fits)."""

    @property
    def name(self) -> str: ...
    @property
    def models(self) -> tuple[str, ...]: ...
    @property
    def kind(self) -> Literal["generative", "single_pass"]: ...
    @property
    def max_inflight(self) -> int: ...


@dataclass(slots=True)
class Replica:
    """One configured engine replica and the turns the scheduler has placed on it."""

    name: str
    models: tuple[str, ...]
    kind: Literal["generative", "single_pass"]
    max_inflight: int
    """Capacity: at most this many placed turns at once (a resync may adopt more; none are added then)."""
    index: int
    """Position in the configuration: breaks ties between equally loaded replicas."""
    inflight: int = 0
    """Turns placed here and not yet finished, failed, abandoned or expired."""
    healthy: bool = True
    """From the last probe; a replica never probed counts as healthy."""
    probed_at: float | None = None
    """Seconds (the shell's monotonic clock) of the last probe; ``None`` before the first."""
    engine_running: int | None = None
    """Requests the engine reported running at the last probe; ``None``: it reports no load."""
    engine_waiting: int | None = None
    """Requests the engine reported queued at the last probe; ``None``: it reports no load."""
    batch_capacity: int | None = None
    """Requests its engine runs at once, learned from probes (:mod:`.policies.engine_load`):
    ``None`` until a probe shows a queue, and again after ill health or a probe with no load."""
    queued: bool = False
    """Its last probe showed a queue (:mod:`.policies.engine_load`: a queue on two probes in a row is
    the engine's bound)."""
    kv_usage: float | None = None
    """Fraction of the engine's KV cache in use at the last probe (0..1), if reported."""
    cache_hit_rate: float | None = None
    """The engine's prefix cache hit rate at the last probe (0..1), if reported."""
    turn_s: float | None = None
    """Moving mean of its finished generative turns' times, placement to end (seconds;
    :func:`.policies.pause_hold.learn_turn_time`); ``None`` before the first."""
    reserved_for: set[str] = field(default_factory=set)
    """Interactive runs tool-paused here: one slot each is kept from batch turns (headroom)."""
    leased: int = 0
    """Slots leased to dataplanes and not used yet (rule 14): taken, as far as capacity goes."""
    draining: bool = False
    """Takes no new run, only turns of runs pinned here (rule 16, :mod:`.policies.draining`)."""
    removing: bool = False
    """Being removed: takes no turn, leaves the set when nothing is placed here (rule 16)."""
    breaker: BreakerState = "closed"
    """Its circuit breaker's state (rule 17, :mod:`.policies.breaker`)."""
    fault_times: list[float] = field(default_factory=list)
    """When turns failed here with an engine fault since its last finished turn, within the
    breaker's window (seconds, the shell's clock; oldest first)."""
    opened_at: float = 0.0
    """When its breaker last opened (seconds, the shell's clock)."""
    trial_successes: int = 0
    """Turns finished here in a row while its breaker is half-open."""
    trial_turns: int = 1
    """Turns it takes at once while its breaker is half-open (``breaker_trial_turns``)."""
    kv_tokens: int | None = None
    """Its engine's KV pool in tokens (``[[replicas]] kv_tokens``); ``None``: unknown, runs are
    admitted by slots alone (:mod:`.policies.kv_admission`)."""
    kv_runs: dict[str, int] = field(default_factory=dict)
    """Run id -> tokens counted for each run in progress here (:mod:`.policies.kv_admission`)."""
    kv_used: int = 0
    """The sum of ``kv_runs``' tokens."""

    @property
    def failures(self) -> int:
        """Turns failed here with an engine fault that count toward opening its breaker."""
        return len(self.fault_times)

    @property
    def tripped(self) -> bool:
        """Its breaker is open: it takes no turn."""
        return self.breaker == "open"


@dataclass(slots=True)
class Lease:
    """What one dataplane holds of one replica: ``count`` unused slots, granted under ``epoch``."""

    count: int
    epoch: int


@dataclass(slots=True)
class Run:
    """What the scheduler remembers of one run (an agent's sequence of turns)."""

    run_id: str
    phase: RunPhase
    last_replica: str | None
    """Where its last turn was placed (holds its prefix cache); ``None`` before its first placement."""
    service_class: ServiceClass
    caller: str
    last_activity: float
    """Seconds (the shell's monotonic clock) of the last arrival, placement or end of one of its turns."""
    turns: set[str] = field(default_factory=set)
    """Its turns that are held or placed right now."""
    latest_turn: str | None = None
    """Its most recently placed turn: only that turn's end changes the phase (``None``: any does)."""
    reserved_on: str | None = None
    """The replica holding a headroom slot for it (an interactive run tool-paused there), if any."""
    paused_at: float | None = None
    """When its current tool pause began (seconds, the shell's clock); ``None`` unless paused."""
    hold_until: float | None = None
    """When the current pause's headroom hold ends (:mod:`.policies.pause_hold`); ``None``: never,
    or not paused."""
    hold_expired: bool = False
    """The current pause outlived its hold: it keeps no slot until the run leaves the pause."""
    returned: bool = False
    """A turn of it arrived since its pause began (the pause's length is already recorded)."""
    pauses: list[float] = field(default_factory=list)
    """Its last tool pauses (seconds from a pause's start to its next turn's arrival)."""
    order: int = 0
    """Its start number: the state's arrival counter when the scheduler first saw it (the run
    order's rank, :mod:`.policies.run_order`)."""
    attained_s: float = 0.0
    """Seconds its turns were placed, summed as they ended (its attained service)."""
    idle_at: float | None = None
    """When its latest turn finished without a tool call on ``last_replica`` (seconds), which then
    holds its prefix (:mod:`.policies.idle_affinity`); ``None``: it is not idle so, or its last
    turn failed, was abandoned or expired, or a resync set its phase."""
    prefix_tokens: int = 0
    """Prompt and completion tokens of its last finished turn: what its last replica holds for it."""
    finished_turns: int = 0
    """Its turns that finished (the first one's prefill is a cold one)."""
    cold_s_per_token: float | None = None
    """Seconds per prompt token from placement to first token of its first finished turn: what a
    prefill with nothing cached costs it (``None`` until shown)."""
    kv_on: str | None = None
    """The replica whose KV pool counts it as a run in progress (:mod:`.policies.kv_admission`)."""
    kv_parked: bool = False
    """Its tool outlived its caller's usual pause under KV pressure: counted and pinned nowhere
    until its next turn is placed (:mod:`.policies.kv_admission`)."""


@dataclass(slots=True)
class PlacedTurn:
    """A turn placed on a replica and not yet ended: it holds one of that replica's slots."""

    turn_id: str
    run_id: str
    model: str
    service_class: ServiceClass
    caller: str
    dataplane_id: str
    replica: str
    placed_at: float
    started_at: float | None = None
    first_token_at: float | None = None
    single_pass: bool = False
    """A single-pass turn: it holds a slot of a single-pass replica and belongs to no run."""
    trace_id: str = ""
    """The turn's W3C trace id (32 hex digits), ``""`` when it came without one (or was adopted
    from a resync, which carries none)."""


@dataclass(slots=True)
class Counters:
    """Cumulative counts since the scheduler started (turns unless named otherwise).

    They balance after every event (:meth:`State.balance` gives both sides, the state machine
    checks it):

    * every arrived turn was admitted, abandoned while held, adopted while held (a resync found it
      running), or is held: ``arrived == admitted + abandoned_held + held_adopted + held``;
      a refused turn (``rejected``) never arrived, and a leased turn counts in ``arrived`` and
      ``admitted`` alike (``leased`` is a part of ``admitted``, not a third source); a held turn
      refused past its queue timeout (``held_timed_out``) left the queue unplaced:
      ``arrived == admitted + abandoned_held + held_adopted + held_timed_out + held``;
    * every turn that took a slot (``admitted + adopted``) finished, failed, was abandoned, expired,
      was released (by a resync or a lost dataplane) or is still placed: ``admitted + adopted ==
      finished + failed + abandoned_placed + expired_turns + turns_released_resync +
      turns_released_lost_dataplane + placed``.
    """

    arrived: int = 0
    """New turns with a served model (retried Admits and rejected turns not counted)."""
    admitted: int = 0
    """Placed by this scheduler (also under a lease it granted, counted in ``leased`` too)."""
    adopted: int = 0
    """Taken over from a dataplane's resync."""
    finished: int = 0
    failed: int = 0
    rejected: int = 0
    """Refused at once: an unknown model, a turn its dataplane had reported abandoned, or a
    protection limit (``limited_held``, ``limited_token_rate``)."""
    abandoned: int = 0
    """Held or placed turns whose client left before they ran (Admit cancelled or reported):
    ``abandoned_held + abandoned_placed``."""
    abandoned_held: int = 0
    """Of ``abandoned``, those that were held (they leave the queue, never placed)."""
    abandoned_placed: int = 0
    """Of ``abandoned``, those that had been placed (their slot freed)."""
    held_adopted: int = 0
    """Held turns that a resync listed as already running (an answer lost with a stream): they
    leave the queue as adopted turns, counted in ``adopted`` too."""
    expired_turns: int = 0
    expired_runs: int = 0
    runs_ended: int = 0
    turns_released_resync: int = 0
    """Placed turns released because their dataplane's resync no longer listed them (rule 10)."""
    turns_released_lost_dataplane: int = 0
    """Placed turns released because their dataplane stayed lost past the grace."""
    leased: int = 0
    """Placed by a dataplane under a capacity lease (rule 14), without an Admit."""
    lease_crossings: int = 0
    """Leased turns whose lease had been withdrawn when they were reported (crossed on the wire)."""
    leased_off_affinity: int = 0
    """Leased turns of a run the scheduler had pinned to another healthy replica (a stale dataplane)."""
    lease_revocations: int = 0
    """Leases withdrawn (one per dataplane and replica)."""
    limited_held: int = 0
    """Of ``rejected``, turns refused because their caller had its most turns of their class held."""
    limited_token_rate: int = 0
    """Of ``rejected``, turns refused because their caller's token bucket for their class was empty."""
    held_timed_out: int = 0
    """Held turns refused (429) past their queue timeout: they leave the queue unplaced."""
    breaker_trips: int = 0
    """Times a replica's circuit breaker opened (took it out of rotation)."""
    breaker_closes: int = 0
    """Times a replica's circuit breaker closed (its trial turns finished: back in full rotation)."""
    replicas_added: int = 0
    replicas_retired: int = 0
    """Removed replicas that left the set (their last turn ended)."""


@dataclass(slots=True)
class State:
    """All placement state of one scheduler.

    ``runs`` is kept least recently active first, ``placed`` in placement order, ``tombstones``
    in report order and ``lost_dataplanes`` in order of loss, so expiry looks only at the front of
    each (event times never go backwards).
    """

    replicas: dict[str, Replica]
    """By name, in configuration order."""
    model_replicas: dict[str, tuple[Replica, ...]]
    """Model -> the generative replicas that declare it, in configuration order."""
    single_pass_model_replicas: dict[str, tuple[Replica, ...]] = field(default_factory=dict)
    """Model -> the single-pass replicas that declare it, in configuration order."""
    runs: OrderedDict[str, Run] = field(default_factory=OrderedDict)
    held: HeldTurns = field(default_factory=HeldTurns)
    placed: OrderedDict[str, PlacedTurn] = field(default_factory=OrderedDict)
    tombstones: OrderedDict[str, float] = field(default_factory=OrderedDict)
    """Turn ids a dataplane reported abandoned -> when (seconds), oldest first: their Admits are refused."""
    counters: Counters = field(default_factory=Counters)
    next_seq: int = 0
    """Arrival number given to the next held turn."""
    caller_inflight: dict[str, int] = field(default_factory=dict)
    """Caller -> its placed generative turns (callers with none are absent): the fairness signal
    of ordering among held generative turns."""
    single_pass_inflight: dict[str, int] = field(default_factory=dict)
    """Caller -> its placed single-pass turns (callers with none are absent): the same signal among
    held single-pass turns, which compete for other replicas."""
    root_inflight: dict[str, int] = field(default_factory=dict)
    """Root caller -> the placed generative turns of it and all its sub-callers (roots with none
    are absent; :mod:`.policies.caller_tree`): the first fairness signal among held generative
    turns, so that sub-callers share their root's part (:mod:`.policies.ordering`)."""
    single_pass_root_inflight: dict[str, int] = field(default_factory=dict)
    """Root caller -> the placed single-pass turns under it: the same among held single-pass turns."""
    lost_dataplanes: OrderedDict[str, float] = field(default_factory=OrderedDict)
    """Dataplane id -> when (seconds) its last Connect stream ended, oldest first; an id leaves when
    the dataplane comes back (its next stream's resync) or when its turns are released."""
    dataplane_grace_s: float = DATAPLANE_GRACE_S
    """Seconds a lost dataplane may stay away before its placed turns are released."""
    strict_affinity: bool = True
    """Rule 4 on (the default). Off, every turn may go to any replica serving its model: only for
    measuring what keeping a run on the replica that holds its prefix gains (``bench/flood.py``)."""
    leasing: bool = False
    """Rule 14 on: dataplanes that take leases are granted them (``[scheduler] leases``)."""
    lessees: dict[str, dict[str, Lease]] = field(default_factory=dict)
    """Dataplane id -> replica name -> what it holds there, for the dataplanes taking leases, in the
    order they resynced (the order slots are shared in)."""
    next_lease_epoch: int = 1
    """The epoch the next new or revoked holding gets: never reused within this state's life."""
    resync_hold_s: float = 0.0
    """Startup hold (rule 15, ``[scheduler] resync_hold_s``): seconds from the first event during
    which, once a resync showed a restart, no turn is placed and no lease granted."""
    hold_until: float | None = None
    """When the startup hold ends (seconds, the shell's clock): the first event's time plus
    ``resync_hold_s``; ``None`` before the first event."""
    holding: bool = False
    """The startup hold is in force: held turns are not placed, leases not granted."""
    run_order: RunOrder = "run"
    """Which of a caller's held turns of one class goes first (:mod:`.policies.run_order`)."""
    pause_hold: PauseHold = field(default_factory=PauseHold)
    """How long a tool-paused interactive run keeps its headroom slot (:mod:`.policies.pause_hold`)."""
    caller_pauses: OrderedDict[str, list[float]] = field(default_factory=OrderedDict)
    """Caller -> the last tool pauses its runs showed (seconds), the hold's fallback signal; the
    :data:`MAX_REMEMBERED_CALLERS` callers that showed one most recently (:func:`bound_callers`)."""
    hold_ends: list[tuple[float, str, float]] = field(default_factory=list)
    """Heap of ``(hold end, run id, pause start)`` of every pause hold begun (stale entries are
    dropped when they come up on a tick)."""
    idle_affinity: IdleAffinity = field(default_factory=IdleAffinity)
    """Where an idle run's next turn goes (:mod:`.policies.idle_affinity`)."""
    caller_cold_rates: OrderedDict[str, float] = field(default_factory=OrderedDict)
    """Caller -> the cold prefill rate its latest run showed (seconds per prompt token), the soft
    wait's fallback before a run has shown its own; the :data:`MAX_REMEMBERED_CALLERS` callers
    that showed one most recently."""
    soft_ends: list[tuple[float, int, str]] = field(default_factory=list)
    """Heap of ``(wait end, arrival number, turn id)`` of every turn held for its soft replica
    (stale entries are dropped when they come up on a tick)."""
    protection: Protection = field(default_factory=Protection)
    """Protection limits and the circuit breaker (rules 17, 18, :mod:`.policies.limits`); none by
    default."""
    breaker_transitions: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """``(replica, from, to)`` -> times that replica's breaker went ``from`` -> ``to`` (rule 17)."""
    buckets: dict[tuple[str, str], Bucket] = field(default_factory=dict)
    """``(holder, class)`` -> its token bucket, for the pairs with a token rate that spent any
    (full ones are dropped on a tick); a holder is the name a caller's limits are counted for
    (:meth:`.policies.limits.Protection.holder`: its root, or a configured caller of its lineage)."""
    limited_by_caller: dict[str, int] = field(default_factory=dict)
    """Caller -> its turns refused by a protection limit (at most ``MAX_LIMITED_CALLERS`` callers;
    the rest counted under ``"*"``)."""
    limited_by_class: dict[str, dict[str, int]] = field(default_factory=dict)
    """Class -> reason (``held``, ``queue_timeout``, ``token_rate``) -> turns refused."""
    run_expiry_s: float = RUN_EXPIRY_S
    """Seconds with no turn after which a run is forgotten (``[scheduler] run_expiry_s``,
    :mod:`.policies.expiry`)."""
    kv_admission: KvAdmission = field(default_factory=KvAdmission)
    """Whether runs start on a replica by its KV pool too (:mod:`.policies.kv_admission`)."""
    caller_first_tokens: OrderedDict[str, float] = field(default_factory=OrderedDict)
    """Caller -> moving mean of its runs' first turns' prompt and completion tokens (the
    :data:`MAX_REMEMBERED_CALLERS` most recent callers)."""
    caller_growth: OrderedDict[str, float] = field(default_factory=OrderedDict)
    """Caller -> moving mean of the tokens its runs' contexts grew by per finished turn."""
    first_tokens: float | None = None
    """Moving mean of every caller's runs' first turns (tokens): a new caller's estimate."""
    removing: set[str] = field(default_factory=set)
    """Replicas being removed (rule 16): each leaves the set once nothing is placed or leased on it."""
    next_replica_index: int = 0
    """The configuration index the next replica added at run time gets (after every other)."""

    def balance(self) -> tuple[tuple[int, int], tuple[int, int]]:
        """Both sides of the two balances of :class:`Counters`: ``((arrived, its fates), (turns that
        took a slot, their fates))``; each pair is equal after every event."""
        c = self.counters
        arrivals = (
            c.arrived,
            c.admitted + c.abandoned_held + c.held_adopted + c.held_timed_out + len(self.held),
        )
        ends = (
            c.finished + c.failed + c.abandoned_placed + c.expired_turns + c.turns_released_resync
            + c.turns_released_lost_dataplane + len(self.placed)
        )  # fmt: skip
        return arrivals, (c.admitted + c.adopted, ends)

    def __post_init__(self) -> None:
        # the held queues order roots and callers by their in-flight turns: they read these dicts
        self.held.bind_loads(
            self.caller_inflight,
            self.single_pass_inflight,
            self.root_inflight,
            self.single_pass_root_inflight,
        )


def state_from_replicas(
    specs: Iterable[ReplicaSpec],
    dataplane_grace_s: float = DATAPLANE_GRACE_S,
    strict_affinity: bool = True,
    leasing: bool = False,
    resync_hold_s: float = 0.0,
    pause_hold: PauseHold | None = None,
    run_order: RunOrder = "run",
    protection: Protection | None = None,
    idle_affinity: IdleAffinity | None = None,
    run_expiry_s: float = RUN_EXPIRY_S,
    kv_admission: KvAdmission | None = None,
) -> State:
    """An empty state for these replicas (names must be unique, as the configuration ensures).

    ``dataplane_grace_s``: seconds a dataplane may be without a Connect stream before the turns
    placed for it are released (:mod:`.policies.lost_dataplane`). ``leasing``: capacity leases
    (rule 14 of :mod:`.decide`) are granted to the dataplanes that take them. ``resync_hold_s``:
    the startup hold after a restart (rule 15), 0 for none. ``pause_hold``: how long tool-paused
    interactive runs keep headroom (:mod:`.policies.pause_hold`; ``None``: its defaults).
    ``run_order``: which held turn of a caller and class goes first (:mod:`.policies.run_order`).
    ``protection``: limits and circuit breaker (:mod:`.policies.limits`; ``None``: none).
    ``idle_affinity``: where idle runs' next turns go (:mod:`.policies.idle_affinity`; ``None``:
    its defaults). ``run_expiry_s``: seconds with no turn after which a run is forgotten.
    ``kv_admission``: runs start by the replicas' KV pools too (:mod:`.policies.kv_admission`;
    ``None``: its defaults); a spec's ``kv_tokens`` (absent or ``None``: unknown) is its pool.
    """
    replicas: dict[str, Replica] = {}
    for index, spec in enumerate(specs):
        replica = Replica(spec.name, tuple(spec.models), spec.kind, spec.max_inflight, index)
        replica.draining = bool(getattr(spec, "draining", False))  # ``[[replicas]] draining = true``
        replica.kv_tokens = getattr(spec, "kv_tokens", None)  # ``[[replicas]] kv_tokens = N``
        replicas[replica.name] = replica
    state = State(
        replicas,
        {},
        dataplane_grace_s=dataplane_grace_s,
        strict_affinity=strict_affinity,
        leasing=leasing,
        resync_hold_s=resync_hold_s,
        pause_hold=pause_hold or PauseHold(),
        run_order=run_order,
        protection=protection or Protection(),
        idle_affinity=idle_affinity or IdleAffinity(),
        next_replica_index=len(replicas),
        run_expiry_s=run_expiry_s,
        kv_admission=kv_admission or KvAdmission(),
    )
    index_models(state)
    return state


MAX_REMEMBERED_CALLERS = 4_096
"""Callers whose tool pauses and cold prefill rates the scheduler remembers (the most recent). The
caller is a header a client chooses (``x-luftpause-caller``), so a table keyed by it must not grow
with every value a client sends; a forgotten caller's next run starts from the defaults."""


def bound_callers(table: OrderedDict[str, _V], caller: str) -> None:
    """``caller``'s entry in ``table`` was just written: make it the most recent, and drop the least
    recent callers past :data:`MAX_REMEMBERED_CALLERS`."""
    table.move_to_end(caller)
    while len(table) > MAX_REMEMBERED_CALLERS:
        table.popitem(last=False)


def index_models(state: State) -> None:
    """Rebuild ``model_replicas`` and ``single_pass_model_replicas`` from ``state.replicas`` (at
    start, and when the replica set changes: rule 16)."""
    by_kind: dict[str, dict[str, list[Replica]]] = {"generative": {}, "single_pass": {}}
    for replica in state.replicas.values():
        for model in replica.models:
            by_kind[replica.kind].setdefault(model, []).append(replica)
    state.model_replicas = {model: tuple(rs) for model, rs in by_kind["generative"].items()}
    state.single_pass_model_replicas = {model: tuple(rs) for model, rs in by_kind["single_pass"].items()}


def new_state(config: Config) -> State:
    """An empty state for ``config``'s replicas, dataplane grace, affinity (strict and idle),
    leases, startup hold, pause hold, protection limits and KV-token admission."""
    return state_from_replicas(
        config.replicas,
        config.scheduler.dataplane_grace_s,
        config.scheduler.strict_affinity,
        config.scheduler.leases,
        config.scheduler.resync_hold_s,
        pause_hold=PauseHold(config.scheduler.pause_hold, worth=config.scheduler.pause_hold_worth),
        protection=config.scheduler.protection.policy(),
        idle_affinity=IdleAffinity(config.scheduler.idle_affinity),
        run_expiry_s=config.scheduler.run_expiry_s,
        kv_admission=KvAdmission(config.scheduler.kv_admission, config.scheduler.kv_fill),
    )
