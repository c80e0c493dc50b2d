"""Engine probing: every 2 s, each replica's health and load, fed to the core as one
``ReplicasProbed`` per round (applied whole before any held turn is placed).

Per replica and round, at once and each with a 2 s timeout (docs/architecture.md "Probing"):

* ``GET <url><health_path>``: a 2xx answer is healthy; any other status, a refused connection or a
  timeout is unhealthy. An empty ``health_path`` means the replica has no health endpoint
  (llama-cpp-python's server, some hosted APIs): it is not checked and counts as healthy.
* ``GET <url>/metrics`` (or, for a router with ``load_from``, ``GET <engine>/metrics`` of each
  engine behind it): Prometheus text exposition, parsed with ``prometheus_client``'s parser.
  A replica whose metrics cannot be read, or carry none of the names below, reports no load.

Both carry the replica's key (``api_key_env``) as ``Authorization: Bearer``, as turns do.

Metric names (REFERENCES.md): SGLang ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
``sglang:token_usage``, ``sglang:cache_hit_rate``; vLLM ``vllm:num_requests_running``,
``vllm:num_requests_waiting``, ``vllm:kv_cache_usage_perc``. Samples are summed over their label
sets (one ``model_name`` per served model, one engine index per data-parallel rank) and fractions
averaged over them; over the engines of ``load_from`` likewise. Only the lines of these families
are parsed: an engine's ``/metrics`` runs to hundreds of KB of histograms, and parsing all of it on
the loop that answers Admit would cost tens of milliseconds per replica.

The replica's key goes to its own URL only; a ``load_from`` engine on another host gets none.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from luftpause.config import Config, ReplicaConfig
from luftpause.scheduler.core import ReplicaProbed, ReplicasProbed
from luftpause.scheduler.host import SchedulerHost

log = logging.getLogger("luftpause.scheduler")

PROBE_INTERVAL_S = 2.0
PROBE_TIMEOUT_S = 2.0

RUNNING = ("sglang:num_running_reqs", "vllm:num_requests_running")
WAITING = ("sglang:num_queue_reqs", "vllm:num_requests_waiting")
KV_USAGE = ("sglang:token_usage", "vllm:kv_cache_usage_perc")
CACHE_HIT_RATE = ("sglang:cache_hit_rate",)
_FAMILIES = frozenset(RUNNING + WAITING + KV_USAGE + CACHE_HIT_RATE)


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What one engine's ``/metrics`` say: request counts and fractions (0..1), ``None`` if absent."""

    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    cache_hit_rate: float | None = None


