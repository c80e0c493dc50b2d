"""The runs' store on a real PostgreSQL (tests/postgres_helpers.py): the schema is migrated at
start and a newer one refused, the tenant of each run is a column, a database restart while
records are being written loses none and writes none twice, and the URL's password is never shown.
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from postgres_helpers import PostgresServer
from runtime_helpers import MINIMAL_CONFIG, make_run, with_store

from luftpause.config import ConfigError, parse_config
from luftpause.config.check import effective_toml
from luftpause.runtime.errors import LeaseLost, StoreUnusable
from luftpause.runtime.runs.postgres import SCHEMA_VERSION, PostgresDatabase
from luftpause.runtime.runs.registry import RunRegistry
from luftpause.runtime.runs.store import encode
from luftpause.runtime.wiring import build_runtime
from luftpause.testkit.launch.procs import free_port


def test_the_schema_is_migrated_at_start_and_recorded(postgres: PostgresServer) -> None:
    url = postgres.database()
    database = PostgresDatabase(url)
    assert database.migrate() == 0  # the version it found: an empty database
    assert [row[0] for row in postgres.query(url, "SELECT version FROM luftpause_schema")] == list(
        range(1, SCHEMA_VERSION + 1)
    )
    assert PostgresDatabase(url).migrate() == SCHEMA_VERSION  # a second runtime: nothing to do


def test_a_store_newer_than_this_luftpause_is_refused_and_left_alone(postgres: PostgresServer) -> None:
    url = postgres.database()
    PostgresDatabase(url).migrate()
    newer = SCHEMA_VERSION + 1
    postgres.query(url, "INSERT INTO luftpause_schema (version) VALUES (%s) RETURNING version", newer)
    with pytest.raises(StoreUnusable) as refused:
        PostgresDatabase(url).journal("runs").check_writable()
    message = str(refused.value)
    assert f"schema is at version {newer}, newer than this luftpause knows ({SCHEMA_VERSION})" in message
    assert "upgrade luftpause" in message and "secret" not in message
    rows = postgres.query(url, "SELECT max(version) FROM luftpause_schema")
    assert rows == [(newer,)]


def test_each_run_is_stored_with_its_tenant(postgres: PostgresServer, tmp_path: Path) -> None:
    url = postgres.database()

    async def scenario() -> None:
        registry = RunRegistry(store=PostgresDatabase(url).journal("runs"))
        async with registry:
            alice = registry.add(make_run("run-alice", caller="alice"))
            registry.add(make_run("run-bob", caller="bob"))
            registry.finish(alice, "completed", answer="done")
            await registry.durable()

    asyncio.run(scenario())
    rows = postgres.query(
        url, "SELECT handle, caller FROM luftpause_records WHERE kind = 'start' ORDER BY handle"
    )
    assert rows == [("run-alice", "alice"), ("run-bob", "bob")]
    ends = postgres.query(url, "SELECT handle FROM luftpause_records WHERE kind = 'end'")
    assert ends == [("run-alice",)]


def test_records_appended_while_the_database_is_down_are_written_once_it_is_back(
    postgres: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = postgres.database()
    journal = PostgresDatabase(url, retry_seconds=120).journal("runs")
    handles = [f"run-{i:03d}" for i in range(60)]

    async def scenario() -> None:
        journal.open()
        first = [journal.append(make_run(h).start_record()) for h in handles[:30]]
        await asyncio.gather(*(asyncio.wrap_future(f) for f in first))
        await asyncio.to_thread(postgres.stop)  # the writer's connection is closed under it
        later = [journal.append(make_run(h).start_record()) for h in handles[30:]]
        await asyncio.sleep(0.5)
        assert not any(f.done() for f in later), "acknowledged while the database was down"
        await asyncio.to_thread(postgres.start)
        await asyncio.gather(*(asyncio.wrap_future(f) for f in later))
        journal.close()

    with caplog.at_level(logging.WARNING, logger="luftpause.runtime.runs.postgres"):
        asyncio.run(scenario())
    assert [record["handle"] for record in journal.records()] == handles
    assert "trying again" in caplog.text and "secret" not in caplog.text


def test_a_batch_committed_twice_is_kept_once(postgres: PostgresServer) -> None:
    # What a retry does after a commit that went through but whose answer was lost.
    url = postgres.database()
    journal = PostgresDatabase(url).journal("runs")
    journal.check_writable()
    record = {"type": "stop", "handle": "run-x", "by": "me"}
    rows = journal._rows([(encode(record), record)])
    journal._commit(rows)
    journal._commit(rows)
    journal._drop_connection()
    assert [record["type"] for record in journal.records()] == ["stop"]


def test_the_password_is_never_shown_by_check_config_nor_in_the_log(
    postgres: PostgresServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    url = postgres.database()
    assert ":secret@" in url
    config = with_store(MINIMAL_CONFIG, url, tmp_path)
    shown = effective_toml(config, ("runtime",))
    assert "secret" not in shown and "postgres:***@127.0.0.1" in shown
    assert config.runtime.store == url  # the runtime itself still has it

    caplog.set_level(logging.DEBUG, logger="luftpause")
    runtime = build_runtime(config)

    async def scenario() -> None:
        async with runtime.registry:
            runtime.registry.add(make_run("run-logged"))
            await runtime.registry.durable()

    asyncio.run(scenario())
    assert "secret" not in caplog.text
    assert "secret" not in runtime.journal.label


def test_a_store_that_is_neither_file_nor_a_postgresql_url_is_refused() -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config('[runtime]\nstore = "mysql://u:hunter2@db/x"\n')
    assert 'expected "file" or a postgresql:// URL' in str(refused.value)


def test_a_runtime_whose_lease_was_taken_over_can_write_nothing_more_of_the_run(
    postgres: PostgresServer,
) -> None:
    # Runtime a spawned run-x, then stalled past its lease; b took it over. a's next record is
    # refused (fencing by generation), its renewal says it lost the run, and b writes on.
    url = postgres.database()
    a = PostgresDatabase(url, owner="host-a/127.0.0.1:7000").journal("runs")
    b = PostgresDatabase(url, owner="host-b/127.0.0.1:7000").journal("runs")
    a.claim()
    b.claim()

    async def scenario() -> None:
        a.open()
        await a.write(make_run("run-x").start_record())
        await a.write({"type": "stop", "handle": "run-x", "by": "a, before"})
        postgres.query(
            url, "UPDATE luftpause_leases SET expires_at = now() - interval '1 second' RETURNING 1"
        )
        assert b.database.custody is not None and a.database.custody is not None
        assert b.database.run(b.database.custody.take_over) == ["run-x"]
        with pytest.raises(LeaseLost, match="held by another runtime"):
            await a.write({"type": "stop", "handle": "run-x", "by": "a, after"})
        assert a.database.run(a.database.custody.renew) == ["run-x"]
        b.open()
        await b.write({"type": "stop", "handle": "run-x", "by": "b"})
        a.close()
        b.close()

    asyncio.run(scenario())
    rows = postgres.query(
        url, "SELECT kind, owner, generation, body::json->>'by' FROM luftpause_records ORDER BY seq"
    )
    assert [(kind, owner.split("/")[0], generation, by) for kind, owner, generation, by in rows] == [
        ("start", "host-a", 1, None),
        ("stop", "host-a", 1, "a, before"),
        ("stop", "host-b", 2, "b"),
    ]


def test_a_dead_runtimes_runs_are_taken_over_all_at_once_though_their_leases_expire_apart(
    postgres: PostgresServer,
) -> None:
    # The kill test's input: runtime a renewed its leases, then its spawner run-lead spawned
    # run-child and a died. run-child's lease, created after that renewal, expires later than
    # run-lead's; a takeover between the two took run-lead alone, so the pod was split across two
    # rounds (or two runtimes): run-lead was resumed without its child in its tree (a replay
    # links a child to a parent replayed with it), and the child's scope grant, replayed later,
    # could name a parent b's ledger no longer held (damage).
    url = postgres.database()
    a = PostgresDatabase(url, owner="host-a/127.0.0.1:7000")
    b = PostgresDatabase(url, owner="host-b/127.0.0.1:7000")
    spawner, taker = a.custody, b.custody
    assert spawner is not None and taker is not None
    a.run(spawner.claim_at_start)
    b.run(taker.claim_at_start)
    a.run(lambda conn: [spawner.create(conn, handle) for handle in ("run-lead", "run-child")])
    postgres.query(
        url,
        "UPDATE luftpause_leases SET expires_at = now() + CASE handle WHEN 'run-lead' "
        "THEN interval '-1 second' ELSE interval '8 seconds' END RETURNING 1",
    )
    assert sorted(b.run(taker.take_over)) == ["run-child", "run-lead"]
    assert postgres.query(url, "SELECT DISTINCT owner, generation FROM luftpause_leases") == [
        ("host-b/127.0.0.1:7000", 2)
    ]
    assert b.run(taker.take_over) == []  # b's own now: not taken again


def test_a_renewal_while_a_spawn_is_being_committed_does_not_take_that_run_for_lost(
    postgres: PostgresServer,
) -> None:
    # The bench's input: one runtime on PostgreSQL answered `await` with "unknown run handle" for
    # runs it had just spawned. Their lease was created in the writer's transaction and counted
    # as held at once; a renewal running before that commit did not see it and released them.
    url = postgres.database()
    database = PostgresDatabase(url, owner="host-a/127.0.0.1:7000")
    database.migrate()
    custody = database.custody
    assert custody is not None
    with database.connect() as spawning, database.connect() as renewing:
        with spawning.transaction():
            generation = custody.create(spawning, "run-new")
            assert custody.renew(renewing) == []  # the lease is not committed yet: not lost
        custody.created({"run-new": generation})
        assert custody.renew(renewing) == []
    assert custody.held() == ["run-new"]


def test_a_runtime_on_a_store_newer_than_it_refuses_to_start_in_one_line(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    url = postgres.database()
    PostgresDatabase(url).migrate()
    postgres.query(url, "INSERT INTO luftpause_schema (version) VALUES (%s) RETURNING 1", SCHEMA_VERSION + 1)
    config = tmp_path / "luftpause.toml"
    config.write_text(
        f"""
[runtime]
listen = "127.0.0.1:{free_port()}"
state_dir = "{tmp_path / "state"}"

[[replicas]]
name = "nowhere"
url = "http://127.0.0.1:{free_port()}"
models = ["m"]
"""
    )
    done = subprocess.run(
        [sys.executable, "-m", "luftpause", "runtime", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "LUFTPAUSE_RUNTIME__STORE": url},
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("luftpause runtime: [runtime] store 'postgresql://postgres:***@127.0.0.1:"), line
    assert "newer than this luftpause knows" in line and "secret" not in line
