"""vLLM's V1 scheduler: one token budget per step for decode and prefill chunks alike, KV
allocated as requests compute, preemption by recompute of the newest running request.

Followed from ``vllm/v1/core/sched/scheduler.py`` (``Scheduler.schedule``, at
00024d314514900f361ad072af6931e403b7f589) and ``vllm/v1/core/kv_cache_manager.py``
(``allocate_slots``):

* running requests first, in the order they were admitted: each is given what it still needs
  (1 token when decoding, the rest of its prompt when prefilling), at most what is left of
  ``max_num_batched_tokens``; ``allocate_slots`` takes free blocks (cached blocks no request
  references count as free and are evicted as they are reused);
* when allocation fails, the newest running request (``self.running.pop()``; with the
  priority policy the one of the largest ``(priority, arrival_time)``) is preempted: its blocks
  are freed (their hashes kept, so its prefix stays cached until evicted), its computed tokens
  set to 0, and it is put at the *front* of the waiting queue (``prepend_request``); this
  repeats until the allocation fits or the request preempted itself;
* waiting requests are considered only when nothing was preempted in this step, in queue
  order, while the budget lasts and fewer than ``max_num_seqs`` run: each looks up its prefix
  (``get_computed_blocks``; at least one token is computed), is chunked to the budget left, and
  is admitted if ``allocate_slots`` finds room, else the step's admissions stop.

vLLM's 16-token blocks are counted in tokens here (see :mod:`.kv_pool`).
"""

from __future__ import annotations

from luftpause.testkit.engine.model.profiles import EngineProfile
from luftpause.testkit.engine.model.state import EngineState, RequestState
from luftpause.testkit.engine.model.steps import Planned

__all__ = ["VllmScheduler"]


class VllmScheduler:
    """vLLM's scheduling over ``state`` (one shared pool) with ``profile``'s parameters."""

    def __init__(self, state: EngineState, profile: EngineProfile) -> None:
        self._state = state
        self._profile = profile
        self._pool = state.pools[0]

    @property
    def new_token_ratio(self) -> float:
        return 1.0

    def released(self, request: RequestState) -> None:
        pass

    def _victim(self) -> RequestState:
        running = self._state.running
        if self._state.priority_order == "fcfs":
            return running[-1]
        return max(running, key=lambda r: (self._state.rank(r.spec.priority), r.arrival))

    def plan(self, now: float) -> list[Planned]:
        state, pool, profile = self._state, self._pool, self._profile
        budget = profile.step_tokens
        planned: dict[str, Planned] = {}
        preempted = False
        index = 0
        while index < len(state.running) and budget > 0:
            request = state.running[index]
            tokens = min(request.need, budget)
            while not state.allocate(request, tokens):
                victim = self._victim()
                gave_back = planned.pop(victim.request_id, None)
                if gave_back is not None:
                    budget += gave_back.tokens
                    index -= 1
                state.retract(victim, now, front=True)
                preempted = True
                if victim is request:
                    break
            if not request.running:
                break
            planned[request.request_id] = Planned.of(request, tokens)
            budget -= tokens
            index += 1
        if not preempted:
            queried = hit = 0
            while state.waiting and budget > 0 and len(state.running) < profile.max_running:
                request = state.waiting[0]
                nodes, cached = state.lookup(request, pool)
                state.pin(request, pool, nodes)
                tokens = min(request.seq_tokens - cached, budget)
                if not pool.can_reserve(tokens):
                    state.unpin(request)
                    break
                state.admit(request, now, cached)
                state.allocate(request, tokens)
                planned[request.request_id] = Planned.of(request, tokens)
                queried += request.seq_tokens
                hit += cached
                budget -= tokens
            if queried:
                state.last_prefill_queried, state.last_prefill_hit = queried, hit
        return list(planned.values())
