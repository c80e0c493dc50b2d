"""The dataplane's Prometheus metrics, served at ``GET /metrics``.

Exposition is ``prometheus_client``'s text format ("Exposition formats" in the Prometheus docs;
``CONTENT_TYPE`` names its version); every metric lives in a private
:class:`~prometheus_client.CollectorRegistry`, so several dataplanes in one process (tests) never
collide and no process-wide default metrics leak in.

===============================================================  =========================================
``luftpause_dataplane_turns_total{outcome, service_class}``      turns ended: ``finished``, ``failed``
                                                                 (after placement, or the scheduler
                                                                 failed), ``abandoned`` (client left while
                                                                 held), ``refused`` (by the scheduler,
                                                                 e.g. unknown model)
``luftpause_dataplane_time_to_first_token_seconds{service_class}``  from the turn's arrival (body read)
                                                                 to its first token relayed; held time
                                                                 included, as the client lives it
``luftpause_dataplane_held_seconds{service_class}``              from Admit sent to the placement, for
                                                                 turns that waited for the scheduler's
                                                                 decision; a turn placed at once under
                                                                 a capacity lease sends no Admit and is
                                                                 not observed (it would add a 0)
``luftpause_dataplane_relayed_bytes_total``                      response body bytes relayed from
                                                                 engines to clients
``luftpause_dataplane_turns_in_flight``                          turns sent to an engine, not yet ended
``luftpause_dataplane_turns_held``                               turns whose Admit is out
===============================================================  =========================================

Labels are bounded: ``outcome`` has four values and ``service_class`` two. Run ids and callers
are never labels (unbounded cardinality). Cost on the hot path: the label children are bound
once here, a turn's clock is read once per phase (arrival, placement, first token), bytes are
summed in a local integer and added once per turn, and both gauges are read only at scrape time.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterator

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from luftpause.v1 import scheduler_pb2 as pb

__all__ = ["CONTENT_TYPE", "OUTCOMES", "DataplaneMetrics"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The ``content-type`` of :meth:`DataplaneMetrics.exposition`: the Prometheus text format."""

OUTCOMES = ("finished", "failed", "abandoned", "refused")
"""Values of the ``outcome`` label."""

CLASS_NAMES: dict[int, str] = {
    pb.INTERACTIVE: "interactive",
    pb.BATCH: "batch",
    pb.SERVICE_CLASS_UNSPECIFIED: "interactive",
}
"""``ServiceClass`` enum value -> the ``service_class`` label (unspecified is interactive)."""

# Seconds. Time to first token spans a warm engine's few milliseconds to a long hold in a
# saturated pool; held time starts at the cost of one Admit round trip.
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
_HELD_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0)
_LABELS = ("interactive", "batch")


class _Histogram:
    """One label's observations: a count per bucket (the last for ``+Inf``) and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound counts in that bucket (Prometheus' le, "<=").
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def buckets(self) -> list[tuple[str, float]]:
        cumulative, out = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            cumulative += count
            out.append(("+Inf" if bound == float("inf") else repr(float(bound)), float(cumulative)))
        return out


class DataplaneMetrics:
    """Every metric of one dataplane in its own registry.

    ``DataplaneMetrics(in_flight, held)``: two callables giving the current number of turns sent to
    an engine and of turns whose Admit is out, read only when ``/metrics`` is scraped.

    Why plain integers rather than ``prometheus_client``'s ``Counter`` and ``Histogram``: those take
    a lock on every update, 3.3 us per turn for its four updates (measured), a few per cent of what
    a whole turn costs the dataplane; here an update is an integer added on the event loop (the one
    thread that updates them) and the families are built only at scrape time, by
    ``prometheus_client`` as before (same names, labels and buckets).
    """

    def __init__(self, in_flight: Callable[[], int], held: Callable[[], int]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._in_flight = in_flight
        self._held_now = held
        self._turns = {(outcome, value): 0 for outcome in OUTCOMES for value in CLASS_NAMES}
        self._ttft = {name: _Histogram(_TTFT_BUCKETS) for name in _LABELS}
        self._held = {name: _Histogram(_HELD_BUCKETS) for name in _LABELS}
        self._ttft_by_class = {value: self._ttft[name] for value, name in CLASS_NAMES.items()}
        self._held_by_class = {value: self._held[name] for value, name in CLASS_NAMES.items()}
        self._relayed_bytes = 0
        self.registry.register(self)  # a collector: collect() below

    def turn_ended(self, outcome: str, service_class: int) -> None:
        """Count one turn of ``service_class`` (``ServiceClass`` value) ended with ``outcome``.

        Raises ``KeyError`` for an outcome not in :data:`OUTCOMES` or an unknown class.
        """
        key = (outcome, service_class)
        self._turns[key] += 1

    def first_token(self, service_class: int, seconds: float) -> None:
        """Observe one turn's time to first token, in seconds since it arrived."""
        self._ttft_by_class[service_class].observe(seconds)

    def placed(self, service_class: int, held_seconds: float) -> None:
        """Observe one turn's held time: seconds from its Admit sent to its placement (only for a
        turn that waited for the scheduler's decision, never one placed under a lease)."""
        self._held_by_class[service_class].observe(held_seconds)

    def relayed(self, size: int) -> None:
        """Add ``size`` bytes of engine response body relayed to a client."""
        self._relayed_bytes += size

    def collect(self) -> Iterator[Metric]:
        """The families, for the registry (``prometheus_client``'s collector interface)."""
        turns = CounterMetricFamily(
            "luftpause_dataplane_turns",
            "Turns ended, by outcome (finished, failed, abandoned while held, refused by the scheduler).",
            labels=["outcome", "service_class"],
        )
        by_label: dict[tuple[str, str], int] = {}
        for (outcome, value), count in self._turns.items():
            key = (outcome, CLASS_NAMES[value])
            by_label[key] = by_label.get(key, 0) + count
        for (outcome, name), count in by_label.items():
            turns.add_metric([outcome, name], count)
        yield turns
        ttft = HistogramMetricFamily(
            "luftpause_dataplane_time_to_first_token_seconds",
            "Seconds from a turn's arrival at the dataplane (held time included) to its first token.",
            labels=["service_class"],
        )
        for name, histogram in self._ttft.items():
            ttft.add_metric([name], histogram.buckets(), histogram.total)
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
        relayed = CounterMetricFamily(
            "luftpause_dataplane_relayed_bytes", "Response body bytes relayed from engines to clients."
        )
        relayed.add_metric([], self._relayed_bytes)
        yield relayed
        yield GaugeMetricFamily(
            "luftpause_dataplane_turns_in_flight",
            "Turns sent to an engine that have not ended yet.",
            value=self._in_flight(),
        )
        yield GaugeMetricFamily(
            "luftpause_dataplane_turns_held",
            "Turns whose Admit is out: held by the scheduler, or waiting for it to come back.",
            value=self._held_now(),
        )

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (``content-type``: :data:`CONTENT_TYPE`)."""
        return generate_latest(self.registry)
