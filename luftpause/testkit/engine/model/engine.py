"""The engine model's public face: submit, cancel, advance the clock, read the load.

:class:`EngineModel` is sans-IO. It never reads a clock: every call carries ``now`` (seconds,
never decreasing), and :meth:`EngineModel.next_event_time` says when the step in flight ends,
so a virtual-time harness jumps there and a real-time shell arms one timer for it. A step is
planned when the previous one ends (or when a request arrives at an idle engine) from the
requests the engine holds at that moment, as an engine's scheduler loop does; its duration comes
from the profile's :class:`~.profiles.StepCosts`, times ``time_scale``.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from luftpause.testkit.engine.model.kv_pool import KVPool
from luftpause.testkit.engine.model.llamacpp_style import LlamaCppScheduler
from luftpause.testkit.engine.model.profiles import EngineProfile
from luftpause.testkit.engine.model.queue_order import SCHEDULE_POLICIES, reorder
from luftpause.testkit.engine.model.requests import EngineEvent, EngineLoad, EngineRequest, PrefixNode
from luftpause.testkit.engine.model.sglang_style import SglangScheduler
from luftpause.testkit.engine.model.state import EngineState, RequestState
from luftpause.testkit.engine.model.steps import Planned, StepScheduler
from luftpause.testkit.engine.model.vllm_style import VllmScheduler

__all__ = ["EngineModel"]


@dataclass(frozen=True, slots=True)
class _Step:
    start: float
    end: float
    planned: list[Planned]


class EngineModel:
    """One engine replica in virtual time, scheduled as ``profile.style`` says.

    ``priority_order``: ``"fcfs"`` (the request's priority is ignored), ``"lower_first"``
    (vLLM ``--scheduling-policy priority``) or ``"higher_first"`` (SGLang
    ``--enable-priority-scheduling``). ``schedule_policy``: how the waiting queue is reordered
    before each step (:mod:`.queue_order`: ``"fcfs"``, SGLang's ``"lpm"``, Continuum's
    ``"program"``); the last two need a shared pool (SGLang or vLLM style) and ``priority_order``
    ``"fcfs"``, else ``ValueError``. ``time_scale`` multiplies every step's duration.

    :meth:`hold` pins a finished request's prefix in the KV pool (Continuum's time-to-live pin)
    until :meth:`release`; while anything is held the engine may idle with requests waiting for
    the room the holds take.

    Call :meth:`advance` with the current time before :meth:`submit` or :meth:`cancel` whenever
    a step may have ended (at or after :meth:`next_event_time`): a call with ``now`` past the end
    of the step in flight, or with ``now`` before an earlier call's, raises ``ValueError``.
    Events are returned by :meth:`advance`, in time order, each once.
    """

    def __init__(
        self,
        profile: EngineProfile,
        *,
        priority_order: str = "fcfs",
        time_scale: float = 1.0,
        schedule_policy: str = "fcfs",
    ) -> None:
        if not (math.isfinite(time_scale) and time_scale > 0):
            raise ValueError(f"time_scale must be a positive number, got {time_scale}")
        if schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {schedule_policy!r}")
        if schedule_policy != "fcfs" and (profile.style == "llamacpp" or priority_order != "fcfs"):
            raise ValueError(
                f"schedule_policy {schedule_policy!r} needs a shared KV pool (an sglang or vllm "
                f"profile) and priority_order 'fcfs'; got {profile.style!r} and {priority_order!r}"
            )
        self.schedule_policy = schedule_policy
        self._held: dict[int, list[bytes]] = {}
        self._hold_ids = itertools.count(1)
        self.profile = profile
        self.time_scale = time_scale
        if profile.style == "llamacpp":
            pools = [KVPool(profile.slot_tokens) for _ in range(profile.max_running)]
        else:
            pools = [KVPool(profile.pool_tokens)]
        self._state = EngineState(pools, priority_order)
        schedulers: dict[str, type[SglangScheduler | VllmScheduler | LlamaCppScheduler]] = {
            "sglang": SglangScheduler,
            "vllm": VllmScheduler,
            "llamacpp": LlamaCppScheduler,
        }
        self._scheduler: StepScheduler = schedulers[profile.style](self._state, profile)
        self._step: _Step | None = None
        self._now = -math.inf
        self._arrivals = itertools.count()
        self.steps = 0

    # --- the interface ---------------------------------------------------------------------------

    def submit(self, request: EngineRequest, now: float) -> None:
        """``request`` arrives at ``now`` and waits for the next step that admits it.

        Raises ``ValueError`` when its id is held already, or when it could never run on this
        engine: its prompt plus ``max_tokens`` exceed the KV pool (SGLang: plus one token; vLLM's
        ``max_model_len`` check), or a llama.cpp slot's context (prompt plus ``output_tokens``).
        """
        self._check_time(now)
        if request.request_id in self._state.requests:
            raise ValueError(f"request {request.request_id!r} is already held by the engine")
        self.check(request)
        held = RequestState(request, now, arrival=next(self._arrivals))
        self._state.requests[request.request_id] = held
        self._state.enqueue(held)
        if self._step is None:
            self._start(now)

    def cancel(self, request_id: str, now: float) -> bool:
        """The client of ``request_id`` left at ``now``: a waiting request leaves the queue, a
        running one frees its KV at once (the prefix it computed stays cached, unpinned). No
        event is emitted. Returns whether the engine held it."""
        self._check_time(now)
        held = self._state.requests.get(request_id)
        if held is None:
            return False
        self._state.cancel(held)
        self._scheduler.released(held)
        return True

    def hold(self, nodes: tuple[PrefixNode, ...], now: float) -> int | None:
        """Pin the leading ``nodes`` (a prompt path, its reply node last) that the prefix cache
        holds, so that no eviction takes them; a handle for :meth:`release`, or ``None`` when the
        cache holds none of them. Only for a shared pool (SGLang or vLLM style)."""
        self._check_time(now)
        pool = self._state.pools[0]
        found = pool.match(nodes)
        if not found:
            return None
        keys = [key for key, _ in nodes[:found]]
        pool.lock(keys)
        handle = next(self._hold_ids)
        self._held[handle] = keys
        return handle

    def release(self, handle: int, now: float) -> None:
        """Unpin what :meth:`hold` pinned (it stays cached, evictable); a request waiting for that
        room may start now. An unknown handle is ignored."""
        self._check_time(now)
        keys = self._held.pop(handle, None)
        if keys is None:
            return
        self._state.pools[0].unlock(keys)
        if self._step is None and self._state.waiting:
            self._start(now)

    @property
    def held(self) -> int:
        """Holds not yet released."""
        return len(self._held)

    def next_event_time(self) -> float | None:
        """When the step in flight ends (seconds); ``None`` while the engine is idle."""
        return None if self._step is None else self._step.end

    def advance(self, now: float) -> list[EngineEvent]:
        """Run every step that ends at or before ``now``; return what happened since the last
        call, in time order."""
        if now < self._now:
            raise ValueError(f"time went back: {now} after {self._now}")
        while self._step is not None and self._step.end <= now:
            step = self._step
            self._complete(step)
            self._start(step.end)
        self._now = now
        events, self._state.events = self._state.events, []
        return events

    def generated(self, request_id: str) -> int | None:
        """Tokens ``request_id`` generated so far (``None``: not held; a finished request's count
        is in its :class:`~.requests.RequestFinished`)."""
        held = self._state.requests.get(request_id)
        return None if held is None else held.generated

    def is_running(self, request_id: str) -> bool:
        """Whether ``request_id`` holds KV now (admitted, not retracted)."""
        held = self._state.requests.get(request_id)
        return held is not None and held.running

    def load(self) -> EngineLoad:
        """What ``/metrics`` reports now (see :class:`~.requests.EngineLoad`)."""
        state = self._state
        pools = state.pools
        capacity = sum(pool.capacity for pool in pools)
        used = sum(pool.used for pool in pools)
        queried = state.last_prefill_queried
        return EngineLoad(
            running=len(state.running),
            waiting=len(state.waiting),
            pool_tokens=capacity,
            used_tokens=used,
            cached_tokens=sum(pool.cached for pool in pools),
            evictable_tokens=sum(pool.evictable for pool in pools),
            token_usage=used / capacity,
            cache_hit_rate=state.last_prefill_hit / queried if queried else 0.0,
            retractions=state.retractions,
            prompt_tokens_total=state.prompt_tokens_total,
            cached_tokens_total=state.cached_tokens_total,
            generated_tokens_total=state.generated_tokens_total,
            finished_total=state.finished_total,
            new_token_ratio=self._scheduler.new_token_ratio,
        )

    # --- inner workings --------------------------------------------------------------------------

    def _check_time(self, now: float) -> None:
        if now < self._now:
            raise ValueError(f"time went back: {now} after {self._now}")
        if self._step is not None and self._step.end < now:
            raise ValueError(f"advance({now}) first: a step ended at {self._step.end}")

    def check(self, request: EngineRequest) -> None:
        """Raise ``ValueError`` as :meth:`submit` would for a request that can never fit this
        engine (see there), without submitting it."""
        profile = self.profile
        prompt = request.prompt_tokens
        if profile.style == "sglang":
            needed = prompt + min(request.max_new_tokens, profile.clip_max_new_tokens) + 1
            room = profile.pool_tokens - 1
        elif profile.style == "vllm":
            needed, room = prompt + request.max_new_tokens, profile.pool_tokens
        else:
            needed, room = prompt + request.output_tokens, profile.slot_tokens
        if needed > room:
            raise ValueError(
                f"request {request.request_id!r} needs {needed} tokens of KV "
                f"(prompt {prompt} + its reply); this engine fits {room}"
            )

    def _start(self, now: float) -> None:
        # An empty plan with requests waiting happens once: vLLM preempted its only running
        # request, and admits no waiting request in that step; the next plan admits.
        for _ in range(2):
            reorder(self._state, self._state.pools[0], self.schedule_policy)
            planned = self._scheduler.plan(now)
            if planned:
                computed = sum(p.tokens for p in planned)
                context = sum(p.context for p in planned)
                seconds = self.profile.costs.step_seconds(computed, context) * self.time_scale
                self._step = _Step(now, now + seconds, planned)
                self.steps += 1
                return
            if not self._state.waiting:
                break
        self._step = None
        if self._state.requests and not self._held:
            raise AssertionError(f"the engine stalled holding {len(self._state.requests)} requests")

    def _complete(self, step: _Step) -> None:
        state = self._state
        for planned in step.planned:
            request: RequestState = planned.request
            if request.epoch != planned.epoch or not request.running:
                continue  # cancelled or retracted while the step ran
            if state.commit(request, planned.tokens, step.end):
                state.finish(request, step.end)
                self._scheduler.released(request)
