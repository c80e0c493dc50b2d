"""The dataplane's ``/health`` on an idle pool agrees with the scheduler (the issue's item 7: it
"kept ``leased_turns: 12`` on an idle pool while the scheduler showed nothing in flight").

Why: the lease accounting was right on both sides (the dataplane's unused leased slots equal the
scheduler's leases; nothing leased stayed in flight). ``leased_turns`` was a counter, the turns
ever placed under a lease since start, in a body of figures that are all current ones, so it read
as turns leased now. It is ``leased_turns_total`` now, beside ``in_flight`` and ``held``, the
dataplane's turns at an engine and waiting for the scheduler now. The input: 64 streamed turns of
16 agents, 16 at once, through a stack with capacity leases, then idle.
"""

from __future__ import annotations

import concurrent.futures
from collections.abc import Iterator

import httpx
import openai
import pytest

from luftpause.testkit.launch.stack import Stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    with Stack.start(tmp_path_factory.mktemp("health-idle"), slots=8, env={"LUFTPAUSE_TOKEN": ""}) as started:
        started.wait_connected()
        yield started


def test_an_idle_pool_shows_nothing_in_flight_on_either_side_and_the_lease_counts_agree(stack: Stack) -> None:
    with openai.OpenAI(base_url=f"{stack.dataplane_url}/v1", api_key="unused", max_retries=0) as client:

        def agent_turn(i: int) -> int:
            stream = client.chat.completions.create(
                model=stack.model,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=20,
                stream=True,
                extra_headers={"x-luftpause-run-id": f"agent-{i % 16}"},
            )
            return sum(1 for _ in stream)

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            assert all(chunks > 0 for chunks in pool.map(agent_turn, range(64)))

    status = stack.wait_status(lambda s: s["counters"]["finished"] >= 64 and s["held"]["count"] == 0)
    health = httpx.get(f"{stack.dataplane_url}/health").json()
    assert sum(replica["inflight"] for replica in status["replicas"]) == 0
    assert (health["in_flight"], health["held"]) == (0, 0)
    assert "leased_turns" not in health  # the counter that read as a gauge
    assert health["leased_turns_total"] == status["counters"]["leased"] > 0
    # The dataplane's unused leased slots are what the scheduler lent it.
    assert health["leases"] == next(iter(status["leases"].values()))
