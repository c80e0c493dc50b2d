"""A hung scheduler is noticed by the dataplane's heartbeat (ping / pong items on the stream).

A scheduler stopped by SIGSTOP keeps its TCP connection open and says nothing: gRPC's keepalive
was seen not to notice it in 20 s, so ``/health`` said connected and new turns waited for as long
as it was stopped. Now an unanswered heartbeat ends the stream: ``/health`` says connecting, a new
turn is held, and after SIGCONT the dataplane resyncs and the held turn is admitted and answered.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
from dataplane_procs import fake_engine, scheduler_and_dataplane, wait_until

pytestmark = pytest.mark.integration

# Within this the heartbeat (a ping every 2 s, lost after 6 s unanswered) must have noticed; less
# than the 20 s the review saw go unnoticed, generous for a loaded machine.
NOTICE_WITHIN_S = 18.0


def test_a_stopped_scheduler_is_taken_as_lost_and_held_turns_are_admitted_after_it_continues(
    tmp_path: Path,
) -> None:
    with fake_engine(tmp_path) as engine_url, scheduler_and_dataplane(tmp_path, [engine_url]) as pair:
        scheduler = pair.children["scheduler"].pgid
        assert pair.complete(run_id="before") == 200
        os.killpg(scheduler, signal.SIGSTOP)
        try:
            noticed = wait_until(lambda: pair.health()["scheduler"] == "connecting", NOTICE_WITHIN_S)
            assert noticed, f"/health still says connected with the scheduler stopped\n{pair.logs()}"
            statuses: list[int] = []
            turn = threading.Thread(target=lambda: statuses.append(pair.complete(run_id="during")))
            turn.start()
            try:
                held = wait_until(lambda: pair.metric("luftpause_dataplane_turns_held ") == 1, 30)
                assert held, pair.logs()
                assert pair.health()["scheduler"] == "connecting"
                assert not statuses  # nobody could have placed it: held here
            finally:
                os.killpg(scheduler, signal.SIGCONT)
                turn.join(70)
            assert statuses == [200], pair.logs()
        finally:
            os.killpg(scheduler, signal.SIGCONT)  # never leave it stopped for the stop that follows
        assert wait_until(lambda: pair.health()["scheduler"] == "connected", 30), pair.logs()
        assert pair.metric("luftpause_dataplane_turns_held ") == 0
        assert pair.complete(run_id="after") == 200
        assert "answered no ping" in pair.children["dataplane"].log_tail(200)
