"""The order of the waiting queue at each step: an engine's schedule policy.

Three policies, chosen by :class:`~.engine.EngineModel`'s ``schedule_policy``:

* ``"fcfs"``: arrival order (or by ``priority`` first, as the engine's ``priority_order`` says);
  the queue is kept sorted as requests arrive and nothing is reordered here.
* ``"lpm"``: SGLang's ``--schedule-policy lpm`` (``python/sglang/srt/managers/schedule_policy.py``,
  ``SchedulePolicy.calc_priority`` at 00550cd11b35def9d584bf761a1e32729c20a21d). Before every
  prefill the waiting queue is sorted by the tokens of each request's prompt found in the radix
  cache, longest first (``_sort_by_longest_prefix``; a stable sort, so ties keep the queue's
  current order). The match touches the matched nodes (``match_prefix`` refreshes their last
  access), which keeps the prefixes of waiting requests away from LRU eviction. In-batch prefix
  caching: a request whose cached match is at most 32 tokens
  (``IN_BATCH_PREFIX_CACHING_CHECK_THRESHOLD``) and that shares at least 32 tokens
  (``..._DEPRIORITIZE_THRESHOLD``) with a request examined before it goes to the back, so that
  only one of them computes the shared prefix first; here the shared part is the prompt's first
  node. With more than 128 requests waiting, the queue is left in its current order
  (``_determine_active_policy`` falls back to FCFS: "turn off the expensive prefix matching").
* ``"program"``: program-level first-come first-served (Continuum, arXiv 2511.02230): requests
  ordered by when their program (run) sent its first request, then by their own arrival; a
  request without a program counts as a program of its own.

Reordering writes each request's ``order`` as ``(0, position)``: requests that arrive later get
larger sequence numbers and queue behind, a vLLM preemption's ``front`` numbers are negative and
go ahead, so the queue stays sorted for :meth:`~.state.EngineState.dequeue`.
"""

from __future__ import annotations

from luftpause.testkit.engine.model.kv_pool import KVPool
from luftpause.testkit.engine.model.state import EngineState, RequestState

__all__ = ["LPM_FCFS_ABOVE", "SCHEDULE_POLICIES", "reorder"]

SCHEDULE_POLICIES = ("fcfs", "lpm", "program")
LPM_FCFS_ABOVE = 128
"""SGLang's lpm sorts no queue longer than this."""
IN_BATCH_CHECK_TOKENS = 32
IN_BATCH_DEPRIORITIZE_TOKENS = 32


def reorder(state: EngineState, pool: KVPool, policy: str) -> None:
    """Sort ``state.waiting`` as ``policy`` orders it before a step (``pool``: the radix cache an
    ``lpm`` match looks in). Raises ``ValueError`` for an unknown policy."""
    if policy == "fcfs":
        return
    waiting = state.waiting
    if policy == "lpm":
        if len(waiting) > LPM_FCFS_ABOVE:
            return
        ordered = _longest_prefix_first(state, pool, waiting)
    elif policy == "program":
        ordered = sorted(waiting, key=_program_key)
    else:
        raise ValueError(f"schedule policy must be one of {SCHEDULE_POLICIES}, got {policy!r}")
    for position, request in enumerate(ordered):
        request.order = (0, position)
    waiting[:] = ordered


def _longest_prefix_first(
    state: EngineState, pool: KVPool, waiting: list[RequestState]
) -> list[RequestState]:
    seen_heads: set[bytes] = set()
    keys: dict[int, float] = {}
    for request in waiting:
        _, cached = state.lookup(request, pool)
        head_key, head_tokens = request.spec.prompt.nodes[0]
        if cached <= IN_BATCH_CHECK_TOKENS and head_tokens >= IN_BATCH_DEPRIORITIZE_TOKENS:
            if head_key in seen_heads:
                keys[id(request)] = float("inf")
                continue
            seen_heads.add(head_key)
        keys[id(request)] = -cached
    return sorted(waiting, key=lambda r: keys[id(r)])


def _program_key(request: RequestState) -> tuple[float, float]:
    spec = request.spec
    started = spec.program_arrival if spec.program_arrival is not None else request.submitted
    return (started, request.submitted)
