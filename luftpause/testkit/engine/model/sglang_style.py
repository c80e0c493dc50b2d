"""SGLang's scheduler: reserve for ``max_tokens`` scaled by the new-token ratio, prefill first,
retract when decode runs out of room.

Followed from SGLang's source (``python/sglang/srt/managers/``):

* ``schedule_policy.py`` (``PrefillAdder``, at 00550cd11b35def9d584bf761a1e32729c20a21d): a
  prefill batch takes waiting requests in queue order while ``rem_total_tokens`` (free plus
  evictable tokens, minus ``min(max_new_tokens - generated, CLIP_MAX_NEW_TOKENS) x
  new_token_ratio`` for every running request, minus ``extend + max_new`` for each one admitted
  into this batch) stays above the candidate's ``extend + max_new + page_size``; the first that
  does not fit stops the batch (``NO_TOKEN``), so the queue's head is never overtaken. The
  candidate's cached prefix is pinned while it is weighed (``_lock_node``). Prefill tokens per
  batch are bounded by ``chunked_prefill_size``: a request whose uncached part does not fit is
  cut to what is left and continues as *the* chunked request in the next prefill batch.
* ``scheduler.py`` (``get_next_batch_to_run``): a prefill batch, when one can be formed, runs
  instead of decode (no ``--enable-mixed-chunk``); otherwise every running request decodes one
  token. Before a decode step, ``check_decode_mem`` asks for one token per request (evicting
  the radix cache as needed); when even that fails, ``retract_decode``; otherwise the
  new-token ratio decays by one step. When idle, the ratio returns to its start.
* ``schedule_batch.py`` (``retract_decode``, ``release_req``, at
  000eaffacf048e51b64d4d72985ef8f0b7054b39): requests sorted by (output tokens, -input tokens),
  the one with the fewest output tokens (then the longest input) retracted first, at least one
  and then more while the rest lack one token each; a retracted request frees the KV beyond
  its cached prefix, unpins it and goes to the back of the queue, and the ratio becomes
  ``min(1, (decoded + retract_decode_steps x kept) / sum of kept max_new_tokens)``.
"""

from __future__ import annotations

from luftpause.testkit.engine.model.profiles import EngineProfile
from luftpause.testkit.engine.model.state import EngineState, RequestState
from luftpause.testkit.engine.model.steps import Planned

__all__ = ["SglangScheduler"]


class SglangScheduler:
    """SGLang's scheduling over ``state`` (one shared pool) with ``profile``'s parameters."""

    def __init__(self, state: EngineState, profile: EngineProfile) -> None:
        self._state = state
        self._profile = profile
        self._pool = state.pools[0]
        self._ratio = profile.init_new_token_ratio
        self._chunked: RequestState | None = None

    @property
    def new_token_ratio(self) -> float:
        return self._ratio

    def released(self, request: RequestState) -> None:
        if request is self._chunked:
            self._chunked = None

    def plan(self, now: float) -> list[Planned]:
        if self._chunked is not None and not self._chunked.running:
            self._chunked = None
        prefill = self._prefill(now)
        if prefill:
            return prefill
        if not self._state.running:
            self._ratio = self._profile.init_new_token_ratio
            return []
        return self._decode(now)

    def _reserved(self, request: RequestState) -> int:
        return min(request.remaining_new_tokens, self._profile.clip_max_new_tokens)

    def _prefill(self, now: float) -> list[Planned]:
        state, pool, profile = self._state, self._pool, self._profile
        budget = profile.step_tokens
        planned: list[Planned] = []
        offset = sum(self._reserved(r) * self._ratio for r in state.running if r is not self._chunked)
        chunked = self._chunked
        if chunked is not None:
            tokens = min(chunked.need, budget, pool.free + pool.evictable)
            if tokens > 0 and state.allocate(chunked, tokens):
                planned.append(Planned.of(chunked, tokens))
                budget -= tokens
                finishing = tokens == chunked.need
                offset += tokens + (self._reserved(chunked) if finishing else 0)
                if finishing:
                    self._chunked = None
        queried = hit = 0
        for request in list(state.waiting):
            if budget <= 0 or len(state.running) >= profile.max_running:
                break
            nodes, cached = state.lookup(request, pool)
            state.pin(request, pool, nodes)
            extend = request.seq_tokens - cached
            reserve = self._reserved(request)
            if extend + reserve + 1 >= pool.free + pool.evictable - offset:
                state.unpin(request)
                break
            tokens = min(extend, budget)
            state.admit(request, now, cached)
            if not state.allocate(request, tokens):
                raise AssertionError("rem_total_tokens admitted a request the pool cannot hold")
            planned.append(Planned.of(request, tokens))
            queried += request.seq_tokens
            hit += cached
            budget -= tokens
            if tokens < extend:
                self._chunked = request
                offset += tokens
            else:
                offset += extend + reserve
        if queried:
            state.last_prefill_queried, state.last_prefill_hit = queried, hit
        return planned

    def _decode(self, now: float) -> list[Planned]:
        state, pool, profile = self._state, self._pool, self._profile
        batch = [r for r in state.running if not r.prefilling]
        if not batch:
            return []
        if pool.can_reserve(len(batch)):
            self._ratio = max(self._ratio - profile.new_token_ratio_decay, profile.min_new_token_ratio)
        else:
            batch = self._retract(batch, now)
        planned = []
        for request in batch:
            if not state.allocate(request, 1):
                raise AssertionError("decode found no room after retraction")
            planned.append(Planned.of(request, 1))
        return planned

    def _retract(self, batch: list[RequestState], now: float) -> list[RequestState]:
        state, pool, profile = self._state, self._pool, self._profile
        kept = sorted(batch, key=lambda r: (r.generated, -r.spec.prompt_tokens), reverse=True)
        first = True
        while first or not pool.can_reserve(len(kept)):
            if len(kept) == 1:
                break
            first = False
            state.retract(kept.pop(), now, front=False)
        decoded = sum(r.generated for r in kept)
        budgeted = sum(r.spec.max_new_tokens for r in kept)
        self._ratio = min(1.0, (decoded + profile.retract_decode_steps * len(kept)) / budgeted)
        return [r for r in state.running if r in kept]
