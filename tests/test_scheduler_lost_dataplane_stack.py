"""A dataplane killed for good: the scheduler releases its turns after the grace (real processes).

The stack runs with ``[scheduler] dataplane_grace_s = 2`` so that the test need not wait 60 s:
slow streams fill every slot and queue more, the dataplane is SIGKILLed and never restarted, and
``GET /status`` must show nothing held, nothing in flight, and the placed turns counted as released
for a lost dataplane (they cannot have finished: nobody is left to report them).
"""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any

import orjson
import pytest

from luftpause.testkit.procs import ChildProcess
from luftpause.testkit.stack import Stack

pytestmark = pytest.mark.integration

GRACE_S = 2.0
SLOTS = 4  # two replicas, max_inflight 2 each
STREAMS = 6  # two more than the slots: they are held

_STREAM_CLIENT = """
import sys, urllib.request
request = urllib.request.Request(sys.argv[1], data=sys.argv[2].encode(), method="POST",
    headers={"content-type": "application/json", "x-luftpause-run-id": sys.argv[3]})
try:
    with urllib.request.urlopen(request, timeout=60) as response:
        while response.read(4096):
            pass
except OSError:
    sys.exit(1)
"""


def _status(stack: Stack) -> dict[str, Any]:
    with urllib.request.urlopen(stack.status_url, timeout=10) as response:
        result: dict[str, Any] = orjson.loads(response.read())
        return result


def _settles(stack: Stack, check: Callable[[dict[str, Any]], bool], timeout: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    status = _status(stack)
    while not check(status) and time.monotonic() < deadline:
        time.sleep(0.1)
        status = _status(stack)
    return status


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
        old = running.children["scheduler"]
        old.stop()
        again = ChildProcess("scheduler", old.argv[3:], old.log_path, ready_url=old.ready_url)
        running.children["scheduler"] = again.start()
        again.wait_ready()
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            with urllib.request.urlopen(f"{running.dataplane_url}/health", timeout=10) as response:
                if orjson.loads(response.read())["scheduler"] == "connected":
                    break
            time.sleep(0.05)
        else:
            raise AssertionError("the dataplane did not resync with the restarted scheduler")
        yield running
    finally:
        running.stop()


def test_a_dataplane_killed_for_good_has_its_turns_released_after_the_grace(stack: Stack) -> None:
    body = orjson.dumps(
        {
            "model": stack.model,
            "messages": [{"role": "user", "content": "hi"}],
            "max_tokens": 400,
            "stream": True,
        }
    ).decode()
    url = f"{stack.dataplane_url}/v1/chat/completions"
    clients = [
        subprocess.Popen(
            [sys.executable, "-c", _STREAM_CLIENT, url, body, f"lost-{i}"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for i in range(STREAMS)
    ]
    try:
        busy = _settles(stack, lambda s: _inflight(s) == SLOTS and s["held"]["count"] == STREAMS - SLOTS)
        assert (_inflight(busy), busy["held"]["count"]) == (SLOTS, STREAMS - SLOTS), stack.logs()

        stack.children["dataplane"].kill()  # SIGKILL, and it is not started again

        after = _settles(
            stack,
            lambda s: _inflight(s) == 0 and s["held"]["count"] == 0,
            timeout=GRACE_S + 20.0,
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
