"""A planned engine step: which requests compute how many tokens, and the interface every
scheduler style implements."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from luftpause.testkit.engine.model.state import RequestState

__all__ = ["Planned", "StepScheduler"]


@dataclass(frozen=True, slots=True)
class Planned:
    """``request`` computes ``tokens`` in the step (allocated when planned); ``context`` is the
    KV it attends over (its tokens computed before the step); ``epoch`` the request's epoch when
    planned (the step's result is dropped if the request lost its KV meanwhile)."""

    request: RequestState
    epoch: int
    tokens: int
    context: int

    @classmethod
    def of(cls, request: RequestState, tokens: int) -> Planned:
        return cls(request, request.epoch, tokens, request.kv)


class StepScheduler(Protocol):
    """One scheduler style over an :class:`~.state.EngineState`."""

    def plan(self, now: float) -> list[Planned]:
        """Admit, retract or preempt as the engine would at a step starting at ``now``, allocate
        the KV of what the step computes, and return it (empty: nothing to compute)."""
        ...

    def released(self, request: RequestState) -> None:
        """``request`` finished or was cancelled: forget whatever the style kept of it."""
        ...

    @property
    def new_token_ratio(self) -> float: ...
