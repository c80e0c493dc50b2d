"""The scheduler's Prometheus metrics, served at ``GET /metrics`` on its HTTP listener
(conventions, process collectors and exposition: :mod:`luftpause.observe.metrics`).

Most of them are read from the core's snapshot (:mod:`luftpause.scheduler.core.snapshot`) when
``/metrics`` is scraped, which costs one walk over the held turns and runs per scrape instead of
an update per event. What the snapshot does not keep, :class:`AdmissionCounts` counts as the host
feeds events (a few dict operations per event, on the loop thread): placements by replica,
refusals by reason, the admission latency and probe outcomes.

====================================================================  ====================================
``luftpause_scheduler_held_turns{service_class}``                      turns held now
``luftpause_scheduler_oldest_held_seconds{service_class}``             how long the oldest held turn has
                                                                       waited (0 when none is held)
``luftpause_scheduler_held_turns_by_caller{caller}``                   turns held now, for the
                                                                       :data:`~luftpause.observe.metrics.TOP_CALLERS`
                                                                       callers with the most, the rest
                                                                       summed as ``other`` (always
                                                                       there, 0 when none)
``luftpause_scheduler_oldest_held_seconds_by_caller{caller}``          the same callers' oldest wait
                                                                       (``other``: the longest of theirs)
``luftpause_scheduler_runs{phase}``                                    runs tracked now: ``idle``,
                                                                       ``generating``, ``tool_paused``
``luftpause_scheduler_turns_arrived_total``                            new turns for a served model, by
                                                                       admit or under a lease (retried
                                                                       admits not counted)
``luftpause_scheduler_placements_total{replica, via}``                 turns placed: by the scheduler
                                                                       (``admit``) or by a dataplane under
                                                                       a capacity lease (``lease``)
``luftpause_scheduler_rejections_total{reason}``                       turns refused: ``unknown_model``,
                                                                       ``abandoned`` (its dataplane had
                                                                       given it up), ``limit`` (429),
                                                                       ``other``
``luftpause_scheduler_turns_abandoned_held_total``                     held turns whose client left
``luftpause_scheduler_turns_ended_total{outcome}``                     placed turns ended: ``finished``,
                                                                       ``failed``, ``abandoned``,
                                                                       ``expired``, ``released``
``luftpause_scheduler_admission_latency_seconds{service_class}``       from a turn's first admit to its
                                                                       placement (0 when placed at once);
                                                                       leased turns are not observed
``luftpause_scheduler_limit_refusals_total{service_class, limit}``     turns refused by a protection
                                                                       limit: ``held``, ``queue_timeout``,
                                                                       ``token_rate``
``luftpause_scheduler_breaker_trips_total``                            times a replica's circuit breaker
                                                                       opened (out of rotation)
``luftpause_scheduler_breaker_closes_total``                           times one closed (its trial turns
                                                                       finished: back in rotation)
``luftpause_scheduler_breaker_transitions_total{replica, from, to}``   each breaker transition:
                                                                       ``closed``, ``open``, ``half_open``
``luftpause_scheduler_lease_revocations_total``                        leases withdrawn
``luftpause_scheduler_lost_dataplanes``                                dataplanes whose stream ended and
                                                                       that have not come back
``luftpause_scheduler_replica_healthy{replica}``                       1 healthy, 0 not (never probed: 1)
``luftpause_scheduler_replica_draining{replica}``                      1 while it takes only runs pinned
                                                                       there (or is being removed)
``luftpause_scheduler_replica_breaker_open{replica}``                  1 while its circuit breaker keeps
                                                                       it out of rotation
``luftpause_scheduler_replica_breaker_half_open{replica}``             1 while it takes trial turns only
``luftpause_scheduler_replica_turns_in_flight{replica}``               turns placed there, not ended
``luftpause_scheduler_replica_capacity{replica}``                      configured ``max_inflight``
``luftpause_scheduler_replica_effective_capacity{replica}``            after engine load
``luftpause_scheduler_replica_engine_running{replica}``                as its engine last reported
                                                                       (absent: it reports no load)
``luftpause_scheduler_replica_engine_waiting{replica}``                the same, queued
``luftpause_scheduler_replica_kv_cache_usage_ratio{replica}``          the same, KV cache in use (0..1)
``luftpause_scheduler_replica_prefix_cache_hit_ratio{replica}``        the same, prefix cache hit rate
``luftpause_scheduler_replica_reserved_headroom{replica}``             slots kept from batch turns
``luftpause_scheduler_replica_leased_slots{replica}``                  slots leased to dataplanes, unused
``luftpause_scheduler_replica_probe_age_seconds{replica}``             since its last probe (absent
                                                                       before the first)
``luftpause_scheduler_replica_probe_failures_total{replica}``          probes that found it unhealthy or
                                                                       failed
``luftpause_build_info{process, version}``                             always 1
====================================================================  ====================================

Callers are the one label whose values come from clients: only the
:data:`~luftpause.observe.metrics.TOP_CALLERS` with the most held turns are named (ties by name), the
anonymous caller as ``anonymous``, every other one summed under ``other``. Limit refusals are not
counted by caller here: a counter whose caller may fall out of the top ten would go backwards
(``GET /status`` has them by caller).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from luftpause.observe.metrics import OTHER_CALLERS, Histogram, build_info, counter_by, top_with_other
from luftpause.scheduler.core import (
    AbandonReported,
    Action,
    Event,
    LeasedTurnPlaced,
    Place,
    Reject,
    ReplicasProbed,
    Resynced,
    State,
    TurnAbandoned,
    TurnArrived,
)
from luftpause.scheduler.core.events import SERVICE_CLASSES
from luftpause.scheduler.core.policies import abandoned, routing

if TYPE_CHECKING:
    from luftpause.scheduler.host import SchedulerHost

__all__ = ["REJECTION_REASONS", "VIAS", "AdmissionCounts", "SchedulerMetrics", "rejection_reason"]

VIAS = ("admit", "lease")
"""Values of the ``via`` label: placed by the scheduler after an admit, or by a dataplane under a lease."""

REJECTION_REASONS = ("unknown_model", "abandoned", "limit", "other")
"""Values of the ``reason`` label of refusals."""

LIMITS = ("held", "queue_timeout", "token_rate")
"""Values of the ``limit`` label: the protection limit that refused a turn (rule 18 of the core)."""

TURN_ENDS = {
    "finished": ("finished",),
    "failed": ("failed",),
    "abandoned": ("abandoned_placed",),
    "expired": ("expired_turns",),
    "released": ("turns_released_resync", "turns_released_lost_dataplane"),
}
"""``outcome`` label of ended placed turns -> the core's counters summed into it."""

