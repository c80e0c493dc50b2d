"""Micro-benchmarks of the metrics: what a turn costs the dataplane, what a scrape costs each loop.

Run: ``.venv/bin/python -m pytest bench/test_bench_metrics.py --benchmark-only -q
--benchmark-columns=median,ops,rounds``. The cases:

* ``per turn`` -- one turn's updates as the dataplane makes them (held time, first token, bytes
  relayed, the turn's end): ``by class`` keys them by service class only, as the dataplane did
  before its metrics took a ``replica`` label (the same plain integers and histogram); ``by class
  and replica`` is :class:`~luftpause.dataplane.observe.metrics.DataplaneMetrics` as it was before the
  GenAI families; ``with the GenAI families`` adds what a finished turn now also records
  (:meth:`~luftpause.dataplane.observe.answer_metrics.AnswerMetrics.finished`: its label set by model,
  replica, class and caller root, four histograms, three token counts and the usage per caller) and
  the answer's status code. The ratios of the medians are each addition's cost.
* ``scrape`` -- one ``GET /metrics`` body built (what the serving loop spends per scrape): the
  dataplane's with two replicas, the scheduler's with 10,000 held turns of 200 callers on 8
  replicas (the snapshot walks every held turn and run: what a ``GET /status`` costs too).
"""

from __future__ import annotations

from typing import Any

from luftpause.config import parse_config
from luftpause.dataplane.observe.metrics import CLASS_NAMES, DataplaneMetrics
from luftpause.observe import metrics
from luftpause.observe.metrics import Histogram
from luftpause.scheduler.core import TurnArrived
from luftpause.scheduler.host import SchedulerHost
from luftpause.scheduler.metrics import SchedulerMetrics
from luftpause.v1 import scheduler_pb2 as pb

INTERACTIVE = pb.INTERACTIVE
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)


class ByClass:
    """The dataplane's per-turn bookkeeping keyed by class alone, as it was before the replica
    label (the same four methods, plain integers and histogram)."""

    def __init__(self) -> None:
        self.turns = {(o, v): 0 for o in ("finished", "failed", "abandoned", "refused") for v in CLASS_NAMES}
        ttft = {name: Histogram(_BUCKETS) for name in ("interactive", "batch")}
        self.ttft = {value: ttft[name] for value, name in CLASS_NAMES.items()}
        held = {name: Histogram(_BUCKETS) for name in ("interactive", "batch")}
        self.held = {value: held[name] for value, name in CLASS_NAMES.items()}
        self.relayed_bytes = 0

    def turn_ended(self, outcome: str, service_class: int) -> None:
        key = (outcome, service_class)
        self.turns[key] += 1

    def first_token(self, service_class: int, seconds: float) -> None:
        self.ttft[service_class].observe(seconds)

    def placed(self, service_class: int, held_seconds: float) -> None:
        self.held[service_class].observe(held_seconds)

    def relayed(self, size: int) -> None:
        self.relayed_bytes += size


def test_per_turn_by_class(benchmark: Any) -> None:
    counts = ByClass()

    def turns() -> None:
        for _ in range(1000):
            counts.placed(INTERACTIVE, 0.001)
            counts.first_token(INTERACTIVE, 0.02)
            counts.relayed(1234)
            counts.turn_ended("finished", INTERACTIVE)

    benchmark.group = "per turn (1,000 turns)"
    benchmark(turns)


def test_per_turn_by_class_and_replica(benchmark: Any) -> None:
    dataplane = DataplaneMetrics(replicas=["sim-0", "sim-1"])

    def turns() -> None:
        for _ in range(1000):
            dataplane.placed(INTERACTIVE, 0.001)
            dataplane.first_token(INTERACTIVE, 0.02, "sim-0")
            dataplane.relayed(1234)
            dataplane.turn_ended("finished", INTERACTIVE, "sim-0")

    benchmark.group = "per turn (1,000 turns)"
    benchmark(turns)


def test_per_turn_with_the_genai_families(benchmark: Any) -> None:
    dataplane = DataplaneMetrics(replicas=["sim-0", "sim-1"], callers=["team-a"])
    answers = dataplane.answers

    def turns() -> None:
        for _ in range(1000):
            dataplane.placed(INTERACTIVE, 0.001)
            dataplane.first_token(INTERACTIVE, 0.02, "sim-0")
            dataplane.relayed(1234)
            dataplane.turn_ended("finished", INTERACTIVE, "sim-0")
            answers.finished("m", "sim-0", INTERACTIVE, "team-a/job-7", 1.0, 1.02, 1.5, 812, 64, 512)
            answers.responded(200)

    benchmark.group = "per turn (1,000 turns)"
    benchmark(turns)


def test_scrape_dataplane(benchmark: Any) -> None:
    dataplane = DataplaneMetrics(replicas=["sim-0", "sim-1"])
    for n in range(100):
        dataplane.turn_ended("finished", INTERACTIVE, "sim-0")
        dataplane.first_token(INTERACTIVE, 0.02, "sim-1")
        dataplane.answers.finished("m", f"sim-{n % 2}", INTERACTIVE, f"c{n}", 1.0, 1.02, 1.5, 812, 64, 512)
    benchmark.group = "scrape"
    body = benchmark(dataplane.exposition)
    assert b"luftpause_dataplane_turns_total" in body


def test_scrape_scheduler_with_10000_held_turns(benchmark: Any) -> None:
    replicas = "".join(
        f'[[replicas]]\nname = "r{i}"\nurl = "http://127.0.0.1:{i + 1}"\nmodels = ["m"]\nmax_inflight = 1\n'
        for i in range(8)
    )
    host = SchedulerHost(parse_config(replicas, "bench.toml"), clock=lambda: 100.0)
    for n in range(10_008):  # 8 placed, the rest held
        arrived = TurnArrived(f"t{n}", f"run-{n}", "m", "batch", f"caller-{n % 200}", "dp", 100.0)
        host.arrive(arrived, lambda outcome: None)
    assert len(host.state.held) == 10_000
    registry = metrics.new_registry([SchedulerMetrics(host)])
    benchmark.group = "scrape"
    body = benchmark(metrics.exposition, registry)
    assert b'luftpause_scheduler_held_turns_by_caller{caller="other"}' in body
