"""What a simulated engine serves and how fast it pretends to be."""

from __future__ import annotations

import math
from dataclasses import dataclass

from luftpause.testkit.engine.faults import Fault
from luftpause.testkit.engine.model.profiles import EngineProfile, profile

DEFAULT_MODEL = "llama-3.2-1b"

# Context tokens one running slot may hold: the simulated KV pool is slots x this many tokens.
CONTEXT_TOKENS_PER_SLOT = 8192

# The context length the slot model reports (``max_model_len`` in /v1/models and /tokenize,
# ``context_length`` in its server info): Llama 3.2's 128k. It enforces none; the dataplane caps a
# turn's output tokens by it.
MAX_MODEL_LEN = 131072

# Which Prometheus names /metrics uses.
METRIC_NAMINGS = ("sglang", "vllm", "both")

# The front-door APIs the simulator can serve (``apis``): Chat Completions always.
API_NAMES = ("chat", "messages", "responses")

# How the waiting queue is ordered: arrival only; or by the request's ``priority`` field, lower
# value first as vLLM (``--scheduling-policy priority``), or higher first as SGLang
# (``--enable-priority-scheduling``); equal priorities keep arrival order.
PRIORITY_ORDERS = ("fcfs", "lower_first", "higher_first")

# How the step model reorders its waiting queue before each step: arrival order, or SGLang's
# ``--schedule-policy lpm`` (longest cached prefix first; :mod:`.model.queue_order`).
SCHEDULE_POLICIES = ("fcfs", "lpm")


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """One simulated engine replica.

    * ``models``: model names it serves (``/v1/models`` order); any other model is answered 404.
    * ``slots``: requests decoded at once (continuous batching); the rest wait in a queue.
    * ``priority_order``: one of :data:`PRIORITY_ORDERS` (default ``"fcfs"``: the ``priority``
      field is accepted and ignored, as by an engine started without priority scheduling).
    * ``prefill_ms_per_1k``: milliseconds of prefill per 1,000 prompt tokens not in the prefix
      cache.
    * ``decode_ms``: milliseconds per output token when the request runs alone.
    * ``batch_slowdown``: how much each other running request adds to the per-token decode time,
      as a fraction of ``decode_ms`` (0.1: 4 running requests decode at 1.3 x ``decode_ms`` each).
    * ``cache_tokens``: the prefix cache's bound in tokens (LRU eviction beyond it); ``None`` (the
      default) for the size of the KV pool, ``slots * CONTEXT_TOKENS_PER_SLOT``; 0 for no cache.
    * ``time_scale``: every simulated duration (prefill, decode) is multiplied by it; 0.1 makes a
      3-minute experiment take 18 s. Fault durations (``stall`` seconds, ``slow`` delays) are
      wall-clock times as asked, never scaled.
    * ``metrics``: one of :data:`METRIC_NAMINGS`: the names ``/metrics`` uses.
    * ``max_tokens``: reply length in tokens when the request sets neither ``max_tokens`` nor
      ``max_completion_tokens`` (or sets them to 0).
    * ``tool_rounds``: tool rounds (assistant messages with ``tool_calls`` after the last user
      message) before the simulated model gives a final text answer.
    * ``seed``: varies the filler text and which offered tool is chosen, the classifier's labels,
      and which requests get ``fault``; never the ids, which are random so that two replicas never
      emit the same ``tool_call`` id.
    * ``fault``: a fault (see :mod:`.faults`) given to requests that carry no ``luftpause_fault``
      field of their own; ``None`` (the default) for none.
    * ``fault_rate``: the fraction of those requests (0 to 1) that get ``fault``, drawn at random
      from ``seed``; read only when ``fault`` is set.
    * ``labels``: the classes of the simulated single-pass model behind ``POST /classify`` (at
      least 2, distinct), in the order of its ``probs``.
    * ``apis``: the front-door APIs served: ``"chat"`` always, and ``"messages"`` (``POST
      /v1/messages``) and ``"responses"`` (``POST /v1/responses``) natively when named
      (:mod:`.dialects`); a route not served answers 404, as an engine without it does.
    * ``model_faults``: ``(model, fault)`` pairs: every request for that model that carries no
      ``luftpause_fault`` of its own gets that fault (before ``fault``), so a client that cannot
      put the field in the body (a translated turn) can still steer the engine; each model named
      is served too.
    * ``profile``: the name of an engine profile (:data:`.model.profiles.PROFILES`) to run the
      step model (:mod:`.stepped`) instead of today's slot model: one KV pool shared by running
      requests and the prefix cache, steps shared by every running request, SGLang's, vLLM's or
      llama.cpp's scheduling. ``None`` (the default): the slot model, where ``slots``,
      ``prefill_ms_per_1k``, ``decode_ms``, ``batch_slowdown`` and ``cache_tokens`` apply; with a
      profile they do not, and ``pool_tokens``, ``step_tokens`` and ``max_running`` override the
      profile's figures (``None``: the profile's).
    * ``idle_close_ms``: a ``POST`` arriving on a kept-alive connection idle for this many
      milliseconds or more is dropped unanswered and the connection reset, as when an engine's idle
      close (uvicorn's and llama-server's: 5,000 ms) crosses a request (:mod:`.idle_close`);
      ``None`` (the default): never. Wall-clock, never scaled.
    * ``schedule_policy``: one of :data:`SCHEDULE_POLICIES` (default ``"fcfs"``); ``"lpm"`` (SGLang's
      longest-prefix-match order of the waiting queue) needs a profile with a shared KV pool (an
      SGLang or vLLM profile) and ``priority_order`` ``"fcfs"``.
    """

    models: tuple[str, ...] = (DEFAULT_MODEL,)
    slots: int = 4
    priority_order: str = "fcfs"
    prefill_ms_per_1k: float = 5.0
    decode_ms: float = 2.0
    batch_slowdown: float = 0.1
    cache_tokens: int | None = None
    time_scale: float = 1.0
    metrics: str = "sglang"
    max_tokens: int = 64
    tool_rounds: int = 2
    seed: int = 0
    fault: Fault | None = None
    fault_rate: float = 1.0
    labels: tuple[str, ...] = ("negative", "positive")
    apis: tuple[str, ...] = ("chat",)
    model_faults: tuple[tuple[str, Fault], ...] = ()
    profile: str | None = None
    pool_tokens: int | None = None
    step_tokens: int | None = None
    max_running: int | None = None
    idle_close_ms: float | None = None
    schedule_policy: str = "fcfs"

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("an engine must serve at least one model")
        if (
            "chat" not in self.apis
            or not set(self.apis) <= set(API_NAMES)
            or len(set(self.apis)) != len(self.apis)
        ):
            raise ValueError(
                f"apis must be 'chat' and any of 'messages', 'responses', each once; got {self.apis}"
            )
        missing = [model for model, _ in self.model_faults if model not in self.models]
        if missing:
            raise ValueError(f"model_faults name models not served: {missing}")
        if self.slots < 1:
            raise ValueError(f"slots must be at least 1, got {self.slots}")
        if self.priority_order not in PRIORITY_ORDERS:
            raise ValueError(f"priority_order must be one of {PRIORITY_ORDERS}, got {self.priority_order!r}")
        for name in ("prefill_ms_per_1k", "decode_ms", "batch_slowdown"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite number, not negative; got {value}")
        if not (math.isfinite(self.time_scale) and self.time_scale > 0):
            raise ValueError(f"time_scale must be a positive number, got {self.time_scale}")
        if self.cache_tokens is not None and self.cache_tokens < 0:
            raise ValueError(f"cache_tokens must not be negative, got {self.cache_tokens}")
        if self.metrics not in METRIC_NAMINGS:
            raise ValueError(f"metrics must be one of {METRIC_NAMINGS}, got {self.metrics!r}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.tool_rounds < 0:
            raise ValueError(f"tool_rounds must not be negative, got {self.tool_rounds}")
        if len(self.labels) < 2 or len(set(self.labels)) != len(self.labels):
            raise ValueError(f"labels must be at least 2 distinct names, got {self.labels}")
        if not (math.isfinite(self.fault_rate) and 0.0 <= self.fault_rate <= 1.0):
            raise ValueError(f"fault_rate must be from 0 to 1, got {self.fault_rate}")
        for name in ("pool_tokens", "step_tokens", "max_running"):
            value = getattr(self, name)
            if value is not None and self.profile is None:
                raise ValueError(f"{name} needs a profile (it sizes the step model)")
            if value is not None and value < 1:
                raise ValueError(f"{name} must be at least 1, got {value}")
        idle_close = self.idle_close_ms
        if idle_close is not None and not (math.isfinite(idle_close) and idle_close > 0):
            raise ValueError(f"idle_close_ms must be a positive number, got {self.idle_close_ms}")
        # Raises ValueError naming the known profiles, or for overrides the profile cannot take.
        engine = self.engine_profile
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(
                f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {self.schedule_policy!r}"
            )
        if self.schedule_policy != "fcfs" and (
            engine is None or engine.style == "llamacpp" or self.priority_order != "fcfs"
        ):
            raise ValueError(
                f"schedule_policy {self.schedule_policy!r} needs a profile with a shared KV pool (sglang "
                "or vllm) and priority_order 'fcfs'"
            )

    def model_fault(self, model: str) -> Fault | None:
        """The fault every request for ``model`` gets (``model_faults``), else ``None``."""
        for name, fault in self.model_faults:
            if name == model:
                return fault
        return None

    @property
    def engine_profile(self) -> EngineProfile | None:
        """The named profile with this engine's overrides, or ``None`` for the slot model."""
        if self.profile is None:
            return None
        changes = {
            name: getattr(self, name)
            for name in ("pool_tokens", "step_tokens", "max_running")
            if getattr(self, name) is not None
        }
        base = profile(self.profile)
        return base.with_changes(**changes) if changes else base

    @property
    def kv_tokens(self) -> int:
        """Tokens the simulated KV pool holds: the profile's pool, else ``slots *
        CONTEXT_TOKENS_PER_SLOT``."""
        engine = self.engine_profile
        return engine.pool_tokens if engine is not None else self.slots * CONTEXT_TOKENS_PER_SLOT

    @property
    def prefix_cache_tokens(self) -> int:
        """The prefix cache's bound in tokens (``cache_tokens``, or the KV pool's size)."""
        return self.kv_tokens if self.cache_tokens is None else self.cache_tokens