# Seconds from a turn's first admit to its placement: 0 for one placed at once, up to the 10 min a
# held turn may wait in a saturated pool.
_LATENCY_BUCKETS = (
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
)  # fmt: skip


def rejection_reason(reject: Reject) -> str:
    """The ``reason`` label of a refusal (:data:`REJECTION_REASONS`)."""
    if reject.reason == abandoned.ABANDONED_REASON:
        return "abandoned"
    if reject.http_status == routing.UNKNOWN_MODEL_STATUS:
        return "unknown_model"
    if reject.http_status == 429:
        return "limit"
    return "other"


class AdmissionCounts:
    """What the host counts as it feeds events (the module docstring's table says where each shows).

    Call :meth:`arriving` with every ``TurnArrived`` before the core sees it and :meth:`decided`
    after every event with the core's actions. ``replicas``: the configured names, whose series
    exist from the start.
    """

    def __init__(self, replicas: Iterable[str]) -> None:
        names = list(replicas)
        self.placements: dict[tuple[str, str], int] = {(name, via): 0 for name in names for via in VIAS}
        """``(replica, via)`` -> turns placed."""
        self.rejections: dict[str, int] = dict.fromkeys(REJECTION_REASONS, 0)
        self.latency: dict[str, Histogram] = {name: Histogram(_LATENCY_BUCKETS) for name in SERVICE_CLASSES}
        """Service class -> seconds from first admit to placement."""
        self.probe_rounds = 0
        """Probe rounds fed (the scheduler is ready after the first)."""
        self.probe_failures: dict[str, int] = dict.fromkeys(names, 0)
        """Replica -> probes that found it unhealthy, or failed outright (absent from their round)."""
        self._arrivals: dict[str, tuple[float, str]] = {}
        """Turn id -> (first admit's time, service class), for held turns and those being decided."""

    def arriving(self, event: TurnArrived, state: State) -> None:
        """A turn's admit, before the core decides it: a turn neither held nor placed yet (not a
        retried admit) starts its admission latency here."""
        turn_id = event.turn_id
        if turn_id not in self._arrivals and turn_id not in state.placed and turn_id not in state.held:
            self._arrivals[turn_id] = (event.at, event.service_class)

    def decided(self, event: Event, actions: list[Action], state: State) -> None:
        """Count what ``event`` and its ``actions`` did (``state``: after them)."""
        kind = type(event)
        if kind is ReplicasProbed:
            assert isinstance(event, ReplicasProbed)
            self.probe_rounds += 1
            healthy = {probe.replica: probe.healthy for probe in event.probes}
            failures = self.probe_failures
            for name in state.replicas:
                if not healthy.get(name, False):
                    failures[name] = failures.get(name, 0) + 1
        elif kind is LeasedTurnPlaced:
            assert isinstance(event, LeasedTurnPlaced)
            key = (event.replica, "lease")
            self.placements[key] = self.placements.get(key, 0) + 1
        elif kind is TurnAbandoned or kind is AbandonReported:
            assert isinstance(event, TurnAbandoned | AbandonReported)
            self._arrivals.pop(event.turn_id, None)
        elif kind is Resynced:
            # A held turn a resync lists as running is adopted, never placed: no answer pops it.
            self._arrivals = {tid: arrival for tid, arrival in self._arrivals.items() if tid in state.held}
        for action in actions:
            if type(action) is Place:
                arrival = self._arrivals.pop(action.turn_id, None)
                if arrival is None:
                    continue  # a retried admit answered again: placed once already
                key = (action.replica, "admit")
                self.placements[key] = self.placements.get(key, 0) + 1
                self.latency[arrival[1]].observe(max(0.0, event.at - arrival[0]))
            elif type(action) is Reject:
                self._arrivals.pop(action.turn_id, None)
                self.rejections[rejection_reason(action)] += 1


