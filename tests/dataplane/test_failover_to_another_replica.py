"""A turn its engine never had goes to another replica (issue 25, item 2; docs/failover.md).

What broke: killing one of two engines under load failed 77 of 3,970 turns with 502 "cannot
connect" within 1.2 s: nothing had reached the engine, and each could have gone to the other
replica, which the scheduler only stopped using at its next probe.

Real processes: two simulated engines, the scheduler, the dataplane; the ``openai`` client sends
turns from 12 threads, streamed and not, while one engine is SIGKILLed. A non-streamed answer sends
no byte before it is whole, so every turn the dead engine held or was sent failed before any byte of
its answer: each one must be answered by the other replica. A streamed turn whose answer had begun
may break mid-stream (the failure contract), but none may fail before its stream began.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest
from dataplane_procs import MODEL, SchedulerAndDataplane, scheduler_and_dataplane, wait_until

from luftpause.testkit.launch.procs import ChildProcess, free_port

pytestmark = pytest.mark.integration

THREADS = 12
HI = [{"role": "user", "content": "hi"}]


@contextmanager
def two_engines(workdir: Path, first_args: tuple[str, ...] = ()) -> Iterator[list[ChildProcess]]:
    """Two simulated engines serving :data:`MODEL` (the first with ``first_args`` too); each
    child's ``ready_url`` is its health URL. Stopped at the end."""
    engines = []
    try:
        for i, extra in enumerate((first_args, ())):
            port = free_port()
            engine = ChildProcess(
                f"engine{i}",
                ["fake-engine", "--port", str(port), "--decode-ms", "5", "--model", MODEL, *extra],
                workdir / f"engine{i}.log",
                ready_url=f"http://127.0.0.1:{port}/health",
            )
            engines.append(engine.start())
            engine.wait_ready()
        yield engines
    finally:
        for engine in engines:
            engine.stop()


def urls(engines: list[ChildProcess]) -> list[str]:
    return [str(engine.ready_url).removesuffix("/health") for engine in engines]


def client_of(pair: SchedulerAndDataplane) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{pair.dataplane_url}/v1", api_key="x", max_retries=0, timeout=60)


def load(
    pair: SchedulerAndDataplane, stop: threading.Event, outcomes: Counter[str], errors: list[str]
) -> None:
    with client_of(pair) as client:
        turns(client, stop, outcomes, errors)


def turns(client: openai.OpenAI, stop: threading.Event, outcomes: Counter[str], errors: list[str]) -> None:
    streamed = False
    while not stop.is_set():
        streamed = not streamed
        try:
            if streamed:
                began = False
                try:
                    stream = client.chat.completions.create(
                        model=MODEL,
                        messages=HI,
                        max_tokens=16,
                        stream=True,  # type: ignore[arg-type]
                    )
                    began = True
                    for _ in stream:
                        pass
                    outcomes["stream ok"] += 1
                except openai.APIStatusError as exc:
                    outcomes["stream refused"] += 1
                    errors.append(f"stream {exc.status_code}: {exc.message}")
                except openai.APIError as exc:
                    outcomes["stream broke" if began else "stream refused"] += 1
                    if not began:
                        errors.append(f"stream before it began: {exc}")
            else:
                client.chat.completions.create(model=MODEL, messages=HI, max_tokens=16)  # type: ignore[arg-type]
                outcomes["whole ok"] += 1
        except openai.APIError as exc:
            outcomes["whole failed"] += 1
            errors.append(f"whole: {exc}")


def test_killing_one_of_two_engines_under_load_fails_no_turn_it_never_had(tmp_path: Path) -> None:
    with (
        two_engines(tmp_path) as engines,
        scheduler_and_dataplane(tmp_path, urls(engines), max_inflight=8) as pair,
    ):
        outcomes: Counter[str] = Counter()
        errors: list[str] = []
        stop = threading.Event()
        with ThreadPoolExecutor(THREADS) as pool:
            workers = [pool.submit(load, pair, stop, outcomes, errors) for _ in range(THREADS)]
            assert wait_until(lambda: outcomes["whole ok"] > 60, 60), outcomes
            engines[0].kill()  # SIGKILL: its connections reset, new ones refused
            before = sum(outcomes.values())
            assert wait_until(lambda: sum(outcomes.values()) > before + 300, 120), outcomes
            stop.set()
            for worker in workers:
                worker.result()
        log = pair.children["scheduler"].log_tail(400)
        failovers = pair.metric('luftpause_dataplane_failovers_total{reason="unreachable"}')
    assert outcomes["whole failed"] == 0 and outcomes["stream refused"] == 0, (outcomes, errors[:5])
    assert failovers >= 1, outcomes  # turns did go to the dead engine, and were sent on
    assert re.search(
        r"replica sim-0 out of rotation, its circuit breaker \w+ -> open: engine unreachable", log
    ), log


def test_an_engine_5xx_goes_to_another_replica_only_when_the_policy_names_it(tmp_path: Path) -> None:
    refusing = ("--fault", '{"kind": "status", "status": 503}')
    for policy, expect_refusals in (("", True), ("[dataplane.failover]\nretry_statuses = [503]", False)):
        workdir = tmp_path / ("policy" if policy else "default")
        workdir.mkdir()
        with (
            two_engines(workdir, refusing) as engines,
            scheduler_and_dataplane(workdir, urls(engines), dataplane=policy) as pair,
        ):
            statuses: Counter[int] = Counter()
            with client_of(pair) as client:
                for i in range(24):  # new runs, each placed on the least loaded (the first)
                    try:
                        client.chat.completions.create(
                            model=MODEL,
                            messages=HI,
                            max_tokens=2,
                            extra_headers={"x-luftpause-run-id": f"r{i}"},
                        )  # type: ignore[arg-type]
                        statuses[200] += 1
                    except openai.APIStatusError as exc:
                        statuses[exc.status_code] += 1
            retried = pair.metric('luftpause_dataplane_failovers_total{reason="status"}')
        if expect_refusals:
            assert statuses[503] > 0 and retried == 0, statuses  # off by default: relayed unchanged
        else:
            assert statuses == Counter({200: 24}) and retried > 0, statuses


def test_no_other_healthy_replica_answers_502_at_once(tmp_path: Path) -> None:
    # one replica, its engine gone: the failover is refused at once, never held for the replica
    dead = "http://127.0.0.1:9"  # discard port: nothing listens there
    replicas = f'\n[[replicas]]\nname = "gone"\nurl = "{dead}"\nmodels = ["{MODEL}"]\nhealth_path = ""\n'
    with scheduler_and_dataplane(tmp_path, [], replicas=replicas) as pair:
        with client_of(pair) as client, pytest.raises(openai.APIStatusError) as raised:
            client.chat.completions.create(model=MODEL, messages=HI, max_tokens=2)  # type: ignore[arg-type]
        assert raised.value.status_code == 502
        message = raised.value.response.json()["error"]["message"]
        assert message.startswith("engine gone: cannot connect") and "no other healthy replica" in message
