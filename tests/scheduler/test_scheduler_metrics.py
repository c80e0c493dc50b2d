"""The scheduler's ``/metrics``: what its collector reads from the host's snapshot and counts.

The host runs its real core on a clock the test moves; the status app is served on a free loopback
port and scraped over HTTP, its text parsed by ``prometheus_client``'s parser. That a real
scheduler process exposes the same under a real Prometheus is
``tests/stack/test_metrics_scraped_by_prometheus.py``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import aiohttp
import orjson
from aiohttp import web
from prometheus_client.parser import text_string_to_metric_families

from luftpause.config import parse_config
from luftpause.observe.metrics import CONTENT_TYPE, TOP_CALLERS
from luftpause.scheduler.core import (
    AbandonReported,
    LeasedTurnPlaced,
    Place,
    Reject,
    ReplicaProbed,
    ReplicasProbed,
    TurnArrived,
    TurnFailed,
    TurnFinished,
)
from luftpause.scheduler.host import Outcome, SchedulerHost
from luftpause.scheduler.status_http import status_app
from luftpause.testkit.launch.procs import free_port

CONFIG = parse_config(
    """
[[replicas]]
name = "a"
url = "http://127.0.0.1:1"
models = ["m"]
max_inflight = 1

[[replicas]]
name = "b"
url = "http://127.0.0.1:2"
models = ["m"]
max_inflight = 1
""",
    "metrics.toml",
)

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def new_host() -> tuple[SchedulerHost, Clock]:
    clock = Clock()
    return SchedulerHost(CONFIG, clock=clock), clock


def admit(
    host: SchedulerHost, turn_id: str, caller: str = "c", service_class: str = "interactive"
) -> list[Outcome]:
    answers: list[Outcome] = []
    arrived = TurnArrived(turn_id, f"run-{turn_id}", "m", service_class, caller, "dp", host.now())  # type: ignore[arg-type]
    host.arrive(arrived, answers.append)
    return answers


def finish(host: SchedulerHost, turn_id: str) -> None:
    host.feed(TurnFinished(turn_id, host.now(), "stop", False, 1, 1))


def serve(host: SchedulerHost, check: Callable[[Callable[[str], tuple[int, str, bytes]]], None]) -> None:
    """Serve ``host``'s status app on a free port and run ``check(get)``, ``get(path)`` giving
    ``(status, content type, body)``."""

    async def main() -> None:
        runner = web.AppRunner(status_app(host), access_log=None)
        await runner.setup()
        port = free_port()
        try:
            await web.TCPSite(runner, "127.0.0.1", port).start()
            async with aiohttp.ClientSession() as session:
                answers: dict[str, tuple[int, str, bytes]] = {}
                for path in ("/metrics", "/livez", "/readyz", "/health"):
                    async with session.get(f"http://127.0.0.1:{port}{path}") as response:
                        answers[path] = (
                            response.status,
                            response.headers["content-type"],
                            await response.read(),
                        )
            check(answers.__getitem__)
        finally:
            await runner.cleanup()

    asyncio.run(main())


def scrape(host: SchedulerHost) -> Samples:
    got: list[bytes] = []

    def check(get: Callable[[str], tuple[int, str, bytes]]) -> None:
        status, content_type, body = get("/metrics")
        assert status == 200 and content_type == CONTENT_TYPE
        got.append(body)

    serve(host, check)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(got[0].decode())
        for sample in family.samples
    }


def test_held_turns_and_their_oldest_wait_by_class() -> None:
    host, clock = new_host()
    admit(host, "i1")
    admit(host, "i2")  # both replicas full now
    admit(host, "b1", service_class="batch")
    clock.now += 4
    admit(host, "i3")
    admit(host, "b2", service_class="batch")
    clock.now += 1.5
    samples = scrape(host)
    assert samples[("luftpause_scheduler_held_turns", (("service_class", "interactive"),))] == 1
    assert samples[("luftpause_scheduler_held_turns", (("service_class", "batch"),))] == 2
    assert samples[("luftpause_scheduler_oldest_held_seconds", (("service_class", "batch"),))] == 5.5
    assert samples[("luftpause_scheduler_oldest_held_seconds", (("service_class", "interactive"),))] == 1.5
    assert samples[("luftpause_scheduler_replica_turns_in_flight", (("replica", "a"),))] == 1
    assert samples[("luftpause_scheduler_runs", (("phase", "generating"),))] == 2


def test_held_turns_by_caller_name_the_top_callers_and_sum_the_rest_as_other() -> None:
    host, clock = new_host()
    admit(host, "fill-a")
    admit(host, "fill-b")
    # caller k holds k + 1 turns (k = 0 .. TOP_CALLERS + 2), the anonymous caller one, held first
    admit(host, "anon", caller="")
    for k in range(TOP_CALLERS + 3):
        for n in range(k + 1):
            admit(host, f"c{k}-{n}", caller=f"caller-{k:02d}")
        clock.now += 1
    samples = scrape(host)
    by_caller = {
        dict(labels)["caller"]: value
        for (name, labels), value in samples.items()
        if name == "luftpause_scheduler_held_turns_by_caller"
    }
    waits = {
        dict(labels)["caller"]: value
        for (name, labels), value in samples.items()
        if name == "luftpause_scheduler_oldest_held_seconds_by_caller"
    }
    top = [f"caller-{k:02d}" for k in range(TOP_CALLERS + 2, 2, -1)]  # the ten holding the most
    assert set(by_caller) == {*top, "other"}
    assert all(by_caller[name] == int(name[-2:]) + 1 for name in top)
    # the rest: callers 00, 01, 02 (1 + 2 + 3) and the anonymous caller (1)
    assert by_caller["other"] == 1 + 2 + 3 + 1
    assert sum(by_caller.values()) == len(host.state.held)
    # the longest wait among the rest: the anonymous caller's, held before everyone else
    assert waits["other"] == TOP_CALLERS + 3
    assert waits["caller-12"] == 1


def test_the_anonymous_caller_is_named_anonymous() -> None:
    host, _ = new_host()
    admit(host, "fill-a")
    admit(host, "fill-b")
    admit(host, "anon", caller="")
    samples = scrape(host)
    assert samples[("luftpause_scheduler_held_turns_by_caller", (("caller", "anonymous"),))] == 1


def test_placements_by_replica_and_how_and_the_admission_latency() -> None:
    host, clock = new_host()
    assert admit(host, "t1") == [Place("t1", "a")]  # placed at once: latency 0
    admit(host, "t2")  # on b
    held = admit(host, "t3", service_class="batch")
    assert held == []
    clock.now += 2.0
    finish(host, "t1")  # t3 takes a's slot: it waited 2 s
    assert held == [Place("t3", "a")]
    again = admit(host, "t3", service_class="batch")  # an admit retried on a new stream
    assert again == [Place("t3", "a")]
    host.feed(LeasedTurnPlaced("t4", "run-t4", "m", "interactive", "c", "dp", "b", 1, clock.now))
    samples = scrape(host)

    def placed(replica: str, via: str) -> float:
        return samples[("luftpause_scheduler_placements_total", (("replica", replica), ("via", via)))]

    assert (placed("a", "admit"), placed("b", "admit"), placed("b", "lease"), placed("a", "lease")) == (
        2,
        1,
        1,
        0,
    )
    interactive = (("service_class", "interactive"),)
    batch = (("service_class", "batch"),)
    assert samples[("luftpause_scheduler_admission_latency_seconds_count", interactive)] == 2
    assert samples[("luftpause_scheduler_admission_latency_seconds_sum", interactive)] == 0
    assert samples[("luftpause_scheduler_admission_latency_seconds_count", batch)] == 1
    assert samples[("luftpause_scheduler_admission_latency_seconds_sum", batch)] == 2.0
    assert samples[("luftpause_scheduler_admission_latency_seconds_bucket", (("le", "1.0"), *batch))] == 0
    assert samples[("luftpause_scheduler_admission_latency_seconds_bucket", (("le", "2.5"), *batch))] == 1
    assert samples[("luftpause_scheduler_turns_arrived_total", ())] == 4  # the leased one too
    assert samples[("luftpause_scheduler_turns_ended_total", (("outcome", "finished"),))] == 1


def test_refusals_are_counted_by_reason() -> None:
    host, _ = new_host()
    answers: list[Outcome] = []
    host.arrive(
        TurnArrived("u", "run-u", "no-such-model", "interactive", "c", "dp", host.now()), answers.append
    )
    host.feed(AbandonReported("gone", host.now()))
    admit(host, "gone")  # its admit crossed the report
    samples = scrape(host)

    def refused(reason: str) -> float:
        return samples[("luftpause_scheduler_rejections_total", (("reason", reason),))]

    assert (refused("unknown_model"), refused("abandoned"), refused("limit"), refused("other")) == (
        1,
        1,
        0,
        0,
    )


def test_replicas_as_probed_and_their_probe_failures() -> None:
    host, clock = new_host()
    samples = scrape(host)
    a = (("replica", "a"),)
    assert samples[("luftpause_scheduler_replica_healthy", a)] == 1  # never probed: healthy
    assert ("luftpause_scheduler_replica_probe_age_seconds", a) not in samples
    assert ("luftpause_scheduler_replica_engine_running", a) not in samples
    host.feed(ReplicasProbed(clock.now, (ReplicaProbed("a", clock.now, True, 3, 2, 0.5, 0.25),)))  # b failed
    clock.now += 1.5
    host.feed(ReplicasProbed(clock.now, (ReplicaProbed("b", clock.now, False),)))  # a failed, b unhealthy
    clock.now += 0.5
    samples = scrape(host)
    b = (("replica", "b"),)
    assert samples[("luftpause_scheduler_replica_healthy", b)] == 0
    assert samples[("luftpause_scheduler_replica_engine_running", a)] == 3
    assert samples[("luftpause_scheduler_replica_engine_waiting", a)] == 2
    assert samples[("luftpause_scheduler_replica_kv_cache_usage_ratio", a)] == 0.5
    assert samples[("luftpause_scheduler_replica_prefix_cache_hit_ratio", a)] == 0.25
    assert samples[("luftpause_scheduler_replica_probe_age_seconds", a)] == 2.0
    assert samples[("luftpause_scheduler_replica_probe_failures_total", a)] == 1
    assert samples[("luftpause_scheduler_replica_probe_failures_total", b)] == 2
    assert samples[("luftpause_scheduler_replica_capacity", a)] == 1


def test_the_process_collectors_are_on_and_no_created_series_are_exposed() -> None:
    host, _ = new_host()
    admit(host, "t1")
    samples = scrape(host)
    names = {name for name, _ in samples}
    assert {"process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"} <= names
    assert samples[("luftpause_build_info", (("process", "scheduler"), ("version", "0.1.0")))] == 1
    assert not [name for name in names if name.endswith("_created")]


def test_readyz_waits_for_the_first_probe_round_and_livez_and_health_answer_throughout() -> None:
    host, clock = new_host()
    seen: list[dict[str, tuple[int, bytes]]] = []

    def check(get: Callable[[str], tuple[int, str, bytes]]) -> None:
        seen.append({path: (get(path)[0], get(path)[2]) for path in ("/livez", "/readyz", "/health")})

    serve(host, check)
    host.feed(
        ReplicasProbed(
            clock.now, (ReplicaProbed("a", clock.now, False), ReplicaProbed("b", clock.now, False))
        )
    )
    serve(host, check)
    before, after = seen
    assert before["/livez"] == (200, b'{"status":"ok","checks":{}}')
    assert before["/health"] == after["/health"] == (200, b'{"status":"ok"}')  # as before /livez
    assert before["/readyz"][0] == 503
    assert orjson.loads(before["/readyz"][1]) == {
        "status": "unready",
        "checks": {"probed": {"ok": False, "detail": "no probe round yet"}},
    }
    # ready once probed, even with no replica healthy: it holds turns then, and the dataplanes,
    # told so, say they are not ready
    assert after["/readyz"][0] == 200
    assert orjson.loads(after["/readyz"][1])["checks"]["probed"]["ok"] is True
    assert host.healthy_replicas() == 0


LIMITED = parse_config(
    """
