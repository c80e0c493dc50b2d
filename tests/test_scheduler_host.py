"""The scheduler's shell in-process: how Admit calls wait on the core, and the status app's errors.

The host is driven on a real event loop with its real core; the status app is served on a free
loopback port. What the gRPC layer adds on top is tested with the real process in
``test_scheduler_server.py``.
"""

from __future__ import annotations

import asyncio
import logging

import aiohttp
import pytest
from aiohttp import web

from luftpause.config import parse_config
from luftpause.scheduler.core import (
    AbandonReported,
    Action,
    Event,
    Place,
    Reject,
    TurnAbandoned,
    TurnArrived,
    TurnFinished,
)
from luftpause.scheduler.host import SchedulerHost
from luftpause.scheduler.status_http import status_app
from luftpause.testkit.procs import free_port

ONE_SLOT = parse_config(
    '[[replicas]]\nname = "solo"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\nmax_inflight = 1\n',
    "host.toml",
)


class RecordingHost(SchedulerHost):
    """A host that keeps every event it fed to the core, in order."""

    def __init__(self) -> None:
        super().__init__(ONE_SLOT)
        self.fed: list[Event] = []

    def feed(self, event: Event) -> list[Action]:
        self.fed.append(event)
        return super().feed(event)

    def abandons(self) -> list[TurnAbandoned]:
        return [event for event in self.fed if isinstance(event, TurnAbandoned)]


def arrived(host: SchedulerHost, turn: str, run: str) -> TurnArrived:
    return TurnArrived(turn, run, "m", "interactive", "", "dp", host.now())


async def until_held(host: SchedulerHost, count: int) -> None:
    for _ in range(1000):  # a fail-safe: the admit task runs at its first step
        if len(host.state.held) == count:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"never {count} held")


def test_a_cancelled_held_admit_abandons_its_turn_exactly_once() -> None:
    async def main() -> None:
        host = RecordingHost()
        assert await host.admit(arrived(host, "t1", "r1")) == Place("t1", "solo")
        waiting = asyncio.ensure_future(host.admit(arrived(host, "t2", "r2")))
        await until_held(host, 1)
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert [event.turn_id for event in host.abandons()] == ["t2"]
        assert len(host.state.held) == 0
        assert host.state.counters.abandoned == 1
        assert host._waiters == {}

    asyncio.run(main())


def test_an_admit_cancelled_as_its_placement_lands_gives_the_slot_back() -> None:
    async def main() -> None:
        host = RecordingHost()
        await host.admit(arrived(host, "t1", "r1"))
        waiting = asyncio.ensure_future(host.admit(arrived(host, "t2", "r2")))
        await until_held(host, 1)
        host.feed(TurnFinished("t1", host.now(), "stop", False, 1, 1))  # places t2: its answer is set
        assert "t2" in host.state.placed
        waiting.cancel()  # ... but its caller leaves before reading it: the reply is lost
        with pytest.raises(asyncio.CancelledError):
            await waiting
        assert [event.turn_id for event in host.abandons()] == ["t2"]
        assert host.state.placed == {}
        assert host.state.replicas["solo"].inflight == 0

    asyncio.run(main())


def test_an_abandon_report_answers_the_held_admit_with_a_refusal() -> None:
    async def main() -> None:
        host = RecordingHost()
        await host.admit(arrived(host, "t1", "r1"))
        waiting = asyncio.ensure_future(host.admit(arrived(host, "t2", "r2")))
        await until_held(host, 1)
        host.feed(AbandonReported("t2", host.now()))
        assert await waiting == Reject("t2", "turn was abandoned by its dataplane", 499)
        assert host.abandons() == []  # answered, not cancelled: nothing more to undo
        assert host._waiters == {}
        # the Admit crossing the report, arriving after it, is refused at once
        assert await host.admit(arrived(host, "t2", "r2")) == Reject(
            "t2", "turn was abandoned by its dataplane", 499
        )

    asyncio.run(main())


class BrokenHost(SchedulerHost):
    def status(self) -> dict[str, object]:
        raise RuntimeError("snapshot failed")


def test_an_unexpected_fault_is_answered_500_with_the_json_error_body(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        runner = web.AppRunner(status_app(BrokenHost(ONE_SLOT)), access_log=None)
        await runner.setup()
        port = free_port()
        try:
            await web.TCPSite(runner, "127.0.0.1", port).start()
            async with (
                aiohttp.ClientSession() as session,
                session.get(f"http://127.0.0.1:{port}/status") as response,
            ):
                assert response.status == 500
                assert response.content_type == "application/json"
                assert await response.json() == {"error": {"message": "internal error: RuntimeError"}}
        finally:
            await runner.cleanup()

    with caplog.at_level(logging.ERROR, logger="luftpause.scheduler"):
        asyncio.run(main())
    assert "GET /status failed" in caplog.text
