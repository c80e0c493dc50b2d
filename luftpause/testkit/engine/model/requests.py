"""What goes into the engine model and what comes out: requests, events, the load it reports.

Everything here is a frozen, slotted dataclass. Times are floats of seconds on the caller's clock
(virtual or ``loop.time()``); token counts are ints.
"""

from __future__ import annotations

from dataclasses import dataclass

from luftpause.testkit.engine.prefix_cache import PrefixPath

__all__ = [
    "EngineEvent",
    "EngineLoad",
    "EngineRequest",
    "FirstTokenGenerated",
    "PrefixNode",
    "RequestAdmitted",
    "RequestFinished",
    "RequestRetracted",
]

# One node of a prompt's path: (key, tokens). The key is chained over every node before it, so
# equal keys mean equal prefixes (see :mod:`luftpause.testkit.engine.prefix_cache`).
PrefixNode = tuple[bytes, int]


@dataclass(frozen=True, slots=True)
class EngineRequest:
    """One generation request, as an engine's scheduler sees it.

    * ``request_id``: unique among the requests the engine holds (waiting or running).
    * ``prompt``: the prompt as a path of prefix nodes, root first (one node per message, each
      keyed by a hash chained over the nodes before it); its tokens are the prompt's tokens.
    * ``output_tokens``: how many tokens the request generates before it finishes (at least 1):
      the reply's length, decided by whoever simulates the model.
    * ``reply``: the node the generated reply becomes, ``(key, tokens)``, cached after the prompt
      when the request finishes (the run's next turn carries prompt + reply + tool result), or
      ``None`` to cache nothing after the prompt.
    * ``priority``: the request's ``priority`` field; how it orders the waiting queue is the
      engine's ``priority_order``.
    * ``max_tokens``: the request's ``max_tokens`` (``None``: ``output_tokens``). SGLang reserves
      KV room for ``max_tokens`` (scaled by its new-token ratio), not for what the request will
      really generate; a real model usually stops before ``max_tokens``.
    * ``program_arrival``: when the request's program (an agent's run) sent its first request,
      seconds on the caller's clock, or ``None`` (a program of its own); only the ``program``
      schedule policy reads it (:mod:`.queue_order`).

    Raises ``ValueError`` for an empty prompt, ``output_tokens < 1``, ``max_tokens <
    output_tokens``, or a node or reply of fewer than 0 tokens.
    """

    request_id: str
    prompt: PrefixPath
    output_tokens: int
    reply: PrefixNode | None = None
    priority: int = 0
    max_tokens: int | None = None
    program_arrival: float | None = None

    def __post_init__(self) -> None:
        if not self.prompt.nodes or self.prompt.tokens < 1:
            raise ValueError(f"request {self.request_id!r}: the prompt must hold at least 1 token")
        if any(tokens < 0 for _, tokens in self.prompt.nodes):
            raise ValueError(f"request {self.request_id!r}: a prompt node has negative tokens")
        if self.output_tokens < 1:
            raise ValueError(f"request {self.request_id!r}: output_tokens must be at least 1")
        if self.max_tokens is not None and self.max_tokens < self.output_tokens:
            raise ValueError(
                f"request {self.request_id!r}: max_tokens {self.max_tokens} is below "
                f"output_tokens {self.output_tokens}"
            )
        if self.reply is not None and self.reply[1] < 0:
            raise ValueError(f"request {self.request_id!r}: the reply node has negative tokens")

    @property
    def prompt_tokens(self) -> int:
        return self.prompt.tokens

    @property
    def max_new_tokens(self) -> int:
        """``max_tokens``, else ``output_tokens``."""
        return self.output_tokens if self.max_tokens is None else self.max_tokens


@dataclass(frozen=True, slots=True)
class RequestAdmitted:
    """``request_id`` left the waiting queue at ``time`` (a step began that computes it), its
    prefix cache lookup finding ``cached_tokens``. A retracted request is admitted again later."""

    request_id: str
    time: float
    cached_tokens: int


@dataclass(frozen=True, slots=True)
class FirstTokenGenerated:
    """The step that computed the last prompt token of ``request_id`` ended at ``time``: its
    first output token exists (time to first token is ``time`` minus the submit time)."""

    request_id: str
    time: float


@dataclass(frozen=True, slots=True)
class RequestFinished:
    """``request_id`` generated its last token at ``time`` and left the engine.

    ``prompt_tokens``; ``cached_tokens``: of those, found in the prefix cache at its first
    admission (what a response's ``usage.prompt_tokens_details.cached_tokens`` reports);
    ``completion_tokens``: tokens generated (``output_tokens``); ``recomputed_tokens``: tokens
    computed again after retractions (0 if never retracted); ``retractions``: how often it was
    retracted (SGLang) or preempted (vLLM).
    """

    request_id: str
    time: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    recomputed_tokens: int = 0
    retractions: int = 0


@dataclass(frozen=True, slots=True)
class RequestRetracted:
    """``request_id`` was retracted (SGLang's ``retract_decode``) or preempted (vLLM's
    preemption by recompute) at ``time``, having generated ``generated`` tokens so far: its KV
    outside the prefix cache was freed and it waits again, to recompute prompt + those tokens
    when admitted again. Its client sees only a pause in the stream."""

    request_id: str
    time: float
    generated: int


EngineEvent = RequestAdmitted | FirstTokenGenerated | RequestFinished | RequestRetracted


@dataclass(frozen=True, slots=True)
class EngineLoad:
    """What an engine's ``/metrics`` reports, at one moment.

    * ``running``, ``waiting``: requests (``sglang:num_running_reqs`` / ``num_queue_reqs``,
      ``vllm:num_requests_running`` / ``num_requests_waiting``); retracted ones count as waiting.
    * ``pool_tokens``: the KV pool's size in tokens (SGLang's ``max_total_num_tokens``).
    * ``used_tokens``: tokens held by running requests, the prefix nodes they pin included;
      ``cached_tokens``: tokens of the prefix cache (pinned or not); ``evictable_tokens``: of
      those, not pinned. ``used_tokens + (cached_tokens - pinned) + free = pool_tokens``.
    * ``token_usage``: ``used_tokens / pool_tokens``, as SGLang's ``sglang:token_usage`` and
      vLLM's ``vllm:kv_cache_usage_perc`` both count it (evictable cache counts as free).
    * ``cache_hit_rate``: cached / prompt tokens of the requests admitted in the last prefill
      (``sglang:cache_hit_rate``); 0 before any.
    * ``retractions``: requests retracted or preempted since start (``vllm:num_preemptions``).
    * ``prompt_tokens_total``, ``cached_tokens_total``: prompt tokens looked up in the prefix
      cache and, of those, found (vLLM's ``prefix_cache_queries`` / ``prefix_cache_hits``; a
      recompute after retraction is looked up again and counts again).
    * ``generated_tokens_total``: output tokens generated; ``finished_total``: requests finished.
    * ``new_token_ratio``: SGLang's current new-token ratio (1.0 for other styles).
    """

    running: int
    waiting: int
    pool_tokens: int
    used_tokens: int
    cached_tokens: int
    evictable_tokens: int
    token_usage: float
    cache_hit_rate: float
    retractions: int
    prompt_tokens_total: int
    cached_tokens_total: int
    generated_tokens_total: int
    finished_total: int
    new_token_ratio: float
