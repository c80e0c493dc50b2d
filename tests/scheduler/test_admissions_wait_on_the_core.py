"""The scheduler's shell in-process: how admissions wait on the core, and the status app's errors.

The host is driven on a real event loop with its real core; the status app is served on a free
loopback port. What the gRPC stream adds on top is tested with the real process in
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
from luftpause.scheduler.host import Outcome, SchedulerHost
from luftpause.scheduler.status_http import status_app
from luftpause.testkit.launch.procs import free_port

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


class Answers:
    """An answer callback that records every outcome it is given."""

    def __init__(self) -> None:
        self.outcomes: list[Outcome] = []

    def __call__(self, outcome: Outcome) -> None:
        self.outcomes.append(outcome)


def arrived(host: SchedulerHost, turn: str, run: str) -> TurnArrived:
    return TurnArrived(turn, run, "m", "interactive", "", "dp", host.now())


def test_an_admission_placed_at_once_is_answered_inside_arrive() -> None:
    host = RecordingHost()
    answers = Answers()
    host.arrive(arrived(host, "t1", "r1"), answers)
    assert answers.outcomes == [Place("t1", "solo")]
    assert host._waiters == {}


def test_a_held_admission_is_answered_when_a_slot_frees() -> None:
    host = RecordingHost()
    host.arrive(arrived(host, "t1", "r1"), Answers())
    answers = Answers()
    host.arrive(arrived(host, "t2", "r2"), answers)
    assert answers.outcomes == [] and len(host.state.held) == 1
    host.feed(TurnFinished("t1", host.now(), "stop", False, 1, 1))
    assert answers.outcomes == [Place("t2", "solo")]
    assert host._waiters == {}


def test_an_abandoned_held_admission_leaves_the_queue_exactly_once() -> None:
    host = RecordingHost()
    host.arrive(arrived(host, "t1", "r1"), Answers())
    answers = Answers()
    host.arrive(arrived(host, "t2", "r2"), answers)
    host.abandon("t2", answers)
    assert [event.turn_id for event in host.abandons()] == ["t2"]
    assert len(host.state.held) == 0
    assert host.state.counters.abandoned == 1
    assert host._waiters == {}
    host.feed(TurnFinished("t1", host.now(), "stop", False, 1, 1))
    assert answers.outcomes == []  # never answered after it was given up


def test_a_cancel_crossing_its_placement_gives_the_slot_back() -> None:
    host = RecordingHost()
    host.arrive(arrived(host, "t1", "r1"), Answers())
    answers = Answers()
    host.arrive(arrived(host, "t2", "r2"), answers)
    host.feed(TurnFinished("t1", host.now(), "stop", False, 1, 1))  # places t2: its answer goes out
    assert answers.outcomes == [Place("t2", "solo")]
    host.abandon("t2", None)  # ... but its client had left: the cancel arrives after the answer
    assert [event.turn_id for event in host.abandons()] == ["t2"]
    assert host.state.placed == {}
    assert host.state.replicas["solo"].inflight == 0


def test_an_admission_abandoned_while_another_of_its_turn_waits_is_not_abandoned() -> None:
    host = RecordingHost()
    host.arrive(arrived(host, "t1", "r1"), Answers())
    old_stream, new_stream = Answers(), Answers()
    host.arrive(arrived(host, "t2", "r2"), old_stream)
    host.arrive(arrived(host, "t2", "r2"), new_stream)  # re-sent on a new stream before the old ended
    host.abandon("t2", old_stream)  # the old stream is seen to end
    assert host.abandons() == []
    host.feed(TurnFinished("t1", host.now(), "stop", False, 1, 1))
    assert new_stream.outcomes == [Place("t2", "solo")]
    assert old_stream.outcomes == []


def test_an_abandon_report_answers_the_held_admission_with_a_refusal() -> None:
    host = RecordingHost()
    host.arrive(arrived(host, "t1", "r1"), Answers())
    answers = Answers()
    host.arrive(arrived(host, "t2", "r2"), answers)
    host.feed(AbandonReported("t2", host.now()))
    assert answers.outcomes == [Reject("t2", "turn was abandoned by its dataplane", 499)]
    assert host.abandons() == []  # answered, not cancelled: nothing more to undo
    assert host._waiters == {}
    # the admit crossing the report, arriving after it, is refused at once
    late = Answers()
    host.arrive(arrived(host, "t2", "r2"), late)
    assert late.outcomes == [Reject("t2", "turn was abandoned by its dataplane", 499)]


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
