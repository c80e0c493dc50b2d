"""The probe loop's schedule, driven through its seams (the host's clock, ``sleep``, the session):
every 2 s, each request bounded by 2 s (docs/architecture.md "Constants"), one ``ReplicasProbed`` per round.

No wall time is measured: the clock is the fake host's, advanced only by the fake ``sleep`` and by
the engine's handler (a round that took long); the engines are real HTTP servers on loopback.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import aiohttp
import pytest
from aiohttp import web

from luftpause.config import Config, ReplicaConfig, parse_config
from luftpause.scheduler.core import Event, ReplicasProbed
from luftpause.scheduler.probes import PROBE_INTERVAL_S, PROBE_TIMEOUT_S, Prober
from luftpause.testkit.launch.procs import free_port

METRICS = "sglang:num_running_reqs 3\nsglang:num_queue_reqs 1\n"


class FakeHost:
    """What the prober uses of a ``SchedulerHost``: its clock, ``feed`` and the replica set."""

    def __init__(self) -> None:
        self.clock = 100.0
        self.fed: list[Event] = []
        self.notes: list[tuple[str, str | None, str | None]] = []
        self.replicas: dict[str, ReplicaConfig] = {}
        self.context_lengths: dict[str, int] = {}

    def now(self) -> float:
        return self.clock

    def feed(self, event: Event) -> list[object]:
        self.fed.append(event)
        return []

    def note_load(self, replica: str, engine: str | None, unknown: str | None) -> None:
        self.notes.append((replica, engine, unknown))

    def note_context_length(self, replica: str, tokens: int) -> None:
        self.context_lengths[replica] = tokens


@asynccontextmanager
async def engine(host: FakeHost, round_takes: list[float]) -> AsyncIterator[int]:
    """An engine on a free port; each health check advances the fake clock by the next of
    ``round_takes`` (seconds a round took), or by nothing once they are used up."""

    async def health(request: web.Request) -> web.Response:
        if round_takes:
            host.clock += round_takes.pop(0)
        return web.Response()

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(text=METRICS)

    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port
    finally:
        await runner.cleanup()


def config(port: int, unreachable: int) -> Config:
    return parse_config(
        f'[[replicas]]\nname = "a"\nurl = "http://127.0.0.1:{port}"\nmodels = ["m"]\n'
        f'[[replicas]]\nname = "b"\nurl = "http://127.0.0.1:{unreachable}"\nmodels = ["m"]\n',
        "probes.toml",
    )


def drive(rounds: int, round_takes: list[float]) -> tuple[FakeHost, list[float], list[float]]:
    """Run the default prober for ``rounds`` rounds; the host, the sleeps asked for and the
    timeouts the sessions were made with (seconds)."""
    host = FakeHost()
    sleeps: list[float] = []
    timeouts: list[float] = []

    async def scenario() -> None:
        done = asyncio.get_running_loop().create_future()

        async def sleep(seconds: float) -> None:
            sleeps.append(seconds)
            host.clock += seconds
            if len(sleeps) == rounds:
                done.set_result(None)
                await asyncio.get_running_loop().create_future()  # until stopped

        def session(timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
            assert timeout.total is not None
            timeouts.append(timeout.total)
            return aiohttp.ClientSession(timeout=timeout)

        async with engine(host, round_takes) as port:
            configured = config(port, free_port())
            host.replicas = {replica.name: replica for replica in configured.replicas}
            prober = Prober(configured, host, sleep=sleep, session=session)  # type: ignore[arg-type]
            prober.start()
            try:
                await asyncio.wait_for(done, 30)
            finally:
                await prober.stop()

    asyncio.run(scenario())
    return host, sleeps, timeouts


def test_replicas_are_probed_every_2_s_each_request_bounded_by_2_s() -> None:
    assert (PROBE_INTERVAL_S, PROBE_TIMEOUT_S) == (2.0, 2.0)
    host, sleeps, timeouts = drive(3, [])
    assert timeouts == [2.0], "one session, every request bounded by the probe timeout"
    assert sleeps == [2.0, 2.0, 2.0]
    assert [event.at for event in host.fed] == [100.0, 102.0, 104.0]


def test_a_round_is_one_event_with_every_replica() -> None:
    host, _, _ = drive(1, [])
    (round_,) = host.fed
    assert isinstance(round_, ReplicasProbed)
    by_name = {probe.replica: probe for probe in round_.probes}
    assert sorted(by_name) == ["a", "b"]
    assert (by_name["a"].healthy, by_name["a"].running, by_name["a"].waiting) == (True, 3, 1)
    assert (by_name["b"].healthy, by_name["b"].running) == (False, None)  # nothing listens there
    assert all(probe.at == round_.at for probe in round_.probes)


def test_a_slow_round_shortens_the_wait_and_a_round_past_the_interval_is_followed_at_once() -> None:
    host, sleeps, _ = drive(3, [0.5, 3.0])
    assert sleeps == [1.5, 0.0, 2.0]
    assert [event.at for event in host.fed] == [100.5, 105.0, 105.0]


def test_each_round_notes_whose_metrics_gave_the_load_or_why_none_did_and_logs_a_change_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, "luftpause.scheduler")
    host, _, _ = drive(3, [])
    assert [note[:2] for note in host.notes] == [("a", "sglang"), ("b", None)] * 3
    assert all(note[2] is None for note in host.notes if note[0] == "a")
    why = {note[2] for note in host.notes if note[0] == "b"}
    assert len(why) == 1 and next(iter(why)).endswith("/metrics failed: ClientConnectorError")  # type: ignore[union-attr]
    warned = [r.getMessage() for r in caplog.records if "load of replica b unknown" in r.getMessage()]
    assert len(warned) == 1, "a reason that does not change is logged once, not every 2 s"
    assert "capped only by its max_inflight" in warned[0]
