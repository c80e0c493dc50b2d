"""A turn the scheduler gives up (expired after 10 min without a completion, released with a lost
or resynced dataplane, or abandoned) is logged with its W3C trace id, so an operator can find its
trace, in the JSON and in the default text log format.

In-process: admissions go through the gRPC service's stream handler (``AdmitRequest`` with a
``traceparent``, as the dataplane sends it) into the real host and core; the host's clock is the
test's, so expiry needs no waiting.
"""

from __future__ import annotations

import json
import logging

import pytest

from luftpause.config import parse_config
from luftpause.observe import logs
from luftpause.scheduler.core import AbandonReported, DataplaneLost, Resynced, Tick
from luftpause.scheduler.grpc_service import _Stream, leased_turn
from luftpause.scheduler.host import SchedulerHost
from luftpause.v1 import scheduler_pb2 as pb

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{TRACE_ID}-00f067aa0ba902b7-01"
OTHER_TRACE_ID = "0af7651916cd43dd8448eb211c80319c"

ONE_SLOT = parse_config(
    '[[replicas]]\nname = "solo"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\nmax_inflight = 1\n',
    "expiry.toml",
)


class Clock:
    """The host's monotonic clock, moved by the test (seconds)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _admit(stream: _Stream, turn: str, run: str, traceparent: str = "") -> None:
    stream.admit(
        pb.AdmitRequest(turn_id=turn, run_id=run, model="m", dataplane_id="dp", traceparent=traceparent)
    )


def _about(caplog: pytest.LogCaptureFixture, turn: str) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if r.name == "luftpause.scheduler" and getattr(r, "turn_id", "") == turn
    ]


def _json_line(record: logging.LogRecord) -> dict[str, object]:
    """``record`` as ``--log-format json`` writes it (the process field set as its handler would)."""
    record.luftpause_process = "scheduler"
    line: dict[str, object] = json.loads(logs.json_formatter().format(record))
    return line


def test_an_expired_turn_is_logged_with_its_trace_id(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    host = SchedulerHost(ONE_SLOT, clock)
    stream = _Stream(host)
    _admit(stream, "t1", "r1", TRACEPARENT)  # placed on the one slot
    clock.now = 1.0
    _admit(stream, "t2", "r2")  # held behind it, without a trace context
    caplog.set_level(logging.INFO, logger="luftpause.scheduler")

    clock.now = 600.0
    host.feed(Tick(clock.now))

    assert list(host.state.placed) == ["t2"]  # t1 expired, and t2 took its slot
    (record,) = _about(caplog, "t1")
    assert record.levelno == logging.WARNING
    assert "turn t1 of run r1 expired" in record.getMessage()
    assert (record.trace_id, record.run_id, record.replica) == (TRACE_ID, "r1", "solo")  # type: ignore[attr-defined]
    line = _json_line(record)
    assert line["trace_id"] == TRACE_ID and line["turn_id"] == "t1" and line["level"] == "WARNING"

    clock.now = 1200.0
    host.feed(Tick(clock.now))
    (untraced,) = _about(caplog, "t2")
    assert untraced.trace_id == ""  # type: ignore[attr-defined]  # it came without one


def test_a_turn_not_yet_expired_is_not_logged(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    host = SchedulerHost(ONE_SLOT, clock)
    _admit(_Stream(host), "t1", "r1", TRACEPARENT)
    caplog.set_level(logging.INFO, logger="luftpause.scheduler")
    clock.now = 599.0
    host.feed(Tick(clock.now))
    assert list(host.state.placed) == ["t1"] and _about(caplog, "t1") == []


def test_a_held_turn_abandoned_is_logged_with_its_trace_id(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    host = SchedulerHost(ONE_SLOT, clock)
    stream = _Stream(host)
    _admit(stream, "t1", "r1")
    _admit(stream, "t2", "r2", TRACEPARENT)  # held: the one slot is taken
    caplog.set_level(logging.INFO, logger="luftpause.scheduler")

    clock.now = 2.0
    stream.cancel("t2")  # its client left

    assert len(host.state.held) == 0
    (record,) = _about(caplog, "t2")
    assert record.levelno == logging.INFO and "abandoned while held" in record.getMessage()
    assert (record.trace_id, record.held) == (TRACE_ID, True)  # type: ignore[attr-defined]
    assert _json_line(record)["trace_id"] == TRACE_ID


def test_a_placed_turn_the_dataplane_reports_abandoned_is_logged_with_its_trace_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    host = SchedulerHost(ONE_SLOT, clock)
    _admit(_Stream(host), "t1", "r1", TRACEPARENT)
    caplog.set_level(logging.INFO, logger="luftpause.scheduler")
    clock.now = 3.0
    host.feed(AbandonReported("t1", clock.now))

    assert host.state.placed == {}
    (record,) = _about(caplog, "t1")
    assert "abandoned after its placement" in record.getMessage()
    assert (record.trace_id, record.held) == (TRACE_ID, False)  # type: ignore[attr-defined]


def test_a_turn_placed_under_a_lease_keeps_the_trace_id_of_its_report(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    host = SchedulerHost(ONE_SLOT, clock)
    traceparent = f"00-{OTHER_TRACE_ID}-00f067aa0ba902b7-01"
    message = pb.LeasedTurn(turn_id="t1", run_id="r1", model="m", replica="solo", traceparent=traceparent)
    host.feed(leased_turn(message, "dp", clock.now))
    caplog.set_level(logging.INFO, logger="luftpause.scheduler")
    clock.now = 600.0
    host.feed(Tick(clock.now))

    (record,) = _about(caplog, "t1")
    assert record.trace_id == OTHER_TRACE_ID  # type: ignore[attr-defined]


def test_a_turn_released_with_its_lost_dataplane_is_logged_with_its_trace_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A reviewer's case: only expiry and abandon were logged; the other turns given up were silent.
    clock = Clock()
    host = SchedulerHost(ONE_SLOT, clock)
    _admit(_Stream(host), "t1", "r1", TRACEPARENT)
    caplog.set_level(logging.INFO, logger="luftpause.scheduler")
    clock.now = 5.0
    host.feed(DataplaneLost("dp", clock.now))
    clock.now = 5.0 + ONE_SLOT.scheduler.dataplane_grace_s - 1
    host.feed(Tick(clock.now))
    assert _about(caplog, "t1") == []  # still within the grace

    clock.now += 1
    host.feed(Tick(clock.now))
    assert host.state.placed == {}
    (record,) = _about(caplog, "t1")
    assert record.levelno == logging.WARNING
    assert "turn t1 of run r1 on solo released: its dataplane stayed away" in record.getMessage()
    assert (record.trace_id, record.dataplane_id) == (TRACE_ID, "dp")  # type: ignore[attr-defined]


def test_a_turn_its_dataplanes_resync_no_longer_lists_is_logged_with_its_trace_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    host = SchedulerHost(ONE_SLOT, clock)
    _admit(_Stream(host), "t1", "r1", TRACEPARENT)
    caplog.set_level(logging.INFO, logger="luftpause.scheduler")
    clock.now = 5.0
    host.feed(Resynced("dp", clock.now, runs=(), turns=()))

    assert host.state.placed == {}
    (record,) = _about(caplog, "t1")
    assert "released: its dataplane's resync no longer lists it" in record.getMessage()
    assert record.trace_id == TRACE_ID  # type: ignore[attr-defined]


def test_the_text_log_format_shows_the_trace_id() -> None:
    def line(**fields: str) -> str:
        record = logging.LogRecord(
            "luftpause.scheduler", logging.WARNING, __file__, 1, "turn t1 expired", (), None
        )
        record.__dict__.update(fields)
        return logs._text_formatter().format(record)

    assert line(trace_id=TRACE_ID).endswith(f"turn t1 expired trace={TRACE_ID}")
    assert line(trace_id="").endswith("turn t1 expired")  # no trace context: nothing added
    assert line().endswith("turn t1 expired")
