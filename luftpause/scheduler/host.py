"""The imperative shell around the pure core: feeds events, carries out actions, answers admissions.

One :class:`SchedulerHost` lives in the scheduler's event loop. It owns the core's state, stamps
events with its monotonic clock, and keeps, per turn id, the answer callbacks of the admissions
waiting for that turn's ``Place`` or ``Reject`` (one per dataplane stream that sent the admit).
Everything runs on one loop thread, so ``decide`` needs no lock, and an answer is handed to its
stream in the same step as the decision that made it.

Logged here (logger ``luftpause.scheduler``), each with the fields ``turn_id``, ``run_id`` and
``trace_id`` (the turn's W3C trace id, ``""`` when it came without a ``traceparent``; the text log
format shows it as ``trace=<id>``), so that an operator finds the trace of every turn the scheduler
gives up: a placed turn expired (no completion after 10 min; WARNING, with ``replica``), a placed
turn released because its dataplane stayed away past its grace or no longer listed it in its
resync (WARNING, with ``replica`` and ``dataplane_id``), and a held or placed turn abandoned (its
client or its dataplane gave it up; INFO, with ``held`` true or false).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from luftpause.config import Config, ReplicaConfig
from luftpause.scheduler.core import (
    AbandonReported,
    Action,
    BreakerChanged,
    Event,
    Forget,
    GrantLease,
    HeldTurn,
    Place,
    PlacedTurn,
    Reject,
    ReplicaAdded,
    ReplicaDrained,
    ReplicaRemoved,
    ReplicaRestored,
    Resynced,
    RetireReplica,
    RevokeLease,
    State,
    Tick,
    TurnAbandoned,
    TurnArrived,
    dataplanes_gone_for_good,
    decide,
    expiring_turns,
    new_state,
    resync_gone_turns,
    snapshot,
    turns_on,
)
from luftpause.scheduler.core.policies import health
from luftpause.scheduler.core.policies.expiry import TURN_EXPIRY_S
from luftpause.scheduler.dataplanes import Dataplanes
from luftpause.scheduler.metrics import AdmissionCounts
from luftpause.scheduler.series import SchedulerSeries
from luftpause.scheduler.trace import TraceRecorder

log = logging.getLogger("luftpause.scheduler")

TICK_INTERVAL_S = 1.0

Outcome = Place | Reject
"""How an admission ends: placed on a replica, or refused."""

Answer = Callable[[Outcome], None]
"""Called once with the outcome of an admission, inside the ``feed`` that decided it; must not block."""

LeaseChange = GrantLease | RevokeLease
LeaseSink = Callable[[LeaseChange], None]
"""Takes the lease grants and revocations for one dataplane (its newest stream); must not block."""


def _turn_fields(turn: HeldTurn | PlacedTurn) -> dict[str, str]:
    """The structured fields of a log record about ``turn`` (JSON keys, :mod:`luftpause.observe.logs`)."""
    return {"turn_id": turn.turn_id, "run_id": turn.run_id, "trace_id": turn.trace_id}


class SchedulerHost:
    """The scheduler's state plus the admissions waiting on it.

    ``clock`` returns seconds on a monotonic scale (``time.monotonic`` by default).
    """

    def __init__(self, config: Config, clock: Callable[[], float] = time.monotonic) -> None:
        self.state: State = new_state(config)
        self.clock = clock
        self.replicas: dict[str, ReplicaConfig] = {replica.name: replica for replica in config.replicas}
        """The replica set as it stands (rule 16 of the core): what the prober probes and the
        dataplanes learn over their streams; a removed replica stays until it is retired."""
        self._replica_watchers: list[Callable[[], None]] = []
        self.context_lengths: dict[str, int] = {}
        """Replica -> the context length (tokens) its engine reported (:meth:`note_context_length`)."""
        self._waiters: dict[str, list[Answer]] = {}
        self._lessees: dict[str, LeaseSink] = {}
        self._tick_handle: asyncio.TimerHandle | None = None
        self._load_notes: dict[str, tuple[str | None, str | None]] = {}
        self.counts = AdmissionCounts(self.state.replicas)
        """What ``/metrics`` shows besides the snapshot (:mod:`luftpause.scheduler.metrics`)."""
        self.trace: TraceRecorder | None = None
        if config.scheduler.trace:
            self.trace = TraceRecorder(Path(config.scheduler.trace), clock())
        self.series = SchedulerSeries()  # the live page's last minutes, sampled on the clock's ticks
        self.dataplanes = Dataplanes(config.scheduler.run_expiry_s)
        """The dataplanes seen, and which run emitted each tool call
        (:mod:`luftpause.scheduler.dataplanes`)."""

    def now(self) -> float:
        """The shell's clock in seconds (monotonic), the ``at`` of every event."""
        return self.clock()

    def feed(self, event: Event) -> list[Action]:
        """Apply ``event`` to the core and carry out its actions; returns them."""
        # What the event gives up is read before it is applied: the core forgets it then.
        expiring: list[PlacedTurn] = []
        released: list[tuple[PlacedTurn, str]] = []
        abandoned: HeldTurn | PlacedTurn | None = None
        if type(event) is Tick:
            expiring = expiring_turns(self.state, event.at)
            gone = dataplanes_gone_for_good(self.state, event.at)
            if gone:
                expired = {placed.turn_id for placed in expiring}
                why = f"its dataplane stayed away past its grace ({self.state.dataplane_grace_s:.0f} s)"
                released = [(p, why) for p in turns_on(self.state, set(gone)) if p.turn_id not in expired]
        elif type(event) is Resynced:
            why = "its dataplane's resync no longer lists it"
            released = [(placed, why) for placed in resync_gone_turns(self.state, event)]
        elif type(event) is TurnAbandoned or type(event) is AbandonReported:
            abandoned = self.state.held.get(event.turn_id) or self.state.placed.get(event.turn_id)
        elif type(event) is TurnArrived:
            self.counts.arriving(event, self.state)
        if self.trace is not None:
            turn_id = getattr(event, "turn_id", "")
            self.trace.record(event, turn_id not in self.state.placed and turn_id not in self.state.held)
        self.state, actions = decide(self.state, event)
        self.series.observe(event)
        self.counts.decided(event, actions, self.state)
        for placed in expiring:
            log.warning(
                "turn %s of run %s expired: no completion %.0f s after its placement on %s",
                placed.turn_id,
                placed.run_id,
                TURN_EXPIRY_S,
                placed.replica,
                extra={**_turn_fields(placed), "replica": placed.replica},
            )
        for placed, why in released:
            log.warning(
                "turn %s of run %s on %s released: %s",
                placed.turn_id,
                placed.run_id,
                placed.replica,
                why,
                extra={
                    **_turn_fields(placed),
                    "replica": placed.replica,
                    "dataplane_id": placed.dataplane_id,
                },
            )
        if abandoned is not None:
            held = isinstance(abandoned, HeldTurn)
            log.info(
                "turn %s of run %s abandoned %s",
                abandoned.turn_id,
                abandoned.run_id,
                "while held" if held else "after its placement",
                extra={**_turn_fields(abandoned), "held": held},
            )
        for action in actions:
            if isinstance(action, Place | Reject):
                for answer in self._waiters.pop(action.turn_id, ()):
                    answer(action)
            elif isinstance(action, GrantLease | RevokeLease):
                sink = self._lessees.get(action.dataplane_id)
                if sink is not None:
                    sink(action)
            elif isinstance(action, Forget):
                log.debug("forgot run %s", action.run_id)
            elif isinstance(action, BreakerChanged):
                extra = {"replica": action.replica, "breaker": action.after, "breaker_from": action.before}
                if action.opened:
                    log.warning(
                        "replica %s out of rotation, its circuit breaker %s -> open: %s",
                        action.replica,
                        action.before,
                        action.reason,
                        extra=extra,
                    )
                elif action.after == "half_open":
                    log.info(
                        "replica %s takes trial turns, its circuit breaker open -> half_open: %s",
                        action.replica,
                        action.reason,
                        extra=extra,
                    )
                else:
                    log.info(
                        "replica %s back in rotation, its circuit breaker half_open -> closed: %s",
                        action.replica,
                        action.reason,
                        extra=extra,
                    )
            elif isinstance(action, RetireReplica):
                self.replicas.pop(action.replica, None)
                log.warning("replica %s left the set", action.replica, extra={"replica": action.replica})
                self._replicas_changed()
        return actions

    # -- the replica set at run time (the admin API, SIGHUP) ---------------------------------------------

    def watch_replicas(self, watcher: Callable[[], None]) -> Callable[[], None]:
        """Call ``watcher`` whenever the replica set changes; returns what stops it."""
        self._replica_watchers.append(watcher)
        return lambda: self._replica_watchers.remove(watcher)

    def _replicas_changed(self) -> None:
        for watcher in list(self._replica_watchers):
            watcher()

    def add_replica(self, replica: ReplicaConfig) -> None:
        """Add ``replica`` to the set; ``ValueError`` when its name is taken."""
        if replica.name in self.replicas:
            raise ValueError(f"replica {replica.name!r} is already in the set")
        self.replicas[replica.name] = replica
        self.feed(ReplicaAdded(replica.name, self.now(), replica.models, replica.kind, replica.max_inflight))
        log.warning("replica %s added", replica.name, extra={"replica": replica.name})
        self._replicas_changed()

    def drain_replica(self, name: str) -> None:
        """Drain ``name``: no new run goes there; ``KeyError`` when it is not in the set."""
        self._known(name)
        self.feed(ReplicaDrained(name, self.now()))
        log.warning("replica %s draining", name, extra={"replica": name})

    def restore_replica(self, name: str) -> None:
        """Put ``name`` back in rotation (ends a drain or a removal not finished yet)."""
        self._known(name)
        self.feed(ReplicaRestored(name, self.now()))
        log.warning("replica %s back in rotation", name, extra={"replica": name})

    def remove_replica(self, name: str) -> bool:
        """Remove ``name``: it takes no turn and leaves once its last placed turn ends; True when
        it left at once (nothing was placed there)."""
        self._known(name)
        self.feed(ReplicaRemoved(name, self.now()))
        gone = name not in self.replicas
        if not gone:
            log.warning("replica %s removed: it leaves when its turns end", name, extra={"replica": name})
        return gone

    def _known(self, name: str) -> None:
        if name not in self.state.replicas:
            raise KeyError(name)

    def reload(self, config: Config) -> list[str]:
        """Apply a re-read configuration's ``[[replicas]]`` (``SIGHUP``): new names are added, names
        gone are removed, ``draining = true`` drains and its removal puts back. A replica whose other
        settings changed is left as it is (remove it and add it under a new name). What was done or
        left, one line each."""
        done: list[str] = []
        wanted = {replica.name: replica for replica in config.replicas}
        for name in list(self.replicas):
            if name not in wanted and not self.state.replicas[name].removing:
                self.remove_replica(name)
                done.append(f"removed {name}")
        for name, replica in wanted.items():
            current = self.replicas.get(name)
            if current is None:
                self.add_replica(replica)
                done.append(f"added {name}")
                if replica.draining:
                    self.drain_replica(name)
                continue
            core = self.state.replicas[name]
            if current.model_copy(update={"draining": replica.draining}) != replica:
                done.append(f"left {name} as it was: only 'draining' changes at run time")
            if replica.draining and not core.draining:
                self.drain_replica(name)
                done.append(f"draining {name}")
            elif not replica.draining and (core.draining or core.removing):
                self.restore_replica(name)
                done.append(f"put {name} back in rotation")
        return done

    def lease_to(self, dataplane_id: str, sink: LeaseSink) -> None:
        """Send dataplane ``dataplane_id``'s lease changes to ``sink`` (its newest stream) from now.

        Call it before feeding that stream's ``Resynced``, whose grants then reach it.
        """
        self._lessees[dataplane_id] = sink

    def lease_ended(self, dataplane_id: str, sink: LeaseSink) -> None:
        """``sink``'s stream ended: it takes no more lease changes (unless a newer stream took over)."""
        if self._lessees.get(dataplane_id) == sink:  # bound methods: equal, not identical
            del self._lessees[dataplane_id]

    def arrive(self, arrived: TurnArrived, answer: Answer) -> None:
        """Feed ``arrived``; ``answer`` gets that turn's ``Place`` or ``Reject`` when it is decided.

        That may be at once (inside this call) or later, when a slot frees. Several admissions of
        one turn id (an admit re-sent on a new stream while the old one is not yet seen to end) each
        get the answer.
        """
        self._waiters.setdefault(arrived.turn_id, []).append(answer)
        self.feed(arrived)

    def abandon(self, turn_id: str, answer: Answer | None) -> None:
        """The admission of ``turn_id`` that ``answer`` was waiting for is given up.

        Its client left (a cancel), or its stream ended before the answer came; ``answer`` is None
        when it had been answered already. The turn leaves the
        queue, or frees the slot it was given (the placement may have crossed the cancel on the
        wire), by ``TurnAbandoned`` -- unless another admission of the same turn id still waits, in
        which case that one is answered as usual.
        """
        if self.drop(turn_id, answer):
            return
        self.feed(TurnAbandoned(turn_id, self.now()))

    def drop(self, turn_id: str, answer: Answer | None) -> bool:
        """Forget ``answer`` without abandoning the turn; True when other admissions of it still wait."""
        waiters = self._waiters.get(turn_id)
        if waiters is None:
            return False
        if answer in waiters:
            waiters.remove(answer)
        if not waiters:
            del self._waiters[turn_id]
            return False
        return True

    def note_context_length(self, replica: str, tokens: int) -> None:
        """The context length (tokens) ``replica``'s engine reports (``GET /v1/models``'
        ``max_model_len``), 0 for none: the dataplanes are told when it changes, and cap a turn's
        output tokens by it (docs/failover.md)."""
        if self.context_lengths.get(replica, 0) != tokens:
            self.context_lengths[replica] = tokens
            log.info("replica %s reports a context length of %d tokens", replica, tokens)
            self._replicas_changed()

    def note_load(self, replica: str, engine: str | None, unknown: str | None) -> None:
        """What the last probe of ``replica`` read its load from (``engine``: ``"sglang"``,
        ``"vllm"``, ``"llama.cpp"``) or why it read none (``unknown``), for :meth:`status`."""
        self._load_notes[replica] = (engine, unknown)

    def replica_list(self) -> list[dict[str, object]]:
        """``GET /admin/replicas``: each replica's settings and where it stands, in order."""
        listed = []
        for name, replica in self.replicas.items():
            core = self.state.replicas.get(name)
            state = "in rotation"
            if core is not None and core.removing:
                state = "removing"
            elif core is not None and core.draining:
                state = "draining"
            listed.append(
                {
                    **replica.model_dump(mode="json", exclude={"draining"}),
                    "state": state,
                    "inflight": 0 if core is None else core.inflight,
                }
            )
        return listed

    def status(self) -> dict[str, Any]:
        """``GET /status``: :func:`luftpause.scheduler.core.snapshot` at the current time, each
        replica with ``load_metrics`` (whose metrics its load was read from) and ``load_unknown``
        (why none was, e.g. ``"GET http://.../metrics answered 404"``), both ``None`` before the
        first probe and one of them after it (:meth:`note_load`); and ``dataplanes`` and
        ``tool_call_runs`` (:meth:`luftpause.scheduler.dataplanes.Dataplanes.status`)."""
        now = self.now()
        status = snapshot(self.state, now)
        status.update(self.dataplanes.status(self.state, now))
        for replica in status["replicas"]:
            engine, unknown = self._load_notes.get(str(replica["name"]), (None, None))
            replica["load_metrics"] = engine
            replica["load_unknown"] = unknown
        return status

    def recent(self, after: int | None = None) -> dict[str, Any]:
        """``GET /series``: the last minutes' samples (:mod:`luftpause.scheduler.series`), those
        after seq ``after`` only when given."""
        return self.series.ring.since(after)

    def healthy_replicas(self) -> int:
        """Replicas that take new turns now: usable (healthy, or never probed; breaker not open: a
        half-open one takes its trial turns; not being removed) and not draining. What the
        dataplanes' readiness asks for."""
        return sum(1 for r in self.state.replicas.values() if health.usable(r) and not r.draining)

    @property
    def probed(self) -> bool:
        """Whether a probe round has been fed: before it, replica health is assumed, not seen."""
        return self.counts.probe_rounds > 0

    def start_clock(self) -> None:
        """Feed a ``Tick`` every second on the running loop, until :meth:`stop_clock`."""
        loop = asyncio.get_running_loop()

        def tick() -> None:
            self.feed(Tick(self.now()))
            self.series.tick(self.state, self.now(), time.time())
            self.dataplanes.prune(self.state, self.now())
            if self.trace is not None:
                self.trace.flush()
            self._tick_handle = loop.call_later(TICK_INTERVAL_S, tick)

        self._tick_handle = loop.call_later(TICK_INTERVAL_S, tick)

    def stop_clock(self) -> None:
        if self._tick_handle is not None:
            self._tick_handle.cancel()
            self._tick_handle = None
        if self.trace is not None:
            self.trace.close()