[[replicas]]
name = "a"
url = "http://127.0.0.1:1"
models = ["m"]
max_inflight = 1

[scheduler.protection]
breaker_failures = 2

[scheduler.protection.interactive]
max_held = 1
""",
    "limits.toml",
)


def test_limit_refusals_by_class_and_limit_and_the_circuit_breaker() -> None:
    clock = Clock()
    host = SchedulerHost(LIMITED, clock=clock)
    admit(host, "placed")
    admit(host, "held")
    refused = admit(host, "over")  # a second held turn of the same caller and class: 429
    assert len(refused) == 1 and isinstance(refused[0], Reject) and refused[0].http_status == 429
    for n in range(2):  # two engine faults in a row on a: its breaker opens
        admit(host, f"f{n}", caller=f"other-{n}")
        host.feed(TurnFailed("placed" if n == 0 else "held", clock.now, "engine answered 500"))
    samples = scrape(host)
    interactive_held = (("limit", "held"), ("service_class", "interactive"))
    assert samples[("luftpause_scheduler_limit_refusals_total", interactive_held)] == 1
    assert (
        samples[
            (
                "luftpause_scheduler_limit_refusals_total",
                (("limit", "token_rate"), ("service_class", "batch")),
            )
        ]
        == 0
    )
    assert samples[("luftpause_scheduler_rejections_total", (("reason", "limit"),))] == 1
    assert samples[("luftpause_scheduler_breaker_trips_total", ())] == 1
    assert samples[("luftpause_scheduler_replica_breaker_open", (("replica", "a"),))] == 1
    assert samples[("luftpause_scheduler_replica_breaker_half_open", (("replica", "a"),))] == 0
    opened = (("from", "closed"), ("replica", "a"), ("to", "open"))
    assert samples[("luftpause_scheduler_breaker_transitions_total", opened)] == 1
    assert samples[("luftpause_scheduler_replica_draining", (("replica", "a"),))] == 0
    assert host.healthy_replicas() == 0  # out of rotation: the dataplanes are told none is healthy
