"""``GET /metrics``: the engine's load as Prometheus text, under SGLang's or vLLM's names.

Each engine owns a ``CollectorRegistry`` (so that several engines in one test process never share
a metric) and refreshes it from the live counts at every scrape. Samples carry a ``model_name``
label as both engines' do (vLLM's also ``engine="0"``, its engine core index); with several
models served, each model's sample counts that model's requests, so the replica's load is the sum
over ``model_name``.

SGLang (``--enable-metrics``): gauges ``sglang:num_running_reqs``, ``sglang:num_queue_reqs``,
``sglang:token_usage`` (fraction of the KV pool in use), ``sglang:cache_hit_rate`` (fraction of
prompt tokens found in the prefix cache: over the last ``CACHE_HIT_WINDOW`` requests of the model,
or of the last prefill batch on the step model); counters ``sglang:prompt_tokens``,
``sglang:generation_tokens``, ``sglang:cached_tokens`` (tokens) and
``sglang:num_retracted_requests`` (SGLang's ``SchedulerMetricsCollector`` and
``TokenizerMetricsCollector``).

vLLM (v1 engine): gauges ``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc`` (a fraction from 0 to 1, despite the name); counters, in tokens,
``vllm:prefix_cache_queries``, ``vllm:prefix_cache_hits``, ``vllm:prompt_tokens``,
``vllm:generation_tokens``, and ``vllm:num_preemptions``.

Counters are exposed with the ``_total`` suffix that Prometheus counters carry. KV usage counts
what running requests hold: an unpinned prefix cache counts as free, as both engines count it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from luftpause.testkit.engine.settings import CONTEXT_TOKENS_PER_SLOT

# Requests over which sglang:cache_hit_rate is computed, per model.
CACHE_HIT_WINDOW = 100

__all__ = ["CACHE_HIT_WINDOW", "CONTENT_TYPE_LATEST", "EngineMetrics", "ModelLoad", "SglangMetrics"]


@dataclass(slots=True)
class ModelLoad:
    """Live counts for one served model: requests running and waiting, KV tokens held by running
    ones, prefix-cache lookups in tokens (totals, and the last ``CACHE_HIT_WINDOW`` as
    ``(queried, hit)`` pairs), prompt and generated tokens, and retractions (or preemptions)."""

    running: int = 0
    waiting: int = 0
    kv_tokens: int = 0
    cache_queries: int = 0
    cache_hits: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    retractions_total: int = 0
    recent_lookups: deque[tuple[int, int]] = field(default_factory=lambda: deque(maxlen=CACHE_HIT_WINDOW))

    def count_lookup(self, queried: int, hit: int) -> None:
        self.cache_queries += queried
        self.cache_hits += hit
        self.recent_lookups.append((queried, hit))

    def recent_hit_rate(self) -> float:
        queried = sum(q for q, _ in self.recent_lookups)
        return sum(h for _, h in self.recent_lookups) / queried if queried else 0.0


class EngineMetrics:
    """The gauges and counters a scheduler reads, under ``naming`` ``"sglang"``, ``"vllm"`` or
    ``"both"``, for ``models`` sharing one KV pool of ``kv_capacity`` tokens."""

    def __init__(self, models: Sequence[str], kv_capacity: int, naming: str = "sglang") -> None:
        if naming not in ("sglang", "vllm", "both"):
            raise ValueError(f"naming must be sglang, vllm or both, got {naming!r}")
        self.registry = CollectorRegistry(auto_describe=True)
        self._models = tuple(models)
        self._kv_capacity = kv_capacity
        self._sglang = naming in ("sglang", "both")
        self._vllm = naming in ("vllm", "both")
        # The value each counter had at the last scrape, by naming, field and labels.
        self._seen: dict[tuple[str, ...], int] = {}
        reg = self.registry
        if self._sglang:
            labels = ["model_name"]
            self._sg_running = Gauge(
                "sglang:num_running_reqs", "The number of running requests.", labels, registry=reg
            )
            self._sg_queued = Gauge(
                "sglang:num_queue_reqs", "The number of requests in the waiting queue.", labels, registry=reg
            )
            self._sg_usage = Gauge("sglang:token_usage", "The token usage.", labels, registry=reg)
            self._sg_hit_rate = Gauge(
                "sglang:cache_hit_rate", "The prefix cache hit rate.", labels, registry=reg
            )
            self._sg_counters = {
                "prompt_tokens_total": Counter(
                    "sglang:prompt_tokens", "Number of prefill tokens processed.", labels, registry=reg
                ),
                "generation_tokens_total": Counter(
                    "sglang:generation_tokens", "Number of generation tokens processed.", labels, registry=reg
                ),
                "cache_hits": Counter(
                    "sglang:cached_tokens", "Number of cached prompt tokens.", labels, registry=reg
                ),
                "retractions_total": Counter(
                    "sglang:num_retracted_requests",
                    "Total number of retracted requests.",
                    labels,
                    registry=reg,
                ),
            }
        if self._vllm:
            labels = ["model_name", "engine"]
            self._vl_running = Gauge(
                "vllm:num_requests_running",
                "Number of requests in model execution batches.",
                labels,
                registry=reg,
            )
            self._vl_waiting = Gauge(
                "vllm:num_requests_waiting",
                "Number of requests waiting to be processed.",
                labels,
                registry=reg,
            )
            self._vl_usage = Gauge(
                "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", labels, registry=reg
            )
            self._vl_counters = {
                "cache_queries": Counter(
                    "vllm:prefix_cache_queries",
                    "Prefix cache queries, in terms of number of queried tokens.",
                    labels,
                    registry=reg,
                ),
                "cache_hits": Counter(
                    "vllm:prefix_cache_hits",
                    "Prefix cache hits, in terms of number of cached tokens.",
                    labels,
                    registry=reg,
                ),
                "prompt_tokens_total": Counter(
                    "vllm:prompt_tokens", "Number of prefill tokens processed.", labels, registry=reg
                ),
                "generation_tokens_total": Counter(
                    "vllm:generation_tokens", "Number of generation tokens processed.", labels, registry=reg
                ),
                "retractions_total": Counter(
                    "vllm:num_preemptions",
                    "Cumulative number of preemption from the engine.",
                    labels,
                    registry=reg,
                ),
            }

    def render(
        self, load: Mapping[str, ModelLoad], pool_usage: float | None = None, hit_rate: float | None = None
    ) -> bytes:
        """Prometheus text exposition (format 0.0.4) of ``load`` per model; ``pool_usage`` and
        ``hit_rate``, when given, are the engine's own (the step model's pool and last prefill)
        instead of what ``load`` says."""
        # The models share one KV pool: each model's sample reports that pool's usage, as every
        # label set of a real engine (a data-parallel rank) reports the fraction of its own pool.
        if pool_usage is None:
            held = sum(counts.kv_tokens for counts in load.values())
            pool_usage = min(1.0, held / self._kv_capacity) if self._kv_capacity else 0.0
        for model in self._models:
            counts = load.get(model, ModelLoad())
            if self._sglang:
                self._sg_running.labels(model).set(counts.running)
                self._sg_queued.labels(model).set(counts.waiting)
                self._sg_usage.labels(model).set(pool_usage)
                rate = counts.recent_hit_rate() if hit_rate is None else hit_rate
                self._sg_hit_rate.labels(model).set(rate)
                self._add_counts("sglang", self._sg_counters, counts, (model,))
            if self._vllm:
                self._vl_running.labels(model, "0").set(counts.running)
                self._vl_waiting.labels(model, "0").set(counts.waiting)
                self._vl_usage.labels(model, "0").set(pool_usage)
                self._add_counts("vllm", self._vl_counters, counts, (model, "0"))
        return generate_latest(self.registry)

    def _add_counts(
        self, naming: str, counters: Mapping[str, Counter], counts: ModelLoad, labels: tuple[str, ...]
    ) -> None:
        # Counters only go up: add what was counted since the last scrape.
        for field_name, counter in counters.items():
            key = (naming, field_name, *labels)
            value: int = getattr(counts, field_name)
            counter.labels(*labels).inc(value - self._seen.get(key, 0))
            self._seen[key] = value


class SglangMetrics(EngineMetrics):
    """SGLang's names only, for an engine of ``slots`` slots (a KV pool of
    ``slots * CONTEXT_TOKENS_PER_SLOT`` tokens)."""

    def __init__(self, models: Sequence[str], slots: int) -> None:
        super().__init__(models, slots * CONTEXT_TOKENS_PER_SLOT, "sglang")
