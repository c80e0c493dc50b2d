"""The pages' time series: the bounded ring (``luftpause.observe.series``), the scheduler's samples of held
turns, time to first token and runs (``luftpause.scheduler.series``), and ``GET /series``."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import httpx2
import pytest
from aiohttp import web

from luftpause.config import parse_config
from luftpause.observe.series import MAX_OBSERVATIONS, SeriesRing, Window, parse_after, sample_every
from luftpause.scheduler.core import FirstToken, LeasedTurnPlaced, TurnArrived, TurnFinished
from luftpause.scheduler.host import SchedulerHost
from luftpause.scheduler.status_http import status_app
from luftpause.testkit.launch.procs import free_port

# --- the ring -------------------------------------------------------------------------------------


def test_the_ring_holds_ten_minutes_of_two_second_samples_and_no_more() -> None:
    ring = SeriesRing()
    assert (ring.interval_s, ring.window_s, ring.capacity) == (2.0, 600.0, 300)
    for i in range(1000):  # 33 minutes of samples
        ring.add(1000.0 + 2 * i, {"held": {"batch": i}})
    assert len(ring) == 300
    answer = ring.since()
    samples = answer["samples"]
    assert [s["seq"] for s in samples] == list(range(700, 1000))  # the newest, oldest first
    assert samples[0] == {"seq": 700, "t": 2400.0, "held": {"batch": 700}}
    assert answer["next"] == 1000 and answer["capacity"] == 300 and answer["version"] == 1


def test_the_rings_memory_stays_bounded_whatever_the_uptime() -> None:
    ring = SeriesRing(interval_s=1.0, window_s=50.0)
    ring.add(0.0, {"x": 0})
    one = sys.getsizeof(ring._samples)
    for i in range(100_000):
        ring.add(float(i), {"x": i})
    assert len(ring) == ring.capacity == 50
    assert sys.getsizeof(ring._samples) <= one * 2  # the deque's own size does not grow with uptime


def test_after_answers_only_newer_samples() -> None:
    ring = SeriesRing(interval_s=2.0, window_s=10.0)  # 5 samples
    for i in range(8):
        ring.add(float(i), {"v": i})
    assert [s["seq"] for s in ring.since(5)["samples"]] == [6, 7]
    assert ring.since(7)["samples"] == []
    assert ring.since(99)["samples"] == []  # a seq from a longer-lived boot: nothing (the boot differs)
    assert [s["seq"] for s in ring.since(0)["samples"]] == [3, 4, 5, 6, 7]  # fell out: all that is kept
    assert SeriesRing().since(3)["samples"] == []
    assert SeriesRing().boot != ring.boot


@pytest.mark.parametrize("value", ["-1", "1.5", "x", "٣", " 2"])
def test_a_bad_after_is_refused_saying_what_was_expected(value: str) -> None:
    with pytest.raises(ValueError, match="after: expected the seq of a sample"):
        parse_after(value)
    assert parse_after(None) is None and parse_after("") is None and parse_after("12") == 12


def test_a_ring_needs_a_positive_interval_within_its_window() -> None:
    for interval, window in [(0.0, 10.0), (-1.0, 10.0), (5.0, 1.0), (float("nan"), 10.0)]:
        with pytest.raises(ValueError, match="interval_s"):
            SeriesRing(interval, window)


# --- the window of one interval -------------------------------------------------------------------


def test_a_window_summarizes_and_empties() -> None:
    window = Window()
    assert window.take() == {"n": 0, "p50": None, "p95": None, "max": None}
    for value in [0.4, 0.1, 0.3, 0.2, 2.0]:
        window.add(value)
    assert window.take() == {"n": 5, "p50": 0.3, "p95": 2.0, "max": 2.0}
    assert window.take()["n"] == 0


def test_a_window_keeps_a_bounded_sample_with_exact_count_and_max() -> None:
    window = Window(seed=7)
    for i in range(MAX_OBSERVATIONS * 5):
        window.add(i / 1000)
    window.add(-1.0)
    assert len(window._kept) == MAX_OBSERVATIONS
    summary = window.take()
    assert summary["n"] == MAX_OBSERVATIONS * 5 + 1
    assert summary["max"] == round((MAX_OBSERVATIONS * 5 - 1) / 1000, 4)
    middle = MAX_OBSERVATIONS * 5 / 2 / 1000  # a uniform sample's median is near the whole one's
    assert abs(summary["p50"] - middle) < middle * 0.1


@pytest.mark.anyio
async def test_sample_every_takes_one_sample_at_once_then_one_per_interval_and_survives_a_bad_one() -> None:
    ring = SeriesRing(interval_s=0.01, window_s=1.0)
    calls = 0
    five = asyncio.Event()

    def sample() -> dict[str, int]:
        nonlocal calls
        calls += 1
        if calls == 5:
            five.set()
        if calls == 2:
            raise RuntimeError("a bad sample")
        return {"n": calls}

    task = asyncio.create_task(sample_every(ring, sample))
    await asyncio.wait_for(five.wait(), 10)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    values = [s["n"] for s in ring.since()["samples"]]
    assert values[:3] == [1, 3, 4]  # the second raised and was skipped


# --- the scheduler's samples ----------------------------------------------------------------------

TWO_SLOTS = parse_config(
    '[[replicas]]\nname = "solo"\nurl = "http://127.0.0.1:1"\nmodels = ["m"]\nmax_inflight = 2\n',
    "series.toml",
)


def arrive(host: SchedulerHost, turn_id: str, run_id: str, service_class: str, at: float) -> None:
    event = TurnArrived(turn_id, run_id, "m", service_class, "c", "dp", at)  # type: ignore[arg-type]
    host.arrive(event, lambda outcome: None)


def test_the_scheduler_samples_held_turns_first_tokens_and_runs() -> None:
    now = [100.0]
    host = SchedulerHost(TWO_SLOTS, clock=lambda: now[0])
    arrive(host, "t1", "r1", "interactive", 100.0)
    arrive(host, "t2", "r2", "batch", 100.0)
    arrive(host, "t3", "r3", "batch", 100.1)  # both slots taken: held
    arrive(host, "t4", "r4", "interactive", 100.2)  # held, before t3 (interactive first)
    host.feed(FirstToken("t1", 100.25))
    host.feed(TurnFinished("t1", 100.5, "tool_calls", True, 3, 2))
    # t4 took t1's slot: it waited 0.3 s here; its first token 0.5 s after it arrived
    host.feed(FirstToken("t4", 100.7))
    host.feed(TurnFinished("t4", 100.8, "stop", False, 3, 2))
    assert host.series.tick(host.state, 101.0, 1_700_000_000.0) is True
    assert host.series.tick(host.state, 102.0, 1_700_000_001.0) is False  # within the interval
    (sample,) = host.recent()["samples"]
    assert sample["t"] == 1_700_000_000.0
    assert sample["held"] == {"interactive": 0, "batch": 1}  # t3
    assert sample["ttft_s"]["interactive"] == {"n": 2, "p50": 0.25, "p95": 0.5, "max": 0.5}
    assert sample["ttft_s"]["batch"] == {"n": 0, "p50": None, "p95": None, "max": None}
    # r4 answered and r3 held are idle, r2 generating, r1 paused on its tool
    assert sample["runs"] == {"idle": 2, "generating": 1, "tool_paused": 1}
    host.feed(FirstToken("t2", 102.0))
    assert host.series.tick(host.state, 103.0, 1_700_000_002.0) is True
    (later,) = host.recent(sample["seq"])["samples"]
    assert later["ttft_s"]["batch"]["n"] == 1 and later["ttft_s"]["batch"]["p50"] == 2.0
    assert later["ttft_s"]["interactive"]["n"] == 0  # each window is its own interval


def test_a_leased_turn_is_timed_from_its_report_and_a_forgotten_turn_leaves_no_trace() -> None:
    host = SchedulerHost(TWO_SLOTS, clock=lambda: 10.0)
    host.feed(LeasedTurnPlaced("t9", "r9", "m", "interactive", "c", "dp", "solo", 1, 10.0))
    host.feed(FirstToken("t9", 10.05))
    arrive(host, "t8", "r8", "batch", 10.0)
    assert set(host.series._arrived) == {"t8"}
    host.state.placed.pop("t8")  # forgotten by the core without an end seen here (an expiry)
    host.series.tick(host.state, 12.0, 0.0)
    assert host.series._arrived == {}
    (sample,) = host.recent()["samples"]
    assert sample["ttft_s"]["interactive"]["p50"] == 0.05


@pytest.fixture
async def status_url() -> AsyncIterator[tuple[str, SchedulerHost]]:
    host = SchedulerHost(TWO_SLOTS)
    runner = web.AppRunner(status_app(host))
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}", host
    finally:
        await runner.cleanup()


@pytest.mark.anyio
async def test_get_series_answers_the_samples_and_refuses_a_bad_after(
    status_url: tuple[str, SchedulerHost],
) -> None:
    url, host = status_url
    host.series.tick(host.state, 1.0, 1000.0)
    host.series.tick(host.state, 3.0, 1002.0)
    async with httpx2.AsyncClient() as client:
        whole = (await client.get(f"{url}/series")).json()
        assert [s["seq"] for s in whole["samples"]] == [0, 1] and whole["interval_s"] == 2.0
        newer = (await client.get(f"{url}/series", params={"after": "0"})).json()
        assert [s["seq"] for s in newer["samples"]] == [1] and newer["boot"] == whole["boot"]
        refused = await client.get(f"{url}/series", params={"after": "soon"})
        assert refused.status_code == 400
        assert "after: expected the seq of a sample" in refused.json()["error"]["message"]
        assert (await client.post(f"{url}/series")).status_code == 405


# --- the runtime's samples -----------------------------------------------------------------------


def test_the_runtime_samples_runs_by_their_state() -> None:
    from types import SimpleNamespace

    from runtime_helpers import make_run

    from luftpause.runtime.runs.series import RunSeries

    runs = [make_run(f"run-{i}") for i in range(5)]
    runs[1].end("completed", answer="a")
    runs[2].end("completed", answer="b")
    runs[3].end("failed", error="boom")
    runs[4].approvals = SimpleNamespace(open=lambda: [object()])  # type: ignore[assignment]
    series = RunSeries(SimpleNamespace(all=lambda: runs))  # type: ignore[arg-type]
    assert series.sample() == {
        "runs": {"running": 1, "AwaitingApproval": 1, "completed": 2, "failed": 1, "cancelled": 0},
        "tenants": {},
    }


def test_a_tenant_is_served_the_counts_of_its_own_runs_only() -> None:
    from types import SimpleNamespace

    from runtime_helpers import make_run

    from luftpause.runtime.runs.series import RunSeries, for_tenant
    from luftpause.runtime.runs.tenants import Tenant

    runs = [make_run("run-a", tenant="team-a"), *(make_run(f"run-b{i}", tenant="team-b") for i in range(2))]
    runs[2].end("failed", error="boom")
    series = RunSeries(SimpleNamespace(all=lambda: runs))  # type: ignore[arg-type]
    series.ring.add(1.0, series.sample())
    answer = series.ring.since()

    def served(tenant: Tenant | None) -> dict[str, int]:
        (sample,) = for_tenant(answer, tenant)["samples"]
        assert set(sample) == {"seq", "t", "runs"}  # never another tenant's counts
        return {state: n for state, n in sample["runs"].items() if n}

    assert served(Tenant("team-a")) == {"running": 1}
    assert served(Tenant("team-b")) == {"running": 1, "failed": 1}
    assert served(Tenant("team-c")) == {}  # a tenant with no run held
    assert served(Tenant("operator", admin=True)) == served(None) == {"running": 2, "failed": 1}
