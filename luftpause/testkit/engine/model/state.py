"""The engine model's state: every request it holds, the waiting queue, the running batch, the KV
pool and the counters, with the transitions the scheduler styles share.

A request is *waiting* (in ``waiting``, holding no KV) or *running* (in ``running``, in admission
order, holding KV: the prefix nodes it pinned plus private tokens). Its sequence is its prompt
then the tokens it generated; ``kv`` of those have KV computed. A running request needs
``seq_tokens - kv`` tokens computed before the engine samples its next token: the prompt's
uncached part at first, then 1 per decode step (the KV of the token sampled last). A retracted
request keeps its generated tokens (as SGLang keeps ``output_ids`` and vLLM its output token ids)
and recomputes prompt + those tokens when admitted again, finding what the prefix cache still
holds of its prompt.

Transitions (each emits its event into ``events``): :meth:`EngineState.admit`,
:meth:`EngineState.commit` (a step computed ``n`` tokens of a request; complete prompt nodes enter
the prefix tree pinned, and when the sequence is computed the next token is sampled),
:meth:`EngineState.retract`, :meth:`EngineState.finish`, :meth:`EngineState.cancel`.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass, field

from luftpause.testkit.engine.model.kv_pool import KVPool
from luftpause.testkit.engine.model.requests import (
    EngineEvent,
    EngineRequest,
    FirstTokenGenerated,
    PrefixNode,
    RequestAdmitted,
    RequestFinished,
    RequestRetracted,
)

__all__ = ["PRIORITY_ORDERS", "EngineState", "RequestState"]

# How the waiting queue is ordered: arrival only; or by priority, lower value first (vLLM
# ``--scheduling-policy priority``) or higher first (SGLang ``--enable-priority-scheduling``).
PRIORITY_ORDERS = ("fcfs", "lower_first", "higher_first")


@dataclass(slots=True, eq=False)
class RequestState:
    """One request the engine holds; see the module docstring. ``epoch`` changes whenever the
    request loses its KV (retracted, cancelled), so a step planned before knows to skip it."""

    spec: EngineRequest
    submitted: float
    arrival: int = 0
    order: tuple[int, int] = (0, 0)
    """``(rank, sequence)``: the waiting queue is kept sorted by it (see :mod:`.queue_order`)."""
    generated: int = 0
    kv: int = 0
    pool: KVPool | None = None
    locked: int = 0
    locked_tokens: int = 0
    private: int = 0
    prefilling: bool = False
    first_cached: int | None = None
    recomputed: int = 0
    retractions: int = 0
    epoch: int = 0
    running: bool = False
    slot: int | None = None

    @property
    def request_id(self) -> str:
        return self.spec.request_id

    @property
    def seq_tokens(self) -> int:
        """Prompt tokens plus the tokens generated so far."""
        return self.spec.prompt_tokens + self.generated

    @property
    def need(self) -> int:
        """Tokens to compute before the next token is sampled (0 while waiting)."""
        return self.seq_tokens - self.kv if self.running else 0

    @property
    def remaining_new_tokens(self) -> int:
        """``max_tokens`` not generated yet."""
        return max(self.spec.max_new_tokens - self.generated, 0)


@dataclass(slots=True)
class EngineState:
    """Requests, queue, batch, KV pools and counters of one engine (see the module docstring).

    ``pools``: one shared pool (SGLang, vLLM), or one per slot (llama.cpp), each with its prefix
    tree; a running request holds KV in the pool it was admitted to (``RequestState.pool``).
    """

    pools: list[KVPool]
    priority_order: str = "fcfs"
    requests: dict[str, RequestState] = field(default_factory=dict)
    waiting: list[RequestState] = field(default_factory=list)
    running: list[RequestState] = field(default_factory=list)
    events: list[EngineEvent] = field(default_factory=list)
    retractions: int = 0
    prompt_tokens_total: int = 0
    cached_tokens_total: int = 0
    generated_tokens_total: int = 0
    finished_total: int = 0
    last_prefill_queried: int = 0
    last_prefill_hit: int = 0
    _arrivals: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _front: itertools.count[int] = field(default_factory=lambda: itertools.count(-1, -1))

    def __post_init__(self) -> None:
        if self.priority_order not in PRIORITY_ORDERS:
            raise ValueError(f"priority_order must be one of {PRIORITY_ORDERS}, got {self.priority_order!r}")

    # --- the waiting queue ----------------------------------------------------------------------

    def rank(self, priority: int) -> int:
        """Queue rank of ``priority`` under ``priority_order`` (lower goes first)."""
        return {"fcfs": 0, "lower_first": priority, "higher_first": -priority}[self.priority_order]

    def enqueue(self, request: RequestState, front: bool = False) -> None:
        """Into the waiting queue: by rank, then at the back (or, ``front``, ahead of its rank)."""
        sequence = next(self._front) if front else next(self._arrivals)
        request.order = (self.rank(request.spec.priority), sequence)
        request.running = False
        bisect.insort(self.waiting, request, key=lambda r: r.order)

    def dequeue(self, request: RequestState) -> None:
        index = bisect.bisect_left(self.waiting, request.order, key=lambda r: r.order)
        if index >= len(self.waiting) or self.waiting[index] is not request:
            raise ValueError(f"{request.request_id} is not waiting")
        del self.waiting[index]

    # --- prefix cache lookups -------------------------------------------------------------------

    def lookup(self, request: RequestState, pool: KVPool, touch: bool = True) -> tuple[int, int]:
        """``(nodes, tokens)`` of the request's prompt found in ``pool``'s prefix tree (touched
        unless not ``touch``). Tokens are capped at ``seq_tokens - 1``: the engines compute at
        least one token."""
        nodes = request.spec.prompt.nodes
        found = pool.match(nodes, touch=touch)
        tokens = sum(tokens for _, tokens in nodes[:found])
        return found, min(tokens, request.seq_tokens - 1)

    # --- transitions ----------------------------------------------------------------------------

    def pin(self, request: RequestState, pool: KVPool, nodes: int) -> None:
        """Pin the first ``nodes`` prompt nodes of a waiting request in ``pool`` before
        :meth:`admit`, so that making room for it cannot evict them (undo: :meth:`unpin`)."""
        pool.lock(node_keys(request.spec.prompt.nodes[:nodes]))
        request.pool = pool
        request.locked = nodes
        request.locked_tokens = sum(tokens for _, tokens in request.spec.prompt.nodes[:nodes])

    def unpin(self, request: RequestState) -> None:
        """Undo :meth:`pin` of a request that was not admitted after all."""
        assert request.pool is not None and not request.running
        request.pool.unlock(node_keys(request.spec.prompt.nodes[: request.locked]))
        request.pool = None
        request.locked = 0
        request.locked_tokens = 0

    def admit(self, request: RequestState, now: float, cached: int) -> None:
        """Waiting -> running, its prompt's cached nodes pinned (:meth:`pin`) and ``cached``
        tokens of KV; counts the lookup. The caller allocates what it computes."""
        self.dequeue(request)
        request.kv = cached
        request.running = True
        request.prefilling = True
        self.running.append(request)
        queried = request.seq_tokens
        self.prompt_tokens_total += queried
        self.cached_tokens_total += cached
        self.last_prefill_queried += queried
        self.last_prefill_hit += cached
        if request.first_cached is None:
            request.first_cached = cached
        else:
            request.recomputed += queried - cached
        self.events.append(RequestAdmitted(request.request_id, now, cached))

    def commit(self, request: RequestState, tokens: int, now: float) -> bool:
        """A step ending at ``now`` computed ``tokens`` of the request (allocated when it was
        planned). Complete prompt nodes enter the prefix tree, pinned; when the sequence is all
        computed the next token is sampled. Returns whether the request is finished (the caller
        then calls :meth:`finish`)."""
        request.kv += tokens
        nodes = request.spec.prompt.nodes
        while request.locked < len(nodes) and request.locked_tokens + nodes[request.locked][1] <= request.kv:
            key, node_tokens = nodes[request.locked]
            parent = nodes[request.locked - 1][0] if request.locked else None
            pool = _pool_of(request)
            pool.insert(parent, (key, node_tokens), from_private=True)
            request.private -= node_tokens
            pool.lock([key])
            request.locked += 1
            request.locked_tokens += node_tokens
        if request.kv < request.seq_tokens:
            return False
        request.generated += 1
        self.generated_tokens_total += 1
        if request.prefilling:
            request.prefilling = False
            if request.generated == 1:
                self.events.append(FirstTokenGenerated(request.request_id, now))
        return request.generated >= request.spec.output_tokens

    def allocate(self, request: RequestState, tokens: int) -> bool:
        """Give the request ``tokens`` private KV tokens (evicting unpinned prefixes as needed);
        ``False`` when they do not fit."""
        if not _pool_of(request).allocate(tokens):
            return False
        request.private += tokens
        return True

    def _drop_kv(self, request: RequestState) -> None:
        pool = _pool_of(request)
        pool.release(request.private)
        request.private = 0
        pool.unlock(node_keys(request.spec.prompt.nodes[: request.locked]))
        request.pool = None
        request.locked = 0
        request.locked_tokens = 0
        request.kv = 0
        request.prefilling = False
        request.epoch += 1
        self.running.remove(request)

    def retract(self, request: RequestState, now: float, front: bool) -> None:
        """Running -> waiting, its private KV freed and its prefix nodes unpinned (they stay in
        the prefix cache until evicted); back in the queue at its rank's back (SGLang) or
        ``front`` (vLLM's ``prepend_request``)."""
        self._drop_kv(request)
        request.retractions += 1
        self.retractions += 1
        self.enqueue(request, front=front)
        self.events.append(RequestRetracted(request.request_id, now, request.generated))

    def finish(self, request: RequestState, now: float) -> None:
        """Running -> gone. The reply node is cached after the prompt when it fits in free and
        evictable tokens (its prompt still pinned meanwhile), then the prompt is unpinned."""
        pool = _pool_of(request)
        pool.release(request.private)
        request.private = 0
        reply = request.spec.reply
        nodes = request.spec.prompt.nodes
        if reply is not None and request.locked == len(nodes) and pool.reserve(reply[1]):
            pool.insert(nodes[-1][0], reply, from_private=False)
        pool.unlock(node_keys(nodes[: request.locked]))
        request.pool = None
        request.locked = 0
        request.locked_tokens = 0
        request.running = False
        request.epoch += 1
        self.running.remove(request)
        del self.requests[request.request_id]
        self.finished_total += 1
        self.events.append(
            RequestFinished(
                request.request_id,
                now,
                prompt_tokens=request.spec.prompt_tokens,
                cached_tokens=request.first_cached or 0,
                completion_tokens=request.generated,
                recomputed_tokens=request.recomputed,
                retractions=request.retractions,
            )
        )

    def cancel(self, request: RequestState) -> None:
        """Gone at once: out of the queue, or its KV freed (what it computed of the prompt stays
        cached, unpinned)."""
        if request.running:
            self._drop_kv(request)
        else:
            if request.pool is not None:
                self.unpin(request)
            self.dequeue(request)
        del self.requests[request.request_id]


def _pool_of(request: RequestState) -> KVPool:
    if request.pool is None:
        raise ValueError(f"{request.request_id} holds no KV")
    return request.pool


def node_keys(nodes: tuple[PrefixNode, ...]) -> list[bytes]:
    """The keys of ``nodes``."""
    return [key for key, _ in nodes]
