"""What a simulated engine serves and how fast it pretends to be."""

from __future__ import annotations

import math
from dataclasses import dataclass

from luftpause.testkit.engine.faults import Fault

DEFAULT_MODEL = "llama-3.2-1b"


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """One simulated engine replica.

    * ``models``: model names it serves (``/v1/models`` order); any other model is answered 404.
    * ``slots``: requests decoded at once; the rest wait in a FIFO queue (SGLang's running/queue).
    * ``prefill_ms_per_1k``: milliseconds of prefill per 1,000 prompt tokens.
    * ``decode_ms``: milliseconds per output token.
    * ``max_tokens``: reply length in tokens when the request sets neither ``max_tokens`` nor
      ``max_completion_tokens`` (or sets them to 0).
    * ``tool_rounds``: tool rounds (assistant messages with ``tool_calls`` after the last user
      message) before the simulated model gives a final text answer.
    * ``seed``: varies the filler text and which offered tool is chosen, and which requests get
      ``fault``; never the ids, which are random so that two replicas never emit the same
      ``tool_call`` id.
    * ``fault``: a fault (see :mod:`.faults`) given to requests that carry no ``luftpause_fault``
      field of their own; ``None`` (the default) for none.
    * ``labels``: the classes of the simulated single-pass model behind ``POST /classify`` (at
      least 2, distinct), in the order of its ``probs``.
    * ``fault_rate``: the fraction of those requests (0 to 1) that get ``fault``, drawn at random
      from ``seed``; read only when ``fault`` is set.
    """

    models: tuple[str, ...] = (DEFAULT_MODEL,)
    slots: int = 4
    prefill_ms_per_1k: float = 5.0
    decode_ms: float = 2.0
    max_tokens: int = 64
    tool_rounds: int = 2
    seed: int = 0
    fault: Fault | None = None
    fault_rate: float = 1.0
    labels: tuple[str, ...] = ("negative", "positive")
    # Later behaviour (a prefix cache, batch-size effects on decode, vLLM metric names) each gets
    # its own field here; costs.py and metrics.py are where it acts.

    def __post_init__(self) -> None:
        if not self.models:
            raise ValueError("an engine must serve at least one model")
        if self.slots < 1:
            raise ValueError(f"slots must be at least 1, got {self.slots}")
        if self.prefill_ms_per_1k < 0 or self.decode_ms < 0:
            raise ValueError("prefill and decode times must not be negative")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if self.tool_rounds < 0:
            raise ValueError(f"tool_rounds must not be negative, got {self.tool_rounds}")
        if len(self.labels) < 2 or len(set(self.labels)) != len(self.labels):
            raise ValueError(f"labels must be at least 2 distinct names, got {self.labels}")
        if not (math.isfinite(self.fault_rate) and 0.0 <= self.fault_rate <= 1.0):
            raise ValueError(f"fault_rate must be from 0 to 1, got {self.fault_rate}")