def _gauge(name: str, documentation: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels)


class SchedulerMetrics:
    """The collector of one scheduler's metrics (``prometheus_client``'s collector interface),
    reading ``host``'s snapshot and :attr:`SchedulerHost.counts` at scrape time."""

    def __init__(self, host: SchedulerHost) -> None:
        self.host = host

    def collect(self) -> Iterator[Metric]:
        status = self.host.status()
        counts = self.host.counts
        yield build_info("scheduler")
        yield from self._held(status["held"])
        runs = _gauge("luftpause_scheduler_runs", "Runs the scheduler tracks now, by phase.", ["phase"])
        for phase, count in status["runs"].items():
            runs.add_metric([phase], count)
        yield runs
        counters = status["counters"]
        yield CounterMetricFamily(
            "luftpause_scheduler_turns_arrived",
            "New turns for a served model, by admit or under a lease (retried admits, refusals not counted).",
            value=counters["arrived"],
        )
        placements = CounterMetricFamily(
            "luftpause_scheduler_placements",
            "Turns placed on a replica: by the scheduler after an admit, or by a dataplane under a lease.",
            labels=["replica", "via"],
        )
        for (replica, via), count in counts.placements.items():
            placements.add_metric([replica, via], count)
        yield placements
        yield counter_by(
            "luftpause_scheduler_rejections",
            "Turns refused, by reason (unknown_model, abandoned, limit, other).",
            "reason",
            counts.rejections,
        )
        yield CounterMetricFamily(
            "luftpause_scheduler_turns_abandoned_held",
            "Held turns whose client left before placement.",
            value=counters["abandoned_held"],
        )
        ended = CounterMetricFamily(
            "luftpause_scheduler_turns_ended",
            "Placed turns ended, by outcome (finished, failed, abandoned, expired, released).",
            labels=["outcome"],
        )
        for outcome, keys in TURN_ENDS.items():
            ended.add_metric([outcome], sum(counters[key] for key in keys))
        yield ended
        latency = HistogramMetricFamily(
            "luftpause_scheduler_admission_latency_seconds",
            "Seconds from a turn's first admit to its placement (leased turns not observed).",
            labels=["service_class"],
        )
        for name, histogram in counts.latency.items():
            latency.add_metric([name], histogram.buckets(), histogram.total)
        yield latency
        limited = CounterMetricFamily(
            "luftpause_scheduler_limit_refusals",
            "Turns refused by a protection limit, by class and limit (held, queue_timeout, token_rate).",
            labels=["service_class", "limit"],
        )
        by_class = status["limits"]["refused_by_class"]
        for name in SERVICE_CLASSES:
            for limit in LIMITS:
                limited.add_metric([name, limit], by_class.get(name, {}).get(limit, 0))
        yield limited
        yield CounterMetricFamily(
            "luftpause_scheduler_breaker_trips",
            "Times a replica's circuit breaker opened (took it out of rotation).",
            value=counters["breaker_trips"],
        )
        yield CounterMetricFamily(
            "luftpause_scheduler_breaker_closes",
            "Times a replica's circuit breaker closed (its trial turns finished: back in rotation).",
            value=counters["breaker_closes"],
        )
        transitions = CounterMetricFamily(
            "luftpause_scheduler_breaker_transitions",
            "Circuit breaker transitions, by replica, from and to state (closed, open, half_open).",
            labels=["replica", "from", "to"],
        )
        for replica, before, after, count in status["limits"]["breaker_transitions"]:
            transitions.add_metric([replica, before, after], count)
        yield transitions
        yield CounterMetricFamily(
            "luftpause_scheduler_lease_revocations",
            "Capacity leases withdrawn.",
            value=counters["lease_revocations"],
        )
        yield GaugeMetricFamily(
            "luftpause_scheduler_lost_dataplanes",
            "Dataplanes whose last stream ended and that have not come back (within their grace).",
            value=len(status["lost_dataplanes"]),
        )
        yield from self._replicas(status["replicas"], counts.probe_failures)

    def _held(self, held: dict[str, Any]) -> Iterator[Metric]:
        by_class = _gauge("luftpause_scheduler_held_turns", "Turns held now.", ["service_class"])
        wait_by_class = _gauge(
            "luftpause_scheduler_oldest_held_seconds",
            "Seconds the oldest held turn has waited (0 when none is held).",
            ["service_class"],
        )
        for name in SERVICE_CLASSES:
            by_class.add_metric([name], held["by_class"].get(name, 0))
            wait_by_class.add_metric([name], held["oldest_wait_s_by_class"].get(name, 0.0))
        yield by_class
        yield wait_by_class
        by_caller = _gauge(
            "luftpause_scheduler_held_turns_by_caller",
            "Turns held now, for the callers with the most (the rest summed as other).",
            ["caller"],
        )
        wait_by_caller = _gauge(
            "luftpause_scheduler_oldest_held_seconds_by_caller",
            "Seconds the oldest held turn of each of those callers has waited (other: the longest).",
            ["caller"],
        )
        # "other" always has its series (0 while nothing past the top callers is held), so a panel
        # or an alert on this family has data while nothing is held at all.
        counts: dict[str, int] = {OTHER_CALLERS: 0}
        waits: dict[str, float] = {OTHER_CALLERS: 0.0}
        for caller, label in top_with_other(held["by_caller"]):
            counts[label] = counts.get(label, 0) + held["by_caller"][caller]
            waits[label] = max(waits.get(label, 0.0), held["oldest_wait_s_by_caller"].get(caller, 0.0))
        for label, count in counts.items():
            by_caller.add_metric([label], count)
            wait_by_caller.add_metric([label], waits[label])
        yield by_caller
        yield wait_by_caller

    def _replicas(self, replicas: list[dict[str, Any]], failures: dict[str, int]) -> Iterator[Metric]:
        per_replica = [  # (name suffix, help, snapshot key)
            ("healthy", "1 while the replica is healthy (never probed: 1), else 0.", "healthy"),
            ("draining", "1 while it takes only runs pinned there, or is being removed.", "draining"),
            ("breaker_open", "1 while its circuit breaker keeps it out of rotation.", "tripped"),
            ("breaker_half_open", "1 while its circuit breaker is half-open: trial turns only.", "breaker"),
            ("turns_in_flight", "Turns placed on the replica and not ended.", "inflight"),
            ("capacity", "The replica's configured max_inflight.", "capacity"),
            ("effective_capacity", "Turns it takes at once, after its engine's load.", "effective_capacity"),
            ("engine_running", "Requests its engine reported running (absent: no load).", "running"),
            ("engine_waiting", "Requests its engine reported queued (absent: no load).", "waiting"),
            ("kv_cache_usage_ratio", "Fraction of its engine's KV cache in use, as reported.", "kv_usage"),
            ("prefix_cache_hit_ratio", "Its engine's prefix cache hit rate, as reported.", "cache_hit_rate"),
            ("reserved_headroom", "Slots kept from batch turns for runs paused there.", "reserved_headroom"),
            ("leased_slots", "Slots leased to dataplanes and not used yet.", "leased"),
            ("probe_age_seconds", "Seconds since its last probe (absent before the first).", "probed_s_ago"),
        ]
        for suffix, documentation, key in per_replica:
            family = _gauge(f"luftpause_scheduler_replica_{suffix}", documentation, ["replica"])
            for replica in replicas:
                value = replica[key]
                if key == "draining":
                    value = replica["draining"] or replica["removing"]
                elif key == "breaker":
                    value = replica["breaker"] == "half_open"
                if value is not None:
                    family.add_metric([replica["name"]], float(value))
            yield family
        probe_failures = CounterMetricFamily(
            "luftpause_scheduler_replica_probe_failures",
            "Probes that found the replica unhealthy or could not be made.",
            labels=["replica"],
        )
        for name, count in failures.items():
            probe_failures.add_metric([name], count)
        yield probe_failures
