"""The circuit breaker's states with real processes (issue 27, item 5): a replica whose engine
fails every turn opens, takes no turn while open, turns half-open at a healthy probe once
``breaker_open_s`` has passed, takes a trial turn, and closes when it finishes.

Real processes: two simulated engines (the first answers every chat completion with a 500, its
``--fault`` option, until it is restarted without it), the scheduler, the dataplane; the ``openai``
client sends the turns.
"""

from __future__ import annotations

import re
import urllib.request
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import openai
import orjson
import pytest
from dataplane_procs import MODEL, SchedulerAndDataplane, scheduler_and_dataplane, wait_until

from luftpause.testkit.launch.procs import ChildProcess, free_port

pytestmark = pytest.mark.integration

FAILING = ("--fault", '{"kind": "status", "status": 500}')
PROTECTION = """
[scheduler.protection]
breaker_failures = 2
breaker_window_s = 60
breaker_open_s = 3
breaker_success_threshold = 1
breaker_trial_turns = 1
"""


def engine(workdir: Path, name: str, port: int, extra: tuple[str, ...] = ()) -> ChildProcess:
    child = ChildProcess(
        name,
        ["fake-engine", "--port", str(port), "--decode-ms", "2", "--model", MODEL, *extra],
        workdir / f"{name}.log",
        ready_url=f"http://127.0.0.1:{port}/health",
    )
    child.start().wait_ready()
    return child


def status(pair: SchedulerAndDataplane) -> dict[str, Any]:
    with urllib.request.urlopen(pair.status_url, timeout=10) as response:
        result: dict[str, Any] = orjson.loads(response.read())
        return result


def breaker_of(pair: SchedulerAndDataplane, name: str) -> str:
    return str(next(r["breaker"] for r in status(pair)["replicas"] if r["name"] == name))


def scheduler_metric(pair: SchedulerAndDataplane, line_prefix: str) -> float:
    url = pair.status_url.removesuffix("/status") + "/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:
        for line in response.read().decode().splitlines():
            if line.startswith(line_prefix):
                return float(line.rsplit(" ", 1)[1])
    return 0.0


def turn(client: openai.OpenAI) -> int:
    """One turn of a prompt of its own (no replica holds its prefix); its HTTP status (200 when it
    finished)."""
    prompt = f"hi {uuid.uuid4().hex} " * 4
    try:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": prompt}], max_tokens=4
        )
    except openai.APIStatusError as exc:
        return exc.status_code
    return 200


def test_a_failing_replica_opens_turns_half_open_and_closes_after_its_trial_turn(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    engines = [engine(tmp_path, "engine0", ports[0], FAILING), engine(tmp_path, "engine1", ports[1])]
    urls = [f"http://127.0.0.1:{port}" for port in ports]
    try:
        with (
            scheduler_and_dataplane(tmp_path, urls, max_inflight=4, scheduler=PROTECTION) as pair,
            openai.OpenAI(
                base_url=f"{pair.dataplane_url}/v1", api_key="x", max_retries=0, timeout=60
            ) as client,
            ThreadPoolExecutor(8) as pool,
        ):
            assert breaker_of(pair, "sim-0") == "closed"
            # turns two at a time until sim-0 has failed two of them: its breaker opens
            seen: list[int] = []
            for _ in range(50):
                seen += pool.map(lambda _: turn(client), range(2))
                if breaker_of(pair, "sim-0") == "open":
                    break
            assert breaker_of(pair, "sim-0") == "open", (seen, pair.logs())
            assert seen.count(500) >= 2
            # its engine stopped (its probes fail: it stays open) and restarted without its fault,
            # while every turn goes to sim-1 and finishes
            engines[0].stop()
            assert list(pool.map(lambda _: turn(client), range(2))) == [200] * 2
            assert breaker_of(pair, "sim-0") == "open"
            engines[0] = engine(tmp_path, "engine0-fixed", ports[0])
            # breaker_open_s after it opened, a healthy probe makes it half-open
            assert wait_until(lambda: breaker_of(pair, "sim-0") == "half_open", 30), pair.logs()
            # turns until its trial turn finished there: closed. More at once than the dataplane's
            # leases of sim-1 hold, so some come to the scheduler (a half-open replica is never leased)
            for _ in range(50):
                assert list(pool.map(lambda _: turn(client), range(8))) == [200] * 8
                if breaker_of(pair, "sim-0") == "closed":
                    break
            assert breaker_of(pair, "sim-0") == "closed", pair.logs()
            log = pair.children["scheduler"].log_tail(400)
            transitions = {
                (before, after): scheduler_metric(
                    pair,
                    "luftpause_scheduler_breaker_transitions_total"
                    f'{{from="{before}",replica="sim-0",to="{after}"}}',
                )
                for before, after in (("closed", "open"), ("open", "half_open"), ("half_open", "closed"))
            }
            page = status(pair)["limits"]["breaker_transitions"]
    finally:
        for child in engines:
            child.stop()
    assert transitions == {("closed", "open"): 1, ("open", "half_open"): 1, ("half_open", "closed"): 1}
    assert ["sim-0", "half_open", "closed", 1] in page
    for level, said in (
        ("WARNING", "out of rotation, its circuit breaker closed -> open"),
        ("INFO", "takes trial turns, its circuit breaker open -> half_open"),
        ("INFO", "back in rotation, its circuit breaker half_open -> closed"),
    ):
        assert re.search(rf"{level} replica sim-0 {said}", log), log
