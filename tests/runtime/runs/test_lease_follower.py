"""Following the leases while serving (luftpause/runtime/runs/takeovers.py) and releasing a run
another runtime took over (luftpause/runtime/runs/held.py), on a real PostgreSQL
(tests/postgres_helpers.py) and on a store that fails on purpose.

* the follower outlives a failing round: a lease renewal that raises once ended it (silently, the
  runtime then stopped renewing and lost every run while still driving them); now the failure is
  logged with its cause, once per kind, and the renewals go on;
* a run lost to another runtime leaves nothing behind: its checkpoint, its budget timer (which
  could fire and cancel a run another runtime drives), its retention bookkeeping stayed, and the
  listeners never heard ``run_dropped``;
* the store's pooled connections are closed at shutdown, and replaced after a database restart.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest
from pods_helpers import until
from postgres_helpers import PostgresServer
from runtime_helpers import make_run

from luftpause.runtime.errors import StoreUnusable, UnknownRun
from luftpause.runtime.runs.custody import Custody
from luftpause.runtime.runs.journal import Journal
from luftpause.runtime.runs.postgres import PostgresDatabase
from luftpause.runtime.runs.record import Run
from luftpause.runtime.runs.registry import RunRegistry
from luftpause.runtime.runs.store import Record, RecordStore, Takeover

FOLLOWER = "luftpause.runtime.runs.takeovers"


async def idle(run: Run) -> None:
    """A run's loop that never finishes (it is cancelled)."""
    await asyncio.Event().wait()


class Heard:
    """A run listener that writes down what it hears, and journals each run dropped (as pods'
    scopes and notifications do) when given a ``store``."""

    record_types: frozenset[str] = frozenset({"heard"})

    def __init__(self, store: RecordStore | None = None) -> None:
        self.store = store
        self.dropped: list[str] = []
        self.ended: list[str] = []

    def replay(self, record: Record) -> None:
        pass

    def replayed(self, runs: Mapping[str, Run]) -> None:
        pass

    def run_ended(self, run: Run) -> None:
        self.ended.append(run.handle)

    def run_dropped(self, handle: str) -> None:
        self.dropped.append(handle)
        if self.store is not None:
            self.store.append({"type": "heard", "handle": handle})

    def snapshot(self) -> Iterable[Record]:
        return []


def _lines(caplog: pytest.LogCaptureFixture, level: int) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == FOLLOWER and r.levelno == level]


