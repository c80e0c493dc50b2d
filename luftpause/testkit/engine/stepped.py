"""The step model (:mod:`.model`) run in real time behind the HTTP routes (``--profile NAME``).

A thin asyncio shell over the sans-IO :class:`~.model.EngineModel`, as aioquic's shell over its
connection: the model's clock is the event loop's (``loop.time()`` since the backend started),
one timer is armed for :meth:`~.model.EngineModel.next_event_time`, and when it fires every step
due is run and the handlers whose requests made progress are woken. A request's handler submits
it, waits for its first token, then streams the tokens as the model generates them; leaving
(its client gone) cancels it in the model at once. The model computes every duration, so what
``/testkit/cost/{id}`` reports is exact even when the loop is late; the stream then catches up.

Counts for ``/metrics`` come from the model's pool: requests running and waiting, KV usage,
the cache hit rate of the last prefill, retractions or preemptions, token counters.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import asdict
from typing import Any

from luftpause.testkit.engine import wire
from luftpause.testkit.engine.backend import Held
from luftpause.testkit.engine.metrics import EngineMetrics, ModelLoad
from luftpause.testkit.engine.model import (
    EngineModel,
    EngineProfile,
    EngineRequest,
    FirstTokenGenerated,
    RequestAdmitted,
    RequestFinished,
    RequestRetracted,
)
from luftpause.testkit.engine.prefix_cache import PrefixPath
from luftpause.testkit.engine.replies import Reply
from luftpause.testkit.engine.scheduling import EngineStats
from luftpause.testkit.engine.settings import EngineSettings

__all__ = ["SteppedBackend"]


class _Handle:
    """One request the model holds for a handler: what it found cached, its simulated prefill
    and decode seconds, its first token and finish, and an event set whenever it progressed."""

    __slots__ = (
        "admitted_at",
        "cached_tokens",
        "changed",
        "decode_s",
        "finished",
        "first_at",
        "model",
        "prefill_s",
        "prompt_tokens",
        "request_id",
        "seen",
    )

    def __init__(self, request_id: str, model: str, prompt_tokens: int) -> None:
        self.request_id = request_id
        self.model = model
        self.prompt_tokens = prompt_tokens
        self.cached_tokens = 0
        self.prefill_s = 0.0
        self.decode_s = 0.0
        self.admitted_at: float | None = None
        self.first_at: float | None = None
        self.finished: RequestFinished | None = None
        self.seen: int | None = 0
        self.changed = asyncio.Event()


class SteppedBackend:
    """The engine model of ``settings.engine_profile``, in real time (see the module docstring);
    counts go to ``stats``, the ids of requests as they are first admitted to ``started``."""

    def __init__(self, settings: EngineSettings, stats: EngineStats, started: deque[str]) -> None:
        profile = settings.engine_profile
        if profile is None:
            raise ValueError("the step model needs a profile")
        self.settings = settings
        self.profile: EngineProfile = profile
        self.stats = stats
        self._started = started
        self.model = EngineModel(
            profile,
            priority_order=settings.priority_order,
            time_scale=settings.time_scale,
            schedule_policy=settings.schedule_policy,
        )
        self._metrics = EngineMetrics(settings.models, profile.pool_tokens, settings.metrics)
        self._load = {model: ModelLoad() for model in settings.models}
        self._handles: dict[str, _Handle] = {}
        self._passes = itertools.count(1)
        self._origin: float | None = None
        self._clock = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None

    # --- the backend interface -------------------------------------------------------------------

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
    ) -> AsyncIterator[_Handle]:
        """Submit the request, wait for its first token, hold it while the block streams; leaving
        the block early cancels it in the model. Raises ``ValueError`` when it can never fit."""
        request_id = completion_id or f"pass-{next(self._passes)}"
        output = max(reply.count, 1) if reply is not None else 1
        request = EngineRequest(
            request_id,
            _prompt(request_id, path, prompt_tokens),
            output,
            reply=_reply_node(path, reply),
            priority=priority,
            max_tokens=max(max_tokens or output, output),
        )
        now = self._now()
        self._advance(now)
        self.model.submit(request, now)
        handle = _Handle(request_id, model, prompt_tokens)
        self._handles[request_id] = handle
        self._after_change()
        try:
            while handle.first_at is None and handle.finished is None:
                handle.changed.clear()
                await handle.changed.wait()
            yield handle
        finally:
            if handle.finished is None:
                now = self._now()
                self._advance(now)
                self.model.cancel(request_id, now)
            del self._handles[request_id]
            self._after_change()

    async def decode(self, held: Held) -> AsyncIterator[int]:
        """Yield the request's generated tokens so far, each time more are, until it finished."""
        if not isinstance(held, _Handle):
            raise TypeError("decode takes what running() yielded")
        last = 0
        while True:
            if held.finished is not None:
                count = held.finished.completion_tokens
            else:
                count = self.model.generated(held.request_id) or 0
            if count > last:
                last = count
                yield count
            if held.finished is not None:
                return
            held.changed.clear()
            await held.changed.wait()

    def refusal(self, prompt_tokens: int, output_tokens: int, max_tokens: int) -> wire.RequestError | None:
        """A 400 for a request the model could never fit (:meth:`.EngineModel.check`)."""
        node = (b"refusal-check", max(prompt_tokens, 1))
        output = max(output_tokens, 1)
        request = EngineRequest("check", PrefixPath((node,)), output, max_tokens=max(max_tokens, output))
        try:
            self.model.check(request)
        except ValueError as exc:
            return wire.RequestError(400, str(exc).replace("request 'check' needs", "this request needs"))
        return None

    def render_metrics(self) -> bytes:
        self._advance(self._now())
        for load in self._load.values():
            load.running = load.waiting = 0
        for handle in self._handles.values():
            if handle.finished is None:
                counts = self._load[handle.model]
                if self.model.is_running(handle.request_id):
                    counts.running += 1
                else:
                    counts.waiting += 1
        engine = self.model.load()
        return self._metrics.render(self._load, pool_usage=engine.token_usage, hit_rate=engine.cache_hit_rate)

    def server_info(self) -> dict[str, Any]:
        profile = self.profile
        costs = asdict(profile.costs)
        return {
            "max_running_requests": profile.max_running,
            "max_total_num_tokens": profile.pool_tokens,
            "context_length": profile.slot_tokens if profile.style == "llamacpp" else profile.pool_tokens,
            "chunked_prefill_size": profile.step_tokens,
            "schedule_policy": self.model.schedule_policy,  # as SGLang's server args name it
            "simulator": {
                "profile": profile.name,
                "style": profile.style,
                "pool_tokens": profile.pool_tokens,
                "step_tokens": profile.step_tokens,
                "mixed": profile.mixed,
                "step_costs": costs,
                "time_scale": self.settings.time_scale,
                "metrics": self.settings.metrics,
                "sources": dict(profile.sources),
            },
        }

    # --- the shell -------------------------------------------------------------------------------

    def _now(self) -> float:
        """The model's clock: seconds since the first call, never going back (a timer that
        fires a little early counts as on time, see :meth:`_fire`)."""
        loop = asyncio.get_running_loop()
        if self._origin is None:
            self._origin = loop.time()
        self._clock = max(self._clock, loop.time() - self._origin)
        return self._clock

    def _fire(self) -> None:
        self._timer = None
        moment, self._timer_at = self._timer_at, None
        self._now()
        if moment is not None:
            self._clock = max(self._clock, moment)
        self._advance(self._clock)
        self._after_change()

    def _advance(self, now: float) -> None:
        for event in self.model.advance(now):
            handle = self._handles.get(event.request_id)
            if handle is None:
                continue
            load = self._load[handle.model]
            if isinstance(event, RequestAdmitted):
                # Every admission looks the prompt up (vLLM counts a recompute's lookup too).
                load.count_lookup(handle.prompt_tokens, event.cached_tokens)
                if handle.admitted_at is None:
                    handle.admitted_at = event.time
                    handle.cached_tokens = event.cached_tokens
                    load.prompt_tokens_total += handle.prompt_tokens
                    self._started.append(handle.request_id)
            elif isinstance(event, FirstTokenGenerated):
                handle.first_at = event.time
                if handle.admitted_at is not None:
                    handle.prefill_s = event.time - handle.admitted_at
            elif isinstance(event, RequestRetracted):
                load.retractions_total += 1
            elif isinstance(event, RequestFinished):
                handle.finished = event
                if handle.first_at is not None:
                    handle.decode_s = event.time - handle.first_at
                load.generation_tokens_total += event.completion_tokens
            handle.changed.set()
        for handle in self._handles.values():
            generated = self.model.generated(handle.request_id)
            if generated != handle.seen:
                handle.seen = generated
                handle.changed.set()

    def _after_change(self) -> None:
        """Re-arm the one timer for the end of the step in flight; update the counts."""
        moment = self.model.next_event_time()
        if moment != self._timer_at:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._timer_at = moment
            if moment is not None and self._origin is not None:
                self._timer = asyncio.get_running_loop().call_at(self._origin + moment, self._fire)
        load = self.model.load()
        stats = self.stats
        stats.running, stats.waiting = load.running, load.waiting
        stats.max_running_seen = max(stats.max_running_seen, load.running)
        stats.max_waiting_seen = max(stats.max_waiting_seen, load.waiting)

    def close(self) -> None:
        """Stop the timer (the server is shutting down)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _prompt(request_id: str, path: PrefixPath | None, prompt_tokens: int) -> PrefixPath:
    """The prompt's path; a single pass (``path`` ``None``) gets one node of its own, never
    shared; a path of fewer tokens than ``prompt_tokens`` (empty messages) gets a tail node."""
    if path is None:
        return PrefixPath(
            ((hashlib.blake2b(request_id.encode(), digest_size=16).digest(), max(prompt_tokens, 1)),)
        )
    missing = prompt_tokens - path.tokens
    if missing <= 0:
        return path
    parent = path.nodes[-1][0] if path.nodes else b""
    tail = hashlib.blake2b(parent + b"\x00tail", digest_size=16).digest()
    return PrefixPath((*path.nodes, (tail, missing)))


def _reply_node(path: PrefixPath | None, reply: Reply | None) -> tuple[bytes, int] | None:
    """The node the reply becomes after ``path`` (as :meth:`.PrefixPath.extended` keys it, so
    the run's next turn finds it), or ``None`` for a single pass."""
    if path is None or reply is None:
        return None
    return path.extended(wire.reply_message(reply)).nodes[-1]
