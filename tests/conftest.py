from __future__ import annotations

from collections.abc import Iterator

import pytest

from luftpause.testkit.stack import Stack

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
