"""A dataplane killed for good: the scheduler releases its turns after the grace (real processes).

The stack runs with ``[scheduler] dataplane_grace_s = 2`` so that the test need not wait 60 s:
slow streams fill every slot and queue more, the dataplane is SIGKILLed and never restarted, and
``GET /status`` must show nothing held, nothing in flight, and the placed turns counted as released
for a lost dataplane (they cannot have finished: nobody is left to report them).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration

GRACE_S = 2.0
SLOTS = 4  # two replicas, max_inflight 2 each
STREAMS = 6  # two more than the slots: they are held


def _inflight(status: dict[str, Any]) -> int:
    return sum(replica["inflight"] for replica in status["replicas"])


@pytest.fixture
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A slow stack whose scheduler runs with a 2 s dataplane grace (restarted with that key)."""
    running = Stack.start(tmp_path_factory.mktemp("lost-dataplane"), decode_ms=25.0, max_inflight=2)
    try:
        # Stack writes its own [scheduler] table; add the key there and restart the scheduler on it
        text = running.config_path.read_text()
        running.config_path.write_text(
            text.replace("[scheduler]\n", f"[scheduler]\ndataplane_grace_s = {GRACE_S}\n", 1)
        )
        running.restart("scheduler")
        yield running
    finally:
        running.stop()


def test_a_dataplane_killed_for_good_has_its_turns_released_after_the_grace(stack: Stack) -> None:
    clients = stack.stream_clients(STREAMS, max_tokens=400, run_prefix="lost")
    try:
        busy = stack.wait_status(lambda s: _inflight(s) == SLOTS and s["held"]["count"] == STREAMS - SLOTS)
        assert (_inflight(busy), busy["held"]["count"]) == (SLOTS, STREAMS - SLOTS), stack.logs()

        stack.children["dataplane"].kill()  # SIGKILL, and it is not started again

        after = stack.wait_status(
            lambda s: _inflight(s) == 0 and s["held"]["count"] == 0, timeout=GRACE_S + 20.0
        )
        assert _inflight(after) == 0, stack.logs()
        # its held Admits died with its connection and were abandoned at once
        assert after["held"]["count"] == 0
        assert after["counters"]["abandoned"] == STREAMS - SLOTS
        # the placed ones were released as lost, not finished or failed (nobody could report them)
        assert after["counters"]["turns_released_lost_dataplane"] == SLOTS
        assert after["counters"]["finished"] == 0 and after["counters"]["failed"] == 0
        assert after["counters"]["expired_turns"] == 0
        assert after["lost_dataplanes"] == {}  # released, so no longer tracked
        assert after["runs"]["generating"] == 0
    finally:
        for client in clients:
            client.kill()
            client.wait()
