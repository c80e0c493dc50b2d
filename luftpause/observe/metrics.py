"""What the three processes share of their Prometheus metrics (``GET /metrics`` on each).

Exposition is ``prometheus_client``'s text format ("Exposition formats" in the Prometheus docs;
:data:`CONTENT_TYPE` names its version). Each process keeps its metrics in a private
:class:`~prometheus_client.CollectorRegistry` made by :func:`new_registry`, so several processes'
worth in one interpreter (tests) never collide; besides its own collector, a registry carries the
defaults ``prometheus_client`` puts in its global one: the process collector (``process_*``: CPU
seconds, resident memory, open file descriptors, start time), the platform collector
(``python_info``) and the garbage collector's (``python_gc_*``).

Conventions, for every ``luftpause_*`` family (Prometheus "Metric and label naming"): base units
(seconds, bytes), counters end in ``_total``, histograms in ``_seconds``; labels take bounded sets
of values only (classes, outcomes, reasons, the configured replicas and MCP servers, and at most
:data:`TOP_CALLERS` callers plus ``other``); a run id is never a label. ``_created`` series are
off (:func:`prometheus_client.disable_created_metrics`, called on import): they would double the
series of every counter and histogram, and no query here reads them.

Why the processes' own collectors count in plain integers rather than with ``prometheus_client``'s
``Counter`` and ``Histogram``: those take a lock per update (3.3 us per dataplane turn against
0.5 us, bench/README.md), and every update here happens on one event loop thread anyway. The
families are built by ``prometheus_client`` at scrape time (:class:`Histogram` gives its buckets).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping

import prometheus_client
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from luftpause import __version__

__all__ = [
    "CONTENT_TYPE",
    "TOP_CALLERS",
    "Histogram",
    "build_info",
    "counter_by",
    "exposition",
    "new_registry",
    "top_with_other",
]

prometheus_client.disable_created_metrics()  # type: ignore[no-untyped-call]

CONTENT_TYPE = CONTENT_TYPE_LATEST
"""The ``content-type`` of :func:`exposition`: the Prometheus text format."""

TOP_CALLERS = 10
"""Callers that get a series of their own in a by-caller family; the rest are summed as ``other``."""

OTHER_CALLERS = "other"
"""The ``caller`` label value of every caller past the first :data:`TOP_CALLERS`."""

ANONYMOUS_CALLER = "anonymous"
"""The ``caller`` label value of the shared anonymous caller (``""`` in the status JSON): an empty
label value is the same as no label to Prometheus."""

INF = float("inf")


class Histogram:
    """One label set's observations: a count per bucket (the last for ``+Inf``) and their sum.

    ``bounds`` are the buckets' upper bounds, increasing, without ``+Inf``.
    """

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.total = 0.0

    def observe(self, value: float) -> None:
        # bisect_left: a value equal to a bound counts in that bucket (Prometheus' le, "<=").
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def add(self, other: Histogram) -> None:
        """Add ``other``'s observations (same bounds) to these."""
        for index, count in enumerate(other.counts):
            self.counts[index] += count
        self.total += other.total

    def buckets(self) -> list[tuple[str, float]]:
        """Cumulative ``(le, count)`` pairs, ``+Inf`` last, as ``HistogramMetricFamily`` takes them."""
        cumulative, out = 0, []
        for bound, count in zip((*self.bounds, INF), self.counts, strict=True):
            cumulative += count
            out.append(("+Inf" if bound == INF else repr(float(bound)), float(cumulative)))
        return out


def top_with_other(values: dict[str, float], limit: int = TOP_CALLERS) -> list[tuple[str, str]]:
    """Which label each key of ``values`` is shown under: the ``limit`` keys with the largest
    values (ties by key) as themselves (``""`` as :data:`ANONYMOUS_CALLER`), the rest as
    :data:`OTHER_CALLERS`. Returns ``[(key, label), ...]`` for every key."""
    ranked = sorted(values, key=lambda key: (-values[key], key))
    return [
        (key, (key or ANONYMOUS_CALLER) if index < limit else OTHER_CALLERS)
        for index, key in enumerate(ranked)
    ]


def counter_by(name: str, documentation: str, label: str, values: Mapping[str, float]) -> CounterMetricFamily:
    """A counter family with one label: a series per key of ``values`` (``{label value: count}``)."""
    family = CounterMetricFamily(name, documentation, labels=[label])
    for key, value in values.items():
        family.add_metric([key], value)
    return family


def build_info(process: str) -> GaugeMetricFamily:
    """``luftpause_build_info{process, version} 1``: which process and version a target is (the
    dashboard's variables read it)."""
    info = GaugeMetricFamily(
        "luftpause_build_info",
        "Always 1: the luftpause process (scheduler, dataplane, runtime) and its version.",
        labels=["process", "version"],
    )
    info.add_metric([process, __version__], 1)
    return info


def new_registry(collectors: Iterable[Collector] = ()) -> CollectorRegistry:
    """A private registry with ``collectors`` and the process, platform and GC collectors."""
    registry = CollectorRegistry(auto_describe=False)
    prometheus_client.ProcessCollector(registry=registry)
    prometheus_client.PlatformCollector(registry=registry)
    prometheus_client.GCCollector(registry=registry)
    for collector in collectors:
        registry.register(collector)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """``registry`` in the Prometheus text format (``content-type``: :data:`CONTENT_TYPE`)."""
    return generate_latest(registry)
