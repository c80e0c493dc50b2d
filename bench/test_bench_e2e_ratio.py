"""The latency regression suite: a streamed turn through the dataplane, timed against the same turn
sent directly to the engine and through nginx, in the same session, and recorded as the ratio.

Run it as ``make bench-regress`` (compares with the saved baseline and fails on a regression of a
ratio) or ``make bench-regress-save`` (saves a new baseline); the commands are in bench/README.md.

What one round is: one streamed turn (``stream: true``, 16 tokens, closed: the next turn is sent
when the last ended) through the dataplane and one through the baseline, back to back, the order
swapped every round; the round's value is the dataplane's time over the baseline's, each from
sending the request to reading ``data: [DONE]`` (time to first token rides in ``extra_info``).
So what pytest-benchmark records as a round's "time" is that ratio, a pure number (1.0: as fast
as the baseline): the benchmark's clock is :class:`RatioClock`, which advances by the ratio each
round. A regression is a ratio grown past ``--benchmark-compare-fail`` (``median:N%``) against the
saved baseline; the machine being slower or faster that day moves both turns alike and not the
ratio, which is the point of the suite on a shared machine.

The arrangements are those of ``e2e_overhead.py`` (``e2e_arrangements.py``): one fast simulated
engine (no prefill or decode time; SIMULATED), nginx from Debian (``apt-get install -y
nginx-light``; without it the suite fails, rather than pass with nothing compared), and a
scheduler plus dataplane with one replica, every turn placed under a capacity lease.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import orjson
import pytest
from conftest import RATIO_GROUP
from e2e_arrangements import NGINX, Arrangement, start_engine, start_luftpause, start_nginx, working_tree

from luftpause.config import DEFAULT_MODEL

ROUNDS = 300
WARMUP_ROUNDS = 30
MAX_TOKENS = 16


class RatioClock:
    """A clock for pytest-benchmark that only moves when told: each round's target advances it by
    that round's ratio, so the round's "duration" is the ratio."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Turns:
    """Streamed turns through one event loop and one kept-alive session per URL."""

    loop: asyncio.AbstractEventLoop
    session: aiohttp.ClientSession
    body: bytes
    ttft: dict[str, list[float]] = field(default_factory=dict)

    def one(self, url: str) -> float:
        """One streamed turn through ``url``: seconds from the request to ``data: [DONE]``."""
        return self.loop.run_until_complete(self._one(url))

    async def _one(self, url: str) -> float:
        started = time.perf_counter()
        first: float | None = None
        tail = b""
        async with self.session.post(
            f"{url}/v1/chat/completions", data=self.body, headers={"content-type": "application/json"}
        ) as response:
            if response.status != 200:
                raise AssertionError(f"{url}: status {response.status}: {(await response.read())[:200]!r}")
            async for data in response.content.iter_any():
                if first is None and b'"content":"' in data.replace(b'"content":""', b""):
                    first = time.perf_counter() - started
                tail = (tail + data)[-64:]
        ended = time.perf_counter() - started
        if not tail.rstrip().endswith(b"data: [DONE]"):
            raise AssertionError(f"{url}: the stream did not end with [DONE]: {tail!r}")
        self.ttft.setdefault(url, []).append(first if first is not None else ended)
        return ended


@dataclass
class Arrangements:
    direct: str
    nginx: str
    dataplane: str
    turns: Turns


@pytest.fixture(scope="module")
def arrangements() -> Iterator[Arrangements]:
    if not os.access(NGINX, os.X_OK):
        pytest.fail(f"{NGINX} is not installed: apt-get install -y nginx-light (the suite's baseline)")
    tmp = Path(tempfile.mkdtemp(prefix="luftpause-regress-"))
    src = working_tree()
    started: list[Arrangement] = []
    engine = None
    loop = asyncio.new_event_loop()
    try:
        engine, port = start_engine(tmp, src, slots=64, max_tokens=MAX_TOKENS)
        for start in (start_nginx, start_luftpause):
            arrangement = start(tmp, src, port)
            started.append(arrangement)
            if arrangement.url is None:
                pytest.fail(f"{arrangement.name} did not start: {arrangement.reason}")
        body = orjson.dumps(
            {
                "model": DEFAULT_MODEL,
                "messages": [{"role": "user", "content": "Say something short."}],
                "max_tokens": MAX_TOKENS,
                "stream": True,
            }
        )
        session = loop.run_until_complete(_session())
        nginx, dataplane = (a.url for a in started)
        assert nginx is not None and dataplane is not None
        yield Arrangements(f"http://127.0.0.1:{port}", nginx, dataplane, Turns(loop, session, body))
        loop.run_until_complete(session.close())
    finally:
        loop.close()
        for arrangement in reversed(started):
            for child in reversed(arrangement.children):
                child.stop()
        if engine is not None:
            engine.stop()
        shutil.rmtree(tmp, ignore_errors=True)


async def _session() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=4))


def _ratio_rounds(benchmark: object, turns: Turns, dataplane: str, baseline: str) -> None:
    """Time rounds of (dataplane turn / baseline turn) with pytest-benchmark, the order swapped each
    round; extra_info gets the medians of both times and of their times to first token (ms)."""
    clock = RatioClock()
    benchmark._timer = clock  # type: ignore[attr-defined]  # the fixture's clock: see RatioClock
    seconds: dict[str, list[float]] = {dataplane: [], baseline: []}
    turns.ttft.clear()
    round_index = 0

    def one_round() -> None:
        nonlocal round_index
        order = (dataplane, baseline) if round_index % 2 == 0 else (baseline, dataplane)
        round_index += 1
        took = {url: turns.one(url) for url in order}
        for url, value in took.items():
            seconds[url].append(value)
        clock.now += took[dataplane] / took[baseline]

    pedantic: Callable[..., None] = benchmark.pedantic  # type: ignore[attr-defined]
    pedantic(one_round, rounds=ROUNDS, warmup_rounds=WARMUP_ROUNDS, iterations=1)
    info: dict[str, object] = benchmark.extra_info  # type: ignore[attr-defined]
    info["unit"] = "ratio (dataplane / baseline), not seconds"
    info["simulated"] = True
    info["load_average_1m"] = os.getloadavg()[0]
    for name, url in (("dataplane", dataplane), ("baseline", baseline)):
        info[f"{name}_turn_ms_median"] = round(_median(seconds[url][WARMUP_ROUNDS:]) * 1000, 3)
        info[f"{name}_ttft_ms_median"] = round(_median(turns.ttft[url][WARMUP_ROUNDS:]) * 1000, 3)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


@pytest.mark.benchmark(group=RATIO_GROUP)
def test_a_streamed_turn_through_the_dataplane_against_the_engine_directly(
    benchmark: object, arrangements: Arrangements
) -> None:
    _ratio_rounds(benchmark, arrangements.turns, arrangements.dataplane, arrangements.direct)


@pytest.mark.benchmark(group=RATIO_GROUP)
def test_a_streamed_turn_through_the_dataplane_against_nginx(
    benchmark: object, arrangements: Arrangements
) -> None:
    _ratio_rounds(benchmark, arrangements.turns, arrangements.dataplane, arrangements.nginx)