def test_a_lease_renewal_that_raises_once_is_logged_and_the_renewals_go_on(
    postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = postgres.database()
    database = PostgresDatabase(url, owner="host-a/127.0.0.1:7000", lease_seconds=5.0, renew_seconds=0.1)
    custody = database.custody
    assert custody is not None
    renewals: list[str] = []
    renew = custody.renew

    def renew_failing_once(conn: Any) -> list[str]:
        renewals.append("tried")
        if len(renewals) == 1:
            raise RuntimeError("injected: the first renewal fails")
        renewals.append("renewed")
        return renew(conn)

    custody.renew = renew_failing_once  # type: ignore[method-assign]
    registry = RunRegistry(store=database.journal("runs"))

    async def scenario() -> list[tuple[Any, ...]]:
        async with registry.serving(idle):
            run = registry.add(make_run("run-held"))
            registry.start(run)
            await registry.durable()

            async def renewed_since(count: int) -> bool:
                return renewals.count("renewed") >= count

            await until(lambda: renewed_since(3), "three renewals after the failed one")
            assert not run.done and run.handle in custody.held()
            return postgres.query(url, "SELECT owner, expires_at > now() FROM luftpause_leases")

    with caplog.at_level(logging.DEBUG, logger=FOLLOWER):
        leases = asyncio.run(scenario())
    assert leases == [("host-a/127.0.0.1:7000", True)]
    (error,) = _lines(caplog, logging.ERROR)
    assert "following the leases on" in error and "secret" not in error
    assert "RuntimeError: injected: the first renewal fails" in error
    assert "trying again in" in error
    (back,) = _lines(caplog, logging.WARNING)
    assert "got through again, after 1 failed attempts" in back


class FailingStore(Journal):
    """A file journal that says it is shared, whose custody rounds fail as ``failures`` says
    (an exception to raise, or ``None`` for a round that gets through), then get through."""

    def __init__(self, state_dir: Path, failures: list[BaseException | None]) -> None:
        super().__init__(state_dir)
        self.failures = failures
        self.rounds = 0

    @property
    def custody_period(self) -> float | None:
        return 0.01

    async def custody_round(self) -> Takeover:
        self.rounds += 1
        failure = self.failures.pop(0) if self.failures else None
        if failure is not None:
            raise failure
        return Takeover()


def test_failures_are_logged_once_per_kind_while_they_last_and_again_after_a_recovery(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    unreachable = StoreUnusable("store postgresql://u:***@db/x: connection refused")
    fault = KeyError("generation")
    store = FailingStore(
        tmp_path, [unreachable, unreachable, unreachable, fault, unreachable, None, fault, fault]
    )
    registry = RunRegistry(store=store)

    async def scenario() -> None:
        async with registry.serving(idle):

            async def drained() -> bool:
                return not store.failures and store.rounds >= 10

            await until(drained, "every failure met, and rounds after")

    with caplog.at_level(logging.DEBUG, logger=FOLLOWER):
        asyncio.run(scenario())
    errors = [r for r in caplog.records if r.name == FOLLOWER and r.levelno == logging.ERROR]
    # First episode: one line per kind (not five); second episode: the fault again, once.
    assert [r.getMessage().split(" failed: ")[1].split(";")[0] for r in errors] == [
        "StoreUnusable: store postgresql://u:***@db/x: connection refused",
        "KeyError: 'generation'",
        "KeyError: 'generation'",
    ]
    assert errors[0].exc_info is None  # a store out of reach: its message says it all
    assert errors[1].exc_info is not None  # a fault: its traceback
    assert _lines(caplog, logging.WARNING) == [
        f"following the leases on {store.label} got through again, after 5 failed attempts",
        f"following the leases on {store.label} got through again, after 2 failed attempts",
    ]
    assert len(_lines(caplog, logging.DEBUG)) == 4  # the repeats, quietly


def test_a_run_taken_over_by_another_runtime_leaves_nothing_behind(
    postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Runtime a holds two runs: one running (its tool round's checkpoint, its seconds budget's
    # timer), one finished (retention counts its bytes). Runtime b takes both over (a stalled
    # past its leases); a's next renewal finds them lost.
    url = postgres.database()
    a = PostgresDatabase(url, owner="host-a/127.0.0.1:7000", lease_seconds=30.0, renew_seconds=0.1)
    b = PostgresDatabase(url, owner="host-b/127.0.0.1:7000")
    store = a.journal("runs")
    heard = Heard(store)
    registry = RunRegistry(store=store, listeners=(heard,))
    handles = ["run-running", "run-finished"]
    written: list[int] = []

    async def scenario() -> None:
        async with registry.serving(idle):
            running = registry.add(make_run("run-running", budget_seconds=4.0))
            registry.start(running)
            assistant = {"role": "assistant", "content": None, "tool_calls": []}
            registry.complete_round(running, [assistant])
            finished = registry.add(make_run("run-finished"))
            registry.finish(finished, "completed", answer="done")
            await registry.durable()
            timer = registry.held.timers["run-running"]
            assert registry.held.checkpoints and registry.retained_total > 0
            written.append(len(postgres.query(url, "SELECT seq FROM luftpause_records")))

            b_custody = b.custody
            assert isinstance(b_custody, Custody)

            def take_over(conn: Any) -> list[str]:
                with conn.transaction():  # expired and taken at once: a's renewal cannot come between
                    conn.execute("UPDATE luftpause_leases SET expires_at = now() - interval '1 second'")
                    return b_custody._take_expired(conn)

            assert sorted(b.run(take_over)) == sorted(handles)

            async def released() -> bool:
                return sorted(heard.dropped) == sorted(handles)

            await until(released, "a to release both runs")
            await store.written()  # the listener's records about them: refused by fencing
            for handle in handles:
                assert registry.find(handle) is None
                with pytest.raises(UnknownRun):  # not "expired": it lives on elsewhere
                    registry.get(handle)
            assert registry.held.runs == {} and registry.held.checkpoints == {}
            assert registry.held.timers == {} and registry.held.to_resume == []
            assert registry.retained_total == 0 and not registry.retention.expired("run-finished")
            assert timer.cancelled()
            await until(lambda: asyncio.sleep(0, running.done), "the released run's loop to stop")
            assert running.interrupted and heard.ended == ["run-finished"]
            # Past the moment the budget timer was due: it did not fire (no budget cancellation).
            await asyncio.sleep(max(0.0, timer.when() - asyncio.get_running_loop().time()) + 0.1)
            assert running.exceeded is None
            assert not any(registry.counts.budget_cancellations.values())

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert len(postgres.query(url, "SELECT seq FROM luftpause_records")) == written[0]  # nothing more
    refused = [r for r in caplog.records if "a heard record of" in r.getMessage()]
    # Refused records of a run known lost are warnings; its loss is the one error.
    assert len(refused) == 2 and {r.levelno for r in refused} == {logging.WARNING}
    losses = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert sorted(losses) == sorted(
        [f"run {h} is held by another runtime now; this one stopped driving it" for h in handles]
        + ["runtime host-a/127.0.0.1:7000 lost the lease of 2 runs: " + ", ".join(handles)]
    )


def test_the_pool_is_open_while_serving_closed_at_shutdown_and_survives_a_database_restart(
    postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = postgres.database()
    database = PostgresDatabase(url, owner="host-a/127.0.0.1:7000", retry_seconds=60.0)
    runs, tasks = database.journal("runs"), database.journal("tasks")
    registry = RunRegistry(store=runs)

    async def no_backends() -> bool:
        rows = postgres.query(
            postgres.url(), "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", url.rsplit("/", 1)[1]
        )
        return int(rows[0][0]) == 0

    async def scenario() -> None:
        async with registry.serving(idle):
            tasks.open()
            assert database.pooled
            registry.add(make_run("run-before"))
            await registry.durable()
            assert database.run(lambda conn: conn.execute("SELECT 1").fetchone()) == (1,)
            await asyncio.to_thread(postgres.restart)  # every connection, pooled ones too, closed
            found = await asyncio.to_thread(
                database.run, lambda conn: conn.execute("SELECT count(*) FROM luftpause_leases").fetchone()
            )
            assert found == (1,)
            registry.add(make_run("run-after"))
            await registry.durable()
            tasks.close()
            assert database.pooled  # the runs' store is still open
        assert not database.pooled

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert "secret" not in caplog.text
    # The writers' and the pool's connections are all closed (their server processes end after).
    asyncio.run(until(no_backends, "the runtime's connections to end"))
    assert [record["handle"] for record in runs.records()] == ["run-before", "run-after"]
