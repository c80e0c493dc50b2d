from __future__ import annotations

from collections.abc import Iterator

import pytest

from luftpause.testkit.stack import Stack


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """The whole stack as real processes on free loopback ports, shared by the integration tests."""
    running = Stack.start(tmp_path_factory.mktemp("stack"))
    try:
        yield running
    finally:
        running.stop()
