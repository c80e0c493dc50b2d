from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
from hypothesis import settings
from postgres_helpers import STORES, PostgresServer, find_binaries, postgres_server, store_of

from luftpause.testkit.engine import EngineSettings, RunningEngine, start_engine
from luftpause.testkit.launch.stack import Stack

# ``pytest --hypothesis-profile=thorough``: the scheduler's state machine over 2,000 random
# sequences (tests/scheduler/core/test_decide_state_machine.py) instead of its fast default of 400. Registered
# here because the plugin loads the profile before test modules are imported.
settings.register_profile("thorough", max_examples=2000)

EngineFactory = Callable[..., Awaitable[RunningEngine]]

ENGINE_KEY = "engine-key-from-the-replica-config"


@pytest.fixture(scope="session")
def engine_key() -> str:
    """The upstream key the shared stack's replicas are configured with (``api_key_env``)."""
    return ENGINE_KEY


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The whole stack as real processes on free loopback ports, shared by the integration tests."""
    running = Stack.start(
        tmp_path_factory.mktemp("stack"),
        api_key_env="LUFTPAUSE_TEST_ENGINE_KEY",
        env={"LUFTPAUSE_TEST_ENGINE_KEY": ENGINE_KEY},
    )
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def anyio_backend() -> str:
    """The ``pytest.mark.anyio`` tests run on asyncio, the loop luftpause serves on."""
    return "asyncio"


@pytest.fixture
async def make_engine() -> AsyncIterator[EngineFactory]:
    """Start simulated engines in-process on free ports (``EngineSettings`` keywords); all are
    closed when the test ends."""
    engines: list[RunningEngine] = []

    async def make(**settings: Any) -> RunningEngine:
        engine = await start_engine(EngineSettings(**settings))
        engines.append(engine)
        return engine

    try:
        yield make
    finally:
        for engine in engines:
            await engine.close()


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    """A real PostgreSQL of the test session (tests/postgres_helpers.py), on a free loopback port;
    skips with the reason where PostgreSQL is not installed."""
    _, why = find_binaries()
    if why is not None:
        pytest.skip(why)
    with postgres_server() as server:
        yield server


@pytest.fixture(params=STORES)
def store(request: pytest.FixtureRequest) -> str:
    """``[runtime] store`` for a test of the runs' behaviour that must hold on both stores:
    ``"file"``, or the URL of a fresh database of :func:`postgres`. A fixture of wider scope that
    starts a runtime takes ``params=STORES`` and :func:`postgres_helpers.store_of` instead."""
    return store_of(request)
