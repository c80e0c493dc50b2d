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

from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

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


class DataplaneMetrics:
    """Every metric of one dataplane in its own registry.

    ``DataplaneMetrics(in_flight, held)``: two callables giving the current number of turns sent to
    an engine and of turns whose Admit is out, read only when ``/metrics`` is scraped.
    """

    def __init__(self, in_flight: Callable[[], int], held: Callable[[], int]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        turns = Counter(
            "luftpause_dataplane_turns",
            "Turns ended, by outcome (finished, failed, abandoned while held, refused by the scheduler).",
            ["outcome", "service_class"],
            registry=self.registry,
        )
        ttft = Histogram(
            "luftpause_dataplane_time_to_first_token_seconds",
            "Seconds from a turn's arrival at the dataplane (held time included) to its first token.",
            ["service_class"],
            buckets=_TTFT_BUCKETS,
            registry=self.registry,
        )
        held_time = Histogram(
            "luftpause_dataplane_held_seconds",
            "Seconds from the Admit sent to the scheduler to the turn's placement on a replica, for "
            "turns that waited for its decision (turns placed under a capacity lease are not observed).",
            ["service_class"],
            buckets=_HELD_BUCKETS,
            registry=self.registry,
        )
        self._relayed_bytes = Counter(
            "luftpause_dataplane_relayed_bytes",
            "Response body bytes relayed from engines to clients.",
            registry=self.registry,
        )
        Gauge(
            "luftpause_dataplane_turns_in_flight",
            "Turns sent to an engine that have not ended yet.",
            registry=self.registry,
        ).set_function(in_flight)
        Gauge(
            "luftpause_dataplane_turns_held",
            "Turns whose Admit is out: held by the scheduler, or waiting for it to come back.",
            registry=self.registry,
        ).set_function(held)
        # Bound once: a labelled child looked up per turn would cost a lock and a dict per call.
        self._turns = {
            (outcome, value): turns.labels(outcome=outcome, service_class=name)
            for outcome in OUTCOMES
            for value, name in CLASS_NAMES.items()
        }
        self._ttft = {value: ttft.labels(service_class=name) for value, name in CLASS_NAMES.items()}
        self._held = {value: held_time.labels(service_class=name) for value, name in CLASS_NAMES.items()}

    def turn_ended(self, outcome: str, service_class: int) -> None:
        """Count one turn of ``service_class`` (``ServiceClass`` value) ended with ``outcome``.

        Raises ``KeyError`` for an outcome not in :data:`OUTCOMES` or an unknown class.
        """
        self._turns[outcome, service_class].inc()

    def first_token(self, service_class: int, seconds: float) -> None:
        """Observe one turn's time to first token, in seconds since it arrived."""
        self._ttft[service_class].observe(seconds)

    def placed(self, service_class: int, held_seconds: float) -> None:
        """Observe one turn's held time: seconds from its Admit sent to its placement (only for a
        turn that waited for the scheduler's decision, never one placed under a lease)."""
        self._held[service_class].observe(held_seconds)

    def relayed(self, size: int) -> None:
        """Add ``size`` bytes of engine response body relayed to a client."""
        if size:
            self._relayed_bytes.inc(size)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (``content-type``: :data:`CONTENT_TYPE`).."""
        return generate_latest(self.registry)
