"""``GET /metrics``: the engine's load as Prometheus text, under SGLang's metric names.

Each engine owns a ``CollectorRegistry`` (so that several engines in one test process never share
a gauge) and refreshes its gauges from the live counts at every scrape. Gauges carry a
``model_name`` label, as SGLang's do; with several models served, each model's sample counts that
model's requests, so the replica's load is the sum over ``model_name``.

vLLM's names (``vllm:num_requests_running``, ``vllm:num_requests_waiting``,
``vllm:kv_cache_usage_perc``) would be a second set of gauges chosen by a setting, here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

# Context tokens one running slot may hold: the simulated KV cache is slots x this many tokens.
CONTEXT_TOKENS_PER_SLOT = 8192

__all__ = ["CONTENT_TYPE_LATEST", "ModelLoad", "SglangMetrics"]


@dataclass(slots=True)
class ModelLoad:
    """Live counts for one served model: requests running and waiting, KV tokens held by running ones."""

    running: int = 0
    waiting: int = 0
    kv_tokens: int = 0


class SglangMetrics:
    """The four SGLang gauges the scheduler reads, in a registry of their own."""

    def __init__(self, models: Sequence[str], slots: int) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._models = tuple(models)
        self._kv_capacity = slots * CONTEXT_TOKENS_PER_SLOT
        labels = ["model_name"]
        self._running = Gauge(
            "sglang:num_running_reqs", "The number of running requests.", labels, registry=self.registry
        )
        self._queued = Gauge(
            "sglang:num_queue_reqs",
            "The number of requests in the waiting queue.",
            labels,
            registry=self.registry,
        )
        self._token_usage = Gauge(
            "sglang:token_usage",
            "The token usage (fraction of the KV cache in use).",
            labels,
            registry=self.registry,
        )
        self._cache_hit_rate = Gauge(
            "sglang:cache_hit_rate",
            "The prefix cache hit rate (always 0: the simulator has no prefix cache yet).",
            labels,
            registry=self.registry,
        )

    def render(self, load: Mapping[str, ModelLoad]) -> bytes:
        """Prometheus text exposition (format 0.0.4 / 1.0.0) of ``load`` per model."""
        # The models share one KV pool: each model's sample reports that pool's usage, as every
        # label set of a real engine (a data-parallel rank) reports the fraction of its own pool.
        pool_usage = min(1.0, sum(counts.kv_tokens for counts in load.values()) / self._kv_capacity)
        for model in self._models:
            counts = load.get(model, ModelLoad())
            self._running.labels(model).set(counts.running)
            self._queued.labels(model).set(counts.waiting)
            self._token_usage.labels(model).set(pool_usage)
            self._cache_hit_rate.labels(model).set(0.0)
        return generate_latest(self.registry)
