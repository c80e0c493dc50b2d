"""llama.cpp's ``llama-server``: a fixed number of slots, each with its own context and the KV of
the last request it served, and a prompt cache in host memory that saves and restores slots.

Followed from llama.cpp as vendored by llama-cpp-python 0.3.36 (REFERENCES.md), files
``tools/server/server-context.cpp`` (``get_available_slot``, the task loop, ``update_slots``),
``tools/server/server-task.cpp`` (``server_prompt_cache::alloc``, ``load``, ``update``) and
``common/common.h`` (defaults):

* ``-c`` context tokens are split evenly over ``-np`` slots (``kv_unified`` is off with an
  explicit ``-np``); a request runs in one slot, a slot's context is a pool of its own here;
* a waiting request takes the idle, non-empty slot whose tokens share the largest fraction of its
  prompt (longest common prefix / prompt length), if above ``--slot-prompt-similarity`` (0.1),
  else the least recently used idle slot;
* the prompt cache (``--cache-ram``, 8192 MiB): when the slot was taken by recency, or keeps
  less than half of its tokens for this prompt, its tokens are saved to the cache (unless an
  entry holds them all; entries they hold all are dropped; the oldest entries go when the cache
  is over its limit), then the cached entry that keeps at least a quarter of its own tokens and
  beats the slot's own on both fractions (kept and shared) is restored into the slot and leaves
  the cache; after a request is launched, every idle slot is saved too (``--cache-idle-slots``);
* the request reuses the common prefix of the slot's tokens and recomputes the rest;
* each ``update_slots`` pass builds one batch of at most ``--batch-size`` tokens: first one token
  per generating slot, then prompt tokens of slots still processing their prompt;
* a request that does not fit a slot's context is refused when it arrives (there is no
  retraction or preemption).

Not modelled: the time a restore takes (a copy of the slot's state, ~23 KB per token here).
"""

from __future__ import annotations

import itertools
from collections import deque

from luftpause.testkit.engine.model.kv_pool import KVPool
from luftpause.testkit.engine.model.profiles import EngineProfile
from luftpause.testkit.engine.model.requests import PrefixNode
from luftpause.testkit.engine.model.state import EngineState, RequestState
from luftpause.testkit.engine.model.steps import Planned

__all__ = ["LlamaCppScheduler"]

Tokens = tuple[PrefixNode, ...]


def _tokens(nodes: Tokens) -> int:
    return sum(tokens for _, tokens in nodes)


def _common(a: Tokens, b: Tokens) -> int:
    """Tokens of the longest common prefix (whole nodes) of ``a`` and ``b``."""
    common = 0
    for (key_a, tokens), (key_b, _) in zip(a, b, strict=False):
        if key_a != key_b:
            break
        common += tokens
    return common


class LlamaCppScheduler:
    """llama-server's slots over ``state`` (one pool per slot) with ``profile``'s parameters."""

    def __init__(self, state: EngineState, profile: EngineProfile) -> None:
        self._state = state
        self._profile = profile
        self._busy: list[RequestState | None] = [None] * len(state.pools)
        self._clock = itertools.count(1)
        self._last_used = [0] * len(state.pools)
        # What each idle slot holds (its last request's prompt and reply), and the prompt cache.
        self._held: list[Tokens] = [() for _ in state.pools]
        self._saved: deque[Tokens] = deque()
        self.restored = 0

    @property
    def new_token_ratio(self) -> float:
        return 1.0

    @property
    def saved_tokens(self) -> int:
        """Tokens in the prompt cache (host memory)."""
        return sum(_tokens(entry) for entry in self._saved)

    def released(self, request: RequestState) -> None:
        slot = request.slot
        if slot is None or self._busy[slot] is not request:
            return
        self._busy[slot] = None
        self._last_used[slot] = next(self._clock)
        request.slot = None
        pool = self._state.pools[slot]
        nodes = request.spec.prompt.nodes
        held = nodes[: pool.match(nodes, touch=False)]
        reply = request.spec.reply
        if reply is not None and len(held) == len(nodes) and reply[0] in pool:
            held = (*held, reply)
        self._held[slot] = held

    def _choose(self, prompt: Tokens, idle: list[int]) -> tuple[int, bool]:
        """The slot for ``prompt`` and whether the prompt cache is updated (server-context.cpp,
        ``get_available_slot``)."""
        best, best_share = None, 0.0
        total = _tokens(prompt)
        for slot in idle:
            if not self._held[slot]:
                continue
            share = _common(self._held[slot], prompt) / total
            if share > best_share and share > self._profile.slot_prompt_similarity:
                best, best_share = slot, share
        if best is not None:
            kept = best_share * total / max(_tokens(self._held[best]), 1)
            return best, kept < 0.5
        return min(idle, key=lambda slot: self._last_used[slot]), True

    def _save(self, held: Tokens) -> None:
        """``server_prompt_cache::alloc`` and ``update``."""
        if not held or self._profile.ram_cache_tokens <= 0:
            return
        size = _tokens(held)
        if any(_common(entry, held) == size for entry in self._saved):
            return  # held whole already
        self._saved = deque(entry for entry in self._saved if _common(entry, held) != _tokens(entry))
        self._saved.append(held)
        while self._saved and self.saved_tokens > self._profile.ram_cache_tokens:
            self._saved.popleft()

    def _restore(self, slot: int, prompt: Tokens) -> None:
        """``server_prompt_cache::load``: the saved entry that beats the slot's own, if any."""
        held = self._held[slot]
        common = _common(held, prompt)
        best_keep = common / _tokens(held) if held and _tokens(held) else -1.0
        best_share = common / _tokens(prompt)
        best = None
        for entry in self._saved:
            size = _tokens(entry)
            if size == 0:
                continue
            shared = _common(entry, prompt)
            keep, share = shared / size, shared / _tokens(prompt)
            if keep < 0.25:
                continue
            if best_keep < keep and best_share < share:
                best, best_keep, best_share = entry, keep, share
        if best is None:
            return
        self._saved.remove(best)
        self._held[slot] = best
        self.restored += 1
        pool = self._state.pools[slot]
        pool.evict(pool.capacity)
        parent = None
        for node in best:
            pool.insert(parent, node, from_private=False)
            parent = node[0]

    def plan(self, now: float) -> list[Planned]:
        state = self._state
        for request in list(state.waiting):
            idle = [slot for slot, holder in enumerate(self._busy) if holder is None]
            if not idle:
                break
            prompt = request.spec.prompt.nodes
            slot, update = self._choose(prompt, idle)
            if update and self._profile.ram_cache_tokens > 0:
                self._save(self._held[slot])
                self._restore(slot, prompt)
            pool: KVPool = state.pools[slot]
            nodes, cached = state.lookup(request, pool)
            state.pin(request, pool, nodes)
            pool.evict(pool.capacity)  # the rest of the slot's tokens are overwritten
            state.admit(request, now, cached)
            self._busy[slot] = request
            self._held[slot] = ()
            request.slot = slot
            for other, holder in enumerate(self._busy):
                if holder is None:
                    self._save(self._held[other])
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
