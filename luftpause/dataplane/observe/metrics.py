"""The dataplane's Prometheus metrics, served at ``GET /metrics`` (conventions, process collectors
and exposition: :mod:`luftpause.observe.metrics`).

=====================================================================  ===================================
``luftpause_dataplane_turns_total{outcome, service_class, replica}``   turns ended: ``finished``,
                                                                       ``failed`` (after placement, or
                                                                       the scheduler failed),
                                                                       ``abandoned`` (client left while
                                                                       held), ``refused`` (by the
                                                                       scheduler, e.g. unknown model);
                                                                       ``replica`` the one it was sent
                                                                       to, ``""`` for a turn that
                                                                       reached none
``luftpause_dataplane_time_to_first_token_seconds{service_class,      from the turn's arrival (body
replica}``                                                             read) to its first token relayed;
                                                                       held time included, as the
                                                                       client lives it
``luftpause_dataplane_held_seconds{service_class}``                    from Admit sent to the placement,
                                                                       for turns that waited for the
                                                                       scheduler's decision; a turn
                                                                       placed at once under a capacity
                                                                       lease sends no Admit and is not
                                                                       observed (it would add a 0)
``luftpause_dataplane_failovers_total{reason}``                        turns sent again to another
                                                                       replica (docs/failover.md):
                                                                       ``unreachable`` (the engine never
                                                                       had it) or ``status`` (a
                                                                       ``retry_statuses`` answer); the
                                                                       first send counts as ``failed``
``luftpause_dataplane_relayed_bytes_total``                            response body bytes relayed from
                                                                       engines to clients
``luftpause_dataplane_turns_in_flight``                                turns sent to an engine, not yet
                                                                       ended
``luftpause_dataplane_turns_held``                                     turns whose Admit is out
``luftpause_dataplane_scheduler_connected``                            1 while the link to the scheduler
                                                                       is resynced, else 0
``luftpause_dataplane_healthy_replicas``                               replicas the scheduler counts
                                                                       healthy, as it last said (absent
                                                                       until it has)
``luftpause_build_info{process, version}``                             always 1
=====================================================================  ===================================

The families of finished turns' latency and tokens (the OpenTelemetry GenAI names, by model,
replica, class and caller) and the answers by status code are
:mod:`luftpause.dataplane.observe.answer_metrics`, in the same registry (``answers``).

Labels are bounded: ``outcome`` has four values, ``service_class`` two, ``replica`` the configured
replicas and ``""``. Run ids and callers are never labels (unbounded cardinality). Cost on the hot
path: a turn's clock is read once per phase (arrival, placement, first token), an update is one
dict lookup and an integer added (keyed by the ``ServiceClass`` value and the replica's name,
folded into labels only at scrape time), bytes are summed in a local integer and added once per
turn, and the gauges are read only at scrape time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from luftpause.dataplane.observe.answer_metrics import AnswerMetrics
from luftpause.dataplane.observe.usage import CallerLabels
from luftpause.observe.metrics import CONTENT_TYPE, Histogram, build_info, exposition, new_registry
from luftpause.v1 import scheduler_pb2 as pb

__all__ = ["CONTENT_TYPE", "OUTCOMES", "DataplaneMetrics"]

OUTCOMES = ("finished", "failed", "abandoned", "refused")
"""Values of the ``outcome`` label."""

PLACED_OUTCOMES = ("finished", "failed")
"""The outcomes of a turn sent to a replica (their series exist for every configured replica)."""

CLASS_NAMES: dict[int, str] = {
    pb.INTERACTIVE: "interactive",
    pb.BATCH: "batch",
    pb.SERVICE_CLASS_UNSPECIFIED: "interactive",
}
"""``ServiceClass`` enum value -> the ``service_class`` label (unspecified is interactive)."""

FAILOVER_REASONS = ("unreachable", "status")
"""Values of the ``reason`` label of ``luftpause_dataplane_failovers_total``."""

NO_REPLICA = ""
"""The ``replica`` label of a turn that reached no replica (held, refused, the scheduler failed)."""

# Seconds. Time to first token spans a warm engine's few milliseconds to a long hold in a
# saturated pool; held time starts at the cost of one Admit round trip.
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_HELD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0)
_LABELS = ("interactive", "batch")


@dataclass(frozen=True, slots=True)
class Gauges:
    """What is going on now, read when ``/metrics`` is scraped: turns sent to an engine and not
    ended (``in_flight``), turns whose Admit is out (``held``), whether the scheduler link is
    resynced, and how many replicas the scheduler last counted healthy (``None``: it has not said)."""

    in_flight: int = 0
    held: int = 0
    connected: bool = False
    healthy_replicas: int | None = None


class DataplaneMetrics:
    """Every metric of one dataplane in its own registry.

    ``DataplaneMetrics(replicas=(), callers=(), usage_window_s=3600.0, wall_clock=time.time)``:
    ``replicas``: the configured replicas' names, whose series exist from the start (a replica
    named later gets its series when its first turn ends); ``callers``: the configured callers
    (caller keys', ``[scheduler.protection] callers``), whose roots are the caller labels of
    ``answers`` (:class:`~luftpause.dataplane.observe.answer_metrics.AnswerMetrics`), whose usage
    windows are ``usage_window_s`` seconds long on ``wall_clock`` (seconds since the epoch). The
    gauges of what is going on now are not read from the other parts: the ``/metrics`` route hands
    them to :meth:`exposition` (:class:`Gauges`), so the metrics depend on nothing.
    """

    def __init__(
        self,
        *,
        replicas: Iterable[str] = (),
        callers: Iterable[str] = (),
        usage_window_s: float = 3600.0,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self._gauges = Gauges()
        names = list(replicas)
        self._turns: dict[tuple[str, int, str], int] = {
            (outcome, value, name): 0
            for value in CLASS_NAMES
            for outcome, name in [
                *((o, NO_REPLICA) for o in ("failed", "abandoned", "refused")),
                *((o, n) for o in PLACED_OUTCOMES for n in names),
            ]
        }
        self._ttft: dict[tuple[int, str], Histogram] = {
            (value, name): Histogram(_TTFT_BUCKETS) for value in CLASS_NAMES for name in names
        }
        self._held = {name: Histogram(_HELD_BUCKETS) for name in _LABELS}
        self._held_by_class = {value: self._held[name] for value, name in CLASS_NAMES.items()}
        self._relayed_bytes = 0
        self._failovers = {reason: 0 for reason in FAILOVER_REASONS}
        self.answers = AnswerMetrics(CallerLabels(callers), usage_window_s, wall_clock)
        self.registry = new_registry([self, self.answers])

    def turn_ended(self, outcome: str, service_class: int, replica: str = NO_REPLICA) -> None:
        """Count one turn of ``service_class`` (``ServiceClass`` value) ended with ``outcome`` on
        ``replica`` (:data:`NO_REPLICA` for one that reached none).

        Raises ``KeyError`` for an outcome not in :data:`OUTCOMES` or an unknown class.
        """
        key = (outcome, service_class, replica)
        turns = self._turns
        if key in turns:
            turns[key] += 1
            return
        if outcome not in OUTCOMES or service_class not in CLASS_NAMES:
            raise KeyError(key)
        turns[key] = 1

    def first_token(self, service_class: int, seconds: float, replica: str = NO_REPLICA) -> None:
        """Observe one turn's time to first token on ``replica``, in seconds since it arrived.

        Raises ``KeyError`` for an unknown class."""
        key = (service_class, replica)
        histogram = self._ttft.get(key)
        if histogram is None:
            if service_class not in CLASS_NAMES:
                raise KeyError(key)
            histogram = self._ttft[key] = Histogram(_TTFT_BUCKETS)
        histogram.observe(seconds)

    def placed(self, service_class: int, held_seconds: float) -> None:
        """Observe one turn's held time: seconds from its Admit sent to its placement (only for a
        turn that waited for the scheduler's decision, never one placed under a lease)."""
        self._held_by_class[service_class].observe(held_seconds)

    def failed_over(self, reason: str) -> None:
        """Count one turn sent again to another replica (``reason`` in :data:`FAILOVER_REASONS`)."""
        self._failovers[reason] += 1

    def relayed(self, size: int) -> None:
        """Add ``size`` bytes of engine response body relayed to a client."""
        self._relayed_bytes += size

    def collect(self) -> Iterator[Metric]:
        """The families, for the registry (``prometheus_client``'s collector interface)."""
        yield build_info("dataplane")
        turns = CounterMetricFamily(
            "luftpause_dataplane_turns",
            "Turns ended, by outcome (finished, failed, abandoned while held, refused by the scheduler) "
            'and the replica they were sent to ("" for none).',
            labels=["outcome", "service_class", "replica"],
        )
        by_label: dict[tuple[str, str, str], int] = {}
        for (outcome, value, replica), count in list(self._turns.items()):
            key = (outcome, CLASS_NAMES[value], replica)
            by_label[key] = by_label.get(key, 0) + count
        for labels, count in by_label.items():
            turns.add_metric(list(labels), count)
        yield turns
        ttft = HistogramMetricFamily(
            "luftpause_dataplane_time_to_first_token_seconds",
            "Seconds from a turn's arrival at the dataplane (held time included) to its first token, "
            "by the replica that sent it.",
            labels=["service_class", "replica"],
        )
        merged: dict[tuple[str, str], Histogram] = {}
        for (value, replica), histogram in list(self._ttft.items()):
            label = (CLASS_NAMES[value], replica)
            if label not in merged:
                merged[label] = Histogram(_TTFT_BUCKETS)
            merged[label].add(histogram)
        for (name, replica), histogram in merged.items():
            ttft.add_metric([name, replica], histogram.buckets(), histogram.total)
        yield ttft
        held = HistogramMetricFamily(
            "luftpause_dataplane_held_seconds",
            "Seconds from the Admit sent to the scheduler to the turn's placement on a replica, for "
            "turns that waited for its decision (turns placed under a capacity lease are not observed).",
            labels=["service_class"],
        )
        for name, histogram in self._held.items():
            held.add_metric([name], histogram.buckets(), histogram.total)
        yield held
        failovers = CounterMetricFamily(
            "luftpause_dataplane_failovers",
            "Turns sent again to another replica after theirs failed before answering: unreachable "
            "(the engine never had the turn) or status (an engine status [dataplane.failover] retries).",
            labels=["reason"],
        )
        for reason, count in self._failovers.items():
            failovers.add_metric([reason], count)
        yield failovers
        relayed = CounterMetricFamily(
            "luftpause_dataplane_relayed_bytes", "Response body bytes relayed from engines to clients."
        )
        relayed.add_metric([], self._relayed_bytes)
        yield relayed
        yield GaugeMetricFamily(
            "luftpause_dataplane_turns_in_flight",
            "Turns sent to an engine that have not ended yet.",
            value=self._gauges.in_flight,
        )
        yield GaugeMetricFamily(
            "luftpause_dataplane_turns_held",
            "Turns whose Admit is out: held by the scheduler, or waiting for it to come back.",
            value=self._gauges.held,
        )
        yield GaugeMetricFamily(
            "luftpause_dataplane_scheduler_connected",
            "1 while the link to the scheduler is open and resynced, else 0.",
            value=1 if self._gauges.connected else 0,
        )
        healthy = GaugeMetricFamily(
            "luftpause_dataplane_healthy_replicas",
            "Replicas the scheduler counts healthy, as it last told this dataplane (absent until it has).",
        )
        healthy_now = self._gauges.healthy_replicas
        if healthy_now is not None:
            healthy.add_metric([], healthy_now)
        yield healthy

    def exposition(self, gauges: Gauges | None = None) -> bytes:
        """The registry in the Prometheus text format (``content-type``: :data:`CONTENT_TYPE`),
        with ``gauges`` as what is going on now (none given: all zero, the link not connected)."""
        self._gauges = gauges or Gauges()
        return exposition(self.registry)
