"""``luftpause_dataplane_held_seconds`` observes only turns that waited for the scheduler's decision.

A turn placed at once under a capacity lease sends no Admit and waits for nobody: observing it
added a 0 per turn, which dragged the histogram towards zero in an idle pool (the review item).
Here a run the dataplane made up (no ``x-luftpause-run-id``) is placed under a lease and leaves the
histogram's count unchanged, while a run named by its client, unknown to this dataplane, asks the
scheduler and is observed once.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from dataplane_procs import fake_engine, scheduler_and_dataplane, wait_until

pytestmark = pytest.mark.integration

HELD_COUNT = 'luftpause_dataplane_held_seconds_count{service_class="interactive"} '


def test_held_seconds_counts_turns_that_waited_for_a_decision_and_not_leased_ones(tmp_path: Path) -> None:
    with fake_engine(tmp_path) as engine_url, scheduler_and_dataplane(tmp_path, [engine_url]) as pair:
        assert wait_until(lambda: bool(pair.health()["leases"]), 15), f"no lease granted\n{pair.logs()}"
        leased_before = pair.health()["leased_turns_total"]
        held_before = pair.metric(HELD_COUNT)

        assert pair.complete(run_id=None) == 200  # a new run made up here: placed under a lease
        assert pair.health()["leased_turns_total"] == leased_before + 1
        assert pair.metric(HELD_COUNT) == held_before

        assert pair.complete(run_id="named-by-its-client") == 200  # unknown here: asks
        assert pair.health()["leased_turns_total"] == leased_before + 1
        assert pair.metric(HELD_COUNT) == held_before + 1