def _wanted_lines(text: str) -> str:
    """The lines of ``text`` that belong to the families read here (samples, HELP and TYPE)."""
    kept = []
    for line in text.splitlines():
        if line.startswith("#"):
            parts = line.split(None, 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE") and parts[2] in _FAMILIES:
                kept.append(line)
        elif line.split("{", 1)[0].split(" ", 1)[0] in _FAMILIES:
            kept.append(line)
    return "\n".join(kept) + "\n"


def parse_load(text: str) -> EngineLoad:
    """Read an engine's load from Prometheus text: SGLang or vLLM names, counts summed over label
    sets, fractions averaged over them and capped at 1.

    Raises ``ValueError`` when those lines are not valid exposition format (the parser's error).
    """
    values: dict[str, list[float]] = {}
    for family in text_string_to_metric_families(_wanted_lines(text)):
        for sample in family.samples:
            values.setdefault(sample.name, []).append(sample.value)

    def found(names: tuple[str, ...]) -> list[float] | None:
        samples = [v for name in names for v in values.get(name, ())]
        return samples or None

    running, waiting = found(RUNNING), found(WAITING)
    kv_usage, hit_rate = found(KV_USAGE), found(CACHE_HIT_RATE)
    return EngineLoad(
        None if running is None else round(sum(running)),
        None if waiting is None else round(sum(waiting)),
        None if kv_usage is None else min(1.0, sum(kv_usage) / len(kv_usage)),
        None if hit_rate is None else min(1.0, sum(hit_rate) / len(hit_rate)),
    )


def combine(loads: Iterable[EngineLoad]) -> EngineLoad:
    """The load of a router from its engines': counts summed, fractions averaged (absent ones skipped)."""
    items = list(loads)

    def summed(values: list[int | None]) -> int | None:
        present = [v for v in values if v is not None]
        return sum(present) if present else None

    def mean(values: list[float | None]) -> float | None:
        present = [v for v in values if v is not None]
        return sum(present) / len(present) if present else None

    return EngineLoad(
        summed([load.running for load in items]),
        summed([load.waiting for load in items]),
        mean([load.kv_usage for load in items]),
        mean([load.cache_hit_rate for load in items]),
    )


async def probe_replica(session: aiohttp.ClientSession, replica: ReplicaConfig) -> tuple[bool, EngineLoad]:
    """Probe ``replica`` once, health and load at the same time: ``(healthy, load)``."""
    key = replica.api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    metrics_urls = [url.rstrip("/") for url in replica.load_from] or [replica.url]
    healthy, *loads = await asyncio.gather(
        _healthy(session, replica, headers),
        *(
            _load(session, f"{url}/metrics", headers if _same_origin(url, replica.url) else {})
            for url in metrics_urls
        ),
    )
    return bool(healthy), combine(item for item in loads if isinstance(item, EngineLoad))


def _same_origin(a: str, b: str) -> bool:
    first, second = urlsplit(a), urlsplit(b)
    return (first.scheme, first.hostname, first.port) == (second.scheme, second.hostname, second.port)


async def _healthy(session: aiohttp.ClientSession, replica: ReplicaConfig, headers: dict[str, str]) -> bool:
    if not replica.health_path:
        return True
    try:
        async with session.get(f"{replica.url}{replica.health_path}", headers=headers) as response:
            await response.read()
            return 200 <= response.status < 300
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.debug("health of %s: %r", replica.name, exc)
        return False


async def _load(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> EngineLoad | None:
    try:
        async with session.get(url, headers=headers) as response:
            if response.status != 200:
                return None
            text = await response.text(errors="replace")
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.debug("metrics at %s: %r", url, exc)
        return None
    try:
        return parse_load(text)
    except ValueError as exc:
        log.debug("metrics at %s unreadable: %s", url, exc)
        return None


SessionFactory = Callable[[aiohttp.ClientTimeout], aiohttp.ClientSession]
"""Makes the one HTTP session of the probe loop, every request bounded by the timeout given."""


def _session(timeout: aiohttp.ClientTimeout) -> aiohttp.ClientSession:
    return aiohttp.ClientSession(timeout=timeout)


class Prober:
    """Probes every replica of ``host.replicas`` (the set as it stands) every ``interval`` seconds
    and feeds ``host`` the results.

    The first round runs at :meth:`start`; a round that takes longer than ``interval`` (every probe
    timing out) is followed by the next one at once, never by two at the same time. Each round is
    fed as one ``ReplicasProbed`` (the replicas whose probe did not fail), stamped when fed.

    ``interval`` and ``timeout`` are seconds (docs/architecture.md "Constants": 2 s each); the
    schedule reads the host's clock (``host.now()``) and waits with ``sleep``, and ``session``
    makes the HTTP session: the three seams a test drives the schedule through without waiting.
    """

    def __init__(
        self,
        config: Config,
        host: SchedulerHost,
        interval: float = PROBE_INTERVAL_S,
        timeout: float = PROBE_TIMEOUT_S,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        session: SessionFactory = _session,
    ) -> None:
        self.host = host
        self.interval = interval
        self.timeout = timeout
        self._sleep = sleep
        self._session = session
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Begin probing on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="luftpause-probes")

    async def stop(self) -> None:
        """Stop probing and wait until the loop has ended."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None

    async def _run(self) -> None:
        async with self._session(aiohttp.ClientTimeout(total=self.timeout)) as session:
            while True:
                started = self.host.now()
                try:
                    now = await self._round(session)
                except Exception:  # a fault in one round must not end probing for good
                    log.exception("probe round failed")
                    now = self.host.now()
                await self._sleep(max(0.0, self.interval - (now - started)))

    async def _round(self, session: aiohttp.ClientSession) -> float:
        """Probe every replica once and feed the results; returns when they were stamped."""
        replicas = list(self.host.replicas.values())  # the set as it stands (the admin API, SIGHUP)
        results = await asyncio.gather(
            *(probe_replica(session, replica) for replica in replicas),
            return_exceptions=True,
        )
        now = self.host.now()  # stamped when fed: event times must not go backwards
        probed: list[ReplicaProbed] = []
        for replica, result in zip(replicas, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("probe of %s failed: %r", replica.name, result)
                continue
            healthy, load = result
            probed.append(
                ReplicaProbed(
                    replica.name,
                    now,
                    healthy,
                    load.running,
                    load.waiting,
                    load.kv_usage,
                    load.cache_hit_rate,
                )
            )
        # one event: the whole round is applied before any held turn is placed, so the replica
        # probed first does not take every held turn that another could have taken
        self.host.feed(ReplicasProbed(now, tuple(probed)))
        return now
