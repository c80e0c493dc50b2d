"""Today's timing model: ``slots`` running places and a waiting queue, each request sleeping its
own prefill and decode time (:class:`.costs.CostModel`), a message-prefix cache per replica
(:class:`.prefix_cache.PrefixCache`, bounded in tokens, LRU).

A request waits for a slot (:class:`.scheduling.SlotPool`), looks its prompt up in the prefix
cache, sleeps the prefill of the tokens it did not find, caches its prompt, then decodes one token
per decode step (longer as more requests run), and at the end caches its reply after its prompt
for the run's next turn. Running requests do not share engine time beyond that slowdown, and the
prefix cache's bound is separate from what running requests hold: for memory pressure and shared
steps use the step model (:mod:`.stepped`).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from luftpause.testkit.engine import wire
from luftpause.testkit.engine.backend import Held
from luftpause.testkit.engine.costs import CostModel
from luftpause.testkit.engine.metrics import EngineMetrics, ModelLoad
from luftpause.testkit.engine.prefix_cache import PrefixCache, PrefixPath
from luftpause.testkit.engine.replies import Reply
from luftpause.testkit.engine.scheduling import EngineStats, SlotPool
from luftpause.testkit.engine.settings import MAX_MODEL_LEN, EngineSettings

__all__ = ["MAX_TOKENS_PER_STEP", "MIN_SLEEP_S", "SlottedBackend"]

# Shortest sleep between streamed tokens: below it, tokens that are due go out together in one
# write, so a tiny decode_ms keeps the total time of the model without a timer per token.
MIN_SLEEP_S = 0.001

# Most tokens sent in one write: with decode_ms 0 a huge max_tokens must not build one huge
# write nor hold the event loop from other requests.
MAX_TOKENS_PER_STEP = 64


class _HeldTokens:
    """One running request: the KV-cache tokens it holds (prompt, then each decoded token), its
    prefix path, reply and cached tokens, and its simulated prefill and decode seconds."""

    __slots__ = ("_load", "cached_tokens", "decode_s", "path", "prefill_s", "reply", "tokens")

    def __init__(self, load: ModelLoad, path: PrefixPath | None, reply: Reply | None) -> None:
        self._load = load
        self.path = path
        self.reply = reply
        self.tokens = 0
        self.cached_tokens = 0
        self.prefill_s = 0.0
        self.decode_s = 0.0

    def add(self, tokens: int) -> None:
        self.tokens += tokens
        self._load.kv_tokens += tokens

    def decoded(self, tokens: int) -> None:
        """``tokens`` more output tokens: held as KV and counted as generated."""
        self.add(tokens)
        self._load.generation_tokens_total += tokens

    def release(self) -> None:
        self._load.kv_tokens -= self.tokens
        self.tokens = 0


class SlottedBackend:
    """Slots, queue, costs and prefix cache of one engine with ``settings``; counts go to
    ``stats``, the ids of requests as they get a slot to ``started``."""

    def __init__(self, settings: EngineSettings, stats: EngineStats, started: deque[str]) -> None:
        self.settings = settings
        self.stats = stats
        self._started = started
        self._pool = SlotPool(settings.slots, stats)
        self._costs = CostModel(settings)
        self.cache = PrefixCache(settings.prefix_cache_tokens)
        self._metrics = EngineMetrics(settings.models, settings.kv_tokens, settings.metrics)
        self._load = {model: ModelLoad() for model in settings.models}
        # Queue rank of a request's priority: 0 for all (FIFO), or lower/higher value first.
        self._rank_sign = {"fcfs": 0, "lower_first": 1, "higher_first": -1}[settings.priority_order]

    def render_metrics(self) -> bytes:
        return self._metrics.render(self._load)

    def refusal(self, prompt_tokens: int, output_tokens: int, max_tokens: int) -> wire.RequestError | None:
        """None: the slot model takes any size (its KV pool is not modelled)."""
        return None

    def server_info(self) -> dict[str, Any]:
        settings = self.settings
        return {
            "max_running_requests": settings.slots,
            "max_total_num_tokens": settings.kv_tokens,
            "context_length": MAX_MODEL_LEN,
            "simulator": {
                "prefill_ms_per_1k": settings.prefill_ms_per_1k,
                "decode_ms": settings.decode_ms,
                "batch_slowdown": settings.batch_slowdown,
                "prefix_cache_tokens": settings.prefix_cache_tokens,
                "time_scale": settings.time_scale,
                "metrics": settings.metrics,
            },
        }

    @asynccontextmanager
    async def running(
        self,
        model: str,
        prompt_tokens: int,
        path: PrefixPath | None,
        priority: int,
        completion_id: str | None = None,
        reply: Reply | None = None,
        max_tokens: int | None = None,
    ) -> AsyncIterator[_HeldTokens]:
        """Wait for a slot, look ``path`` up in the prefix cache (``None``: a single pass, not
        cached), prefill the rest and cache ``path``; the block decodes. Counts go to ``/metrics``;
        ``completion_id``, when given, to ``/testkit/started`` once the slot is taken."""
        load = self._load[model]
        load.waiting += 1
        queued = True
        try:
            async with self._pool.slot(self._rank_sign * priority):
                if completion_id is not None:
                    self._started.append(completion_id)
                load.waiting -= 1
                queued = False
                load.running += 1
                held = _HeldTokens(load, path, reply)
                held.add(prompt_tokens)
                load.prompt_tokens_total += prompt_tokens
                try:
                    if path is not None:
                        # Looked up once running, as an engine does: a prefix cached while this
                        # request waited counts.
                        held.cached_tokens = self.cache.lookup(path, prompt_tokens)
                        load.count_lookup(prompt_tokens, held.cached_tokens)
                    held.prefill_s = self._costs.prefill_seconds(prompt_tokens - held.cached_tokens)
                    await asyncio.sleep(held.prefill_s)
                    if path is not None:
                        self.cache.insert(path)
                    yield held
                finally:
                    load.running -= 1
                    held.release()
        finally:
            if queued:
                load.waiting -= 1

    async def decode(self, held: Held) -> AsyncIterator[int]:
        """Yield how many of the reply's tokens are decoded by now, each time more are; then
        cache the reply after its prompt (the run's next turn starts with both).

        Token ``i`` is due one decode step after token ``i - 1`` (token 0 one step after decode
        starts); a step lasts :meth:`.CostModel.decode_seconds` of the requests running when it is
        counted, and is added to ``held.decode_s``: the simulated decode time, whatever the event
        loop's punctuality.
        """
        if not isinstance(held, _HeldTokens):
            raise TypeError("decode takes what running() yielded")
        count = held.reply.count if held.reply is not None else 0
        loop = asyncio.get_running_loop()
        due_at = loop.time()  # when the last token counted was due
        done = 0
        while done < count:
            now = loop.time()
            step = self._costs.decode_seconds(self.stats.running)
            ready = done
            while ready < count and ready - done < MAX_TOKENS_PER_STEP and due_at + step <= now + 1e-9:
                due_at += step
                held.decode_s += step
                ready += 1
                step = self._costs.decode_seconds(self.stats.running)
            if ready > done:
                held.decoded(ready - done)
                done = ready
                yield done
                if done < count and due_at + step <= loop.time():
                    # Behind schedule (decode_ms 0, or a busy loop): let other requests run too.
                    await asyncio.sleep(0)
                continue
            await asyncio.sleep(max(due_at + step - now, MIN_SLEEP_S))
        if held.path is not None and held.reply is not None:
            self.cache.insert(held.path.extended(wire.reply_message(held.reply)))
