"""Capacity leases with real processes (scheduler, dataplane, two simulated engines).

An idle pool: turns of runs the dataplane knows are placed under leases, with no admission round
trip (``counters.leased`` in ``/status`` counts them). A saturated pool: every lease is withdrawn
while turns are held, the held turns are placed as slots free, and the leases come back when the
pool is idle. A scheduler restart with leases outstanding: the new scheduler grants fresh ones after
the dataplane's resync, and a known run's next turn is placed under one.
"""

from __future__ import annotations

import subprocess
import urllib.request
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # two slots per replica, 20 ms per token: a 400-token stream holds its slot for about 8 s
    running = Stack.start(tmp_path_factory.mktemp("leases"), max_inflight=2, decode_ms=20.0)
    try:
        yield running
    finally:
        running.stop()


def _complete(stack: Stack, run_id: str | None) -> dict[str, Any]:
    headers = {"content-type": "application/json"}
    if run_id is not None:
        headers["x-luftpause-run-id"] = run_id
    body = {"model": stack.model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    request = urllib.request.Request(
        f"{stack.dataplane_url}/v1/chat/completions", data=orjson.dumps(body), headers=headers, method="POST"
    )
    with urllib.request.urlopen(request, timeout=30) as response:
        result: dict[str, Any] = orjson.loads(response.read())
        return result


def _leased_slots(status: dict[str, Any]) -> int:
    return sum(replica["leased"] for replica in status["replicas"] if replica["kind"] == "generative")


def _inflight(status: dict[str, Any]) -> int:
    return sum(replica["inflight"] for replica in status["replicas"])


def _idle_and_leased(status: dict[str, Any]) -> bool:
    """Nothing placed or held, every slot (2 replicas x 2) leased to the one dataplane."""
    return _inflight(status) == 0 and status["held"]["count"] == 0 and _leased_slots(status) == 4


def _dataplane_leased_slots(stack: Stack) -> int:
    """Unused leased slots the dataplane holds, by its own ``/health`` (the lease items reached it)."""
    with urllib.request.urlopen(f"{stack.dataplane_url}/health", timeout=10) as response:
        leases: dict[str, int] = orjson.loads(response.read())["leases"]
        return sum(leases.values())


def _settled(stack: Stack) -> dict[str, Any]:
    """Wait until the scheduler is idle with every slot leased and the dataplane holds those leases.

    The scheduler counts a lease granted as it sends the lease item; the dataplane places turns
    under it only once the item has arrived on its stream (after a restart, grants follow the
    resync's acknowledgement, which is all ``wait_connected`` waits for). The last status.
    """
    status = stack.wait_status(
        lambda s: _idle_and_leased(s) and _dataplane_leased_slots(stack) == 4, timeout=30
    )
    assert _idle_and_leased(status), status
    assert _dataplane_leased_slots(stack) == 4, f"the dataplane holds no lease\n{stack.logs()}"
    return status


def _end(clients: list[subprocess.Popen[bytes]]) -> None:
    for client in clients:
        client.kill()
        client.wait()


def test_an_idle_pool_places_known_runs_turns_under_leases(stack: Stack) -> None:
    before = _settled(stack)
    assert len(before["leases"]) == 1  # the one dataplane holds them
    _complete(stack, "run-idle")  # a run named by its client, unknown here: asks
    _complete(stack, "run-idle")  # now known (idle): placed under a lease
    _complete(stack, "run-idle")
    _complete(stack, None)  # a run the dataplane made up: placed under a lease at once
    after = stack.wait_status(lambda s: s["counters"]["finished"] - before["counters"]["finished"] == 4)
    assert after["counters"]["leased"] - before["counters"]["leased"] == 3
    assert after["counters"]["admitted"] - before["counters"]["admitted"] == 4
    assert after["counters"]["lease_crossings"] == 0
    assert stack.wait_status(_idle_and_leased)["leases"] == before["leases"]


def test_a_saturated_pool_withdraws_every_lease_and_holds_turns_until_slots_free(stack: Stack) -> None:
    _settled(stack)
    occupiers = stack.stream_clients(4, max_tokens=400, run_prefix="occupier")
    waiting: list[subprocess.Popen[bytes]] = []
    try:
        full = stack.wait_status(lambda s: _inflight(s) == 4)
        assert _inflight(full) == 4 and _leased_slots(full) == 0, full
        waiting = stack.stream_clients(2, max_tokens=2, run_prefix="waiting")
        held = stack.wait_status(lambda s: s["held"]["count"] == 2)
        assert held["held"]["count"] == 2, held
        assert _leased_slots(held) == 0 and all(not slots for slots in held["leases"].values())
    finally:
        _end(occupiers)  # their engine requests close: the slots free
    try:
        done = stack.wait_status(lambda s: s["held"]["count"] == 0 and _inflight(s) == 0, timeout=30.0)
        assert done["held"]["count"] == 0, done
        assert [client.wait(timeout=30) for client in waiting] == [0, 0]  # read to their end
    finally:
        _end(waiting)
    assert _idle_and_leased(stack.wait_status(_idle_and_leased)), "the leases come back when idle"


def test_a_restarted_scheduler_grants_fresh_leases_and_a_known_run_uses_one(stack: Stack) -> None:
    _settled(stack)
    _complete(stack, "run-restart")
    stack.children["scheduler"].kill()
    stack.restart("scheduler")
    status = _settled(stack)  # the fresh grants reached the dataplane: the next turn may use one
    assert status["counters"]["leased"] == 0 and status["counters"]["admitted"] == 0
    _complete(stack, "run-restart")  # known to the dataplane, idle: under a fresh lease
    after = stack.wait_status(lambda s: s["counters"]["finished"] == 1)
    assert (after["counters"]["leased"], after["counters"]["admitted"]) == (1, 1)
