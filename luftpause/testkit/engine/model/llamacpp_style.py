"""llama.cpp's ``llama-server``: a fixed number of slots, each with its own context and a prompt
cache of the last request it served.

Followed from llama.cpp's ``tools/server/server.cpp`` (``get_available_slot``,
``update_slots``), as vendored by llama-cpp-python 0.3.36 (REFERENCES.md):

* ``-c`` context tokens are split evenly over ``-np`` slots; a request runs in one slot and
  nothing is shared between slots, so a slot's context is a pool of its own here, holding the
  tokens of the last request it served (prompt and reply) as its prompt cache;
* a waiting request takes the idle slot whose cached tokens share the largest fraction of its
  prompt (longest common prefix / prompt length), if that fraction exceeds
  ``--slot-prompt-similarity``, else the least recently used idle slot; the common prefix is
  reused and the rest of that slot's cache is overwritten;
* each ``update_slots`` pass builds one batch of at most ``--batch-size`` tokens: first one token
  per generating slot, then prompt tokens of slots still processing their prompt;
* a request that does not fit a slot's context is refused when it arrives (there is no
  retraction, preemption or cross-slot cache).
"""

from __future__ import annotations

import itertools

from luftpause.testkit.engine.model.profiles import EngineProfile
from luftpause.testkit.engine.model.state import EngineState, RequestState
from luftpause.testkit.engine.model.steps import Planned

__all__ = ["LlamaCppScheduler"]


class LlamaCppScheduler:
    """llama-server's slots over ``state`` (one pool per slot) with ``profile``'s parameters."""

    def __init__(self, state: EngineState, profile: EngineProfile) -> None:
        self._state = state
        self._profile = profile
        self._busy: list[RequestState | None] = [None] * len(state.pools)
        self._clock = itertools.count(1)
        self._last_used = [0] * len(state.pools)

    @property
    def new_token_ratio(self) -> float:
        return 1.0

    def released(self, request: RequestState) -> None:
        slot = request.slot
        if slot is not None and self._busy[slot] is request:
            self._busy[slot] = None
            self._last_used[slot] = next(self._clock)
        request.slot = None

    def _choose(self, request: RequestState, idle: list[int]) -> int:
        best, best_share = None, self._profile.slot_prompt_similarity
        for slot in idle:
            _, tokens = self._state.lookup(request, self._state.pools[slot], touch=False)
            share = tokens / request.spec.prompt_tokens
            if share > best_share:
                best, best_share = slot, share
        if best is not None:
            return best
        return min(idle, key=lambda slot: self._last_used[slot])

    def plan(self, now: float) -> list[Planned]:
        state = self._state
        for request in list(state.waiting):
            idle = [slot for slot, holder in enumerate(self._busy) if holder is None]
            if not idle:
                break
            slot = self._choose(request, idle)
            pool = state.pools[slot]
            nodes, cached = state.lookup(request, pool)
            state.pin(request, pool, nodes)
            pool.evict(pool.capacity)  # the rest of the slot's cache is overwritten
            state.admit(request, now, cached)
            self._busy[slot] = request
            request.slot = slot
        budget = self._profile.step_tokens
        planned: list[Planned] = []
        for request in state.running:
            if not request.prefilling and budget > 0:
                self._allocate(request, 1)
                planned.append(Planned.of(request, 1))
                budget -= 1
        for request in state.running:
            if request.prefilling and budget > 0:
                tokens = min(request.need, budget)
                self._allocate(request, tokens)
                planned.append(Planned.of(request, tokens))
                budget -= tokens
        return planned

    def _allocate(self, request: RequestState, tokens: int) -> None:
        if not self._state.allocate(request, tokens):
            raise AssertionError("a request outgrew its slot's context, which submit should refuse")
