"""Engine probing: every 2 s, each replica's health and load, fed to the core as one
``ReplicasProbed`` per round (applied whole before any held turn is placed).

Per replica and round, at once and each with a 2 s timeout (docs/architecture.md "Probing"):

* ``GET <url><health_path>``: a 2xx answer is healthy; any other status, a refused connection or a
  timeout is unhealthy. An empty ``health_path`` means the replica has no health endpoint
  (llama-cpp-python's server, some hosted APIs): it is not checked and counts as healthy.
* ``GET <url>/metrics`` (or, for a router with ``load_from``, ``GET <engine>/metrics`` of each
  engine behind it): Prometheus text exposition, parsed with ``prometheus_client``'s parser.
  A replica whose metrics cannot be read, or carry none of the names below, reports no load: it
  keeps taking turns, capped only by its ``max_inflight``, and why its load is unknown is logged
  once (WARNING, when the reason changes) and shown by ``GET /status`` (``load_unknown``).

* ``GET <url>/v1/models``, until it has been read once: the context length its engine reports
  (``max_model_len`` of its models' entries, as vLLM and SGLang give it; the largest when they
  differ), which caps a turn's output tokens at the dataplane (docs/failover.md). An answer
  without it is final (0: not reported); a failed request is tried again the next round.

All carry the replica's key (``api_key_env``) as ``Authorization: Bearer``, as turns do.

Metric names, per engine (REFERENCES.md "Engines"; llama.cpp's from the server it builds,
``tools/server/server-task.cpp`` ``to_metrics``, llama-cpp-python 0.3.36's vendored tree):

* running (requests): SGLang ``sglang:num_running_reqs``, vLLM ``vllm:num_requests_running``,
  llama.cpp ``llamacpp:requests_processing``;
* waiting (the engine's queue): ``sglang:num_queue_reqs``, ``vllm:num_requests_waiting``,
  ``llamacpp:requests_deferred``;
* KV cache in use (0..1): ``sglang:token_usage``, ``vllm:kv_cache_usage_perc``; llama.cpp's
  server reports none;
* prefix cache hit rate (0..1): ``sglang:cache_hit_rate``; for llama.cpp,
  ``llamacpp:prompt_tokens_cached_total`` over it plus ``llamacpp:prompt_tokens_total``; none
  read for vLLM.

llama.cpp's running count is its busy slots (``--parallel`` of them) and its waiting count the
requests it deferred because every slot was busy; its two prompt counters are totals since the
server started (``prompt_tokens_total`` counts the tokens computed, the cached ones excluded), so
its hit rate is the fraction of all prompt tokens it served from its prompt cache since then.
Ollama and llama-cpp-python's server expose no such metrics: load unknown.

Samples are summed over their label sets (one ``model_name`` per served model, one engine index
per data-parallel rank) and fractions averaged over them; over the engines of ``load_from``
likewise. Only the lines of these families are parsed: an engine's ``/metrics`` runs to hundreds
of KB of histograms, and parsing all of it on the loop that answers Admit would cost tens of
milliseconds per replica.

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

RUNNING = ("sglang:num_running_reqs", "vllm:num_requests_running", "llamacpp:requests_processing")
WAITING = ("sglang:num_queue_reqs", "vllm:num_requests_waiting", "llamacpp:requests_deferred")
KV_USAGE = ("sglang:token_usage", "vllm:kv_cache_usage_perc")
CACHE_HIT_RATE = ("sglang:cache_hit_rate",)
PROMPT_TOKENS_COMPUTED = ("llamacpp:prompt_tokens_total",)
PROMPT_TOKENS_CACHED = ("llamacpp:prompt_tokens_cached_total",)
_FAMILIES = frozenset(
    RUNNING + WAITING + KV_USAGE + CACHE_HIT_RATE + PROMPT_TOKENS_COMPUTED + PROMPT_TOKENS_CACHED
)
ENGINES = {"sglang:": "sglang", "vllm:": "vllm", "llamacpp:": "llama.cpp"}
"""Metric name prefix -> the engine that emits it, for ``EngineLoad.engine``."""

NO_KNOWN_METRICS = "its /metrics carry none of the load metrics luftpause reads"


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What one engine's ``/metrics`` say: request counts and fractions (0..1), ``None`` if absent.

    ``engine`` names whose metrics gave the running and waiting counts (``"sglang"``, ``"vllm"``,
    ``"llama.cpp"``; several joined by ``", "`` for a router over mixed engines), ``None`` when
    there were none; ``unknown`` then says why, in words for an operator (``None`` when known).
    """

    running: int | None = None
    waiting: int | None = None
    kv_usage: float | None = None
    cache_hit_rate: float | None = None
    engine: str | None = None
    unknown: str | None = None


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
    """Read an engine's load from Prometheus text: SGLang, vLLM or llama.cpp names (the list in the
    module docstring), counts summed over label sets, fractions averaged over them and capped at 1.

    Load counts as known only when both a running and a waiting count are present (engine-load
    admission needs both); otherwise ``running`` and ``waiting`` are ``None`` and ``unknown`` says
    so. Raises ``ValueError`` when those lines are not valid exposition format (the parser's error).
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
    computed, cached = found(PROMPT_TOKENS_COMPUTED), found(PROMPT_TOKENS_CACHED)
    rate = None if hit_rate is None else min(1.0, sum(hit_rate) / len(hit_rate))
    if rate is None and computed is not None and cached is not None and sum(computed) + sum(cached) > 0:
        rate = min(1.0, sum(cached) / (sum(computed) + sum(cached)))
    if running is None or waiting is None:
        present = sorted(n for n in values if n in RUNNING + WAITING)
        missing = "waiting" if running else "running"
        why = f"its /metrics carry {present[0]} but no {missing} count" if present else NO_KNOWN_METRICS
        return EngineLoad(
            kv_usage=None if kv_usage is None else min(1.0, sum(kv_usage) / len(kv_usage)),
            cache_hit_rate=rate,
            unknown=why,
        )
    engines = sorted(
        {engine for p, engine in ENGINES.items() for name in values if name in RUNNING and name.startswith(p)}
    )
    return EngineLoad(
        round(sum(running)),
        round(sum(waiting)),
        None if kv_usage is None else min(1.0, sum(kv_usage) / len(kv_usage)),
        rate,
        ", ".join(engines),
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

    known = [load for load in items if load.running is not None and load.waiting is not None]
    engines = sorted({name for load in known if load.engine for name in load.engine.split(", ")})
    reasons = list(dict.fromkeys(load.unknown for load in items if load.unknown))
    return EngineLoad(
        summed([load.running for load in known]),
        summed([load.waiting for load in known]),
        mean([load.kv_usage for load in items]),
        mean([load.cache_hit_rate for load in items]),
        ", ".join(engines) or None,
        None if known else ("; ".join(reasons) or "no load was read"),
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


async def context_length(session: aiohttp.ClientSession, replica: ReplicaConfig) -> int | None:
    """The context length (tokens) ``replica``'s engine reports in ``GET /v1/models``: the largest
    ``max_model_len`` among its entries for the replica's models (vLLM, SGLang); 0 when it reports
    none; ``None`` when the request failed (to be tried again). Never raises."""
    key = replica.api_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        async with session.get(f"{replica.url}/v1/models", headers=headers) as response:
            if response.status != 200:
                return 0 if 400 <= response.status < 500 else None
            body = await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        log.debug("models of %s: %r", replica.name, exc)
        return None
    entries = body.get("data") if isinstance(body, dict) else None
    lengths = [
        entry["max_model_len"]
        for entry in (entries if isinstance(entries, list) else [])
        if isinstance(entry, dict)
        and entry.get("id") in replica.models
        and type(entry.get("max_model_len")) is int
        and entry["max_model_len"] > 0
    ]
    return max(lengths, default=0)


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


async def _load(session: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> EngineLoad:
    """The load at ``url`` (a ``/metrics`` URL); never raises: a failure is an ``unknown`` reason."""
    try:
        async with session.get(url, headers=headers) as response:
            if response.status != 200:
                return EngineLoad(unknown=f"GET {url} answered {response.status}")
            text = await response.text(errors="replace")
    except (aiohttp.ClientError, TimeoutError) as exc:
        log.debug("metrics at %s: %r", url, exc)
        return EngineLoad(unknown=f"GET {url} failed: {type(exc).__name__}")
    try:
        return parse_load(text)
    except ValueError as exc:
        log.debug("metrics at %s unreadable: %s", url, exc)
        return EngineLoad(unknown=f"GET {url} is not Prometheus text: {exc}")


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
        self._unknown: dict[str, str | None] = {}  # replica -> why its load was unknown last round
        self._context_read: set[str] = set()  # replicas whose /v1/models was read

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
        unread = [replica for replica in replicas if replica.name not in self._context_read]
        results, lengths = await asyncio.gather(
            asyncio.gather(
                *(probe_replica(session, replica) for replica in replicas), return_exceptions=True
            ),
            asyncio.gather(*(context_length(session, replica) for replica in unread)),
        )
        for replica, length in zip(unread, lengths, strict=True):
            if length is not None:
                self._context_read.add(replica.name)
                self.host.note_context_length(replica.name, length)
        now = self.host.now()  # stamped when fed: event times must not go backwards
        probed: list[ReplicaProbed] = []
        for replica, result in zip(replicas, results, strict=True):
            if isinstance(result, BaseException):
                log.warning("probe of %s failed: %r", replica.name, result)
                continue
            healthy, load = result
            self._note(replica.name, load)
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

    def _note(self, name: str, load: EngineLoad) -> None:
        """Tell the host whose metrics gave ``name``'s load, or why there was none; log a change."""
        self.host.note_load(name, load.engine, load.unknown)
        before = self._unknown.get(name, "")  # "": never probed
        if load.unknown != before:
            if load.unknown is not None:
                log.warning(
                    "load of replica %s unknown: %s; it is capped only by its max_inflight",
                    name,
                    load.unknown,
                    extra={"replica": name},
                )
            elif before:
                log.info("load of replica %s read from %s metrics again", name, load.engine)
        self._unknown[name] = load.unknown
